// A fixed-order block reduction, pasted by build.rs in place of
// `#include "reduce.cuh"`. The tree has the same shape on every launch, so a
// float sum has the same bits run to run (no atomics whose order varies).

#define REDUCE_THREADS 256

// The sum of `v` over the block's REDUCE_THREADS threads, returned to every
// thread. Every thread of the block must call it, and blockDim.x must be
// REDUCE_THREADS.
template <class T>
__device__ T block_sum(T v) {
    __shared__ T part[REDUCE_THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    return part[0];
}
