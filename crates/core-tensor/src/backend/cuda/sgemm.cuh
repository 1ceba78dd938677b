// The tiled SGEMM core shared by the linear and conv2d kernels. build.rs
// pastes this file in place of `#include "sgemm.cuh"`, so NVRTC sees one
// self-contained source per op.
//
// C[M, N] = A[M, K] · B[K, N], one BM x BN tile of C per block of 256
// threads, each thread owning a 4 x TN register block. Three tile shapes:
// 64x64 (TN = 4), 32x128 (TN = 4) for products with at most 32 rows (a
// layer with 32 channels), whose 64-row tiles would be half padding, and
// 64x128 (TN = 8, float32 only), which loads 12 operands from shared
// memory per 32 FMAs instead of 8 per 16. The host picks one per product
// and passes it as `tile_m` and `tile_n`; `gemm` dispatches on them. Every
// shape sums each output over k in the same order, so the shape never
// changes a bit; only the host's split-K plan does, and it does not depend
// on the shape.
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
// CUDA cores, `_tf32` and `_bf16` on the tensor cores (mma.cuh,
// gemm_bf16.cuh; the host's `MatmulPrecision`), `_f32w` on the CUDA cores
// with the 64 x 128 tile too (the host's `Fp32Tile`). Staging, loaders, split-K and stores
// are the same; a kernel holds only the products it runs, so none costs
// another registers.
//
// The host mirrors GEMM_BK, GEMM_THREADS, the tile shapes and `GemmTiling`
// in gemm.rs.

#define GEMM_BK 16
#define GEMM_THREADS 256
// Outputs per block of the tensor-core shapes (64x64, 32x128): 256 threads
// x 4 x 4.
#define GEMM_TILE_ELEMS 4096

// Mirrors `GemmTiling` in backend/cuda/gemm.rs: how one product is cut
// into blocks.
struct GemmTiling {
    unsigned long long k_chunk, splits, tile_m, tile_n;
};

// A thread's register block in a BM x BN tile: 4 rows by TN columns, the
// columns in TN / 4 groups of 4 that lie BN / (TN / 4) apart, so that the
// threads of a warp read one contiguous run of B per group.
template <int BM, int BN>
struct RegBlock {
    static const int TN = BM * BN / GEMM_THREADS / 4;
    static const int GROUPS = TN / 4;
    static const int THREADS_N = BN / TN;
    // The tile column of this thread's column j.
    static __device__ __forceinline__ int col(int tx, int j) {
        return j / 4 * (BN / GROUPS) + tx * 4 + j % 4;
    }
};

__device__ __forceinline__ int gemm_min(int a, int b) { return a < b ? a : b; }

// An operand tile of R (BM or BN) rows by GEMM_BK k: each thread holds
// PER = R / 16 of its elements, and LDS is the shared row stride. R + 4 keeps
// rows 16-byte aligned for the float4 reads and turns the 16-way bank
// conflict of K-fast stores (a stride of R) into a 2-way one.
template <int R>
struct OperandTile {
    static const int PER = R * GEMM_BK / GEMM_THREADS;
    static const int LDS = R + 4;
};

#include "mma.cuh"

// Where thread `tid` stores its i-th element of an R x 16 operand tile.
template <int R, bool K_FAST>
__device__ __forceinline__ int tile_mn(int tid, int i) {
    return K_FAST ? tid / GEMM_BK + i * (GEMM_THREADS / GEMM_BK) : tid % R;
}
template <int R, bool K_FAST>
__device__ __forceinline__ int tile_k(int tid, int i) {
    return K_FAST ? tid % GEMM_BK : tid / R + i * (GEMM_THREADS / R);
}

// This thread's elements of an R-row operand tile at (mn0, ·): the mn half
// of each address and whether it lies inside [0, MN).
template <int R, class L>
struct Rows {
    typename L::Mn part[OperandTile<R>::PER];
    bool inside[OperandTile<R>::PER];
};

