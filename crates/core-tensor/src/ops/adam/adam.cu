// The fused Adam step over the flat parameter buffer, one thread per element.
// Line for line adam/cpu.rs `update`, with every operation an explicitly
// rounded intrinsic: no fused multiply-add may contract two roundings into
// one, so the GPU result equals the CPU result bit for bit.

// Mirrors `AdamScalars` (f32 fields) field by field.
struct AdamScalars {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

// `guard[0] != 0`: a non-finite loss or gradient was seen (finite.cu); the
// step is skipped, so the parameters stay those before it.
extern "C" __global__ void adam_step_f32(float* params, const float* grads, float* m, float* v,
                                         const unsigned int* guard, AdamScalars s,
                                         unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || guard[0] != 0u) return;
    const float g = grads[i];
    // m += (1 - β1)·(g - m)
    const float mi = __fadd_rn(m[i], __fmul_rn(s.one_minus_beta1, __fsub_rn(g, m[i])));
    // v = v·β2 + (1 - β2)·g·g
    const float vi = __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    // denom = √v / √(1 - β2ᵗ) + ε
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias_correction2_sqrt), s.eps);
    // p += -step_size · (m / denom)
    params[i] = __fadd_rn(params[i], __fmul_rn(-s.step_size, __fdiv_rn(mi, denom)));
    m[i] = mi;
    v[i] = vi;
}
