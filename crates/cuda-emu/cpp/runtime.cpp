// The emulator's runtime: the CUDA driver API calls cudarc and the backend
// make, over host memory, and a block scheduler that runs a kernel's threads
// as fibers.
//
// * Work runs when it is queued: a stream is only a name, an event is always
//   complete. Running every call at once, in the order the host makes them,
//   is one of the schedules a GPU could pick, so a program whose ordering is
//   right gives the same results here.
// * Device memory is host memory from mmap, each allocation flush against a
//   PROT_NONE page: a kernel that reads or writes past the end of a buffer
//   faults, and the handler names the kernel, block and thread.
// * Copies and memsets check that the device range lies inside one
//   allocation; launches check their configuration as the driver does.
// * One launch at a time (a process-wide mutex): shared memory is static and
//   the scheduler's state is global.

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu_kernel.h"

namespace cuda_emu {

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

std::unordered_map<std::string, Entry>& kernel_table() {
    static std::unordered_map<std::string, Entry> table;
    return table;
}

// ---- fibers ----
//
// A fiber is a stack and the stack pointer it was left at; switching saves
// the callee-saved registers (and the FP control words) on the old stack and
// pops them from the new one. No system call, unlike swapcontext, which
// matters at millions of switches per training step.

#if !defined(__x86_64__)
#error "cuda-emu switches fibers with x86-64 assembly; this target is not supported"
#endif

extern "C" void cuda_emu_switch(void** save_sp, void* resume_sp);
asm(R"(
    .text
    .p2align 4
    .hidden cuda_emu_switch
    .type cuda_emu_switch, @function
cuda_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_emu_switch, .-cuda_emu_switch
)");

constexpr std::size_t kStackBytes = 64 * 1024;
constexpr unsigned kMaxThreads = 1024;

enum class State { Ready, AtBarrier, Done };

struct Fiber {
    void* sp;
    State state;
    dim3 index;
};

// The block being run; only touched with `launch_mutex` held.
struct Block {
    Entry entry = nullptr;
    void** params = nullptr;
    const char* kernel = "";
    void* scheduler_sp = nullptr;
    Fiber* current = nullptr;
    Fiber fibers[kMaxThreads];
    char* stacks = nullptr;
};

Block block;
std::mutex launch_mutex;

[[noreturn]] void fiber_main() {
    block.entry(block.params);
    block.current->state = State::Done;
    void* unused;
    cuda_emu_switch(&unused, block.scheduler_sp);
    __builtin_unreachable();
}

// A fresh stack for fiber `i` whose first switch "returns" into fiber_main,
// laid out as cuda_emu_switch leaves a stack: the FP control words, six
// callee-saved registers, the return address; above it a slot standing for
// fiber_main's own return address, placed so that fiber_main starts with
// the stack alignment the ABI requires.
void* fresh_stack(unsigned i, std::uint64_t fp_words) {
    auto* top = reinterpret_cast<std::uint64_t*>(block.stacks + (i + 1) * kStackBytes);
    std::uint64_t* sp = top - 9;
    sp[0] = fp_words;
    for (int r = 1; r <= 6; ++r) sp[r] = 0;
    sp[7] = reinterpret_cast<std::uint64_t>(&fiber_main);
    sp[8] = 0;
    return sp;
}

// The MXCSR and x87 control words in the 8-byte slot cuda_emu_switch
// stores them in: MXCSR in the low half, the x87 word above it.
std::uint64_t fp_control_words() {
    std::uint32_t mxcsr;
    std::uint16_t x87;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(x87));
    return mxcsr | (std::uint64_t{x87} << 32);
}

