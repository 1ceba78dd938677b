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
// The host picks the shape per product and passes it as `tile_m` and
// `tile_n`, and `tensor_cores` for the wide kernels, which hold both
// precisions; `gemm` dispatches on them. Every shape sums each output over
// k in the same order (FMA by FMA on the CUDA cores; on the tensor cores the
// same mma per 16 x 8 product and k step), so the shape never changes a
// bit; only the host's split-K plan does, and it does not depend on the
// shape.
//
// A and B are "loaders" that read one element of an implicit matrix (im2col
// of an image, a transposed weight) without materialising it. An element's
// address is split in two halves so that no integer division runs per
// element:
//
//   typename L::Mn  mn_part(int mn)   once per thread, before the k loop
//   typename L::K   k_part(int k)     once per k per block, into shared memory
//   float at(const Mn&, const K&)     a few adds and compares
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
// Every GEMM kernel comes in four entry points: `_f32` multiplies on the
// CUDA cores in the square tiles, `_tf32` and `_bf16` on the tensor cores
// (mma.cuh, gemm_bf16.cuh; the host's `MatmulPrecision`) in the square
// tiles, `_f32w` in the wide tiles in float32 or TF32 (the host's
// `Fp32Tile::Wide`). Staging, loaders, split-K and stores are the same; a
// kernel holds only the products it runs, so the square kernels do not pay
// the wide ones' registers.
//
// The host mirrors GEMM_BK, GEMM_THREADS, the tile shapes and `GemmTiling`
// in gemm.rs.

#define GEMM_BK 16
#define GEMM_THREADS 256
// Outputs per block of the square shapes (64x64, 32x128): 256 threads x
// 4 x 4.
#define GEMM_TILE_ELEMS 4096

// Mirrors `GemmTiling` in backend/cuda/gemm.rs: how one product is cut
// into blocks, and (read by the wide kernels) whether it runs on the
// tensor cores.
struct GemmTiling {
    unsigned long long k_chunk, splits, tile_m, tile_n, tensor_cores;
};

__device__ __forceinline__ int gemm_min(int a, int b) { return a < b ? a : b; }

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

// Where thread `tid` stores its i-th element of an R x 16 operand tile
// (R divides GEMM_THREADS): K-fast, consecutive threads walk k; else mn.
template <int R, bool K_FAST>
__device__ __forceinline__ int tile_mn(int tid, int i) {
    return K_FAST ? tid / GEMM_BK + i * (GEMM_THREADS / GEMM_BK) : tid % R;
}
template <int R, bool K_FAST>
__device__ __forceinline__ int tile_k(int tid, int i) {
    return K_FAST ? tid % GEMM_BK : tid / R + i * (GEMM_THREADS / R);
}

// This thread's elements of an operand tile T at (mn0, ·): the mn half of
// each address and whether it lies inside [0, MN).
template <class T, class L>
struct Rows {
    typename L::Mn part[T::PER];
    bool inside[T::PER];
};

template <class T, class L>
__device__ __forceinline__ Rows<T, L> gemm_rows(const L& load, int mn0, int MN) {
    Rows<T, L> rows;
#pragma unroll
    for (int i = 0; i < T::PER; ++i) {
        const int mn = mn0 + tile_mn<T::R, L::K_FAST>(threadIdx.x, i);
        rows.inside[i] = mn < MN;
        rows.part[i] = load.mn_part(rows.inside[i] ? mn : 0);
    }
    return rows;
}

// The k halves of the tile starting at kt, one thread per k: threads
// [first, first + GEMM_BK) fill `ks`. Past the end the entries are never read.
template <class L>
__device__ __forceinline__ void gemm_k_parts(const L& load, int first, int kt, int k_end,
                                             typename L::K* ks) {
    const int j = (int)threadIdx.x - first;
    if (L::K_TABLE && j >= 0 && j < GEMM_BK) ks[j] = load.k_part(gemm_min(kt + j, k_end - 1));
}

// Reads this thread's elements of the operand tile at kt into registers;
// elements outside [0, MN) x [kt, k_end) read as zero.
template <class T, class L>
__device__ __forceinline__ void gemm_fetch(const L& load, const Rows<T, L>& rows,
                                           const typename L::K* ks, int kt, int k_end,
                                           float (&r)[T::PER]) {
#pragma unroll
    for (int i = 0; i < T::PER; ++i) {
        const int j = tile_k<T::R, L::K_FAST>(threadIdx.x, i);
        if (rows.inside[i] && kt + j < k_end) {
            r[i] = load.at(rows.part[i], L::K_TABLE ? ks[j] : load.k_part(kt + j));
        } else {
            r[i] = 0.0f;
        }
    }
}

