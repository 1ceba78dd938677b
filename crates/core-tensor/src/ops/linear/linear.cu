// Linear layer y = x·Wᵀ + b with PyTorch's [out, in] weight: three GEMMs on
// the shared tile (sgemm.cuh) and a column sum for the bias gradient.
//
// Each GEMM has a family of whole-tile entry points that store the result
// (`<name>_f32`, `<name>_tf32_cp`, ...: one per line of sgemm.cuh's
// GEMM_VARIANTS), a family of split-K ones that compute one K split into the
// workspace (`<name>_partial_f32`, ...), and `<name>_reduce_f32`, which sums
// the splits in order and stores. The host picks direct or split from the
// shape alone (backend/cuda/gemm.rs).

#include "sgemm.cuh"
#include "linear.cuh"

// Each product is one device function templated on its precision, tile and
// staging; each family below defines its entry point once and stamps it for
// every variant (sgemm.cuh's GEMM_VARIANTS).

#define LINEAR_FWD(SUFFIX, P, T, S)                                                               \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) linear_fwd##SUFFIX(                \
        const float* x, const float* w, const float* bias, float* y, LinearLaunch p) {            \
        linear_fwd<P, T, S>(x, w, p, BiasStore{y, bias, (int)p.g.out_features});                  \
    }
GEMM_VARIANTS(LINEAR_FWD)

#define LINEAR_FWD_PARTIAL(SUFFIX, P, T, S)                                                       \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) linear_fwd_partial##SUFFIX(        \
        const float* x, const float* w, float* ws, LinearLaunch p) {                              \
        linear_fwd<P, T, S>(x, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.out_features});    \
    }
GEMM_VARIANTS(LINEAR_FWD_PARTIAL)

extern "C" __global__ void linear_fwd_reduce_f32(const float* ws, const float* bias, float* y,
                                                 LinearLaunch p) {
    const int O = (int)p.g.out_features;
    gemm_reduce(ws, (int)p.g.batch, O, (int)p.t.splits, BiasStore{y, bias, O});
}

// Weight gradient: dW[o, i] = Σ_b dy[b, o] · x[b, i]; M = out, N = in, K = batch.
template <class P, class TILE, class STAGING, class S>
__device__ __forceinline__ void linear_bwd_weight(const float* x, const float* dy,
                                                  const LinearLaunch& p, const S& store) {
    const int B = (int)p.g.batch, I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<P, TILE, STAGING>(ColsByK{dy, O}, ColsByK{x, I}, O, I, B, p.t, store);
}

#define LINEAR_BWD_WEIGHT(SUFFIX, P, T, S)                                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) linear_bwd_weight##SUFFIX(         \
        const float* x, const float* dy, float* dw, LinearLaunch p) {                             \
        linear_bwd_weight<P, T, S>(x, dy, p, PlainStore{dw, (int)p.g.in_features});               \
    }
GEMM_VARIANTS(LINEAR_BWD_WEIGHT)

#define LINEAR_BWD_WEIGHT_PARTIAL(SUFFIX, P, T, S)                                                \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) linear_bwd_weight_partial##SUFFIX( \
        const float* x, const float* dy, float* ws, LinearLaunch p) {                             \
        linear_bwd_weight<P, T, S>(x, dy, p,                                                      \
                                   PartialStore{ws, (int)p.g.out_features, (int)p.g.in_features}); \
    }
GEMM_VARIANTS(LINEAR_BWD_WEIGHT_PARTIAL)

extern "C" __global__ void linear_bwd_weight_reduce_f32(const float* ws, float* dw, LinearLaunch p) {
    const int I = (int)p.g.in_features;
    gemm_reduce(ws, (int)p.g.out_features, I, (int)p.t.splits, PlainStore{dw, I});
}

// Input gradient: dx[b, i] = Σ_o dy[b, o] · W[o, i]; M = batch, N = in, K = out.
template <class P, class TILE, class STAGING, class S>
__device__ __forceinline__ void linear_bwd_input(const float* dy, const float* w,
                                                 const LinearLaunch& p, const S& store) {
    const int B = (int)p.g.batch, I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<P, TILE, STAGING>(RowsByK{dy, O}, ColsByK{w, I}, B, I, O, p.t, store);
}

#define LINEAR_BWD_INPUT(SUFFIX, P, T, S)                                                         \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) linear_bwd_input##SUFFIX(          \
        const float* dy, const float* w, float* dx, LinearLaunch p) {                             \
        linear_bwd_input<P, T, S>(dy, w, p, PlainStore{dx, (int)p.g.in_features});                \
    }
GEMM_VARIANTS(LINEAR_BWD_INPUT)

#define LINEAR_BWD_INPUT_PARTIAL(SUFFIX, P, T, S)                                                 \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) linear_bwd_input_partial##SUFFIX(  \
        const float* dy, const float* w, float* ws, LinearLaunch p) {                             \
        linear_bwd_input<P, T, S>(dy, w, p,                                                       \
                                  PartialStore{ws, (int)p.g.batch, (int)p.g.in_features});        \
    }
GEMM_VARIANTS(LINEAR_BWD_INPUT_PARTIAL)

extern "C" __global__ void linear_bwd_input_reduce_f32(const float* ws, float* dx, LinearLaunch p) {
    const int I = (int)p.g.in_features;
    gemm_reduce(ws, (int)p.g.batch, I, (int)p.t.splits, PlainStore{dx, I});
}

// Bias gradient: db[o] = Σ_b dy[b, o], one thread per column summing the rows
// in order (the CPU kernel's order, so the result is bit-identical to it).
extern "C" __global__ void linear_bwd_bias_f32(const float* dy, float* db, LinearGeom g) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    const int B = (int)g.batch, O = (int)g.out_features;
    if (o >= O) return;
    float sum = 0.0f;
    for (int b = 0; b < B; ++b) sum += dy[b * O + o];
    db[o] = sum;
}
