// Batch assembly from the resident u8 dataset, `lanes` threads per sample:
// x[b, j] = images[indices[first + b], j] / 255 (correctly rounded, as the
// CPU's f32 division), and lane 0 copies the label. `x` or `y` may be null
// (left out by the caller: a pipeline stage gathers only what it reads);
// without `x` there is one lane per sample.

// Mirrors `GatherArgs` in ops/gather/cuda.rs.
struct GatherArgs {
    unsigned long long batch, pixels, samples, first, lanes;
};

// Bit 1 of the backend's fault word (backend/cuda/fault.rs): a sample index
// was not below the number of samples.
#define FAULT_INDEX 2u

extern "C" __global__ void gather_batch_u8_f32(const unsigned char* images,
                                               const unsigned char* labels,
                                               const unsigned int* indices, float* x,
                                               unsigned char* y, unsigned int* fault,
                                               GatherArgs a) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.batch * a.lanes) return;
    const unsigned long long b = i / a.lanes, j = i - b * a.lanes;
    const bool pixel = x != nullptr && j < a.pixels;
    const unsigned long long sample = indices[a.first + b];
    if (sample >= a.samples) {
        if (j == 0) atomicOr(fault, FAULT_INDEX);
        if (pixel) x[b * a.pixels + j] = 0.0f;
        return;
    }
    if (pixel) x[b * a.pixels + j] = __fdiv_rn((float)images[sample * a.pixels + j], 255.0f);
    if (y != nullptr && j == 0) y[b] = labels[sample];
}