template <int R, class L>
__device__ __forceinline__ Rows<R, L> gemm_rows(const L& load, int mn0, int MN) {
    Rows<R, L> rows;
#pragma unroll
    for (int i = 0; i < OperandTile<R>::PER; ++i) {
        const int mn = mn0 + tile_mn<R, L::K_FAST>(threadIdx.x, i);
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
template <int R, class L>
__device__ __forceinline__ void gemm_fetch(const L& load, const Rows<R, L>& rows,
                                           const typename L::K* ks, int kt, int k_end,
                                           float (&r)[OperandTile<R>::PER]) {
#pragma unroll
    for (int i = 0; i < OperandTile<R>::PER; ++i) {
        const int j = tile_k<R, L::K_FAST>(threadIdx.x, i);
        if (rows.inside[i] && kt + j < k_end) {
            r[i] = load.at(rows.part[i], L::K_TABLE ? ks[j] : load.k_part(kt + j));
        } else {
            r[i] = 0.0f;
        }
    }
}

template <int R, class L, bool TF32>
__device__ __forceinline__ void gemm_stash(float (*tile)[OperandTile<R>::LDS],
                                           const float (&r)[OperandTile<R>::PER]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < OperandTile<R>::PER; ++i) {
        tile[tile_k<R, L::K_FAST>(tid, i)][tile_mn<R, L::K_FAST>(tid, i)] =
            TF32 ? tf32_round(r[i]) : r[i];
    }
}

// acc += this thread's share of As·Bs on the CUDA cores: a 4 x TN block at
// rows 4·ty, columns `RegBlock::col(tx, ·)` of the tile.
template <int BM, int BN>
__device__ __forceinline__ void fma_k_tile(const float (*As)[OperandTile<BM>::LDS],
                                           const float (*Bs)[OperandTile<BN>::LDS],
                                           float (&acc)[4][RegBlock<BM, BN>::TN]) {
    typedef RegBlock<BM, BN> RB;
    const int tx = threadIdx.x % RB::THREADS_N, ty = threadIdx.x / RB::THREADS_N;
#pragma unroll
    for (int k = 0; k < GEMM_BK; ++k) {
        const float4 av = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
        const float ai[4] = {av.x, av.y, av.z, av.w};
        float bj[RB::TN];
#pragma unroll
        for (int g = 0; g < RB::GROUPS; ++g) {
            const float4 bv = *reinterpret_cast<const float4*>(&Bs[k][RB::col(tx, 4 * g)]);
            bj[4 * g] = bv.x;
            bj[4 * g + 1] = bv.y;
            bj[4 * g + 2] = bv.z;
            bj[4 * g + 3] = bv.w;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < RB::TN; ++j) acc[i][j] = fmaf(ai[i], bj[j], acc[i][j]);
        }
    }
}

// The staged operand tiles As and Bs of whichever shape runs: one buffer
// per kernel, sized for the largest (64 x 128). A kernel holds the code of
// every shape, and a static array per shape would add up past the 48 KiB
// of static shared memory (the input gradient's two loaders: 67.5 KiB).
#define GEMM_SHARED_FLOATS (GEMM_BK * (64 + 4) + GEMM_BK * (128 + 4))
__device__ __forceinline__ float* gemm_shared() {
    __shared__ __align__(16) float staged[GEMM_SHARED_FLOATS];
    return staged;
}

// The product of one staged k tile: `fma_k_tile` on the CUDA cores, or
// `mma_k_tile` on the tensor cores (for their 4096-element shapes only;
// only the chosen one is instantiated).
template <bool TF32>
struct KTileProduct {
    template <int BM, int BN>
    static __device__ __forceinline__ void run(const float (*As)[OperandTile<BM>::LDS],
                                               const float (*Bs)[OperandTile<BN>::LDS],
                                               const MmaLane<BM>&,
                                               float (&acc)[4][RegBlock<BM, BN>::TN]) {
        fma_k_tile<BM, BN>(As, Bs, acc);
    }
};
template <>
struct KTileProduct<true> {
    template <int BM, int BN>
    static __device__ __forceinline__ void run(const float (*As)[OperandTile<BM>::LDS],
                                               const float (*Bs)[OperandTile<BN>::LDS],
                                               const MmaLane<BM>& lane,
                                               float (&acc)[4][RegBlock<BM, BN>::TN]) {
        mma_k_tile<BM>(As, Bs, lane, acc);
    }
};