// Runs every thread of the current block to completion. A fiber runs until
// it finishes or reaches a barrier; once every live fiber is parked, all are
// released. Threads that have exited count as arrived, as on the GPU.
void run_block(unsigned threads) {
    const std::uint64_t fp = fp_control_words();
    for (unsigned i = 0; i < threads; ++i) {
        Fiber& f = block.fibers[i];
        f.index = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
        f.state = State::Ready;
        f.sp = fresh_stack(i, fp);
    }
    unsigned live = threads;
    while (live > 0) {
        for (unsigned i = 0; i < threads; ++i) {
            Fiber& f = block.fibers[i];
            if (f.state != State::Ready) continue;
            block.current = &f;
            threadIdx = f.index;
            cuda_emu_switch(&block.scheduler_sp, f.sp);
            if (f.state == State::Done) --live;
        }
        for (unsigned i = 0; i < threads; ++i) {
            if (block.fibers[i].state == State::AtBarrier) block.fibers[i].state = State::Ready;
        }
    }
}

// A fault inside a kernel: say where, then end the process (a GPU would
// report CUDA_ERROR_ILLEGAL_ADDRESS and poison the context).
void on_fault(int sig, siginfo_t* info, void*) {
    char line[512];
    const int n = std::snprintf(
        line, sizeof line,
        "cuda-emu: kernel `%s` block (%u,%u,%u) thread (%u,%u,%u) touched %p (%s): an access "
        "outside every device buffer\n",
        block.kernel, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
        info->si_addr, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS");
    if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<std::size_t>(n));
    _exit(134);
}

}  // namespace

void syncthreads() {
    Fiber* self = block.current;
    self->state = State::AtBarrier;
    cuda_emu_switch(&self->sp, block.scheduler_sp);
}

void register_kernels(const Kernel* kernels, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) kernel_table()[kernels[i].name] = kernels[i].entry;
}

}  // namespace cuda_emu

// ---- the driver API ----

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;

constexpr int kDevices = 1;
constexpr int kComputeMajor = 9;
constexpr int kComputeMinor = 0;
constexpr std::size_t kTotalMemory = std::size_t{16} << 30;

struct Context {
    CUdevice device;
};
Context contexts[kDevices] = {{0}};
thread_local Context* current_context = nullptr;

struct Stream {};
struct Module {};
struct Function {
    const char* name;
    cuda_emu::Entry entry;
};
struct Event {
    std::chrono::steady_clock::time_point at;
};

// A device allocation: `size` bytes at the key, inside the mapping
// [base, base + mapped) whose last page is the PROT_NONE guard.
struct Allocation {
    char* base;
    std::size_t mapped;
    std::size_t size;
};
std::mutex memory_mutex;
std::map<CUdeviceptr, Allocation> allocations;

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

CUresult allocate(CUdeviceptr* out, std::size_t size) {
    if (out == nullptr || size == 0) {
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "%llu bytes", size);
    }
    const std::size_t page = page_size();
    const std::size_t data = (size + page - 1) / page * page;
    void* base = mmap(nullptr, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    char* bytes = static_cast<char*>(base);
    mprotect(bytes + data, page, PROT_NONE);
    // Flush against the guard, keeping the 16-byte alignment of float4.
    char* start = bytes + data - (size + 15) / 16 * 16;
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
    allocations.erase(it);
    return CUDA_SUCCESS;
}

// The host address of device range [ptr, ptr + bytes), or null when it is
// not inside one allocation.
char* device_range(CUdeviceptr ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = allocations.upper_bound(ptr);
    if (it == allocations.begin()) return nullptr;
    --it;
    const CUdeviceptr end = it->first + it->second.size;
    if (ptr > end || bytes > end - ptr) return nullptr;
    return reinterpret_cast<char*>(ptr);
}

CUresult outside(const char* call, CUdeviceptr ptr, std::size_t bytes) {
    return refuse(CUDA_ERROR_INVALID_VALUE, call,
                  "device range %#llx + %llu bytes is not inside one allocation", ptr, bytes);
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
    char* to = device_range(dst, bytes);
    const char* from = device_range(src, bytes);
    if (to == nullptr) return outside("cuMemcpyDtoD", dst, bytes);
    if (from == nullptr) return outside("cuMemcpyDtoD", src, bytes);
    std::memmove(to, from, bytes);
    return CUDA_SUCCESS;
}

