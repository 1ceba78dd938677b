// 2-D convolution (NCHW input, OIHW weight) as implicit GEMMs over the whole
// batch on the shared tile (sgemm.cuh): the im2col matrix is never stored,
// the loaders compute each element's address from the geometry.
//
//   forward      y  [O, (n, oh, ow)]  = W [O, C·K·K]     · im2col(x)
//   input grad   dx [C, (n, ih, iw)]  = Wᵀ[C, (o, kh, kw)] · taps of dy
//   weight grad  dW [O, C·K·K]        = dy [O, (n, oh, ow)] · im2col(x)ᵀ
//
// Each GEMM is a family of whole-tile entry points (`_f32`, `_tf32`,
// `_bf16`, ...: GEMM_VARIANTS in sgemm.cuh), one of split-K ones that fill
// the workspace with one K split each (`_partial_` and the same kinds), and
// `_reduce_f32`, which sums the splits in order.

#include "sgemm.cuh"
#include "reduce.cuh"
#include "conv2d.cuh"

// dy [N, O, OH·OW] as A(o, col) with col = (image, pixel).
struct DyRows : Offsets {
    static const bool K_TABLE = true;
    static const bool K_FAST = true;
    typedef int Mn;
    typedef int K;
    int o, ohw;
    __device__ int mn_part(int m) const { return m * ohw; }
    __device__ int k_part(int k) const {
        const int img = k / ohw;
        return img * o * ohw + (k - img * ohw);
    }
};

// Wᵀ as A(c, (o, kh, kw)) = W[o, c, kh, kw].
struct WeightCols : Offsets {
    static const bool K_TABLE = true;
    static const bool K_FAST = true;
    typedef int Mn;
    typedef int K;
    int c, kk;
    __device__ int mn_part(int m) const { return m * kk; }
    __device__ int k_part(int k) const {
        const int o = k / kk;
        return o * c * kk + (k - o * kk);
    }
};

// An input pixel (image, ih, iw) seen from dy: its image's offset in dy and
// its coordinates in the padded input.
struct InputPixel {
    int base, th, tw;
};

// A tap (o, kh, kw) seen from dy: output channel o's plane offset and the tap.
struct OutputTap {
    int off, kh, kw;
};

// The input-grad B operand, B((o, kh, kw), (image, ih, iw)): the dy element
// whose window placed tap (kh, kw) on input pixel (ih, iw), not there (zero)
// when no output position did (stride gaps, borders). UNIT_STRIDE leaves
// the stride's divisibility test and division out of the inner loop.
template <bool UNIT_STRIDE>
struct DyTaps {
    static const bool K_TABLE = true;
    static const bool K_FAST = false;
    typedef InputPixel Mn;
    typedef OutputTap K;
    const float* dy;
    Dims d;
    __device__ InputPixel mn_part(int n) const {
        const int hw = d.h * d.w;
        const int img = n / hw, q = n - img * hw;
        const int ih = q / d.w, iw = q - ih * d.w;
        return InputPixel{img * d.o * d.ohw, ih + d.pad, iw + d.pad};
    }
    __device__ OutputTap k_part(int k) const {
        const int o = k / d.kk, r = k - o * d.kk;
        const int kh = r / d.k;
        return OutputTap{o * d.ohw, kh, r - kh * d.k};
    }
    __device__ GemmElem at(const InputPixel& px, const OutputTap& tap) const {
        const GemmElem none{dy, 0, false};
        int oh = px.th - tap.kh, ow = px.tw - tap.kw;
        if (oh < 0 || ow < 0) return none;
        if (!UNIT_STRIDE) {
            if (oh % d.s != 0 || ow % d.s != 0) return none;
            oh /= d.s;
            ow /= d.s;
        }
        if (oh >= d.oh || ow >= d.ow) return none;
        return GemmElem{dy, px.base + tap.off + oh * d.ow + ow, true};
    }
};

// dx's tile (or one split's partial tile) of Wᵀ · taps(dy), for either stride.
template <class KIND, class S>
__device__ __forceinline__ void conv2d_bwd_input(const float* dy, const float* w, const Dims& d,
                                                 const Conv2dLaunch& p, const S& store) {
    const WeightCols wt{w, d.c, d.kk};
    const int n = d.n * d.h * d.w, k = d.o * d.kk;
    if (d.s == 1) {
        gemm<KIND>(wt, DyTaps<true>{dy, d}, d.c, n, k, p.t, store);
    } else {
        gemm<KIND>(wt, DyTaps<false>{dy, d}, d.c, n, k, p.t, store);
    }
}

