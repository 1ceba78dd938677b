// Linear layer y = x·Wᵀ + b with PyTorch's [out, in] weight: three GEMMs on
// the shared tile (sgemm.cuh) and a column sum for the bias gradient.
//
// Each GEMM has whole-tile entry points that store the result (`<name>_f32`,
// `<name>_tf32`, `<name>_bf16`, ...), split-K ones that compute one K split
// into the workspace (`<name>_partial_f32`, ...), and `<name>_reduce_f32`,
// which sums the splits in order and stores. The host picks direct or split
// from the shape alone (backend/cuda/gemm.rs).

#include "sgemm.cuh"
#include "linear.cuh"

// Each product is one device function templated on its kind, behind four
// entry points, `_f32`, `_tf32`, `_bf16` and `_f32w` (see sgemm.cuh).

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_f32(const float* x, const float* w, const float* bias, float* y, LinearLaunch p) {
    linear_fwd<GEMM_F32>(x, w, p, BiasStore{y, bias, (int)p.g.out_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_tf32(const float* x, const float* w, const float* bias, float* y, LinearLaunch p) {
    linear_fwd<GEMM_TF32>(x, w, p, BiasStore{y, bias, (int)p.g.out_features});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_bf16(const float* x, const float* w, const float* bias, float* y, LinearLaunch p) {
    linear_fwd<GEMM_BF16>(x, w, p, BiasStore{y, bias, (int)p.g.out_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_f32w(const float* x, const float* w, const float* bias, float* y, LinearLaunch p) {
    linear_fwd<GEMM_F32_WIDE>(x, w, p, BiasStore{y, bias, (int)p.g.out_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_partial_f32(const float* x, const float* w, float* ws, LinearLaunch p) {
    linear_fwd<GEMM_F32>(x, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.out_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_partial_tf32(const float* x, const float* w, float* ws, LinearLaunch p) {
    linear_fwd<GEMM_TF32>(x, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.out_features});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_partial_bf16(const float* x, const float* w, float* ws, LinearLaunch p) {
    linear_fwd<GEMM_BF16>(x, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.out_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_fwd_partial_f32w(const float* x, const float* w, float* ws, LinearLaunch p) {
    linear_fwd<GEMM_F32_WIDE>(x, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.out_features});
}

extern "C" __global__ void linear_fwd_reduce_f32(const float* ws, const float* bias, float* y,
                                                 LinearLaunch p) {
    const int O = (int)p.g.out_features;
    gemm_reduce(ws, (int)p.g.batch, O, (int)p.t.splits, BiasStore{y, bias, O});
}

// Weight gradient: dW[o, i] = Σ_b dy[b, o] · x[b, i]; M = out, N = in, K = batch.
template <int KIND, class S>
__device__ __forceinline__ void linear_bwd_weight(const float* x, const float* dy,
                                                  const LinearLaunch& p, const S& store) {
    const int B = (int)p.g.batch, I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<KIND>(ColsByK{dy, O}, ColsByK{x, I}, O, I, B, p.t, store);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_f32(const float* x, const float* dy, float* dw, LinearLaunch p) {
    linear_bwd_weight<GEMM_F32>(x, dy, p, PlainStore{dw, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_tf32(const float* x, const float* dy, float* dw, LinearLaunch p) {
    linear_bwd_weight<GEMM_TF32>(x, dy, p, PlainStore{dw, (int)p.g.in_features});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_bf16(const float* x, const float* dy, float* dw, LinearLaunch p) {
    linear_bwd_weight<GEMM_BF16>(x, dy, p, PlainStore{dw, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_f32w(const float* x, const float* dy, float* dw, LinearLaunch p) {
    linear_bwd_weight<GEMM_F32_WIDE>(x, dy, p, PlainStore{dw, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_partial_f32(const float* x, const float* dy, float* ws, LinearLaunch p) {
    linear_bwd_weight<GEMM_F32>(x, dy, p,
                             PartialStore{ws, (int)p.g.out_features, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_partial_tf32(const float* x, const float* dy, float* ws, LinearLaunch p) {
    linear_bwd_weight<GEMM_TF32>(x, dy, p,
                            PartialStore{ws, (int)p.g.out_features, (int)p.g.in_features});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_partial_bf16(const float* x, const float* dy, float* ws, LinearLaunch p) {
    linear_bwd_weight<GEMM_BF16>(x, dy, p,
                            PartialStore{ws, (int)p.g.out_features, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_weight_partial_f32w(const float* x, const float* dy, float* ws, LinearLaunch p) {
    linear_bwd_weight<GEMM_F32_WIDE>(x, dy, p,
                             PartialStore{ws, (int)p.g.out_features, (int)p.g.in_features});
}

extern "C" __global__ void linear_bwd_weight_reduce_f32(const float* ws, float* dw, LinearLaunch p) {
    const int I = (int)p.g.in_features;
    gemm_reduce(ws, (int)p.g.out_features, I, (int)p.t.splits, PlainStore{dw, I});
}

// Input gradient: dx[b, i] = Σ_o dy[b, o] · W[o, i]; M = batch, N = in, K = out.
template <int KIND, class S>
__device__ __forceinline__ void linear_bwd_input(const float* dy, const float* w,
                                                 const LinearLaunch& p, const S& store) {
    const int B = (int)p.g.batch, I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<KIND>(RowsByK{dy, O}, ColsByK{w, I}, B, I, O, p.t, store);
}

// Four blocks per SM asked for: holding both stagings, ptxas gave this
// kernel 79 (linear: 73) registers, three blocks per SM, where the register
// staging alone takes 64; at 64 it spills nothing (nvrtc_compile checks).
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 4)
    linear_bwd_input_f32(const float* dy, const float* w, float* dx, LinearLaunch p) {
    linear_bwd_input<GEMM_F32>(dy, w, p, PlainStore{dx, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_tf32(const float* dy, const float* w, float* dx, LinearLaunch p) {
    linear_bwd_input<GEMM_TF32>(dy, w, p, PlainStore{dx, (int)p.g.in_features});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_bf16(const float* dy, const float* w, float* dx, LinearLaunch p) {
    linear_bwd_input<GEMM_BF16>(dy, w, p, PlainStore{dx, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_f32w(const float* dy, const float* w, float* dx, LinearLaunch p) {
    linear_bwd_input<GEMM_F32_WIDE>(dy, w, p, PlainStore{dx, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_partial_f32(const float* dy, const float* w, float* ws, LinearLaunch p) {
    linear_bwd_input<GEMM_F32>(dy, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_partial_tf32(const float* dy, const float* w, float* ws, LinearLaunch p) {
    linear_bwd_input<GEMM_TF32>(dy, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.in_features});
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_partial_bf16(const float* dy, const float* w, float* ws, LinearLaunch p) {
    linear_bwd_input<GEMM_BF16>(dy, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.in_features});
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    linear_bwd_input_partial_f32w(const float* dy, const float* w, float* ws, LinearLaunch p) {
    linear_bwd_input<GEMM_F32_WIDE>(dy, w, p, PartialStore{ws, (int)p.g.batch, (int)p.g.in_features});
}

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
