// The tiled SGEMM core shared by the linear and conv2d kernels. build.rs
// pastes this file in place of `#include "sgemm.cuh"`, so NVRTC sees one
// self-contained source per op.
//
// C[M, N] = A[M, K] · B[K, N], one BM x BN tile of C per block of 256
// threads, in one of three tile shapes:
//
//   square, 4096 outputs: 64x64, and 32x128 for products of at most 32
//     rows (a layer with 32 channels), whose 64-row tiles would be half
//     padding. On the CUDA cores a thread owns a 4 x 4 register block (2
//     float4 shared loads per 16 FMAs), on the tensor cores a warp owns
//     32 x 16 (12 fragment loads per 4 mma).
//   wide, 64x256: a thread owns 8 x 8 (4 float4 loads per 64 FMAs), a warp
//     64 x 32 (24 fragment loads per 16 mma), and each staged element
//     feeds four times the products. (docs/gpu.md, "Wide tiles", says why
//     there is no 32-row wide shape.)
//
// A kernel's kind (`GemmKind` below: precision, tile, staging, each a
// template parameter) fixes its shapes; the host picks the shape among
// them per product and passes it as `tile_m` and `tile_n`. Every shape
// sums each output over k in the same order (FMA by FMA on the CUDA cores;
// on the tensor cores the same mma per 16 x 8 product and k step), so the
// shape never changes a bit; only the host's split-K plan does, and it
// does not depend on the shape.
//
// A and B are "loaders" that give the address of one element of an implicit
// matrix (im2col of an image, a transposed weight) without materialising
// it. An element's address is split in two halves so that no integer
// division runs per element:
//
//   typename L::Mn  mn_part(int mn)   once per thread, before the k loop
//   typename L::K   k_part(int k)     once per k per block, into shared memory
//   GemmElem at(const Mn&, const K&)  a few adds and compares: the
//                                      element's address, and whether it
//                                      is there (false: it reads as zero,
//                                      e.g. in the padding)
//
// Both stagings read through `at`: the register staging loads the address,
// the cp.async staging copies from it (zero fill where it is not there), so
// they stage the same values.
//
// A loader whose k half is a multiply or less says `K_TABLE = false`; its
// k halves are then computed where they are used, with no shared table.
//
// A loader's `K_FAST` says whether consecutive k are adjacent in memory;
// consecutive threads then walk k, so that global reads coalesce either way.
//
// K may be split over gridDim.z (split-K) for outputs with few tiles: each
// split writes its partial tile to a workspace, and a second kernel sums the
// partials in split order. The number of splits is a function of the shape
// alone (backend/cuda/gemm.rs), so results are identical run to run and on
// every GPU: no atomics, every sum has one fixed order.
//
// Every GEMM kernel comes in one entry point per kind, stamped by
// GEMM_VARIANTS (below) from one body: `_f32` multiplies on the CUDA cores,
// `_tf32` and `_bf16` on the tensor cores (mma.cuh, gemm_bf16.cuh; the
// host's `MatmulPrecision`), `w` marks the wide tiles (the host's
// `Fp32Tile::Wide`) and `_cp` the cp.async staging (`GemmStaging::CpAsync`).
// Loaders, split-K and stores are the same; a kernel holds only the
// products and the staging it runs, so no kernel pays another's registers
// or shared memory.
//
// The host mirrors GEMM_BK, GEMM_THREADS, the tile shapes, `GemmTiling` and
// the variants' list in variants.rs.

#define GEMM_BK 16
#define GEMM_THREADS 256
// Shared buffers of the cp.async staging (`gemm_tile`): loads run one k
// tile ahead. Three would not fit: the wide tile's 2 x 21.5 KiB is most of
// the 48 KiB of static shared memory, and conv2d_pool.cu's 16 KiB tile
// sits beside the square tiles' 2 x 10.5 KiB (docs/gpu.md, "cp.async
// staging").
#define GEMM_STAGES 2
// Outputs per block of the square shapes (64x64, 32x128): 256 threads x
// 4 x 4.
#define GEMM_TILE_ELEMS 4096

