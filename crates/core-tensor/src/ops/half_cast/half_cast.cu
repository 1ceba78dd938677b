// Casts between float32 and 16-bit floats over a range, one thread per
// element. Line for line half_cast/cpu.rs; integer operations, and for a
// binary16 subnormal one explicitly rounded float addition.

// `format`: 0 bfloat16, 1 binary16.

__device__ unsigned short to_bf16(float x) {
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
    return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ unsigned short to_fp16(float x) {
    const unsigned int bits = __float_as_uint(x);
    const unsigned int sign = (bits >> 16) & 0x8000u;
    const unsigned int abs = bits & 0x7fffffffu;
    unsigned int magnitude;
    if (abs >= 0x47800000u) {
        magnitude = abs > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (abs < 0x38800000u) {
        magnitude = __float_as_uint(__fadd_rn(__uint_as_float(abs), 0.5f)) - 0x3f000000u;
    } else {
        const unsigned int odd = (abs >> 13) & 1u;
        magnitude = (abs + 0xc8000fffu + odd) >> 13;
    }
    return (unsigned short)(sign | magnitude);
}

__device__ float from_bf16(unsigned short h) {
    return __uint_as_float((unsigned int)h << 16);
}

__device__ float from_fp16(unsigned short h) {
    const unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    const unsigned int exp = ((unsigned int)h >> 10) & 0x1fu;
    const unsigned int mant = (unsigned int)h & 0x3ffu;
    unsigned int magnitude;
    if (exp == 0u) {
        magnitude = __float_as_uint(__fmul_rn((float)mant, 1.0f / 16777216.0f));
    } else if (exp == 0x1fu) {
        magnitude = 0x7f800000u | (mant << 13);
    } else {
        magnitude = ((exp + 112u) << 23) | (mant << 13);
    }
    return __uint_as_float(sign | magnitude);
}

extern "C" __global__ void to_half_f32(const float* src, unsigned short* dst, unsigned int format,
                                       unsigned long long start, unsigned long long end) {
    const unsigned long long i =
        start + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= end) return;
    dst[i] = format == 0u ? to_bf16(src[i]) : to_fp16(src[i]);
}

extern "C" __global__ void from_half_f32(const unsigned short* src, float* dst, unsigned int format,
                                         unsigned long long start, unsigned long long end) {
    const unsigned long long i =
        start + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= end) return;
    dst[i] = format == 0u ? from_bf16(src[i]) : from_fp16(src[i]);
}
