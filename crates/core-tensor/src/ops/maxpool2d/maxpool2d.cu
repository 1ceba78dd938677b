// 2x2 max-pooling with stride 2 (odd trailing rows/columns dropped). The
// window rules are maxpool2d/cpu.rs's `window_max` and `window_argmax`: the
// maximum, NaN when any input is NaN, and the gradient to the first input
// equal to it in row-major window order (the first NaN for NaN). The
// epilogue (`Epilogue` in mod.rs: ReLU when `relu` is 1, then the dropout)
// is relu.cu's, applied to each pooled value and, backward, to its gradient.

#include "dropout.cuh"

// Mirrors `PoolGeom` (usize fields) field by field.
struct PoolGeom {
    unsigned long long batch, channels, in_h, in_w;
};

// f32::NAN, the CPU kernel's NaN: a pooled NaN is the same bits on both
// devices (fmaxf would drop a NaN; one the epilogue scales is CUDA's NaN,
// which the parity suite's NaN rule accepts).
__device__ __forceinline__ float canonical_nan() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ float window_max(const float (&w)[4]) {
    const float m = fmaxf(fmaxf(w[0], w[1]), fmaxf(w[2], w[3]));
    const bool any_nan = isnan(w[0]) || isnan(w[1]) || isnan(w[2]) || isnan(w[3]);
    return any_nan ? canonical_nan() : m;
}

__device__ __forceinline__ int window_argmax(const float (&w)[4]) {
    const float m = window_max(w);
    for (int i = 0; i < 4; ++i) {
        if (w[i] == m || (isnan(m) && isnan(w[i]))) return i;
    }
    return 0;
}

// The window of output (plane, oh, ow), row-major, and where it starts.
__device__ __forceinline__ int load_window(const float* x, int in_h_w, int in_w, int plane,
                                           int oh, int ow, float (&w)[4]) {
    const int top = plane * in_h_w + (2 * oh) * in_w + 2 * ow;
    w[0] = x[top];
    w[1] = x[top + 1];
    w[2] = x[top + in_w];
    w[3] = x[top + in_w + 1];
    return top;
}

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
    const float m = window_max(w);
    y[i] = relu ? dropout_apply(d, i, m < 0.0f ? 0.0f : m) : m;
}

// One thread per window: it writes the window's gradient to its argmax and
// zero to the other three, and the last window of a row or column also
// zeroes the odd column or row dropped beside it, so dx is overwritten
// completely without a separate clearing pass. (A geometry without windows
// has an empty dy, which no CUDA buffer is, so it never reaches here.)
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
    const int arg = window_argmax(w);
    const float grad = !relu ? dy[i] : y[i] > 0.0f ? dropout_apply(d, i, dy[i]) : 0.0f;
    dx[top] = arg == 0 ? grad : 0.0f;
    dx[top + 1] = arg == 1 ? grad : 0.0f;
    dx[top + in_w] = arg == 2 ? grad : 0.0f;
    dx[top + in_w + 1] = arg == 3 ? grad : 0.0f;
    const bool last_col = (in_w & 1) && ow == ow_n - 1;
    const bool last_row = (in_h & 1) && oh == oh_n - 1;
    if (last_col) {
        dx[top + 2] = 0.0f;
        dx[top + in_w + 2] = 0.0f;
    }
    if (last_row) {
        dx[top + 2 * in_w] = 0.0f;
        dx[top + 2 * in_w + 1] = 0.0f;
        if (last_col) dx[top + 2 * in_w + 2] = 0.0f;
    }
}
