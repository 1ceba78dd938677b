// Mean squared error fused with its gradient, in one block: each thread
// takes rows tid, tid + 256, ... (as mse/cpu.rs computes them), then the
// per-thread sums are added by a fixed tree, so loss_sum gets the same bits
// on every run. The gradient is element-wise and equals the CPU's bit for bit.

#include "reduce.cuh"

// Mirrors `MseGeom` (usize fields) field by field.
struct MseGeom {
    unsigned long long batch, features;
};

// This thread's share of the loss sum; writes dy when it is not null.
__device__ float mse_rows(const float* y, const float* target, float* dy, MseGeom g) {
    const int batch = (int)g.batch, features = (int)g.features;
    const float scale = 2.0f / (float)(batch * features);
    const float inv_features = 1.0f / (float)features;
    float total = 0.0f;
    for (int row = threadIdx.x; row < batch; row += REDUCE_THREADS) {
        float sq = 0.0f;
        for (int c = 0; c < features; ++c) {
            const long long i = (long long)row * features + c;
            const float d = __fsub_rn(y[i], target[i]);
            sq = __fadd_rn(sq, __fmul_rn(d, d));
            if (dy) dy[i] = __fmul_rn(d, scale);
        }
        total = __fadd_rn(total, __fmul_rn(sq, inv_features));
    }
    return block_sum(total);
}

extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    mse_fwd_bwd_f32(const float* y, const float* target, float* dy, float* loss_sum, MseGeom g) {
    const float total = mse_rows(y, target, dy, g);
    if (threadIdx.x == 0) loss_sum[0] += total;
}

extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    mse_fwd_f32(const float* y, const float* target, float* loss_sum, MseGeom g) {
    const float total = mse_rows(y, target, nullptr, g);
    if (threadIdx.x == 0) loss_sum[0] += total;
}
