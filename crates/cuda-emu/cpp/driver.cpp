// The CUDA driver API over host memory: the calls cudarc and the backend
// make.
//
// * Device memory is host memory with a guard page after each allocation
//   (memory.cpp); launches check their configuration as the driver does.
// * Kernels, copies and memsets run when they are queued, in the order the
//   host makes the calls: one of the schedules a GPU could pick, so a
//   program whose ordering is right gives the same results here. Work that
//   must wait for other processes (NCCL's collectives, nccl.cpp) is queued
//   on the stream instead and run by the stream's own thread; anything
//   later on that stream first waits for it, and events record how far a
//   stream has got.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "emu.h"

// ---- the driver API ----

namespace {

struct Module {};
struct Function {
    const char* name;
    cuda_emu::Entry entry;
};
// An event is the count of queued operations its stream had when it was
// recorded: complete once the stream has finished that many. A timing event
// also notes the host clock at that moment (`reached_at`, written by the
// stream's thread when the event was recorded behind queued work).
struct Event {
    cuda_emu::Stream* stream = nullptr;
    std::uint64_t ticket = 0;
    bool timing = true;
    std::shared_ptr<std::atomic<double>> reached_at;
};

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}


CUresult launch(const Function* f, const cuda_emu::dim3 grid, const cuda_emu::dim3 threads,
                unsigned shared_bytes, void** params) {
    if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const unsigned long long per_block =
        static_cast<unsigned long long>(threads.x) * threads.y * threads.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535 || per_block == 0 || per_block > 1024 || threads.x > 1024 ||
        threads.y > 1024 || threads.z > 64 || shared_bytes > 48 * 1024) {
        std::fprintf(stderr,
                     "cuda-emu: cuLaunchKernel `%s`: grid (%u,%u,%u), block (%u,%u,%u), %u bytes "
                     "of shared memory is not a valid launch\n",
                     f->name, grid.x, grid.y, grid.z, threads.x, threads.y, threads.z,
                     shared_bytes);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return cuda_emu::run_grid(f->name, f->entry, params, grid, threads) ? CUDA_SUCCESS
                                                                          : CUDA_ERROR_OUT_OF_MEMORY;
}

const char* error_name(CUresult error) {
    switch (error) {
        case CUDA_SUCCESS: return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
        case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
        case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
        default: return nullptr;
    }
}

}  // namespace

// ---- streams

namespace cuda_emu {

struct Stream {
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<std::function<void()>> queue;
    std::uint64_t queued = 0;
    std::uint64_t finished = 0;
    bool has_worker = false;

    // Blocks until everything queued so far has run.
    void drain() {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return finished == queued; });
    }

    bool reached(std::uint64_t ticket) {
        std::lock_guard<std::mutex> lock(mutex);
        return finished >= ticket;
    }

    void wait_for(std::uint64_t ticket) {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return finished >= ticket; });
    }

    bool idle() { return reached(ticket()); }

    std::uint64_t ticket() {
        std::lock_guard<std::mutex> lock(mutex);
        return queued;
    }

    // The stream's thread: runs the queue in order, forever (streams are
    // never freed, so that an event may outlive its stream).
    void work() {
        std::unique_lock<std::mutex> lock(mutex);
        for (;;) {
            changed.wait(lock, [&] { return !queue.empty(); });
            std::function<void()> next = std::move(queue.front());
            lock.unlock();
            next();
            lock.lock();
            queue.pop_front();
            ++finished;
            changed.notify_all();
        }
    }
};

Stream* stream_of(void* handle) {
    static Stream* const default_stream = new Stream;
    return handle ? static_cast<Stream*>(handle) : default_stream;
}

void enqueue(Stream* stream, std::function<void()> work) {
    std::lock_guard<std::mutex> lock(stream->mutex);
    if (!stream->has_worker) {
        std::thread(&Stream::work, stream).detach();
        stream->has_worker = true;
    }
    stream->queue.push_back(std::move(work));
    ++stream->queued;
    stream->changed.notify_all();
}

}  // namespace cuda_emu

namespace {

// Work that runs at once on `handle`'s stream waits for what is queued there.
void drain(void* handle) { cuda_emu::stream_of(handle)->drain(); }

}  // namespace

