// 2-D convolution (NCHW input, OIHW weight) as implicit GEMMs over the whole
// batch on the shared tile (sgemm.cuh): the im2col matrix is never stored,
// the loaders compute each element's address from the geometry.
//
//   forward      y  [O, (n, oh, ow)]  = W [O, C·K·K]     · im2col(x)
//   input grad   dx [C, (n, ih, iw)]  = Wᵀ[C, (o, kh, kw)] · taps of dy
//   weight grad  dW [O, C·K·K]        = dy [O, (n, oh, ow)] · im2col(x)ᵀ
//
// Each GEMM has `_f32` (whole tiles), `_partial_f32` (one K split into the
// workspace) and `_reduce_f32` (sum of the splits in order) entry points.

#include "sgemm.cuh"
#include "reduce.cuh"

// Mirrors `Conv2dGeom` (usize fields) field by field.
struct Conv2dGeom {
    unsigned long long batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding;
};

// Mirrors `GemmLaunch<Conv2dGeom>` in backend/cuda/gemm.rs.
struct Conv2dLaunch {
    Conv2dGeom g;
    unsigned long long k_chunk, splits;
};

// The geometry in 32-bit ints (the host checks that every buffer fits), with
// the derived sizes the index arithmetic needs.
struct Dims {
    int n, c, h, w, o, k, s, pad, oh, ow, ohw, kk, ckk;
};

__device__ __forceinline__ Dims dims(const Conv2dGeom& g) {
    Dims d;
    d.n = (int)g.batch;
    d.c = (int)g.in_channels;
    d.h = (int)g.in_h;
    d.w = (int)g.in_w;
    d.o = (int)g.out_channels;
    d.k = (int)g.kernel;
    d.s = (int)g.stride;
    d.pad = (int)g.padding;
    d.oh = (d.h + 2 * d.pad - d.k) / d.s + 1;
    d.ow = (d.w + 2 * d.pad - d.k) / d.s + 1;
    d.ohw = d.oh * d.ow;
    d.kk = d.k * d.k;
    d.ckk = d.c * d.kk;
    return d;
}

// im2col(x)[row, col] with row = (c, kh, kw) and col = (image, oh, ow);
// zero in the padding.
__device__ __forceinline__ float im2col_at(const float* x, const Dims& d, int col, int row) {
    const int img = col / d.ohw, p = col - img * d.ohw;
    const int oh = p / d.ow, ow = p - oh * d.ow;
    const int c = row / d.kk, r = row - c * d.kk;
    const int kh = r / d.k, kw = r - kh * d.k;
    const int ih = oh * d.s + kh - d.pad, iw = ow * d.s + kw - d.pad;
    if ((unsigned)ih >= (unsigned)d.h || (unsigned)iw >= (unsigned)d.w) return 0.0f;
    return x[((img * d.c + c) * d.h + ih) * d.w + iw];
}

// Forward B operand, B(k = row, n = col): walks output pixels.
struct Im2col {
    static const bool K_FAST = false;
    const float* x;
    Dims d;
    __device__ float operator()(int n, int k) const { return im2col_at(x, d, n, k); }
};

// Weight-grad B operand, B(k = col, n = row): the transpose, walking pixels as k.
struct Im2colT {
    static const bool K_FAST = true;
    const float* x;
    Dims d;
    __device__ float operator()(int n, int k) const { return im2col_at(x, d, k, n); }
};

// W [O, C·K·K] as A(o, row).
struct WeightRows {
    static const bool K_FAST = true;
    const float* w;
    int ckk;
    __device__ float operator()(int m, int k) const { return w[m * ckk + k]; }
};

// dy [N, O, OH·OW] as A(o, col) with col = (image, pixel).
struct DyRows {
    static const bool K_FAST = true;
    const float* dy;
    int o, ohw;
    __device__ float operator()(int m, int k) const {
        const int img = k / ohw, p = k - img * ohw;
        return dy[(img * o + m) * ohw + p];
    }
};

// Wᵀ as A(c, (o, kh, kw)) = W[o, c, kh, kw].
struct WeightCols {
    static const bool K_FAST = true;
    const float* w;
    int c, kk;
    __device__ float operator()(int m, int k) const {
        const int o = k / kk, r = k - o * kk;
        return w[(o * c + m) * kk + r];
    }
};

// The input-grad B operand, B((o, kh, kw), (image, ih, iw)): the dy element
// whose window placed tap (kh, kw) on input pixel (ih, iw), zero when no
// output position did (stride gaps, borders).
struct DyTaps {
    static const bool K_FAST = false;
    const float* dy;
    Dims d;
    __device__ float operator()(int n, int k) const {
        const int hw = d.h * d.w;
        const int img = n / hw, q = n - img * hw;
        const int ih = q / d.w, iw = q - ih * d.w;
        const int o = k / d.kk, r = k - o * d.kk;
        const int kh = r / d.k, kw = r - kh * d.k;
        const int th = ih + d.pad - kh, tw = iw + d.pad - kw;
        if (th < 0 || tw < 0) return 0.0f;
        const int oh = th / d.s, ow = tw / d.s;
        if (oh * d.s != th || ow * d.s != tw || oh >= d.oh || ow >= d.ow) return 0.0f;
        return dy[((img * d.o + o) * d.oh + oh) * d.ow + ow];
    }
};

