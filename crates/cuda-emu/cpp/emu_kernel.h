// What a CUDA C++ kernel source needs to compile as ordinary C++ for the
// emulator: the execution-space keywords, the built-in index variables, the
// block barrier, and the device intrinsics the kernels use. Included before
// every kernel module (see src/lib.rs); fibers.cpp defines what is declared
// here.
//
// The emulator runs one block at a time, each of its threads a fiber on the
// launching host thread, so `__shared__` variables are plain statics (one
// block's threads share them, blocks never overlap) and atomics need no
// hardware atomics.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace cuda_emu {

struct dim3 {
    unsigned int x, y, z;
};

// The current fiber's coordinates; the scheduler sets them before it
// resumes a fiber.
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

// __syncthreads(): parks this fiber until every live thread of the block
// has reached a barrier.
void syncthreads();

}  // namespace cuda_emu

using cuda_emu::blockDim;
using cuda_emu::blockIdx;
using cuda_emu::gridDim;
using cuda_emu::threadIdx;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() cuda_emu::syncthreads()

struct alignas(16) float4 {
    float x, y, z, w;
};

inline float __int_as_float(int bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// The _rn intrinsics: one correctly rounded operation each. The emulator is
// built with -ffp-contract=off, so the compiler fuses nothing either.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }

// Atomics: no other thread runs while a fiber does, so a read-modify-write
// is atomic as written. Each returns the old value, as CUDA's do.
inline unsigned int atomicOr(unsigned int* address, unsigned int value) {
    const unsigned int old = *address;
    *address = old | value;
    return old;
}
inline unsigned int atomicMin(unsigned int* address, unsigned int value) {
    const unsigned int old = *address;
    *address = value < old ? value : old;
    return old;
}
inline unsigned int atomicCAS(unsigned int* address, unsigned int compare, unsigned int value) {
    const unsigned int old = *address;
    if (old == compare) *address = value;
    return old;
}

// A kernel entry point called with the driver's `kernelParams`: one pointer
// per argument, each to the argument's value.
namespace cuda_emu {

using Entry = void (*)(void** params);

template <class... A, std::size_t... I>
inline void call_unpacked(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(params[I])...);
}

template <class... A>
inline void call_unpacked(void (*kernel)(A...), void** params) {
    call_unpacked(kernel, params, std::index_sequence_for<A...>{});
}

// `entry<&kernel>` is the kernel behind the driver's calling convention.
template <auto Kernel>
void entry(void** params) {
    call_unpacked(Kernel, params);
}

struct Kernel {
    const char* name;
    Entry entry;
};

// Adds a module's kernels to the table cuModuleGetFunction looks names up in.
void register_kernels(const Kernel* kernels, std::size_t count);

struct Registrar {
    Registrar(const Kernel* kernels, std::size_t count) { register_kernels(kernels, count); }
};

}  // namespace cuda_emu
