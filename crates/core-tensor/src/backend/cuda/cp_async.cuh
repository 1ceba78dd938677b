// cp.async (compute capability 8.0 and later): a 4-byte copy from global
// to shared memory that no register holds, for the cp.async staging of the
// shared SGEMM tile (sgemm.cuh's `gemm_tile`). sgemm.cuh pastes this in.
//
// A thread's copies are gathered in commit groups; `cp_async_wait<N>()`
// returns once at most the N newest of its committed groups are pending.
// A copy is visible to the other threads of the block only after the
// issuing thread's wait and a barrier. cuda-emu defines CUDA_EMU and
// supplies these in C++, performing each group's copies at the latest
// point the PTX allows (the wait), so a read before it sees stale data.
#ifndef CUDA_EMU
// Copies *src to *dst, or where not `there` zeros *dst (src-size 0: no byte
// is read, the 4 bytes are zero-filled; src is still a valid global
// address). No memory clobber: the copy lands at the wait, and the block
// reads it after a barrier, which orders the compiler's accesses as well.
__device__ __forceinline__ void cp_async_f32(float* dst, const float* src, bool there) {
#if __CUDA_ARCH__ >= 800
    const unsigned to = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(to), "l"(src),
                 "r"(there ? 4 : 0));
#else
    __trap();  // never runs: the host refuses cp.async below 8.0
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
#endif
