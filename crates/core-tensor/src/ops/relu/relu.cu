// ReLU in place, one thread per element. The comparisons are the CPU
// kernel's, so NaN passes through the forward pass and the backward pass
// masks by the forward output (y > 0).

extern "C" __global__ void relu_fwd_f32(float* x, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = v < 0.0f ? 0.0f : v;
}

extern "C" __global__ void relu_bwd_f32(const float* y, float* dy, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