template <class T, class L, bool TF32>
__device__ __forceinline__ void gemm_stash(float (*tile)[T::LDS], const float (&r)[T::PER]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < T::PER; ++i) {
        tile[tile_k<T::R, L::K_FAST>(tid, i)][tile_mn<T::R, L::K_FAST>(tid, i)] =
            TF32 ? tf32_round(r[i]) : r[i];
    }
}

// The staged operand tiles As and Bs of whichever shape runs: one buffer
// per kernel, sized for the largest shape it holds (FLOATS). A kernel holds
// the code of every shape of its kind, and a static array per shape would
// add up past the 48 KiB of static shared memory.
template <int FLOATS>
__device__ __forceinline__ float* gemm_shared() {
    __shared__ __align__(16) float staged[FLOATS];
    return staged;
}

// The product of one staged k tile: `fma_k_tile` on the CUDA cores, or
// `mma_k_tile` on the tensor cores (only the chosen one is instantiated).
template <bool TF32>
struct KTileProduct {
    template <class S>
    static __device__ __forceinline__ void run(
        const float (*As)[S::A::LDS], const float (*Bs)[S::B::LDS],
        const MmaLane<S::BM, S::BN>&,
        float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
        fma_k_tile<S>(As, Bs, acc);
    }
};
template <>
struct KTileProduct<true> {
    template <class S>
    static __device__ __forceinline__ void run(
        const float (*As)[S::A::LDS], const float (*Bs)[S::B::LDS],
        const MmaLane<S::BM, S::BN>& lane,
        float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
        mma_k_tile<S>(As, Bs, lane, acc);
    }
};

// This thread's TM x TN elements of the tile at (m0, n0) = (BM·blockIdx.y,
// BN·blockIdx.x) over the block's k range (split blockIdx.z of k_chunk), in
// the layout of `fma_k_tile` or `mma_k_tile` (`gemm_store` maps them), with
// the operand tiles staged in a buffer of FLOATS.
template <class S, int FLOATS, class LA, class LB>
__device__ __forceinline__ void gemm_tile(
    const LA& a, const LB& b, int M, int N, int K, int k_chunk,
    float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
    typedef typename S::A TA;
    typedef typename S::B TB;
    typedef RegBlock<S::BM, S::BN> RB;
    // Rows of LDS floats, a multiple of 4: both tiles start 16-byte aligned.
    float(*As)[TA::LDS] = reinterpret_cast<float(*)[TA::LDS]>(gemm_shared<FLOATS>());
    float(*Bs)[TB::LDS] =
        reinterpret_cast<float(*)[TB::LDS]>(gemm_shared<FLOATS>() + GEMM_BK * TA::LDS);
    // The k halves of the next tile's addresses, double-buffered: one buffer
    // is read by this tile's fetch while the other is filled for the next.
    __shared__ typename LA::K a_ks[2][GEMM_BK];
    __shared__ typename LB::K b_ks[2][GEMM_BK];
    const int m0 = blockIdx.y * S::BM, n0 = blockIdx.x * S::BN;
    const int k_begin = blockIdx.z * k_chunk;
    const int k_end = gemm_min(K, k_begin + k_chunk);
#pragma unroll
    for (int i = 0; i < RB::TM; ++i) {
#pragma unroll
        for (int j = 0; j < RB::TN; ++j) acc[i][j] = 0.0f;
    }
    if (k_begin >= k_end) return;
    const Rows<TA, LA> a_rows = gemm_rows<TA>(a, m0, M);
    const Rows<TB, LB> b_rows = gemm_rows<TB>(b, n0, N);
    gemm_k_parts(a, 0, k_begin, k_end, a_ks[0]);
    gemm_k_parts(b, GEMM_BK, k_begin, k_end, b_ks[0]);
    __syncthreads();
    float ra[TA::PER], rb[TB::PER];
    gemm_fetch<TA>(a, a_rows, a_ks[0], k_begin, k_end, ra);
    gemm_fetch<TB>(b, b_rows, b_ks[0], k_begin, k_end, rb);
    const MmaLane<S::BM, S::BN> lane;  // read by the tensor-core product only
    int buf = 0;
    for (int kt = k_begin; kt < k_end; kt += GEMM_BK) {
        const bool more = kt + GEMM_BK < k_end;
        gemm_stash<TA, LA, S::TF32>(As, ra);
        gemm_stash<TB, LB, S::TF32>(Bs, rb);
        if (more) {
            gemm_k_parts(a, 0, kt + GEMM_BK, k_end, a_ks[buf ^ 1]);
            gemm_k_parts(b, GEMM_BK, kt + GEMM_BK, k_end, b_ks[buf ^ 1]);
        }
        __syncthreads();
        // The next tile's global reads are in flight while this one computes.
        if (more) {
            buf ^= 1;
            gemm_fetch<TA>(a, a_rows, a_ks[buf], kt + GEMM_BK, k_end, ra);
            gemm_fetch<TB>(b, b_rows, b_ks[buf], kt + GEMM_BK, k_end, rb);
        }
        KTileProduct<S::TF32>::template run<S>(As, Bs, lane, acc);
        __syncthreads();
    }
}

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

