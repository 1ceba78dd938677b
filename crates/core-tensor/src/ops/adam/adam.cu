// The fused Adam steps, one thread per element. Line for line adam/cpu.rs
// `update` and `update_lazy`, with every operation an explicitly rounded
// intrinsic: no fused multiply-add may contract two roundings into one, so
// the GPU result equals the CPU result bit for bit.

// Mirrors `AdamScalars` (f32 fields) field by field.
struct AdamScalars {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

// Mirrors `SparseAdamScalars` (f32 fields) field by field.
struct SparseAdamScalars {
    float one_minus_beta1, one_minus_beta2, step_size, eps;
};

// Mirrors `RowsGeom` (usize fields) field by field.
struct RowsGeom {
    unsigned long long count, dim, rows, offset;
};

// Bit 3 of the backend's fault word (backend/cuda/fault.rs), as rows.cu:
// an id was not below the table's row count, or not above the one before it.
#define FAULT_ROWS 8u

// Elements `start..end`. `guard[0] != 0`: a non-finite loss or gradient was
// seen (finite.cu); the step is skipped, so the parameters stay those
// before it.
extern "C" __global__ void adam_step_f32(float* params, const float* grads, float* m, float* v,
                                         const unsigned int* guard, AdamScalars s,
                                         unsigned long long start, unsigned long long end) {
    const unsigned long long i = start + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= end || guard[0] != 0u) return;
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

// SparseAdam on the rows `ids[0..count]` names, one thread per value.
extern "C" __global__ void sparse_adam_step_f32(float* params, const float* grads, float* m,
                                                float* v, const unsigned int* ids,
                                                const unsigned int* guard, unsigned int* fault,
                                                SparseAdamScalars s, RowsGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.count * g.dim || guard[0] != 0u) return;
    const unsigned long long b = i / g.dim, d = i - b * g.dim;
    if (ids[b] >= g.rows || (b > 0 && ids[b - 1] >= ids[b])) {
        if (d == 0) atomicOr(fault, FAULT_ROWS);
        return;
    }
    const unsigned long long at = g.offset + ids[b] * g.dim + d;
    const float gr = grads[at];
    // m += (g - m)·(1 - β1)
    const float mi = __fadd_rn(m[at], __fmul_rn(__fsub_rn(gr, m[at]), s.one_minus_beta1));
    // v += (g·g - v)·(1 - β2)
    const float vi = __fadd_rn(v[at], __fmul_rn(__fsub_rn(__fmul_rn(gr, gr), v[at]), s.one_minus_beta2));
    // denom = √v + ε
    const float denom = __fadd_rn(__fsqrt_rn(vi), s.eps);
    // p += -step_size · (m / denom)
    params[at] = __fadd_rn(params[at], __fmul_rn(-s.step_size, __fdiv_rn(mi, denom)));
    m[at] = mi;
    v[at] = vi;
}
