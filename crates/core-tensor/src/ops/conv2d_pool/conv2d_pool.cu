// conv2d (with its bias), 2x2 max-pooling, then ReLU and the dropout
// (`Epilogue`), in one GEMM kernel that writes only the pooled values and
// each window's argmax (one byte, 0-3 row-major), never the convolution's
// output. Backward routes each pooled gradient to its argmax from those
// bytes; the convolution's own backward is conv2d.cu's.
//
// The forward product is conv2d.cu's, W [O, C·K·K] · im2col(x), with its
// columns in window order: column ((image · PH + ph) · PW + pw) · 4 + q is
// pixel (2·ph + q / 2, 2·pw + q % 2), so every tile (64 or 128 columns)
// holds whole windows. Each block stages its tile of conv + bias in shared
// memory, then pools it. Every output is still one chain over k in order
// plus the bias, so the pooled values are those of conv2d_fwd then
// maxpool2d_fwd, bit for bit (the host runs this kernel only when K is not
// split and the tile is square; a split product, or one in the wide tiles,
// whose 64 x 256 floats would not fit the 48 KiB of static shared memory
// beside their staging, goes through conv2d.cu and `conv2d_pool_argmax_f32`).

#include "sgemm.cuh"
#include "conv2d/conv2d.cuh"
#include "dropout/dropout.cuh"
#include "maxpool2d/pool_window.cuh"

// The forward B operand in window order (above); the windows drop an odd
// last row or column of the convolution's output, as the pool does.
struct PooledIm2col : Im2col {
    __device__ Window mn_part(int n) const {
        const int pw_n = d.ow / 2, phw = (d.oh / 2) * pw_n;
        const int win = n / 4, q = n - 4 * win;
        const int img = win / phw, r = win - img * phw;
        const int ph = r / pw_n, pw = r - ph * pw_n;
        const int oh = 2 * ph + q / 2, ow = 2 * pw + q % 2;
        return window_at(d, img * d.ohw + oh * d.ow + ow);
    }
};

// Stores conv + bias into the block's tile in shared memory, row-major with
// `ld` columns: the expression of conv2d.cu's `NchwStore`, so the same bits.
struct TileStore {
    float* tile;
    const float* bias;
    int m0, n0, ld;
    __device__ void operator()(int m, int n, float v) const {
        tile[(m - m0) * ld + (n - n0)] = v + bias[m];
    }
};

// The block's tile of pooled values: conv + bias staged in shared memory,
// then a thread per window (a 16-byte shared load) writes the pooled value
// after the epilogue, and its argmax.
template <class KIND>
__device__ __forceinline__ void conv2d_pool_fwd(const float* x, const float* w, const float* bias,
                                                float* y, unsigned char* arg, const Conv2dLaunch& p,
                                                unsigned int relu, const DropoutArgs& dr) {
    __shared__ __align__(16) float tile[GEMM_TILE_ELEMS];
    const Dims d = dims(p.g);
    const int bm = (int)p.t.tile_m, bn = (int)p.t.tile_n;
    const int m0 = blockIdx.y * bm, n0 = blockIdx.x * bn;
    const int phw = (d.oh / 2) * (d.ow / 2), windows = d.n * phw;
    gemm<KIND>(WeightRows{w, d.ckk}, PooledIm2col{x, d}, d.o, 4 * windows, d.ckk, p.t,
               TileStore{tile, bias, m0, n0, bn});
    __syncthreads();
    const int per_row = bn / 4;
    for (int i = threadIdx.x; i < bm * per_row; i += GEMM_THREADS) {
        const int r = i / per_row, c = i - r * per_row;
        const int m = m0 + r, win = n0 / 4 + c;
        if (m >= d.o || win >= windows) continue;
        const float4 v = *reinterpret_cast<const float4*>(&tile[r * bn + 4 * c]);
        const float wv[4] = {v.x, v.y, v.z, v.w};
        const int img = win / phw, out = (img * d.o + m) * phw + (win - img * phw);
        y[out] = pooled_fwd(relu, dr, out, window_max(wv));
        arg[out] = (unsigned char)window_argmax(wv);
    }
}

// The square tiles' kinds only (the host takes the unfused route for the
// wide ones, above).
#define CONV2D_POOL_FWD(NAME, KIND)                                                           \
    GEMM_ENTRY NAME(const float* x, const float* w, const float* bias, float* y,              \
                    unsigned char* arg, Conv2dLaunch p, unsigned int relu, DropoutArgs d) {   \
        conv2d_pool_fwd<KIND>(x, w, bias, y, arg, p, relu, d);                                \
    }
GEMM_SQUARE_VARIANTS(conv2d_pool_fwd, CONV2D_POOL_FWD)

// The split-K route: pools the convolution's output `a` as maxpool2d_fwd_f32
// does, and writes each window's argmax too. One thread per window.
extern "C" __global__ void conv2d_pool_argmax_f32(const float* a, float* y, unsigned char* arg,
                                                  PoolGeom g, unsigned int relu, DropoutArgs d) {
    const int in_h = (int)g.in_h, in_w = (int)g.in_w, oh_n = in_h / 2, ow_n = in_w / 2;
    const int windows = oh_n * ow_n;
    const int total = (int)(g.batch * g.channels) * windows;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int plane = i / windows, r = i - plane * windows;
    float w[4];
    load_window(a, in_h * in_w, in_w, plane, r / ow_n, r % ow_n, w);
    y[i] = pooled_fwd(relu, d, i, window_max(w));
    arg[i] = (unsigned char)window_argmax(w);
}

// Backward of the pool and its epilogue: one thread per window routes its
// gradient to the argmax byte the forward pass wrote (`route_window`), so
// the convolution's output is never read. An argmax past 3 (a buffer the
// forward pass did not write) zeroes the whole window: its gradient is lost
// rather than written out of place.
extern "C" __global__ void conv2d_pool_bwd_f32(const unsigned char* arg, const float* y,
                                               const float* dy, float* da, PoolGeom g,
                                               unsigned int relu, DropoutArgs d) {
    const int in_h = (int)g.in_h, in_w = (int)g.in_w, oh_n = in_h / 2, ow_n = in_w / 2;
    const int windows = oh_n * ow_n;
    const int total = (int)(g.batch * g.channels) * windows;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int plane = i / windows, r = i - plane * windows;
    const int oh = r / ow_n, ow = r - oh * ow_n;
    const int top = plane * in_h * in_w + (2 * oh) * in_w + 2 * ow;
    route_window(da, top, in_h, in_w, oh, ow, arg[i], pooled_bwd(relu, d, i, y, dy[i]));
}
