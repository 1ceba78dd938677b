// Device memory over host memory: each allocation is an mmap flush against a
// PROT_NONE page, so a kernel that reads or writes past the end of a buffer
// faults (fibers.cpp names the kernel, block and thread); copies and memsets
// check that the device range lies inside one allocation.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "emu.h"

namespace cuda_emu {

namespace {

// A device allocation: `size` bytes at the key, inside the mapping
// [base, base + mapped) whose last page is the PROT_NONE guard.
struct Allocation {
    char* base;
    std::size_t mapped;
    std::size_t size;
};
std::mutex memory_mutex;
std::map<CUdeviceptr, Allocation> allocations;
// The bytes the live allocations asked for, on all GPUs together.
std::size_t allocated_bytes = 0;

// The memory each GPU reports: $CUDA_EMU_MEMORY_MIB, else 80 GiB.
std::size_t total_bytes() {
    static const std::size_t total = [] {
        const char* text = std::getenv("CUDA_EMU_MEMORY_MIB");
        const unsigned long long mib = text ? std::strtoull(text, nullptr, 10) : 0;
        return static_cast<std::size_t>(mib > 0 ? mib : 80 * 1024) << 20;
    }();
    return total;
}

// Says why a call is refused: a real driver returns the bare code, the
// emulator also names the call and the cause on stderr.
CUresult refuse(CUresult code, const char* call, const char* why, unsigned long long a = 0,
                unsigned long long b = 0) {
    std::fprintf(stderr, "cuda-emu: %s: ", call);
    std::fprintf(stderr, why, a, b);
    std::fputc('\n', stderr);
    return code;
}

std::size_t page_size() {
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return page;
}

CUresult outside(const char* call, CUdeviceptr ptr, std::size_t bytes) {
    return refuse(CUDA_ERROR_INVALID_VALUE, call,
                  "device range %#llx + %llu bytes is not inside one allocation", ptr, bytes);
}

}  // namespace

CUresult allocate(CUdeviceptr* out, std::size_t size) {
    if (out == nullptr || size == 0) {
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "%llu bytes", size);
    }
    {
        // The memory a GPU reports ends: past it, the driver's error (what
        // the process holds counts against every GPU, as in cuMemGetInfo).
        std::lock_guard<std::mutex> lock(memory_mutex);
        if (size > total_bytes() - std::min(allocated_bytes, total_bytes())) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        allocated_bytes += size;
    }
    const std::size_t page = page_size();
    const std::size_t data = (size + page - 1) / page * page;
    void* base = mmap(nullptr, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED) {
        std::lock_guard<std::mutex> lock(memory_mutex);
        allocated_bytes -= size;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    char* bytes = static_cast<char*>(base);
    mprotect(bytes + data, page, PROT_NONE);
    // Flush against the guard, keeping the 16-byte alignment of float4.
    char* start = bytes + data - (size + 15) / 16 * 16;
    // Fresh pages are zero, but what a GPU hands out (from cudarc's
    // stream-ordered pool, often a buffer freed moments before) is not:
    // every byte 0xff, a NaN in every float, so a kernel that reads what
    // nobody wrote fails here too.
    std::memset(start, 0xff, size);
    std::lock_guard<std::mutex> lock(memory_mutex);
    allocations[reinterpret_cast<CUdeviceptr>(start)] = {bytes, data + page, size};
    *out = reinterpret_cast<CUdeviceptr>(start);
    return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr ptr) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = allocations.find(ptr);
    if (it == allocations.end()) {
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree", "%#llx was not allocated", ptr);
    }
    munmap(it->second.base, it->second.mapped);
    allocated_bytes -= it->second.size;
    allocations.erase(it);
    return CUDA_SUCCESS;
}

char* device_range(CUdeviceptr ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = allocations.upper_bound(ptr);
    if (it == allocations.begin()) return nullptr;
    --it;
    const CUdeviceptr end = it->first + it->second.size;
    if (ptr > end || bytes > end - ptr) return nullptr;
    return reinterpret_cast<char*>(ptr);
}

CUresult copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes) {
    char* to = device_range(dst, bytes);
    if (to == nullptr) return outside("cuMemcpyHtoD", dst, bytes);
    if (src == nullptr && bytes > 0) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(to, src, bytes);
    return CUDA_SUCCESS;
}

CUresult copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) {
    const char* from = device_range(src, bytes);
    if (from == nullptr) return outside("cuMemcpyDtoH", src, bytes);
    if (dst == nullptr && bytes > 0) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(dst, from, bytes);
    return CUDA_SUCCESS;
}

CUresult copy_on_device(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
    const char* from = device_range(src, bytes);
    if (from == nullptr) return outside("cuMemcpyDtoD", src, bytes);
    char* to = device_range(dst, bytes);
    if (to == nullptr) return outside("cuMemcpyDtoD", dst, bytes);
    std::memmove(to, from, bytes);
    return CUDA_SUCCESS;
}

CUresult fill(CUdeviceptr dst, const void* word, std::size_t width, std::size_t count) {
    char* to = device_range(dst, count * width);
    if (to == nullptr) return outside("cuMemset", dst, count * width);
    for (std::size_t i = 0; i < count; ++i) std::memcpy(to + i * width, word, width);
    return CUDA_SUCCESS;
}

}  // namespace cuda_emu

// The current GPU's free memory: its total less what this process holds on
// any emulated GPU (other processes are not seen).
extern "C" CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(cuda_emu::memory_mutex);
    *total = cuda_emu::total_bytes();
    *free = *total > cuda_emu::allocated_bytes ? *total - cuda_emu::allocated_bytes : 0;
    return CUDA_SUCCESS;
}