// Each product below is one device function templated on its kind; a
// STAMP macro writes its entry point once, and GEMM_VARIANTS stamps it per
// kind.

// ---- forward: M = O, N = batch·OH·OW, K = C·K·K ----

template <class KIND, class S>
__device__ __forceinline__ void conv2d_fwd(const float* x, const float* w, const Conv2dLaunch& p,
                                           const S& store) {
    const Dims d = dims(p.g);
    gemm<KIND>(WeightRows{w, d.ckk}, Im2col{x, d}, d.o, d.n * d.ohw, d.ckk, p.t, store);
}

#define CONV2D_FWD(NAME, KIND)                                                                \
    GEMM_ENTRY NAME(const float* x, const float* w, const float* bias, float* y, Conv2dLaunch p) { \
        const Dims d = dims(p.g);                                                             \
        conv2d_fwd<KIND>(x, w, p, NchwStore{y, bias, d.o, d.ohw});                             \
    }
GEMM_VARIANTS(conv2d_fwd, CONV2D_FWD)

#define CONV2D_FWD_PARTIAL(NAME, KIND)                                            \
    GEMM_ENTRY NAME(const float* x, const float* w, float* ws, Conv2dLaunch p) {  \
        const Dims d = dims(p.g);                                                 \
        conv2d_fwd<KIND>(x, w, p, PartialStore{ws, d.o, d.n * d.ohw});            \
    }
GEMM_VARIANTS(conv2d_fwd_partial, CONV2D_FWD_PARTIAL)

extern "C" __global__ void conv2d_fwd_reduce_f32(const float* ws, const float* bias, float* y,
                                                 Conv2dLaunch p) {
    const Dims d = dims(p.g);
    gemm_reduce(ws, d.o, d.n * d.ohw, (int)p.t.splits, NchwStore{y, bias, d.o, d.ohw});
}

// ---- input gradient: M = C, N = batch·H·W, K = O·K·K ----

// Each kind's bound (GEMM_ENTRY_BOUNDS, sgemm.cuh) holds it at or below the
// registers of the kernel that held every staging (nvrtc_compile's
// ceilings). Whole tiles: the float32 kernel capped at 64, four blocks per
// SM (left to itself ptxas gives it 77, three blocks; asked for four
// blocks, it spills 4 bytes at 64), the TF32 cp.async one asked for four
// blocks (75 unasked). Split: four blocks per SM asked for in the square
// tiles, where ptxas would spill at 64, and one in the wide tiles, where it
// would spill at 128.
#define CONV2D_BWD_INPUT(NAME, KIND)                                                 \
    GEMM_ENTRY_BOUNDS(KIND, REGS(64), ANY, ANY, BLOCKS(4), ANY,                      \
                      ANY, ANY, ANY, ANY)                                            \
    NAME(const float* dy, const float* w, float* dx, Conv2dLaunch p) {               \
        const Dims d = dims(p.g);                                                    \
        conv2d_bwd_input<KIND>(dy, w, d, p, NchwStore{dx, nullptr, d.c, d.h * d.w}); \
    }
GEMM_VARIANTS(conv2d_bwd_input, CONV2D_BWD_INPUT)

#define CONV2D_BWD_INPUT_PARTIAL(NAME, KIND)                                         \
    GEMM_ENTRY_BOUNDS(KIND, BLOCKS(4), BLOCKS(4), BLOCKS(4), BLOCKS(4), ANY,         \
                      BLOCKS(1), BLOCKS(1), BLOCKS(1), BLOCKS(1))                    \
    NAME(const float* dy, const float* w, float* ws, Conv2dLaunch p) {               \
        const Dims d = dims(p.g);                                                    \
        conv2d_bwd_input<KIND>(dy, w, d, p, PartialStore{ws, d.c, d.n * d.h * d.w}); \
    }
GEMM_VARIANTS(conv2d_bwd_input_partial, CONV2D_BWD_INPUT_PARTIAL)

extern "C" __global__ void conv2d_bwd_input_reduce_f32(const float* ws, float* dx, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    const int hw = d.h * d.w;
    gemm_reduce(ws, d.c, d.n * hw, (int)p.t.splits, NchwStore{dx, nullptr, d.c, hw});
}

// ---- weight gradient: M = O, N = C·K·K, K = batch·OH·OW ----

