// What the emulator's runtime files share (fibers.cpp, driver.cpp,
// nccl.cpp). Kernel sources see only emu_kernel.h.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "emu_kernel.h"

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

// The host address of device range [ptr, ptr + bytes), or null when it is
// not inside one allocation.
char* device_range(unsigned long long ptr, std::size_t bytes);

}  // namespace cuda_emu
