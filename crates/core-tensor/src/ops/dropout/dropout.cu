// Inverted dropout in place, one thread per element. The keep decision is a
// line-for-line copy of rng.rs (`mix`, `uniform`) and dropout/mod.rs
// (`keeps`), so the mask equals the CPU mask bit for bit: change both or
// neither. The scale 1/(1-p) arrives computed by the host, as the CPU uses it.

// Mirrors `DropoutArgs` in backend/cuda/launch.rs.
struct DropoutArgs {
    unsigned long long n, seed;
    float p, scale;
};

// rng::mix: the splitmix64 finalizer of seed + (index + 1)·φ.
__device__ __forceinline__ unsigned long long mix(unsigned long long seed,
                                                  unsigned long long index) {
    unsigned long long z = seed + (index + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// rng::uniform: the top 24 bits as a float in [0, 1), exact.
__device__ __forceinline__ float uniform(unsigned long long seed, unsigned long long index) {
    return (float)(mix(seed, index) >> 40) * (1.0f / 16777216.0f);
}

// Forward and backward are the same map: scale the kept, zero the rest.
extern "C" __global__ void dropout_fwd_f32(float* x, DropoutArgs a) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    x[i] = uniform(a.seed, i) >= a.p ? x[i] * a.scale : 0.0f;
}

extern "C" __global__ void dropout_bwd_f32(float* dy, DropoutArgs a) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    dy[i] = uniform(a.seed, i) >= a.p ? dy[i] * a.scale : 0.0f;
}