template <class T>
CUresult set_words(CUdeviceptr dst, T value, std::size_t count) {
    char* to = device_range(dst, count * sizeof(T));
    if (to == nullptr) return outside("cuMemset", dst, count * sizeof(T));
    for (std::size_t i = 0; i < count; ++i) std::memcpy(to + i * sizeof(T), &value, sizeof(T));
    return CUDA_SUCCESS;
}

CUresult launch(const Function* f, const cuda_emu::dim3 grid, const cuda_emu::dim3 threads,
                unsigned shared_bytes, void** params) {
    if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const unsigned long long per_block =
        static_cast<unsigned long long>(threads.x) * threads.y * threads.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535 || per_block == 0 || per_block > cuda_emu::kMaxThreads ||
        threads.x > 1024 || threads.y > 1024 || threads.z > 64 || shared_bytes > 48 * 1024) {
        std::fprintf(stderr,
                     "cuda-emu: cuLaunchKernel `%s`: grid (%u,%u,%u), block (%u,%u,%u), %u bytes "
                     "of shared memory is not a valid launch\n",
                     f->name, grid.x, grid.y, grid.z, threads.x, threads.y, threads.z,
                     shared_bytes);
        return CUDA_ERROR_INVALID_VALUE;
    }
    std::lock_guard<std::mutex> lock(cuda_emu::launch_mutex);
    auto& b = cuda_emu::block;
    if (b.stacks == nullptr) {
        void* stacks = mmap(nullptr, cuda_emu::kMaxThreads * cuda_emu::kStackBytes,
                            PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (stacks == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        b.stacks = static_cast<char*>(stacks);
    }
    b.entry = f->entry;
    b.params = params;
    b.kernel = f->name;
    struct sigaction fault = {}, old_segv = {}, old_bus = {};
    fault.sa_sigaction = cuda_emu::on_fault;
    fault.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&fault.sa_mask);
    sigaction(SIGSEGV, &fault, &old_segv);
    sigaction(SIGBUS, &fault, &old_bus);
    cuda_emu::gridDim = grid;
    cuda_emu::blockDim = threads;
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                cuda_emu::blockIdx = {x, y, z};
                cuda_emu::run_block(static_cast<unsigned>(per_block));
            }
        }
    }
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    return CUDA_SUCCESS;
}

const char* error_name(CUresult error) {
    switch (error) {
        case CUDA_SUCCESS: return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
        case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
        default: return nullptr;
    }
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned) { return CUDA_SUCCESS; }

CUresult cuDriverGetVersion(int* version) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = 12090;
    return CUDA_SUCCESS;
}

