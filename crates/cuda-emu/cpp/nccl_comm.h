// The emulated NCCL communicator, as nccl.cpp's collectives and
// nccl_p2p.cpp's point-to-point calls share it: the shared-memory layout
// (a header, then one staging slot per rank), the barrier every chunk of
// a collective passes, and the checks and the queueing of a call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "emu.h"
#include "nccl_abi.h"

namespace nccl_emu {

// NCCL_VERSION(2, 30, 7), the release this emulates the interface of.
constexpr int kVersion = 23007;
constexpr int kMaxRanks = 64;
constexpr std::size_t kSlotFloats = 256 * 1024;
constexpr unsigned kConfigMagic = 0xcafebeef;

// The shared-memory header; the slots follow it.
struct Header {
    std::atomic<int> joined;
    std::atomic<int> aborted;
    std::atomic<int> pid[kMaxRanks];
    std::atomic<std::uint64_t> arrived[kMaxRanks];
};

struct Comm {
    int nranks;
    int rank;
    std::string path;
    Header* header;
    std::size_t mapped;
    float* slots;
    std::atomic<bool> joined_all{false};
    // The barriers this rank has entered (the stream's thread only).
    std::uint64_t phase = 0;
    std::atomic<bool> aborting{false};
    std::atomic<int> state{ncclSuccess};
    std::atomic<int> running{0};
    std::mutex error_mutex;
    std::string last_error;

    float* slot(int r) { return slots + static_cast<std::size_t>(r) * kSlotFloats; }
};

// Records `why` as `comm`'s error (the process's, for a null `comm`) and
// returns `code`.
ncclResult_t fail(Comm* comm, ncclResult_t code, const std::string& why);

// Every rank's next barrier: true once all arrived, false (with the
// communicator's error set) when that cannot happen.
bool barrier(Comm* comm);

// Whether `comm` may start a call (`*result` says why not).
bool usable(Comm* comm, ncclResult_t* result);

// The device ranges of a float32 collective (and, in an all-reduce, of a
// float16, bfloat16 or int64 one), or an error naming the bad one.
bool device_floats(Comm* comm, const void* send, void* recv, std::size_t count, int datatype,
                   ncclResult_t* result, bool all_reduce = false);

// Queues `work` on `stream`, counted as running on `comm` until it ends.
void queue(Comm* comm, void* stream, std::function<void()> work);

// Runs `step(offset, n)` over `count` elements in chunks of `per_slot`
// (a slot's worth: `kSlotFloats` floats, or half as many int64), each
// between two barriers.
template <class Step>
void chunked(Comm* comm, std::size_t count, Step step, std::size_t per_slot = kSlotFloats) {
    for (std::size_t offset = 0; offset < count; offset += per_slot) {
        const std::size_t n = std::min(per_slot, count - offset);
        if (comm->state.load() != ncclSuccess) return;
        step(offset, n, [comm] { return barrier(comm); });
    }
}

}  // namespace nccl_emu
