// Linear layer y = x·Wᵀ + b with PyTorch's [out, in] weight: three GEMMs on
// the shared tile (sgemm.cuh) and a column sum for the bias gradient.
//
// Each GEMM is one family of whole-tile entry points that store the result
// (`<name>_f32`, `<name>_tf32`, `<name>_bf16`, ...: GEMM_VARIANTS in
// sgemm.cuh), one of split-K ones that compute one K split into the
// workspace (`<name>_partial_f32`, ...), and `<name>_reduce_f32`, which sums
// the splits in order and stores. The host picks direct or split from the
// shape alone (backend/cuda/gemm.rs).

#include "sgemm.cuh"
#include "linear.cuh"

// Each product is one device function templated on its kind; a STAMP
// macro writes its entry point once, and GEMM_VARIANTS stamps it per kind.

// Each kind's bound (GEMM_ENTRY_BOUNDS, sgemm.cuh) holds it at or below the
// registers of the kernel that held every staging (nvrtc_compile's
// ceilings): here the wide float32 register kernels capped at 147 (ptxas's
// own choice: 173 and 171; one block per SM either way).
#define LINEAR_FWD(NAME, KIND)                                                          \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                                    \
                      REGS(147), ANY, ANY, ANY)                                         \
    NAME(const float* x, const float* w, const float* bias, float* y, LinearLaunch p) { \
        linear_fwd<KIND>(x, w, p, BiasStore{y, bias, (int)p.g.out_features});           \
    }
GEMM_VARIANTS(linear_fwd, LINEAR_FWD)

#define LINEAR_FWD_PARTIAL(NAME, KIND)                                                      \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                                        \
                      REGS(147), ANY, ANY, ANY)                                             \
    NAME(const float* x, const float* w, float* ws, LinearLaunch p) {                       \
        linear_fwd<KIND>(x, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.out_features}); \
    }
GEMM_VARIANTS(linear_fwd_partial, LINEAR_FWD_PARTIAL)

extern "C" __global__ void linear_fwd_reduce_f32(const float* ws, const float* bias, float* y,
                                                 LinearLaunch p) {
    const int O = (int)p.g.out_features;
    gemm_reduce(ws, (int)p.g.batch, O, (int)p.t.splits, BiasStore{y, bias, O});
}

// Weight gradient: dW[o, i] = Σ_b dy[b, o] · x[b, i]; M = out, N = in, K = batch.
template <class KIND, class S>
__device__ __forceinline__ void linear_bwd_weight(const float* x, const float* dy,
                                                  const LinearLaunch& p, const S& store) {
    const int B = (int)p.g.batch, I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<KIND>(ColsByK{dy, O}, ColsByK{x, I}, O, I, B, p.t, store);
}

// Two blocks per SM asked for in the wide tiles, which fit 127 registers
// (left to itself, ptxas gives the float32 one 129: one block); the split
// float32 one capped at 127 (asked for two blocks, it takes 128).
#define LINEAR_BWD_WEIGHT(NAME, KIND)                                            \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                             \
                      BLOCKS(2), BLOCKS(2), BLOCKS(2), BLOCKS(2))                \
    NAME(const float* x, const float* dy, float* dw, LinearLaunch p) {           \
        linear_bwd_weight<KIND>(x, dy, p, PlainStore{dw, (int)p.g.in_features}); \
    }
GEMM_VARIANTS(linear_bwd_weight, LINEAR_BWD_WEIGHT)

#define LINEAR_BWD_WEIGHT_PARTIAL(NAME, KIND)                                                   \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                                            \
                      REGS(127), BLOCKS(2), BLOCKS(2), BLOCKS(2))                               \
    NAME(const float* x, const float* dy, float* ws, LinearLaunch p) {                          \
        linear_bwd_weight<KIND>(x, dy, p,                                                       \
                                PartialStore{ws, (int)p.g.out_features, (int)p.g.in_features}); \
    }
GEMM_VARIANTS(linear_bwd_weight_partial, LINEAR_BWD_WEIGHT_PARTIAL)

extern "C" __global__ void linear_bwd_weight_reduce_f32(const float* ws, float* dw, LinearLaunch p) {
    const int I = (int)p.g.in_features;
    gemm_reduce(ws, (int)p.g.out_features, I, (int)p.t.splits, PlainStore{dw, I});
}

// Input gradient: dx[b, i] = Σ_o dy[b, o] · W[o, i]; M = batch, N = in, K = out.
template <class KIND, class S>
__device__ __forceinline__ void linear_bwd_input(const float* dy, const float* w,
                                                 const LinearLaunch& p, const S& store) {
    const int B = (int)p.g.batch, I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<KIND>(RowsByK{dy, O}, ColsByK{w, I}, B, I, O, p.t, store);
}

// The wide float32 register kernel capped at 139 (ptxas's own choice: 143);
// it takes 128.
#define LINEAR_BWD_INPUT(NAME, KIND)                                            \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                            \
                      REGS(139), ANY, ANY, ANY)                                 \
    NAME(const float* dy, const float* w, float* dx, LinearLaunch p) {          \
        linear_bwd_input<KIND>(dy, w, p, PlainStore{dx, (int)p.g.in_features}); \
    }
GEMM_VARIANTS(linear_bwd_input, LINEAR_BWD_INPUT)

// The wide tiles capped at 139: left to itself, ptxas spills the cp.async
// float32 one at 128 registers, and asked for one block per SM, it gave
// the four kinds 143-152.
#define LINEAR_BWD_INPUT_PARTIAL(NAME, KIND)                                                      \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                                              \
                      REGS(139), REGS(139), REGS(139), REGS(139))                                 \
    NAME(const float* dy, const float* w, float* ws, LinearLaunch p) {                            \
        linear_bwd_input<KIND>(dy, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.in_features}); \
    }
GEMM_VARIANTS(linear_bwd_input_partial, LINEAR_BWD_INPUT_PARTIAL)

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
