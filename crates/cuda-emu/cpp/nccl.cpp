// NCCL over the emulated GPUs: the calls comm::nccl makes, for ranks in one
// process or several on one machine. The emulator's folder has a
// `libnccl.so` link to this library, so cudarc finds it like the real one.
//
// * The unique id names a shared-memory file, /dev/shm/cuda-emu-nccl-<id>,
//   holding a header (joined ranks, their pids, barrier counters, an abort
//   flag) and one staging slot per rank.
// * Initialisation is non-blocking as configured: it returns at once, and
//   ncclCommGetAsyncError reports ncclInProgress until every rank joined.
// * A collective is queued on its stream and run by the stream's thread:
//   per chunk, every rank copies its part into its slot, meets the others
//   at a barrier, reduces the slots in rank order (identical bits on every
//   rank) into its output, and meets them again.
// * A barrier that cannot complete ends the collective with an error the
//   communicator keeps (ncclCommGetAsyncError): a peer that aborted, or
//   whose process is gone, is ncclRemoteError; this rank's own
//   ncclCommAbort releases it too. Nothing else times out, as in NCCL:
//   that is the caller's watchdog's job.
// * Point to point (ncclSend/ncclRecv): nccl_p2p.cpp.

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "nccl_comm.h"

namespace nccl_emu {

std::mutex global_error_mutex;
std::string global_error;

ncclResult_t fail(Comm* comm, ncclResult_t code, const std::string& why) {
    if (comm != nullptr) {
        std::lock_guard<std::mutex> lock(comm->error_mutex);
        comm->last_error = why;
        int expected = ncclSuccess;
        comm->state.compare_exchange_strong(expected, code);
    } else {
        std::lock_guard<std::mutex> lock(global_error_mutex);
        global_error = why;
    }
    return code;
}

bool process_gone(int pid) { return pid > 0 && kill(pid, 0) == -1 && errno == ESRCH; }

bool barrier(Comm* comm) {
    const std::uint64_t phase = ++comm->phase;
    comm->header->arrived[comm->rank].store(phase, std::memory_order_release);
    for (unsigned spins = 0;; ++spins) {
        int missing = -1;
        for (int r = 0; r < comm->nranks; ++r) {
            if (comm->header->arrived[r].load(std::memory_order_acquire) < phase) {
                missing = r;
                break;
            }
        }
        if (missing < 0) return true;
        if (comm->aborting.load()) {
            fail(comm, ncclInvalidUsage, "the communicator was aborted");
            return false;
        }
        if (comm->header->aborted.load()) {
            fail(comm, ncclRemoteError, "a peer aborted the communicator");
            return false;
        }
        if (spins % 4096 == 4095 && process_gone(comm->header->pid[missing].load())) {
            fail(comm, ncclRemoteError,
                 "rank " + std::to_string(missing) + " (pid " +
                     std::to_string(comm->header->pid[missing].load()) + ") exited");
            return false;
        }
        // Spin briefly, then yield, then nap: a peer may be mid-step on a
        // busy machine for a long time.
        if (spins > 4096) {
            usleep(50);
        } else if (spins > 64) {
            sched_yield();
        }
    }
}

bool usable(Comm* comm, ncclResult_t* result) {
    if (comm == nullptr) {
        *result = fail(nullptr, ncclInvalidArgument, "null communicator");
        return false;
    }
    if (!comm->joined_all) {
        *result = fail(comm, ncclInvalidUsage, "initialisation has not completed");
        return false;
    }
    *result = comm->state.load();
    return *result == ncclSuccess;
}

bool device_floats(Comm* comm, const void* send, void* recv, std::size_t count, int datatype,
                   ncclResult_t* result, bool all_reduce) {
    const std::size_t size = element_bytes(datatype, all_reduce);
    if (size == 0) {
        *result = fail(comm, ncclInvalidArgument,
                       all_reduce ? "the emulator's ncclAllReduce takes ncclFloat32, ncclFloat16, "
                                    "ncclBfloat16 and ncclInt64 only"
                                  : "the emulator supports ncclFloat32 only here");
        return false;
    }
    const auto bytes = count * size;
    const bool ok =
        cuda_emu::device_range(reinterpret_cast<std::uintptr_t>(send), bytes) != nullptr &&
        cuda_emu::device_range(reinterpret_cast<std::uintptr_t>(recv), bytes) != nullptr;
    if (!ok) {
        *result = ncclInvalidArgument;
        std::lock_guard<std::mutex> lock(comm->error_mutex);
        comm->last_error = "a buffer is not inside one device allocation";
    }
    return ok;
}

void queue(Comm* comm, void* stream, std::function<void()> work) {
    ++comm->running;
    cuda_emu::enqueue(cuda_emu::stream_of(stream), [comm, work = std::move(work)] {
        work();
        --comm->running;
    });
}

}  // namespace nccl_emu

