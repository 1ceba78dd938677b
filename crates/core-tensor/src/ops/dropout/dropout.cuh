// Inverted dropout as a kernel epilogue (ops/dropout/mod.rs): build.rs
// pastes this file in place of `#include "dropout/dropout.cuh"`. The keep decision is
// a line-for-line copy of rng.rs (`mix`, `uniform`) and `Dropout::keeps`, so
// the mask equals the CPU mask bit for bit: change both or neither. The
// scale 1/(1-p) arrives computed by the host, as the CPU computes it.

// Mirrors `DropoutArgs` in ops/dropout/cuda.rs.
struct DropoutArgs {
    unsigned long long seed;
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

// `Dropout::apply`: v at element i after the mask, scaled if kept, else
// zero; forward and backward are the same map. At p = 0 every value passes
// untouched (the mask would keep all and scale by 1), without the hash.
// The scaling is `__fmul_rn`, one rounding as the CPU's `v * scale`, which
// NVRTC may then not fuse into a caller's addition, and the one form of a
// multiply cuda-emu sees: a NaN it scales is CUDA's 0x7fffffff there too.
__device__ __forceinline__ float dropout_apply(const DropoutArgs& d, unsigned long long i,
                                               float v) {
    if (d.p == 0.0f) return v;
    return uniform(d.seed, i) >= d.p ? __fmul_rn(v, d.scale) : 0.0f;
}
