// Cross-entropy over logits fused with its gradient, in one block: each
// thread takes rows tid, tid + 256, ... (a numerically stable log-softmax per
// row, as cross_entropy/cpu.rs computes it), then the per-thread losses are
// summed by a fixed tree, so loss_sum gets the same bits on every run.

#include "reduce.cuh"

// Mirrors `ClassGeom` (usize fields) field by field.
struct ClassGeom {
    unsigned long long batch, classes;
};

// Bit 0 of the backend's fault word (backend/cuda/fault.rs): a label was not
// below the number of classes.
#define FAULT_LABEL 1u

extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    cross_entropy_fwd_bwd_f32(const float* logits, const unsigned char* labels, float* dlogits,
                              float* loss_sum, unsigned int* fault, ClassGeom g) {
    const int batch = (int)g.batch, classes = (int)g.classes;
    const float inv_batch = 1.0f / (float)batch;
    float total = 0.0f;
    for (int row = threadIdx.x; row < batch; row += REDUCE_THREADS) {
        const float* z = logits + (long long)row * classes;
        float* dz = dlogits + (long long)row * classes;
        const int label = labels[row];
        if (label >= classes) {
            atomicOr(fault, FAULT_LABEL);
            for (int c = 0; c < classes; ++c) dz[c] = 0.0f;
            continue;
        }
        float max = __int_as_float(0xff800000);  // -inf
        for (int c = 0; c < classes; ++c) max = fmaxf(max, z[c]);
        float sum_exp = 0.0f;
        for (int c = 0; c < classes; ++c) sum_exp += expf(z[c] - max);
        total += logf(sum_exp) - (z[label] - max);
        for (int c = 0; c < classes; ++c) {
            const float softmax = expf(z[c] - max) / sum_exp;
            dz[c] = (softmax - (c == label ? 1.0f : 0.0f)) * inv_batch;
        }
    }
    total = block_sum(total);
    if (threadIdx.x == 0) loss_sum[0] += total;
}
