// Embedding rows inside the flat parameter buffer. Forward: one thread per
// output value. Backward: the table's gradient is zeroed, then one thread
// per column adds the samples' gradients in batch order, as
// embedding/cpu.rs does, so repeated ids sum in a fixed order (no atomics).

// Mirrors `EmbeddingGeom` (usize fields) field by field.
struct EmbeddingGeom {
    unsigned long long batch, dim, rows, offset;
};

// Bit 2 of the backend's fault word (backend/cuda/fault.rs): an id was not
// below the table's row count.
#define FAULT_EMBEDDING 4u

extern "C" __global__ void embedding_fwd_f32(const unsigned int* ids, const float* params,
                                             float* out, unsigned int* fault, EmbeddingGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.batch * g.dim) return;
    const unsigned long long b = i / g.dim, d = i - b * g.dim;
    const unsigned long long id = ids[b];
    if (id >= g.rows) {
        if (d == 0) atomicOr(fault, FAULT_EMBEDDING);
        out[i] = 0.0f;
        return;
    }
    out[i] = params[g.offset + id * g.dim + d];
}

extern "C" __global__ void embedding_bwd_zero_f32(float* grads, EmbeddingGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < g.rows * g.dim) grads[g.offset + i] = 0.0f;
}

extern "C" __global__ void embedding_bwd_f32(const unsigned int* ids, const float* dout,
                                             float* grads, unsigned int* fault,
                                             EmbeddingGeom g) {
    const unsigned long long d = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= g.dim) return;
    for (unsigned long long b = 0; b < g.batch; ++b) {
        const unsigned long long id = ids[b];
        if (id >= g.rows) {
            if (d == 0) atomicOr(fault, FAULT_EMBEDDING);
            continue;
        }
        float* t = grads + g.offset + id * g.dim + d;
        *t = __fadd_rn(*t, dout[b * g.dim + d]);
    }
}