// The driver's private interfaces, which NVRTC asks a loaded libcuda for:
// there are none here, and NVRTC then does without.
CUresult cuGetExportTable(const void** table, const void*) {
    *table = nullptr;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
    *name = error_name(error);
    return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
    *text = error_name(error);
    return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// -- devices and contexts

CUresult cuDeviceGetCount(int* count) {
    *count = kDevices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (ordinal < 0 || ordinal >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
    if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<std::size_t>(length), "cuda-emu (CUDA on the CPU)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
        case 1: *value = 1024; break;   // MAX_THREADS_PER_BLOCK
        case 8: *value = 48 * 1024; break;  // MAX_SHARED_MEMORY_PER_BLOCK
        case 10: *value = 32; break;    // WARP_SIZE
        case 16: *value = 1; break;     // MULTIPROCESSOR_COUNT
        case 75: *value = kComputeMajor; break;
        case 76: *value = kComputeMinor; break;
        case 115: *value = 1; break;    // MEMORY_POOLS_SUPPORTED: cuMemAllocAsync
        default: *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char* uuid, CUdevice device) {
    if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
    std::memcpy(uuid, "cuda-emu-device", 16);
    uuid[15] = static_cast<unsigned char>(device);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(unsigned char* uuid, CUdevice device) {
    return cuDeviceGetUuid(uuid, device);
}

CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice) {
    *bytes = kTotalMemory;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
    *free = kTotalMemory;
    *total = kTotalMemory;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(Context** context, CUdevice device) {
    if (device < 0 || device >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
    *context = &contexts[device];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return device >= 0 && device < kDevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxSetCurrent(Context* context) {
    current_context = context;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(Context** context) {
    *context = current_context;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
    if (current_context == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *device = current_context->device;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() { return CUDA_SUCCESS; }

// -- streams and events: the work has already run

CUresult cuStreamCreate(Stream** stream, unsigned) {
    *stream = new Stream;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(Stream* stream) {
    delete stream;
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(Stream*) { return CUDA_SUCCESS; }
CUresult cuStreamQuery(Stream*) { return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(Stream*, Event* event, unsigned) {
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventCreate(Event** event, unsigned) {
    *event = new Event{std::chrono::steady_clock::now()};
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(Event* event) {
    delete event;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(Event* event, Stream*) {
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    event->at = std::chrono::steady_clock::now();
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(Event* event) { return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventSynchronize(Event* event) { return cuEventQuery(event); }

CUresult cuEventElapsedTime(float* ms, Event* start, Event* end) {
    if (start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime_v2(float* ms, Event* start, Event* end) {
    return cuEventElapsedTime(ms, start, end);
}

// -- memory

CUresult cuMemAlloc_v2(CUdeviceptr* ptr, std::size_t bytes) { return allocate(ptr, bytes); }
CUresult cuMemAllocAsync(CUdeviceptr* ptr, std::size_t bytes, Stream*) {
    return allocate(ptr, bytes);
}
CUresult cuMemFree_v2(CUdeviceptr ptr) { return release(ptr); }
CUresult cuMemFreeAsync(CUdeviceptr ptr, Stream*) { return release(ptr); }

CUresult cuMemHostRegister_v2(void* ptr, std::size_t bytes, unsigned) {
    return ptr != nullptr && bytes > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemHostUnregister(void* ptr) {
    return ptr != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t bytes) {
    return copy_to_device(dst, src, bytes);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t bytes, Stream*) {
    return copy_to_device(dst, src, bytes);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t bytes) {
    return copy_to_host(dst, src, bytes);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t bytes, Stream*) {
    return copy_to_host(dst, src, bytes);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
    return copy_on_device(dst, src, bytes);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, Stream*) {
    return copy_on_device(dst, src, bytes);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, std::size_t count) {
    return set_words(dst, value, count);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t count, Stream*) {
    return set_words(dst, value, count);
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned value, std::size_t count) {
    return set_words(dst, value, count);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, std::size_t count, Stream*) {
    return set_words(dst, value, count);
}

// -- modules and launches: a module's image (PTX or CUBIN) is not read;
// its functions are the kernels compiled into this library.

CUresult cuModuleLoadData(Module** module, const void* image) {
    if (image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *module = new Module;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(Module* module) {
    delete module;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(Function** function, Module* module, const char* name) {
    if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    static std::mutex functions_mutex;
    static std::unordered_map<std::string, Function> functions;
    auto& table = cuda_emu::kernel_table();
    auto kernel = table.find(name);
    if (kernel == table.end()) return CUDA_ERROR_NOT_FOUND;
    std::lock_guard<std::mutex> lock(functions_mutex);
    auto [it, _] = functions.try_emplace(kernel->first, Function{kernel->first.c_str(), kernel->second});
    *function = &it->second;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* value, int attribute, Function* function) {
    if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *value = attribute == 0 ? 1024 : 0;  // MAX_THREADS_PER_BLOCK
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(Function* function, int, int) {
    return function ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuLaunchKernel(Function* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                        unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                        Stream*, void** params, void** extra) {
    if (extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
    return launch(function, {grid_x, grid_y, grid_z}, {block_x, block_y, block_z}, shared_bytes,
                  params);
}

}  // extern "C"