// Mirrors `GemmTiling` in backend/cuda/launch.rs: how one product is cut
// into blocks.
struct GemmTiling {
    unsigned long long k_chunk, splits, tile_m, tile_n;
};

// A GEMM kernel's kind, its three axes: how it multiplies, in which tiles,
// and how it stages them (`gemm_tile`).
enum GemmPrecision { GEMM_F32, GEMM_TF32, GEMM_BF16 };
enum GemmTiles { GEMM_SQUARE, GEMM_WIDE };
enum GemmStaging { GEMM_REGISTERS, GEMM_CP_ASYNC };

template <GemmPrecision P, GemmTiles T, GemmStaging S>
struct GemmKind {
    static const GemmPrecision PRECISION = P;
    static const GemmTiles TILES = T;
    static const GemmStaging STAGING = S;
};

// Buffers of one k tile a staging keeps in shared memory: the register
// staging one, cp.async GEMM_STAGES (it loads ahead into the others).
template <GemmStaging S>
struct StagedTiles {
    static const int N = S == GEMM_CP_ASYNC ? GEMM_STAGES : 1;
};

__device__ __forceinline__ int gemm_min(int a, int b) { return a < b ? a : b; }

// An operand element as a loader gives it: its address, base + off (a
// 32-bit offset, which takes half the registers of a pointer), read only
// where `there` (elsewhere the element is zero, and `off` may be anything).
struct GemmElem {
    const float* base;
    int off;
    bool there;
};

// An operand tile of R (BM or BN) rows by GEMM_BK k: each thread holds
// PER = R / 16 of its elements, and LDS is the shared row stride, R + PAD.
// PAD = 4 keeps rows 16-byte aligned for the float4 reads and turns the
// 16-way bank conflict of K-fast stores (a stride of R) into a 2-way one.
// The wide tensor-core tiles take PAD = 8: a fragment load (lane 4·g + t
// reads row k0 + t, column c + g: bank 8·t + g) then hits 32 banks, where
// PAD = 4 puts rows t and t + 1 on four common banks (2-way); K-fast
// stores become 4-way, and there are 20 stores per thread per k tile
// against 48 fragment loads.
template <int R_, int PAD>
struct OperandTile {
    static const int R = R_;
    static const int PER = R * GEMM_BK / GEMM_THREADS;
    static const int LDS = R + PAD;
};

// A BM x BN tile in one precision: its two operand tiles and the shared
// floats they take.
template <int BM_, int BN_, bool TF32_>
struct TileShape {
    static const int BM = BM_, BN = BN_;
    static const bool TF32 = TF32_;
    static const int PAD = TF32 && BM * BN > GEMM_TILE_ELEMS ? 8 : 4;
    typedef OperandTile<BM, PAD> A;
    typedef OperandTile<BN, PAD> B;
    static const int FLOATS = GEMM_BK * (A::LDS + B::LDS);
};

#include "fma.cuh"
#include "mma.cuh"
#include "cp_async.cuh"
#include "gemm_tile.cuh"

// Hands each in-range element of the tile to `store(m, n, value)`; acc is
// laid out as `fma_k_tile` or `mma_k_tile` left it.
template <class S, class ST>
__device__ __forceinline__ void gemm_store(
    const float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN], int M, int N,
    const ST& store) {
    typedef RegBlock<S::BM, S::BN> RB;
    const int m0 = blockIdx.y * S::BM, n0 = blockIdx.x * S::BN;
    if (S::TF32) {
        typedef MmaLane<S::BM, S::BN> W;
        const W l;
#pragma unroll
        for (int p = 0; p < W::MI * W::NI; ++p) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int m = m0 + l.wm + p / W::NI * 16 + l.g + r / 2 * 8;
                const int n = n0 + l.wn + p % W::NI * 8 + 2 * l.t + r % 2;
                if (m < M && n < N) store(m, n, acc[(4 * p + r) / RB::TN][(4 * p + r) % RB::TN]);
            }
        }
        return;
    }
    const int tx = threadIdx.x % RB::THREADS_N, ty = threadIdx.x / RB::THREADS_N;