// This thread's 4 x TN elements of the tile at (m0, n0) = (BM·blockIdx.y,
// BN·blockIdx.x) over the block's k range (split blockIdx.z of k_chunk), in
// the layout of `fma_k_tile` or `mma_k_tile` (`gemm_store` maps them).
template <int BM, int BN, bool TF32, class LA, class LB>
__device__ __forceinline__ void gemm_tile(const LA& a, const LB& b, int M, int N, int K,
                                          int k_chunk, float (&acc)[4][RegBlock<BM, BN>::TN]) {
    typedef OperandTile<BM> TA;
    typedef OperandTile<BN> TB;
    // Rows of LDS floats, a multiple of 4: both tiles start 16-byte aligned.
    float(*As)[TA::LDS] = reinterpret_cast<float(*)[TA::LDS]>(gemm_shared());
    float(*Bs)[TB::LDS] = reinterpret_cast<float(*)[TB::LDS]>(gemm_shared() + GEMM_BK * TA::LDS);
    // The k halves of the next tile's addresses, double-buffered: one buffer
    // is read by this tile's fetch while the other is filled for the next.
    __shared__ typename LA::K a_ks[2][GEMM_BK];
    __shared__ typename LB::K b_ks[2][GEMM_BK];
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_begin = blockIdx.z * k_chunk;
    const int k_end = gemm_min(K, k_begin + k_chunk);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < RegBlock<BM, BN>::TN; ++j) acc[i][j] = 0.0f;
    }
    if (k_begin >= k_end) return;
    const Rows<BM, LA> a_rows = gemm_rows<BM>(a, m0, M);
    const Rows<BN, LB> b_rows = gemm_rows<BN>(b, n0, N);
    gemm_k_parts(a, 0, k_begin, k_end, a_ks[0]);
    gemm_k_parts(b, GEMM_BK, k_begin, k_end, b_ks[0]);
    __syncthreads();
    float ra[TA::PER], rb[TB::PER];
    gemm_fetch<BM>(a, a_rows, a_ks[0], k_begin, k_end, ra);
    gemm_fetch<BN>(b, b_rows, b_ks[0], k_begin, k_end, rb);
    const MmaLane<BM> lane;  // read by the tensor-core product only
    int buf = 0;
    for (int kt = k_begin; kt < k_end; kt += GEMM_BK) {
        const bool more = kt + GEMM_BK < k_end;
        gemm_stash<BM, LA, TF32>(As, ra);
        gemm_stash<BN, LB, TF32>(Bs, rb);
        if (more) {
            gemm_k_parts(a, 0, kt + GEMM_BK, k_end, a_ks[buf ^ 1]);
            gemm_k_parts(b, GEMM_BK, kt + GEMM_BK, k_end, b_ks[buf ^ 1]);
        }
        __syncthreads();
        // The next tile's global reads are in flight while this one computes.
        if (more) {
            buf ^= 1;
            gemm_fetch<BM>(a, a_rows, a_ks[buf], kt + GEMM_BK, k_end, ra);
            gemm_fetch<BN>(b, b_rows, b_ks[buf], kt + GEMM_BK, k_end, rb);
        }
        KTileProduct<TF32>::template run<BM, BN>(As, Bs, lane, acc);
        __syncthreads();
    }
}

// Hands each in-range element of the tile to `store(m, n, value)`; acc is
// laid out as `fma_k_tile` or `mma_k_tile` left it.
template <int BM, int BN, bool TF32, class S>
__device__ __forceinline__ void gemm_store(const float (&acc)[4][RegBlock<BM, BN>::TN], int M,
                                           int N, const S& store) {
    typedef RegBlock<BM, BN> RB;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    if (TF32) {
        // acc[2·mi + ni][r]: C fragment element r of the warp's product (mi, ni).
        const MmaLane<BM> l;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int m = m0 + l.wm + i / 2 * 16 + l.g + r / 2 * 8;
                const int n = n0 + l.wn + i % 2 * 8 + 2 * l.t + r % 2;
                if (m < M && n < N) store(m, n, acc[i][r]);
            }
        }
        return;
    }
    const int tx = threadIdx.x % RB::THREADS_N, ty = threadIdx.x / RB::THREADS_N;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < RB::TN; ++j) {
            const int n = n0 + RB::col(tx, j);
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}

template <int BM, int BN, bool TF32, class LA, class LB, class S>
__device__ __forceinline__ void gemm_shaped(const LA& a, const LB& b, int M, int N, int K,
                                            int k_chunk, const S& store) {
    float acc[4][RegBlock<BM, BN>::TN];
    gemm_tile<BM, BN, TF32>(a, b, M, N, K, k_chunk, acc);
    gemm_store<BM, BN, TF32>(acc, M, N, store);
}

#include "gemm_bf16.cuh"

// What a GEMM entry point holds: float32 products in the square tiles
// (`_f32`), TF32 ones on the tensor cores (`_tf32`), or float32 in the
// 64 x 128 tile as well (`_f32w`, which the host launches for the products
// it plans in that tile: its registers are the wide tile's, so the other
// kinds do not pay for them).
#define GEMM_F32 0
#define GEMM_TF32 1
#define GEMM_F32_WIDE 2
#define GEMM_BF16 3  // bf16 operands on the tensor cores (gemm_bf16.cuh)

// The block's tile (or split's partial tile) of a·b, handed to `store`, in
// the tile shape the host chose (`tile_m` x `tile_n`) among those of KIND.
template <int KIND, class LA, class LB, class S>
__device__ __forceinline__ void gemm(const LA& a, const LB& b, int M, int N, int K,
                                     const GemmTiling& t, const S& store) {
    const bool TF32 = KIND == GEMM_TF32;
    if (KIND == GEMM_BF16) {
        gemm_bf16(a, b, M, N, K, t, store);
    } else if (t.tile_m == 32) {
        gemm_shaped<32, 128, TF32>(a, b, M, N, K, (int)t.k_chunk, store);
    } else if (KIND == GEMM_F32_WIDE && t.tile_n == 128) {
        gemm_shaped<64, 128, false>(a, b, M, N, K, (int)t.k_chunk, store);
    } else {
        gemm_shaped<64, 64, TF32>(a, b, M, N, K, (int)t.k_chunk, store);
    }
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