template <class KIND, class S>
__device__ __forceinline__ void conv2d_bwd_weight(const float* x, const float* dy,
                                                  const Conv2dLaunch& p, const S& store) {
    const Dims d = dims(p.g);
    gemm<KIND>(DyRows{dy, d.o, d.ohw}, Im2colT{x, d}, d.o, d.ckk, d.n * d.ohw, p.t, store);
}

// The wide float32 register kernels capped at 217 (ptxas's own choice: 233;
// one block per SM either way).
#define CONV2D_BWD_WEIGHT(NAME, KIND)                                     \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                      \
                      REGS(217), ANY, ANY, ANY)                           \
    NAME(const float* x, const float* dy, float* dw, Conv2dLaunch p) {    \
        conv2d_bwd_weight<KIND>(x, dy, p, PlainStore{dw, dims(p.g).ckk}); \
    }
GEMM_VARIANTS(conv2d_bwd_weight, CONV2D_BWD_WEIGHT)

#define CONV2D_BWD_WEIGHT_PARTIAL(NAME, KIND)                            \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                     \
                      REGS(217), ANY, ANY, ANY)                          \
    NAME(const float* x, const float* dy, float* ws, Conv2dLaunch p) {   \
        const Dims d = dims(p.g);                                        \
        conv2d_bwd_weight<KIND>(x, dy, p, PartialStore{ws, d.o, d.ckk}); \
    }
GEMM_VARIANTS(conv2d_bwd_weight_partial, CONV2D_BWD_WEIGHT_PARTIAL)

extern "C" __global__ void conv2d_bwd_weight_reduce_f32(const float* ws, float* dw, Conv2dLaunch p) {
    const Dims d = dims(p.g);
    gemm_reduce(ws, d.o, d.ckk, (int)p.t.splits, PlainStore{dw, d.ckk});
}

// ---- bias gradient: db[o] = Σ dy[n, o, :], in two passes ----
//
// Channel o's elements e = (image, pixel) are cut into slices of
// BIAS_SLICE, the last one short; block (o, s) sums slice s of channel o
// into ws[s · O + o], then `conv2d_bwd_bias_reduce_f32` sums each channel's
// slices with a warp. So the batch is spread over O · slices blocks instead
// of O, and each thread loads its BIAS_ITEMS elements before it adds any,
// so that they are in flight together. Every addition's order is fixed by
// the shape (no atomics).
#define BIAS_ITEMS 16
#define BIAS_SLICE (BIAS_ITEMS * REDUCE_THREADS)

// Slices per channel; one when the batch is empty, so that db is zeroed.
__device__ __forceinline__ int bias_slices(const Dims& d) {
    const int total = d.n * d.ohw;
    return total == 0 ? 1 : (total + BIAS_SLICE - 1) / BIAS_SLICE;
}

extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    conv2d_bwd_bias_partial_f32(const float* dy, float* ws, Conv2dGeom g) {
    const Dims d = dims(g);
    const int slices = bias_slices(d);
    const int o = blockIdx.x / slices, s = blockIdx.x - o * slices;
    const int left = d.n * d.ohw - s * BIAS_SLICE;
    // The thread's first element as (image, pixel), and the step of
    // REDUCE_THREADS elements as whole images plus pixels, so that the
    // loop has no division.
    const int e0 = s * BIAS_SLICE + threadIdx.x;
    int img = e0 / d.ohw, p = e0 - img * d.ohw;
    const int step_img = REDUCE_THREADS / d.ohw, step_p = REDUCE_THREADS - step_img * d.ohw;
    float v[BIAS_ITEMS];
#pragma unroll
    for (int u = 0; u < BIAS_ITEMS; ++u) {
        const bool in = (int)threadIdx.x + u * REDUCE_THREADS < left;
        v[u] = in ? dy[(img * d.o + o) * d.ohw + p] : 0.0f;
        img += step_img;
        p += step_p;
        if (p >= d.ohw) {
            p -= d.ohw;
            ++img;
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < BIAS_ITEMS; ++u) sum += v[u];
    sum = block_sum(sum);
    if (threadIdx.x == 0) ws[s * d.o + o] = sum;
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    conv2d_bwd_bias_reduce_f32(const float* ws, float* db, Conv2dGeom g) {
    const Dims d = dims(g);
    sum_splits_by_warp(ws, d.o, 1, bias_slices(d), PlainStore{db, 1});
}
