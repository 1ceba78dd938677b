// The finiteness guard (finite/mod.rs), one thread per value. Integer
// atomics only: the smallest bad index wins whatever the order, so the
// result is deterministic.

extern "C" __global__ void guard_finite_f32(const float* values, const float* loss,
                                            unsigned int* guard, unsigned int step,
                                            unsigned long long n) {
    // Tripped at an earlier step: keep that one. (Tripped at this step by
    // another block of this launch: go on, to find the smallest index.)
    const unsigned int seen = guard[0];
    if (seen != 0u && seen != step) return;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !isfinite(values[i])) {
        atomicMin(&guard[1], (unsigned int)i);
        atomicCAS(&guard[0], 0u, step);
    }
    if (i == 0 && !isfinite(loss[0])) atomicCAS(&guard[0], 0u, step);
}
