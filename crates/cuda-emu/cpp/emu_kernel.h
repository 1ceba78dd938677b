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
#include <deque>
#include <type_traits>
#include <utility>
#include <vector>

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
#define __maxnreg__(n)
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

inline float __uint_as_float(unsigned int bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline unsigned int __float_as_uint(float f) {
    unsigned int bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

// ---- NaN results ----
//
// A GPU's float32 arithmetic yields one NaN, 0x7fffffff, whatever NaN went
// in or was made (an H100 wrote it where the CPU kept 0x7fc00000:
// docs/gpu.md); an x86 core keeps the first NaN operand's payload, or makes
// 0xffc00000 for an invalid operation such as 0*inf. A copy, a select or a
// comparison keeps a NaN's bits on both. `gpu_result` turns x86's result of
// one arithmetic operation into the GPU's. The emulator applies it where it
// sees the operation: the _rn intrinsics, the math functions below and the
// tensor cores' mma. A kernel's `a * b` on floats is x86 arithmetic, which
// it cannot intercept (that would take a wrapper type for `float`): such
// an operation passes a canonical NaN on unchanged, but keeps any other
// NaN's payload and makes 0xffc00000 from 0*inf, where the GPU makes
// 0x7fffffff. Rewriting the NaNs of a kernel's outputs after its launch
// instead (the kernel table says which parameters are outputs) would model
// the GPU worse: it cannot tell a NaN the kernel computed from one it
// copied, whose bits a GPU keeps (the max-pool's copied NaN stayed
// 0x7fc00000 on the H100), nor an element the kernel wrote from one it left
// (rows_scatter; fresh memory's 0xff bytes). The parity suite compares NaNs
// as NaNs (its nan_rule), so it does not depend on which NaN comes out.
inline float gpu_result(float r) { return r != r ? __int_as_float(0x7fffffff) : r; }

// The _rn intrinsics: one correctly rounded operation each. The emulator is
// built with -ffp-contract=off, so the compiler fuses nothing either.
inline float __fadd_rn(float a, float b) { return gpu_result(a + b); }
inline float __fsub_rn(float a, float b) { return gpu_result(a - b); }
inline float __fmul_rn(float a, float b) { return gpu_result(a * b); }
inline float __fdiv_rn(float a, float b) { return gpu_result(a / b); }
inline float __fsqrt_rn(float a) { return gpu_result(sqrtf(a)); }

// The math functions the kernels call, with the GPU's NaN. Each module's
// namespace takes them by CUDA_EMU_DEVICE_MATH (src/lib.rs), so they hide
// libm's: a function a kernel starts to call goes here too, or it stays
// libm's. fmaxf is max.f32: the other operand when one is NaN, as C's, and
// the GPU's NaN when both are.
namespace cuda_emu::device {
inline float expf(float x) { return gpu_result(::expf(x)); }
inline float logf(float x) { return gpu_result(::logf(x)); }
inline float fmaf(float a, float b, float c) { return gpu_result(::fmaf(a, b, c)); }
inline float fmaxf(float a, float b) { return gpu_result(::fmaxf(a, b)); }
}  // namespace cuda_emu::device

#define CUDA_EMU_DEVICE_MATH           \
    using cuda_emu::device::expf;      \
    using cuda_emu::device::logf;      \
    using cuda_emu::device::fmaf;      \
    using cuda_emu::device::fmaxf;

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

// ---- Tensor cores (mma.cuh's TF32 products) ----
//
// CUDA_EMU tells mma.cuh, gemm_bf16.cuh and cp_async.cuh to use these
// instead of their inline PTX.
#define CUDA_EMU 1

// cvt.rna.tf32.f32: to the nearest TF32 (10 stored mantissa bits), ties away
// from zero; infinities and NaNs pass through.
inline float tf32_round(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

// The fragments of a warp-wide instruction on fibers: every lane publishes
// its own, the block meets (every warp of a tensor-core tile issues the same
// products, so the block barrier stands in for the warp's), and then each
// lane reads its warp's. The fragments alternate between two buffers, one
// per call's parity, so that no second barrier is needed before they are
// overwritten: a lane writes call n + 2's fragments into call n's buffer
// only after every lane has met at call n + 1, having read call n's. All
// lanes of a warp make the same calls (`.aligned`), so they agree on the
// parity; blocks run one at a time, so the buffers need no block index.
template <class T>
struct WarpFragments {
    // Per lane: its A fragment's four registers, then B's two.
    T frag[2][1024][6];
    unsigned calls[1024];
    // Publishes this lane's fragments, meets the block, and returns the
    // buffer in which the warp's lanes published theirs.
    const T (*exchange(unsigned tid, const T (&a)[4], const T (&b)[2]))[6] {
        T(*buf)[6] = frag[calls[tid]++ % 2];
        for (int r = 0; r < 4; ++r) buf[tid][r] = a[r];
        for (int r = 0; r < 2; ++r) buf[tid][4 + r] = b[r];
        cuda_emu::syncthreads();
        return buf;
    }
};

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for the calling warp:
// d += a·b, with the fragment layouts mma.cuh lists, exchanged through
// `WarpFragments`. Like the hardware, it ignores the 13 low mantissa bits of
// every input; products are exact, and summed in k order (the hardware's
// order is unspecified); a NaN result is the GPU's NaN, as from the CUDA
// cores' arithmetic (assumed: no GPU has shown the tensor cores' NaN).
inline void mma_m16n8k8_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    static WarpFragments<float> frags;
    const unsigned tid =
        threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = tid % 32, warp = tid - lane;
    const auto tf32 = [](float x) {
        uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        bits &= 0xffffe000u;
        std::memcpy(&x, &bits, sizeof x);
        return x;
    };
    const float ta[4] = {tf32(a[0]), tf32(a[1]), tf32(a[2]), tf32(a[3])};
    const float tb[2] = {tf32(b[0]), tf32(b[1])};
    const float(*frag)[6] = frags.exchange(tid, ta, tb);
    const unsigned g = lane / 4, t = lane % 4;
    for (unsigned r = 0; r < 4; ++r) {
        const unsigned row = g + 8 * (r / 2), col = 2 * t + r % 2;
        float sum = 0.0f;
        for (unsigned k = 0; k < 8; ++k) {
            const float x = frag[warp + (row % 8) * 4 + k % 4][row / 8 + 2 * (k / 4)];
            const float y = frag[warp + col * 4 + k % 4][4 + k / 4];
            sum += x * y;
        }
        d[r] = gpu_result(d[r] + sum);
    }
}

// ---- Tensor cores (gemm_bf16.cuh's bf16 products) ----

// cvt.rn.bf16.f32: the upper 16 bits of x rounded to nearest, ties to even;
// a NaN becomes the canonical 0x7fff, as on the GPU (and in cuda_bf16.h's
// host conversion); what rounds past the largest bf16 becomes infinity.
inline unsigned short bf16_bits(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (unsigned short)(bits >> 16);
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling warp:
// d += a·b, two bf16 per register in the layouts gemm_bf16.cuh lists,
// exchanged through `WarpFragments`. Products of two bf16 are exact in float32;
// they are summed in k order (the hardware's order is unspecified), and a
// NaN result is the GPU's NaN.
inline void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    static WarpFragments<unsigned> frags;
    const unsigned tid =
        threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = tid % 32, warp = tid - lane;
    const unsigned(*frag)[6] = frags.exchange(tid, a, b);
    // Element k of a register pair: the lower half holds the even k.
    const auto half = [](unsigned word, unsigned k) {
        return __uint_as_float(k % 2 ? word & 0xffff0000u : word << 16);
    };
    const unsigned g = lane / 4, t = lane % 4;
    for (unsigned r = 0; r < 4; ++r) {
        const unsigned row = g + 8 * (r / 2), col = 2 * t + r % 2;
        float sum = 0.0f;
        for (unsigned k = 0; k < 16; ++k) {
            const unsigned lane_k = k % 8 / 2;
            const float x = half(frag[warp + (row % 8) * 4 + lane_k][row / 8 + 2 * (k / 8)], k);
            const float y = half(frag[warp + col * 4 + lane_k][4 + k / 8], k);
            sum += x * y;
        }
        d[r] = gpu_result(d[r] + sum);
    }
}

// ---- cp.async (cp_async.cuh's staging of the shared SGEMM tile) ----
//
// Each thread's copies are recorded, gathered into its commit groups, and
// performed only when `cp_async_wait<N>` leaves at most N newer groups
// pending: the latest point the PTX allows, so a kernel that reads the
// shared destination before its wait (and barrier) reads what was there
// before, as a GPU may. The source is read then too, so a copy from memory
// past a buffer faults as any read does. A copy whose element is not
// `there` zero-fills (src-size 0) and reads nothing. Copies are bit copies:
// a NaN keeps its payload.
struct CpAsyncCopy {
    float* dst;
    const float* src;  // null: zero fill
};

struct CpAsyncThread {
    std::vector<CpAsyncCopy> open;  // issued, not yet committed
    std::deque<std::vector<CpAsyncCopy>> committed;
};

inline CpAsyncThread& cp_async_thread() {
    static CpAsyncThread threads[1024];
    return threads[threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)];
}

inline void cp_async_f32(float* dst, const float* src, bool there) {
    cp_async_thread().open.push_back(CpAsyncCopy{dst, there ? src : nullptr});
}

inline void cp_async_commit() {
    CpAsyncThread& t = cp_async_thread();
    t.committed.push_back(std::move(t.open));
    t.open.clear();
}

template <int N>
inline void cp_async_wait() {
    CpAsyncThread& t = cp_async_thread();
    while (t.committed.size() > (std::size_t)N) {
        for (const CpAsyncCopy& c : t.committed.front()) {
            const float zero = 0.0f;
            std::memcpy(c.dst, c.src ? c.src : &zero, sizeof(float));
        }
        t.committed.pop_front();
    }
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