template <int BM, int BN, bool TF32, int FLOATS, class LA, class LB, class ST>
__device__ __forceinline__ void gemm_shaped(const LA& a, const LB& b, int M, int N, int K,
                                            int k_chunk, const ST& store) {
    typedef TileShape<BM, BN, TF32> S;
    float acc[RegBlock<BM, BN>::TM][RegBlock<BM, BN>::TN];
    gemm_tile<S, FLOATS>(a, b, M, N, K, k_chunk, acc);
    gemm_store<S>(acc, M, N, store);
}

#include "gemm_bf16.cuh"

// What a GEMM entry point holds: float32 products in the square tiles
// (`_f32`), TF32 ones on the tensor cores in the square tiles (`_tf32`), or
// either in the wide tiles (`_f32w`, which the host launches for the
// products it plans in those: its registers are the wide tiles', so the
// other kinds do not pay for them).
#define GEMM_F32 0
#define GEMM_TF32 1
#define GEMM_F32_WIDE 2
#define GEMM_BF16 3  // bf16 operands on the tensor cores (gemm_bf16.cuh)

// The shapes a kernel of KIND holds, and the one the host chose for this
// product (`tile_m`; for the wide kind, `tensor_cores`). Each kind stages
// its tiles in the shared floats of its largest shape.
template <int KIND>
struct GemmShapes {
    template <class LA, class LB, class ST>
    static __device__ __forceinline__ void run(const LA& a, const LB& b, int M, int N, int K,
                                               const GemmTiling& t, const ST& store) {
        const bool TF32 = KIND == GEMM_TF32;
        const int F = TileShape<32, 128, TF32>::FLOATS;
        if (t.tile_m == 32) {
            gemm_shaped<32, 128, TF32, F>(a, b, M, N, K, (int)t.k_chunk, store);
        } else {
            gemm_shaped<64, 64, TF32, F>(a, b, M, N, K, (int)t.k_chunk, store);
        }
    }
};
template <>
struct GemmShapes<GEMM_F32_WIDE> {
    template <class LA, class LB, class ST>
    static __device__ __forceinline__ void run(const LA& a, const LB& b, int M, int N, int K,
                                               const GemmTiling& t, const ST& store) {
        const int F = TileShape<64, 256, true>::FLOATS;
        if (t.tensor_cores) {
            gemm_shaped<64, 256, true, F>(a, b, M, N, K, (int)t.k_chunk, store);
        } else {
            gemm_shaped<64, 256, false, F>(a, b, M, N, K, (int)t.k_chunk, store);
        }
    }
};

template <>
struct GemmShapes<GEMM_BF16> {
    template <class LA, class LB, class ST>
    static __device__ __forceinline__ void run(const LA& a, const LB& b, int M, int N, int K,
                                               const GemmTiling& t, const ST& store) {
        gemm_bf16(a, b, M, N, K, t, store);
    }
};

// The block's tile (or split's partial tile) of a·b, handed to `store`, in
// the tile shape the host chose among those of KIND.
template <int KIND, class LA, class LB, class ST>
__device__ __forceinline__ void gemm(const LA& a, const LB& b, int M, int N, int K,
                                     const GemmTiling& t, const ST& store) {
    GemmShapes<KIND>::run(a, b, M, N, K, t, store);
}

// An operand whose element (mn, k) lies at p[mn_part + k_part]: both halves
// are plain offsets. Loaders derive from it and add `mn_part` and `k_part`
// returning ints.
struct Offsets {
    static const bool K_TABLE = false;
    const float* p;
    __device__ float at(int mn, int k) const { return p[mn + k]; }
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