// C(m = channel, n = (image, pixel)) stored into an NCHW tensor with `planes`
// channels of `plane` pixels, plus bias[m] when there is one.
struct NchwStore {
    float* out;
    const float* bias;
    int planes, plane;
    __device__ void operator()(int m, int n, float v) const {
        const int img = n / plane, p = n - img * plane;
        out[(img * planes + m) * plane + p] = bias ? v + bias[m] : v;
    }
};

// ---- forward: M = O, N = batch·OH·OW, K = C·K·K ----

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_fwd_f32(const float* x, const float* w, const float* bias, float* y, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    float acc[4][4];
    gemm_tile(WeightRows{w, d.ckk}, Im2col{x, d}, d.o, d.n * d.ohw, d.ckk, (int)p.k_chunk, acc);
    gemm_store(acc, d.o, d.n * d.ohw, NchwStore{y, bias, d.o, d.ohw});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_fwd_partial_f32(const float* x, const float* w, float* ws, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    float acc[4][4];
    gemm_tile(WeightRows{w, d.ckk}, Im2col{x, d}, d.o, d.n * d.ohw, d.ckk, (int)p.k_chunk, acc);
    gemm_store(acc, d.o, d.n * d.ohw, PartialStore{ws, d.o, d.n * d.ohw});
}

extern "C" __global__ void conv2d_fwd_reduce_f32(const float* ws, const float* bias, float* y,
                                                 Conv2dLaunch p) {
    const Dims d = dims(p.g);
    gemm_reduce(ws, d.o, d.n * d.ohw, (int)p.splits, NchwStore{y, bias, d.o, d.ohw});
}

// ---- input gradient: M = C, N = batch·H·W, K = O·K·K ----

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_bwd_input_f32(const float* dy, const float* w, float* dx, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    const int hw = d.h * d.w;
    float acc[4][4];
    gemm_tile(WeightCols{w, d.c, d.kk}, DyTaps{dy, d}, d.c, d.n * hw, d.o * d.kk, (int)p.k_chunk,
              acc);
    gemm_store(acc, d.c, d.n * hw, NchwStore{dx, nullptr, d.c, hw});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_bwd_input_partial_f32(const float* dy, const float* w, float* ws, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    const int hw = d.h * d.w;
    float acc[4][4];
    gemm_tile(WeightCols{w, d.c, d.kk}, DyTaps{dy, d}, d.c, d.n * hw, d.o * d.kk, (int)p.k_chunk,
              acc);
    gemm_store(acc, d.c, d.n * hw, PartialStore{ws, d.c, d.n * hw});
}

extern "C" __global__ void conv2d_bwd_input_reduce_f32(const float* ws, float* dx, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    const int hw = d.h * d.w;
    gemm_reduce(ws, d.c, d.n * hw, (int)p.splits, NchwStore{dx, nullptr, d.c, hw});
}

// ---- weight gradient: M = O, N = C·K·K, K = batch·OH·OW ----

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_bwd_weight_f32(const float* x, const float* dy, float* dw, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    float acc[4][4];
    gemm_tile(DyRows{dy, d.o, d.ohw}, Im2colT{x, d}, d.o, d.ckk, d.n * d.ohw, (int)p.k_chunk, acc);
    gemm_store(acc, d.o, d.ckk, PlainStore{dw, d.ckk});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_bwd_weight_partial_f32(const float* x, const float* dy, float* ws, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    float acc[4][4];
    gemm_tile(DyRows{dy, d.o, d.ohw}, Im2colT{x, d}, d.o, d.ckk, d.n * d.ohw, (int)p.k_chunk, acc);
    gemm_store(acc, d.o, d.ckk, PartialStore{ws, d.o, d.ckk});
}

extern "C" __global__ void conv2d_bwd_weight_reduce_f32(const float* ws, float* dw, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    gemm_reduce(ws, d.o, d.ckk, (int)p.splits, PlainStore{dw, d.ckk});
}

// ---- bias gradient: db[o] = Σ dy[n, o, :], one block per channel ----

extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    conv2d_bwd_bias_f32(const float* dy, float* db, Conv2dGeom g) {
    const Dims d = dims(g);
    const int o = blockIdx.x;
    float sum = 0.0f;
    for (int img = 0; img < d.n; ++img) {
        const float* plane = dy + (img * d.o + o) * d.ohw;
        for (int p = threadIdx.x; p < d.ohw; p += REDUCE_THREADS) sum += plane[p];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) db[o] = sum;
}
