// The SGD step over the flat parameter buffer, one thread per element. Line
// for line sgd/cpu.rs `update`, with explicitly rounded intrinsics: no fused
// multiply-add may contract the two roundings into one, so the GPU result
// equals the CPU result bit for bit.

// `guard[0] != 0`: a non-finite loss or gradient was seen (finite.cu); the
// step is skipped, so the parameters stay those before it.
extern "C" __global__ void sgd_step_f32(float* params, const float* grads,
                                        const unsigned int* guard, float minus_lr,
                                        unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || guard[0] != 0u) return;
    // p += (-lr)·g
    params[i] = __fadd_rn(params[i], __fmul_rn(minus_lr, grads[i]));
}
