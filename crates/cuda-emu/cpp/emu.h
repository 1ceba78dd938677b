// What the emulator's runtime files share (fibers.cpp, driver.cpp,
// memory.cpp, nccl.cpp, nccl_p2p.cpp). Kernel sources see only
// emu_kernel.h.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "emu_kernel.h"

// The driver API's types and the result codes the emulator returns, under
// cuda.h's names (this library is libcuda; it includes no cuda.h).
using CUresult = int;
using CUdeviceptr = unsigned long long;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;

namespace cuda_emu {

// ---- fibers.cpp

// The kernel registered under `name`, or null; `*entry` is set when found.
// The returned name lives as long as the process.
const std::string* find_kernel(const char* name, Entry* entry);

// Runs `entry` on every thread of every block of `grid`; the configuration
// has been checked. False when the fiber stacks cannot be mapped.
bool run_grid(const char* kernel, Entry entry, void** params, dim3 grid, dim3 threads);

// ---- driver.cpp

struct Stream;

// The stream behind a `CUstream` handle (the default stream for null).
Stream* stream_of(void* handle);

// Queues `work` on `stream`, to run on the stream's own thread after
// everything queued before it.
void enqueue(Stream* stream, std::function<void()> work);

// ---- memory.cpp

// cuMemAlloc: `size` bytes ending at an unmapped page.
CUresult allocate(CUdeviceptr* out, std::size_t size);

// cuMemFree of an allocation's start.
CUresult release(CUdeviceptr ptr);

// The host address of device range [ptr, ptr + bytes), or null when it is
// not inside one allocation.
char* device_range(CUdeviceptr ptr, std::size_t bytes);

// The copies and memsets, refused (and said why) outside one allocation.
CUresult copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes);
CUresult copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes);
CUresult copy_on_device(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes);
// Writes the `width`-byte `word` `count` times from `dst` on.
CUresult fill(CUdeviceptr dst, const void* word, std::size_t width, std::size_t count);

}  // namespace cuda_emu
