// NCCL's point to point over the emulated GPUs (nccl.cpp has the rest):
// ncclSend/ncclRecv, inside ncclGroupStart/End or alone, in communicators
// of two ranks, which is what a two-stage pipeline uses: the pair's send
// and receive become one queued exchange through the slots, between
// barriers like a collective. Larger communicators answer
// ncclInvalidUsage.

#include <algorithm>
#include <cstring>
#include <vector>

#include "nccl_comm.h"

using namespace nccl_emu;

namespace {

// One rank's half of a point-to-point exchange on one communicator and
// stream: what it sends to the other rank and what it receives from it.
struct Exchange {
    Comm* comm;
    void* stream;
    const float* send = nullptr;
    float* recv = nullptr;
    std::size_t send_count = 0, recv_count = 0;
};
thread_local int group_depth = 0;
thread_local std::vector<Exchange> pending;

// Queues an exchange: per chunk, this rank's outgoing part goes into its
// slot, and after a barrier the other rank's slot into the incoming part.
// Both ranks run max(sent, received) floats, the same number on each when
// every receive matches the other rank's send.
void queue_exchange(const Exchange& x) {
    queue(x.comm, x.stream, [x] {
        Comm* comm = x.comm;
        const std::size_t count = std::max(x.send_count, x.recv_count);
        chunked(comm, count, [&](std::size_t offset, std::size_t n, auto meet) {
            const auto part = [&](std::size_t total) { return std::min(n, total - offset); };
            if (offset < x.send_count) {
                std::memcpy(comm->slot(comm->rank), x.send + offset, part(x.send_count) * 4);
            }
            if (!meet()) return;
            if (offset < x.recv_count) {
                std::memcpy(x.recv + offset, comm->slot(1 - comm->rank), part(x.recv_count) * 4);
            }
            meet();
        });
    });
}

// Checks one side of a point-to-point call and adds it to this thread's
// pending exchange for `comm` and `stream` (queued at once outside a group).
ncclResult_t add_side(const void* buf, std::size_t count, int datatype, int peer, Comm* comm,
                      void* stream, bool sending) {
    ncclResult_t result;
    if (!usable(comm, &result) || !device_floats(comm, buf, const_cast<void*>(buf), count,
                                                 datatype, &result)) {
        return result;
    }
    if (comm->nranks != 2) {
        return fail(comm, ncclInvalidUsage,
                    "the emulator supports ncclSend/ncclRecv in communicators of two ranks only");
    }
    if (peer != 1 - comm->rank) return fail(comm, ncclInvalidArgument, "bad peer");
    auto at = std::find_if(pending.begin(), pending.end(),
                           [&](const Exchange& x) { return x.comm == comm && x.stream == stream; });
    if (at == pending.end()) at = pending.insert(pending.end(), Exchange{comm, stream});
    if (sending ? at->send != nullptr : at->recv != nullptr) {
        return fail(comm, ncclInvalidUsage, "the emulator takes one send and one receive per group");
    }
    (sending ? at->send_count : at->recv_count) = count;
    if (sending) at->send = static_cast<const float*>(buf);
    if (!sending) at->recv = static_cast<float*>(const_cast<void*>(buf));
    if (group_depth == 0) {
        queue_exchange(*at);
        pending.erase(at);
    }
    return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGroupStart() { return ++group_depth, ncclSuccess; }

ncclResult_t ncclGroupEnd() {
    if (group_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without a start");
    if (--group_depth == 0) {
        for (const Exchange& x : pending) queue_exchange(x);
        pending.clear();
    }
    return ncclSuccess;
}

ncclResult_t ncclSend(const void* send, std::size_t count, int datatype, int peer, Comm* comm,
                      void* stream) {
    return add_side(send, count, datatype, peer, comm, stream, true);
}

ncclResult_t ncclRecv(void* recv, std::size_t count, int datatype, int peer, Comm* comm,
                      void* stream) {
    return add_side(recv, count, datatype, peer, comm, stream, false);
}

}  // extern "C"