using namespace nccl_emu;

namespace {

// An all-reduce of int64, summed (wrapping, as two's complement: the same
// bits in any order) or maximised, in rank order like the floats.
void queue_int64_all_reduce(const void* send, void* recv, std::size_t count, int op, Comm* comm,
                            void* stream) {
    queue(comm, stream, [=] {
        auto slot = [comm](int r) { return reinterpret_cast<std::int64_t*>(comm->slot(r)); };
        const auto* in = static_cast<const std::int64_t*>(send);
        auto* out = static_cast<std::int64_t*>(recv);
        chunked(
            comm, count,
            [&](std::size_t offset, std::size_t n, auto meet) {
                std::memcpy(slot(comm->rank), in + offset, n * sizeof(std::int64_t));
                if (!meet()) return;
                for (std::size_t i = 0; i < n; ++i) {
                    std::int64_t acc = slot(0)[i];
                    for (int r = 1; r < comm->nranks; ++r) {
                        const std::int64_t v = slot(r)[i];
                        acc = op == ncclMax ? std::max(acc, v)
                                            : static_cast<std::int64_t>(
                                                  static_cast<std::uint64_t>(acc) +
                                                  static_cast<std::uint64_t>(v));
                    }
                    out[offset + i] = acc;
                }
                meet();
            },
            kSlotFloats * sizeof(float) / sizeof(std::int64_t));
    });
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (version == nullptr) return ncclInvalidArgument;
    *version = kVersion;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(UniqueId* id) {
    if (id == nullptr) return ncclInvalidArgument;
    std::random_device random;
    for (auto& byte : id->bytes) byte = static_cast<unsigned char>(random());
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(Comm** out, int nranks, UniqueId id, int rank,
                                    Config* config) {
    if (out == nullptr || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
        return fail(nullptr, ncclInvalidArgument, "bad rank or number of ranks");
    }
    if (config != nullptr && config->magic != kConfigMagic) {
        return fail(nullptr, ncclInvalidArgument, "the config was not NCCL_CONFIG_INITIALIZER'd");
    }
    char name[64];
    int at = std::snprintf(name, sizeof name, "/dev/shm/cuda-emu-nccl-");
    for (int i = 0; i < 12; ++i) at += std::snprintf(name + at, sizeof name - at, "%02x", id.bytes[i]);
    const std::size_t mapped =
        sizeof(Header) + static_cast<std::size_t>(nranks) * kSlotFloats * sizeof(float);
    const int fd = open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
        if (fd >= 0) close(fd);
        return fail(nullptr, ncclSystemError, std::string(name) + ": " + std::strerror(errno));
    }
    void* memory = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (memory == MAP_FAILED) {
        return fail(nullptr, ncclSystemError, std::string("mmap: ") + std::strerror(errno));
    }
    auto* comm = new Comm;
    comm->nranks = nranks;
    comm->rank = rank;
    comm->path = name;
    comm->header = static_cast<Header*>(memory);
    comm->mapped = mapped;
    comm->slots = reinterpret_cast<float*>(static_cast<char*>(memory) + sizeof(Header));
    comm->header->pid[rank].store(getpid());
    comm->header->joined.fetch_add(1);
    *out = comm;
    const bool blocking = config == nullptr || config->blocking != 0;
    if (!blocking) return ncclInProgress;
    while (comm->header->joined.load() < nranks) sched_yield();
    comm->joined_all = true;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(Comm* comm, ncclResult_t* state) {
    if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
    if (!comm->joined_all) {
        if (comm->header->joined.load() < comm->nranks) {
            *state = ncclInProgress;
            return ncclSuccess;
        }
        comm->joined_all = true;
        // Every rank has mapped the file: it needs no name any more.
        if (comm->rank == 0) unlink(comm->path.c_str());
    }
    *state = comm->state.load();
    return ncclSuccess;
}

// An all-reduce of float32, or of 16-bit floats, which it sums in float
// and rounds once (NCCL rounds at each step of its ring or tree; the
// emulator needs only the type's bytes and its precision), or of int64.
ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, int datatype, int op,
                           Comm* comm, void* stream) {
    ncclResult_t result;
    if (!usable(comm, &result) ||
        !device_floats(comm, send, recv, count, datatype, &result, true)) {
        return result;
    }
    if (datatype == ncclInt64) {
        if (op != ncclSum && op != ncclMax) {
            return fail(comm, ncclInvalidArgument,
                        "the emulator reduces ncclInt64 with ncclSum and ncclMax only");
        }
        queue_int64_all_reduce(send, recv, count, op, comm, stream);
        return ncclSuccess;
    }
    if (op != ncclSum && op != ncclAvg) {
        return fail(comm, ncclInvalidArgument,
                    "the emulator reduces floats with ncclSum and ncclAvg only");
    }
    const bool half = datatype != ncclFloat32;
    const auto to_float = datatype == ncclBfloat16 ? bf16_to_float : fp16_to_float;
    const auto from_float = datatype == ncclBfloat16 ? float_to_bf16 : float_to_fp16;
    queue(comm, stream, [=] {
        chunked(comm, count, [&](std::size_t offset, std::size_t n, auto meet) {
            float* mine = comm->slot(comm->rank);
            if (half) {
                const auto* in = static_cast<const std::uint16_t*>(send) + offset;
                for (std::size_t i = 0; i < n; ++i) mine[i] = to_float(in[i]);
            } else {
                std::memcpy(mine, static_cast<const float*>(send) + offset, n * sizeof(float));
            }
            if (!meet()) return;
            for (std::size_t i = 0; i < n; ++i) {
                float sum = comm->slot(0)[i];
                for (int r = 1; r < comm->nranks; ++r) sum += comm->slot(r)[i];
                sum = op == ncclAvg ? sum / static_cast<float>(comm->nranks) : sum;
                if (half) {
                    static_cast<std::uint16_t*>(recv)[offset + i] = from_float(sum);
                } else {
                    static_cast<float*>(recv)[offset + i] = sum;
                }
            }
            meet();
        });
    });
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, int datatype,
                           int root, Comm* comm, void* stream) {
    ncclResult_t result;
    if (!usable(comm, &result) || !device_floats(comm, send, recv, count, datatype, &result)) {
        return result;
    }
    if (root < 0 || root >= comm->nranks) return fail(comm, ncclInvalidArgument, "bad root");
    const auto* in = static_cast<const float*>(send);
    auto* out = static_cast<float*>(recv);
    queue(comm, stream, [=] {
        chunked(comm, count, [&](std::size_t offset, std::size_t n, auto meet) {
            if (comm->rank == root) std::memcpy(comm->slot(root), in + offset, n * sizeof(float));
            if (!meet()) return;
            std::memmove(out + offset, comm->slot(root), n * sizeof(float));
            meet();
        });
    });
    return ncclSuccess;
}

// Releases this rank's queued collectives (they end with an error), tells
// the peers, waits for the collectives to finish, and frees everything.
ncclResult_t ncclCommAbort(Comm* comm) {
    if (comm == nullptr) return ncclSuccess;
    comm->aborting.store(true);
    comm->header->aborted.store(1);
    while (comm->running.load() > 0) sched_yield();
    munmap(comm->header, comm->mapped);
    unlink(comm->path.c_str());
    delete comm;
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclSystemError: return "unhandled system error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(Comm* comm) {
    thread_local std::string copy;
    if (comm != nullptr) {
        std::lock_guard<std::mutex> lock(comm->error_mutex);
        copy = comm->last_error;
    } else {
        std::lock_guard<std::mutex> lock(global_error_mutex);
        copy = global_error;
    }
    return copy.c_str();
}

}  // extern "C"
