// 2x2 max-pooling with stride 2 (odd trailing rows/columns dropped), with
// the epilogue of `Epilogue` in mod.rs; the window rules are
// pool_window.cuh's.

#include "dropout/dropout.cuh"
#include "pool_window.cuh"

// Indices are 32-bit: the host checks that the input fits.

// One thread per output element.
extern "C" __global__ void maxpool2d_fwd_f32(const float* x, float* y, PoolGeom g,
                                             unsigned int relu, DropoutArgs d) {
    const int in_h = (int)g.in_h, in_w = (int)g.in_w, oh_n = in_h / 2, ow_n = in_w / 2;
    const int windows = oh_n * ow_n;
    const int total = (int)(g.batch * g.channels) * windows;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int plane = i / windows, r = i - plane * windows;
    float w[4];
    load_window(x, in_h * in_w, in_w, plane, r / ow_n, r % ow_n, w);
    y[i] = pooled_fwd(relu, d, i, window_max(w));
}

// One thread per window: it writes the window's gradient to its argmax and
// zero to the other three, and the dropped odd row or column beside the
// last window (`route_window`), so dx is overwritten completely without a
// separate clearing pass. (A geometry without windows has an empty dy,
// which no CUDA buffer is, so it never reaches here.)
extern "C" __global__ void maxpool2d_bwd_f32(const float* x, const float* y, const float* dy,
                                             float* dx, PoolGeom g, unsigned int relu,
                                             DropoutArgs d) {
    const int in_h = (int)g.in_h, in_w = (int)g.in_w, oh_n = in_h / 2, ow_n = in_w / 2;
    const int windows = oh_n * ow_n;
    const int total = (int)(g.batch * g.channels) * windows;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int plane = i / windows, r = i - plane * windows;
    const int oh = r / ow_n, ow = r - oh * ow_n;
    float w[4];
    const int top = load_window(x, in_h * in_w, in_w, plane, oh, ow, w);
    const float grad = pooled_bwd(relu, d, i, y, dy[i]);
    route_window(dx, top, in_h, in_w, oh, ow, window_argmax(w), grad);
}
