// Gradient accumulation over a range of the flat gradient buffer, one
// thread per element. Line for line accumulate/cpu.rs `sum`, with
// explicitly rounded intrinsics: no fused multiply-add may contract the two
// roundings into one, so the GPU result equals the CPU result bit for bit.

// `into_grads`: the sum goes into `grads` (the step's last micro-batch),
// else into `acc`.
extern "C" __global__ void accumulate_f32(float* grads, float* acc, float weight,
                                          unsigned int into_grads, unsigned long long start,
                                          unsigned long long end) {
    const unsigned long long i =
        start + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= end) return;
    // acc + w·g
    const float sum = __fadd_rn(acc[i], __fmul_rn(weight, grads[i]));
    if (into_grads != 0u) {
        grads[i] = sum;
    } else {
        acc[i] = sum;
    }
}
