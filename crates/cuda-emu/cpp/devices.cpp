// The driver API's devices and contexts: $CUDA_EMU_DEVICES GPUs of compute
// capability $CUDA_EMU_COMPUTE_CAP, each with its primary context.

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emu.h"

namespace {

using CUdevice = int;

constexpr int kMaxDevices = 8;
// The compute capability reported: $CUDA_EMU_COMPUTE_CAP as nvidia-smi prints
// it (7.5), else 9.0; tests set an older one to meet what the backend refuses.
int compute_cap() {
    static const int cap = [] {
        const char* text = std::getenv("CUDA_EMU_COMPUTE_CAP");
        int major = 0, minor = 0;
        const bool given = text && std::sscanf(text, "%d.%d", &major, &minor) == 2;
        return given ? major * 10 + minor : 90;
    }();
    return cap;
}

struct Context {
    CUdevice device;
};
Context contexts[kMaxDevices] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

// How many GPUs the emulator shows: $CUDA_EMU_DEVICES (1 to 8), else 1. Two
// ranks on two emulated GPUs have GPUs of their own, so they may use NCCL.
int devices() {
    static const int count = [] {
        const char* text = std::getenv("CUDA_EMU_DEVICES");
        const int n = text ? std::atoi(text) : 1;
        return n >= 1 && n <= kMaxDevices ? n : 1;
    }();
    return count;
}

bool valid(CUdevice device) { return device >= 0 && device < devices(); }
thread_local Context* current_context = nullptr;

}  // namespace

extern "C" {

// -- devices and contexts

CUresult cuDeviceGetCount(int* count) {
    *count = devices();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (!valid(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
    if (!valid(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<std::size_t>(length), "cuda-emu (CUDA on the CPU)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (!valid(device)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
        case 1: *value = 1024; break;   // MAX_THREADS_PER_BLOCK
        case 8: *value = 48 * 1024; break;  // MAX_SHARED_MEMORY_PER_BLOCK
        case 10: *value = 32; break;    // WARP_SIZE
        case 16: *value = 1; break;     // MULTIPROCESSOR_COUNT
        case 75: *value = compute_cap() / 10; break;  // COMPUTE_CAPABILITY_MAJOR
        case 76: *value = compute_cap() % 10; break;  // COMPUTE_CAPABILITY_MINOR
        case 115: *value = 1; break;    // MEMORY_POOLS_SUPPORTED: cuMemAllocAsync
        default: *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char* uuid, CUdevice device) {
    if (!valid(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::memcpy(uuid, "cuda-emu-device", 16);
    uuid[15] = static_cast<unsigned char>(device);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(Context** context, CUdevice device) {
    if (!valid(device)) return CUDA_ERROR_INVALID_DEVICE;
    *context = &contexts[device];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return valid(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxSetCurrent(Context* context) {
    current_context = context;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(Context** context) {
    *context = current_context;
    return CUDA_SUCCESS;
}

}  // extern "C"
