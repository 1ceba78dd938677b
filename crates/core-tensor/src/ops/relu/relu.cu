// ReLU in place, then inverted dropout (`DropoutArgs` with p = 0 for none),
// one thread per element. The comparisons are the CPU kernel's, so NaN passes
// through the forward pass and the backward pass masks by the forward output
// (y > 0; a dropped unit's y is 0).

#include "dropout/dropout.cuh"

extern "C" __global__ void relu_fwd_f32(float* x, unsigned long long n, DropoutArgs d) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = dropout_apply(d, i, v < 0.0f ? 0.0f : v);
}

extern "C" __global__ void relu_bwd_f32(const float* y, float* dy, unsigned long long n,
                                        DropoutArgs d) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dy[i] = y[i] > 0.0f ? dropout_apply(d, i, dy[i]) : 0.0f;
}