extern "C" {

CUresult cuInit(unsigned) { return CUDA_SUCCESS; }

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

// -- streams and events

using cuda_emu::Stream;

CUresult cuStreamCreate(Stream** stream, unsigned) {
    *stream = new Stream;
    return CUDA_SUCCESS;
}

// The stream stays allocated (an event may still name it); its queue is
// drained first, as the driver finishes a destroyed stream's work.
CUresult cuStreamDestroy_v2(Stream* stream) {
    if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    stream->drain();
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(Stream* stream) {
    drain(stream);
    return CUDA_SUCCESS;
}

// Later work on `stream` must follow the event. Work queued on the stream
// waits in the queue; with nothing queued, the host waits here, since
// whatever comes next on the stream runs at once.
CUresult cuStreamWaitEvent(Stream* stream, Event* event, unsigned) {
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* s = cuda_emu::stream_of(stream);
    if (event->stream == nullptr || event->stream == s) return CUDA_SUCCESS;
    Stream* other = event->stream;
    const std::uint64_t ticket = event->ticket;
    if (s->idle()) {
        other->wait_for(ticket);
    } else {
        cuda_emu::enqueue(s, [other, ticket] { other->wait_for(ticket); });
    }
    return CUDA_SUCCESS;
}

// CU_EVENT_DISABLE_TIMING: such an event cannot be timed, as on a GPU.
constexpr unsigned kEventDisableTiming = 0x2;

CUresult cuEventCreate(Event** event, unsigned flags) {
    *event = new Event;
    (*event)->timing = (flags & kEventDisableTiming) == 0;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(Event* event) {
    delete event;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(Event* event, Stream* stream) {
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* s = cuda_emu::stream_of(stream);
    event->stream = s;
    event->reached_at = std::make_shared<std::atomic<double>>(now_ms());
    if (event->timing && !s->idle()) {
        // The event is reached when the work queued before it has run.
        cuda_emu::enqueue(s, [at = event->reached_at] { at->store(now_ms()); });
    }
    event->ticket = s->ticket();
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(Event* event) {
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (event->stream != nullptr) event->stream->wait_for(event->ticket);
    return CUDA_SUCCESS;
}

// Milliseconds between two reached timing events, as the driver reports it.
CUresult cuEventElapsedTime(float* ms, Event* start, Event* end) {
    if (start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (!start->timing || !end->timing) return CUDA_ERROR_INVALID_HANDLE;
    if (start->stream == nullptr || end->stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (!start->stream->reached(start->ticket) || !end->stream->reached(end->ticket)) {
        return CUDA_ERROR_NOT_READY;
    }
    *ms = static_cast<float>(end->reached_at->load() - start->reached_at->load());
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(Event* event) {
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (event->stream == nullptr) return CUDA_SUCCESS;
    return event->stream->reached(event->ticket) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

// -- memory

CUresult cuMemAllocAsync(CUdeviceptr* ptr, std::size_t bytes, Stream*) {
    return cuda_emu::allocate(ptr, bytes);
}
CUresult cuMemFreeAsync(CUdeviceptr ptr, Stream* stream) {
    drain(stream);
    return cuda_emu::release(ptr);
}

CUresult cuMemHostRegister_v2(void* ptr, std::size_t bytes, unsigned) {
    return ptr != nullptr && bytes > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemHostUnregister(void* ptr) {
    return ptr != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t bytes,
                              Stream* stream) {
    drain(stream);
    return cuda_emu::copy_to_device(dst, src, bytes);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t bytes, Stream* stream) {
    drain(stream);
    return cuda_emu::copy_to_host(dst, src, bytes);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                              Stream* stream) {
    drain(stream);
    return cuda_emu::copy_on_device(dst, src, bytes);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t count,
                         Stream* stream) {
    drain(stream);
    return cuda_emu::fill(dst, &value, sizeof value, count);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, std::size_t count, Stream* stream) {
    drain(stream);
    return cuda_emu::fill(dst, &value, sizeof value, count);
}

// -- modules and launches: a module's functions are the kernels compiled
// into this library, whatever its image holds; but like the driver it loads
// only a CUBIN (an ELF image) or PTX text (NUL-terminated, with a `.version`
// directive), so other bytes (a damaged cache entry) are an error here too.
CUresult cuModuleLoadData(Module** module, const void* image) {
    if (image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // strncmp stops at a NUL, so a short PTX text is not read past its end.
    const char* text = static_cast<const char*>(image);
    const bool elf = std::strncmp(text, "\x7f" "ELF", 4) == 0;
    if (!elf && std::strstr(text, ".version") == nullptr) {
        return CUDA_ERROR_INVALID_IMAGE;
    }
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
    cuda_emu::Entry entry;
    const std::string* known = cuda_emu::find_kernel(name, &entry);
    if (known == nullptr) return CUDA_ERROR_NOT_FOUND;
    std::lock_guard<std::mutex> lock(functions_mutex);
    auto [it, _] = functions.try_emplace(*known, Function{known->c_str(), entry});
    *function = &it->second;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(Function* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                        unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                        Stream* stream, void** params, void** extra) {
    if (extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
    drain(stream);
    return launch(function, {grid_x, grid_y, grid_z}, {block_x, block_y, block_z}, shared_bytes,
                  params);
}

}  // extern "C"