#pragma unroll
    for (int i = 0; i < RB::TM; ++i) {
        const int m = m0 + ty * RB::TM + i;
#pragma unroll
        for (int j = 0; j < RB::TN; ++j) {
            const int n = n0 + RB::col(tx, j);
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}

template <int BM, int BN, bool TF32, int FLOATS, GemmStaging STAGING, class LA, class LB,
          class ST>
__device__ __forceinline__ void gemm_shaped(const LA& a, const LB& b, int M, int N, int K,
                                            const GemmTiling& t, const ST& store) {
    typedef TileShape<BM, BN, TF32> S;
    float acc[RegBlock<BM, BN>::TM][RegBlock<BM, BN>::TN];
    gemm_tile<S, FLOATS, STAGING>(a, b, M, N, K, (int)t.k_chunk, acc);
    gemm_store<S>(acc, M, N, store);
}

#include "gemm_bf16.cuh"

// The shapes a kernel of KIND holds, and the one the host chose for this
// product (`tile_m`). Each kind stages its tiles in the shared floats of
// its largest shape, as many buffers as its staging keeps.
template <class KIND>
struct GemmShapes;
template <GemmPrecision P, GemmStaging STAGING>
struct GemmShapes<GemmKind<P, GEMM_SQUARE, STAGING> > {
    template <class LA, class LB, class ST>
    static __device__ __forceinline__ void run(const LA& a, const LB& b, int M, int N, int K,
                                               const GemmTiling& t, const ST& store) {
        const bool TF32 = P == GEMM_TF32;
        const int F = StagedTiles<STAGING>::N * TileShape<32, 128, TF32>::FLOATS;
        if (t.tile_m == 32) {
            gemm_shaped<32, 128, TF32, F, STAGING>(a, b, M, N, K, t, store);
        } else {
            gemm_shaped<64, 64, TF32, F, STAGING>(a, b, M, N, K, t, store);
        }
    }
};
template <GemmPrecision P, GemmStaging STAGING>
struct GemmShapes<GemmKind<P, GEMM_WIDE, STAGING> > {
    template <class LA, class LB, class ST>
    static __device__ __forceinline__ void run(const LA& a, const LB& b, int M, int N, int K,
                                               const GemmTiling& t, const ST& store) {
        const bool TF32 = P == GEMM_TF32;
        const int F = StagedTiles<STAGING>::N * TileShape<64, 256, TF32>::FLOATS;
        gemm_shaped<64, 256, TF32, F, STAGING>(a, b, M, N, K, t, store);
    }
};
template <>
struct GemmShapes<GemmKind<GEMM_BF16, GEMM_SQUARE, GEMM_REGISTERS> > {
    template <class LA, class LB, class ST>
    static __device__ __forceinline__ void run(const LA& a, const LB& b, int M, int N, int K,
                                               const GemmTiling& t, const ST& store) {
        gemm_bf16(a, b, M, N, K, t, store);
    }
};

// The block's tile (or split's partial tile) of a·b, handed to `store`, in
// the tile shape the host chose among those of KIND.
template <class KIND, class LA, class LB, class ST>
__device__ __forceinline__ void gemm(const LA& a, const LB& b, int M, int N, int K,
                                     const GemmTiling& t, const ST& store) {
    GemmShapes<KIND>::run(a, b, M, N, K, t, store);
}

// The kinds a GEMM kernel comes in, one line each: its entry point's
// suffix and its kind. `GEMM_VARIANTS(name, STAMP)` expands
// `STAMP(name_<suffix>, kind)` for every kind, `GEMM_SQUARE_VARIANTS` for
// those in the square tiles (conv2d_pool.cu's fused kernel, whose tile of
// outputs beside a wide staging would not fit). The host's list
// (`gemm_variants!`, variants.rs) names the same suffixes in the same order; a
// test in ops/kernels_tests.rs compares the two.
typedef GemmKind<GEMM_F32, GEMM_SQUARE, GEMM_REGISTERS> GemmF32;
typedef GemmKind<GEMM_F32, GEMM_SQUARE, GEMM_CP_ASYNC> GemmF32Cp;
typedef GemmKind<GEMM_TF32, GEMM_SQUARE, GEMM_REGISTERS> GemmTf32;
typedef GemmKind<GEMM_TF32, GEMM_SQUARE, GEMM_CP_ASYNC> GemmTf32Cp;
typedef GemmKind<GEMM_BF16, GEMM_SQUARE, GEMM_REGISTERS> GemmBf16;
typedef GemmKind<GEMM_F32, GEMM_WIDE, GEMM_REGISTERS> GemmF32Wide;
typedef GemmKind<GEMM_F32, GEMM_WIDE, GEMM_CP_ASYNC> GemmF32WideCp;
typedef GemmKind<GEMM_TF32, GEMM_WIDE, GEMM_REGISTERS> GemmTf32Wide;
typedef GemmKind<GEMM_TF32, GEMM_WIDE, GEMM_CP_ASYNC> GemmTf32WideCp;
#define GEMM_SQUARE_VARIANTS(NAME, STAMP) \
    STAMP(NAME##_f32, GemmF32)            \
    STAMP(NAME##_f32_cp, GemmF32Cp)       \
    STAMP(NAME##_tf32, GemmTf32)          \
    STAMP(NAME##_tf32_cp, GemmTf32Cp)     \
    STAMP(NAME##_bf16, GemmBf16)
#define GEMM_VARIANTS(NAME, STAMP)         \
    GEMM_SQUARE_VARIANTS(NAME, STAMP)      \
    STAMP(NAME##_f32w, GemmF32Wide)        \
    STAMP(NAME##_f32w_cp, GemmF32WideCp)   \
    STAMP(NAME##_tf32w, GemmTf32Wide)      \
    STAMP(NAME##_tf32w_cp, GemmTf32WideCp)

// The head of every GEMM entry point a STAMP macro writes. GEMM_ENTRY
// leaves the registers to ptxas in every kind (256 threads per block, so
// at most 255). GEMM_ENTRY_BOUNDS(KIND, f32, f32_cp, tf32, tf32_cp, bf16,
// f32w, f32w_cp, tf32w, tf32w_cp) lists the family's bound for each kind
// and picks KIND's (GEMM_PICK_<kind>):
//   ANY        ptxas's choice, as GEMM_ENTRY;
//   BLOCKS(n)  n blocks of 256 threads per SM, so at most 64K / (256 n)
//              registers (4: 64, 3: 80, 2: 128): where ptxas would stop
//              short of that occupancy step, or spill aiming at it;
//   REGS(n)    at most n registers (`__maxnreg__`), a bound between the
//              steps or where BLOCKS spills. NVRTC takes no thread bound
//              beside it, and the 256-thread bound shapes NVVM's and
//              ptxas's code (in its place `__maxnreg__(255)` gave
//              linear_fwd_f32 80 registers, not 73): REGS only where needed.
// The bounds hold each kind at or below the registers its family's kernel
// took when it held both stagings (and the wide one both precisions);
// nvrtc_compile asserts those ceilings and no spill (docs/gpu.md,
// "cp.async staging"). A kind added to the lists gets a GEMM_PICK_ line,
// `(...) ANY` until its families bound it.
#define GEMM_ENTRY extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
#define GEMM_ENTRY_BOUNDS(KIND, ...) \
    extern "C" __global__ void GEMM_BOUND(GEMM_PICK_##KIND(__VA_ARGS__))
#define GEMM_BOUND(B) GEMM_BOUND_OF(B)
#define GEMM_BOUND_OF(B) GEMM_BOUND_##B
#define GEMM_BOUND_ANY __launch_bounds__(GEMM_THREADS)
#define GEMM_BOUND_BLOCKS(N) __launch_bounds__(GEMM_THREADS, N)
#define GEMM_BOUND_REGS(N) __maxnreg__(N)
#define GEMM_PICK_GemmF32(B, ...) B
#define GEMM_PICK_GemmF32Cp(A, B, ...) B
#define GEMM_PICK_GemmTf32(A, A2, B, ...) B
#define GEMM_PICK_GemmTf32Cp(A, A2, A3, B, ...) B
#define GEMM_PICK_GemmBf16(A, A2, A3, A4, B, ...) B
#define GEMM_PICK_GemmF32Wide(A, A2, A3, A4, A5, B, ...) B
#define GEMM_PICK_GemmF32WideCp(A, A2, A3, A4, A5, A6, B, ...) B
#define GEMM_PICK_GemmTf32Wide(A, A2, A3, A4, A5, A6, A7, B, ...) B
#define GEMM_PICK_GemmTf32WideCp(A, A2, A3, A4, A5, A6, A7, A8, B) B

// An operand whose element (mn, k) lies at p[mn_part + k_part]: both halves
// are plain offsets. Loaders derive from it and add `mn_part` and `k_part`
// returning ints.
struct Offsets {
    static const bool K_TABLE = false;
    const float* p;
    __device__ GemmElem at(int mn, int k) const { return GemmElem{p, mn + k, true}; }
};

// The partial-result store of split blockIdx.z: workspace[z][M][N].
struct PartialStore {
    float* ws;
    int M, N;
    __device__ void operator()(int m, int n, float v) const {
        ws[(blockIdx.z * M + m) * N + n] = v;
    }
};

// Row-major C[M, N] with leading dimension `ld`.
struct PlainStore {
    float* c;
    int ld;
    __device__ void operator()(int m, int n, float v) const { c[m * ld + n] = v; }
};

// At least this many splits are summed by a warp per element (below).
#define GEMM_WIDE_REDUCE_SPLITS 32

// Sums the `splits` partials ws[s · M·N + e] of element e = m·N + n with a
// warp: lane l adds splits l, l + 32, ... in order, then the lanes are added
// pairwise in a fixed tree through shared memory, so the order is fixed by
// `splits` alone. A block of GEMM_THREADS holds GEMM_THREADS / 32 elements,
// and the host launches one block per that many. A chain of one load after
// another would leave the GPU waiting on each (conv1's weight gradient sums
// 169 splits); here a warp's loads are in flight together.
template <class S>
__device__ __forceinline__ void sum_splits_by_warp(const float* ws, int M, int N, int splits,
                                                   const S& store) {
    const int total = M * N;
    __shared__ float lanes[GEMM_THREADS];
    const int lane = threadIdx.x % 32;
    const int e = blockIdx.x * (GEMM_THREADS / 32) + threadIdx.x / 32;
    float sum = 0.0f;
    if (e < total) {
        for (int s = lane; s < splits; s += 32) sum += ws[s * total + e];
    }
    lanes[threadIdx.x] = sum;
    __syncthreads();
    for (int width = 16; width > 0; width /= 2) {
        if (lane < width) lanes[threadIdx.x] += lanes[threadIdx.x + width];
        __syncthreads();
    }
    if (lane == 0 && e < total) store(e / N, e % N, lanes[threadIdx.x]);
}

// Sums the `splits` partials of every element and hands the sum to
// `store`, in an order fixed by `splits` alone. Up to
// GEMM_WIDE_REDUCE_SPLITS splits: one thread per element, grid-stride,
// adding the splits in order; from there a warp per element
// (`sum_splits_by_warp`; `GemmPlan::reduce` launches for either).
template <class S>
__device__ __forceinline__ void gemm_reduce(const float* ws, int M, int N, int splits,
                                            const S& store) {
    const int total = M * N;
    if (splits >= GEMM_WIDE_REDUCE_SPLITS) {
        sum_splits_by_warp(ws, M, N, splits, store);
        return;
    }
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        float sum = ws[e];
        for (int s = 1; s < splits; ++s) sum += ws[s * total + e];
        store(e / N, e % N, sum);
    }
}
