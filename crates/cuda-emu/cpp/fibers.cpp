// Running a kernel on the CPU: every block of the grid in turn, each of its
// threads a fiber on the launching host thread, switched at every
// `__syncthreads`; and the table of kernels by name.
//
// One launch at a time (a process-wide mutex): shared memory is static and
// the scheduler's state is global.

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "emu.h"

namespace cuda_emu {

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

// ---- fibers ----
//
// A fiber is a stack and the stack pointer it was left at; switching saves
// the callee-saved registers on the old stack and pops them from the new
// one. No system call, unlike swapcontext, which matters at millions of
// switches per training step. The FP control words (MXCSR, x87) are not
// switched: no kernel changes them, so every fiber runs with the launching
// thread's, and `fldcw` alone was two thirds of a switch's time. It ends
// in an indirect jump, not `ret`: a switch never returns where it was
// called from, so `ret` missed the return predictor on every switch, and
// the jump's target is predicted by the branch history instead.

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
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    popq %rax
    jmpq *%rax
    .size cuda_emu_switch, .-cuda_emu_switch
)");

constexpr std::size_t kStackBytes = 64 * 1024;
// Stacks lie this far apart: 17 cache lines more than a stack, so that the
// fibers' top frames, which every switch touches, spread over the cache's
// sets instead of all falling in the same few (a power-of-two stride maps
// them to one L1 set).
constexpr std::size_t kStackStride = kStackBytes + 17 * 64;
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
// laid out as cuda_emu_switch leaves a stack: six callee-saved registers,
// the return address; above it a slot standing for fiber_main's own return
// address, placed so that fiber_main starts with the stack alignment the
// ABI requires.
void* fresh_stack(unsigned i) {
    auto* top = reinterpret_cast<std::uint64_t*>(block.stacks + i * kStackStride + kStackBytes);
    std::uint64_t* sp = top - 8;
    for (int r = 0; r < 6; ++r) sp[r] = 0;
    sp[6] = reinterpret_cast<std::uint64_t>(&fiber_main);
    sp[7] = 0;
    return sp;
}

// Runs every thread of the current block to completion. A fiber runs until
// it finishes or reaches a barrier; once every live fiber is parked, all are
// released. Threads that have exited count as arrived, as on the GPU.
// Between two barriers the fibers run in index order, then in reverse
// order up to the next, and so on (odd blocks start reversed): a GPU runs
// them in no order, and one fixed order would hide every race in which a
// thread reads, before the barrier, what a thread on the other side of it
// in that order writes.
void run_block(unsigned threads, bool reverse) {
    for (unsigned i = 0; i < threads; ++i) {
        Fiber& f = block.fibers[i];
        f.index = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
        f.state = State::Ready;
        f.sp = fresh_stack(i);
    }
    unsigned live = threads;
    for (; live > 0; reverse = !reverse) {
        for (unsigned n = 0; n < threads; ++n) {
            Fiber& f = block.fibers[reverse ? threads - 1 - n : n];
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

namespace {

std::unordered_map<std::string, Entry>& kernel_table() {
    static std::unordered_map<std::string, Entry> table;
    return table;
}

}  // namespace

void register_kernels(const Kernel* kernels, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) kernel_table()[kernels[i].name] = kernels[i].entry;
}

const std::string* find_kernel(const char* name, Entry* entry) {
    auto& table = kernel_table();
    auto it = table.find(name);
    if (it == table.end()) return nullptr;
    *entry = it->second;
    return &it->first;
}

namespace {

// The fibers' stacks, on 2 MiB pages where the kernel grants them: every
// switch lands on another fiber's stack, and a block of 256 fibers on 4 KiB
// pages touches more pages between two barriers than the TLB holds.
char* map_stacks() {
    constexpr std::size_t kHuge = 2 << 20;
    const std::size_t bytes = kMaxThreads * kStackStride;
    void* mapped = mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return nullptr;
    const auto at = (reinterpret_cast<std::uintptr_t>(mapped) + kHuge - 1) & ~(kHuge - 1);
    // Only a hint: without transparent huge pages the stacks stay on 4 KiB.
    (void)madvise(reinterpret_cast<void*>(at), bytes, MADV_HUGEPAGE);
    return reinterpret_cast<char*>(at);
}

}  // namespace

bool run_grid(const char* kernel, Entry entry, void** params, dim3 grid, dim3 threads) {
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (block.stacks == nullptr) {
        block.stacks = map_stacks();
        if (block.stacks == nullptr) return false;
    }
    block.entry = entry;
    block.params = params;
    block.kernel = kernel;
    struct sigaction fault = {}, old_segv = {}, old_bus = {};
    fault.sa_sigaction = on_fault;
    fault.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&fault.sa_mask);
    sigaction(SIGSEGV, &fault, &old_segv);
    sigaction(SIGBUS, &fault, &old_bus);
    gridDim = grid;
    blockDim = threads;
    const unsigned per_block = threads.x * threads.y * threads.z;
    // The last block first: a GPU runs blocks in no order, and a kernel
    // whose block reads what a lower one writes in the same launch would
    // pass if they ran in index order.
    for (unsigned z = grid.z; z-- > 0;) {
        for (unsigned y = grid.y; y-- > 0;) {
            for (unsigned x = grid.x; x-- > 0;) {
                blockIdx = {x, y, z};
                run_block(per_block, (x + y + z) % 2 == 1);
            }
        }
    }
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    return true;
}


}  // namespace cuda_emu
