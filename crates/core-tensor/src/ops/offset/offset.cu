// Per-sample offsets added to an output, one thread per sample: offset/cpu.rs
// line for line, each addition rounded on its own, so the GPU's bits equal
// the CPU's.

// Mirrors `OffsetGeom` (usize fields) field by field.
struct OffsetGeom {
    unsigned long long batch, k;
};

extern "C" __global__ void offset_fwd_f32(const float* offsets, float* y, OffsetGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.batch) return;
    float acc = y[i];
    for (unsigned long long j = 0; j < g.k; ++j) acc = __fadd_rn(acc, offsets[i * g.k + j]);
    y[i] = acc;
}

extern "C" __global__ void offset_bwd_f32(const float* dy, float* d_offsets, OffsetGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.batch) return;
    for (unsigned long long j = 0; j < g.k; ++j) d_offsets[i * g.k + j] = dy[i];
}
