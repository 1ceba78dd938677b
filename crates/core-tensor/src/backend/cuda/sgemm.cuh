// The tiled SGEMM core shared by the linear and conv2d kernels. build.rs
// pastes this file in place of `#include "sgemm.cuh"`, so NVRTC sees one
// self-contained source per op.
//
// C[M, N] = A[M, K] · B[K, N], one BM x BN tile of C per block of 256
// threads, each thread owning a 4x4 register block. Two tile shapes: 64x64,
// and 32x128 for products with at most 32 rows (a layer with 32 channels),
// whose 64-row tiles would be half padding. The host picks one per product
// and passes it as `tile_m`; `gemm` dispatches on it.
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
// Every GEMM kernel comes in two entry points: `_f32` multiplies on the CUDA
// cores, `_tf32` on the tensor cores (see "Tensor cores" below; the host's
// `MatmulPrecision`). Staging, loaders, split-K and stores are the same; a
// kernel holds only the products it runs, so neither costs the other
// registers.
//
// The host mirrors GEMM_BK, GEMM_THREADS, the two tile shapes and
// `GemmTiling` in gemm.rs.

#define GEMM_BK 16
#define GEMM_THREADS 256
// Outputs per block: 256 threads x 4 x 4.
#define GEMM_TILE_ELEMS 4096

// Mirrors `GemmTiling` in backend/cuda/gemm.rs: how one product is cut
// into blocks.
struct GemmTiling {
    unsigned long long k_chunk, splits, tile_m;
};

__device__ __forceinline__ int gemm_min(int a, int b) { return a < b ? a : b; }

// ---- Tensor cores ----
//
// mma.sync m16n8k8 with TF32 inputs (a 10-bit mantissa: operands are rounded
// to nearest as they are staged) and float32 accumulation, on compute
// capability 8.0 and later (the host refuses TF32 below). Each warp owns a
// 32 x 16 sub-tile of C: 2 x 2 products of 16 x 8. Fragments (PTX ISA,
// "Matrix fragments for mma.m16n8k8", .tf32), for lane = 4·g + t:
//   A (16 x 8):  a0 (g, t)   a1 (g + 8, t)   a2 (g, t + 4)   a3 (g + 8, t + 4)
//   B (8 x 8):   b0 (k = t, n = g)           b1 (k = t + 4, n = g)
//   C (16 x 8):  c0 (g, 2t)  c1 (g, 2t + 1)  c2 (g + 8, 2t)  c3 (g + 8, 2t + 1)
// cuda-emu defines CUDA_EMU and supplies both functions in C++.
#ifndef CUDA_EMU
__device__ __forceinline__ float tf32_round(float x) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
#else
    return x;  // never runs: TF32 is refused below compute capability 8.0
#endif
}

// d += a·b for the calling warp.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const float (&a)[4],
                                                 const float (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#else
    __trap();  // never runs: TF32 is refused below compute capability 8.0
#endif
}
#endif

// A tensor-core warp's place in a BM-row tile: its sub-tile's corner
// (wm, wn) and the lane's (g, t).
template <int BM>
struct MmaLane {
    int wm, wn, g, t;
    __device__ MmaLane() {
        const int warps_n = GEMM_TILE_ELEMS / BM / 16;
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        wm = warp / warps_n * 32;
        wn = warp % warps_n * 16;
        g = lane / 4;
        t = lane % 4;
    }
};

// An operand tile of R (BM or BN) rows by GEMM_BK k: each thread holds
// PER = R / 16 of its elements, and LDS is the shared row stride. R + 4 keeps
// rows 16-byte aligned for the float4 reads and turns the 16-way bank
// conflict of K-fast stores (a stride of R) into a 2-way one.
template <int R>
struct OperandTile {
    static const int PER = R * GEMM_BK / GEMM_THREADS;
    static const int LDS = R + 4;
};

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

// acc += this thread's share of As·Bs on the CUDA cores: a 4 x 4 block at
// rows 4·ty, columns 4·tx of the tile.
template <int BM>
__device__ __forceinline__ void fma_k_tile(
    const float (*As)[OperandTile<BM>::LDS],
    const float (*Bs)[OperandTile<GEMM_TILE_ELEMS / BM>::LDS], float (&acc)[4][4]) {
    const int BN = GEMM_TILE_ELEMS / BM;
    const int tx = threadIdx.x % (BN / 4), ty = threadIdx.x / (BN / 4);
#pragma unroll
    for (int k = 0; k < GEMM_BK; ++k) {
        const float4 av = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
        const float4 bv = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
        const float ai[4] = {av.x, av.y, av.z, av.w};
        const float bj[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ai[i], bj[j], acc[i][j]);
        }
    }
}

// acc += this warp's share of As·Bs on the tensor cores; acc[2·mi + ni] is
// the C fragment of the 16 x 8 product (mi, ni) of the warp's sub-tile.
template <int BM>
__device__ __forceinline__ void mma_k_tile(
    const float (*As)[OperandTile<BM>::LDS],
    const float (*Bs)[OperandTile<GEMM_TILE_ELEMS / BM>::LDS], const MmaLane<BM>& l,
    float (&acc)[4][4]) {
#pragma unroll
    for (int k0 = 0; k0 < GEMM_BK; k0 += 8) {
        float a[2][4], b[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int m = l.wm + mi * 16 + l.g;
            a[mi][0] = As[k0 + l.t][m];
            a[mi][1] = As[k0 + l.t][m + 8];
            a[mi][2] = As[k0 + l.t + 4][m];
            a[mi][3] = As[k0 + l.t + 4][m + 8];
        }
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
            const int n = l.wn + ni * 8 + l.g;
            b[ni][0] = Bs[k0 + l.t][n];
            b[ni][1] = Bs[k0 + l.t + 4][n];
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int ni = 0; ni < 2; ++ni) mma_m16n8k8_tf32(acc[2 * mi + ni], a[mi], b[ni]);
        }
    }
}

// This thread's 16 elements of the tile at (m0, n0) = (BM·blockIdx.y,
// BN·blockIdx.x) over the block's k range (split blockIdx.z of k_chunk), in
// the layout of `fma_k_tile` or `mma_k_tile` (`gemm_store` maps them).
template <int BM, bool TF32, class LA, class LB>
__device__ __forceinline__ void gemm_tile(const LA& a, const LB& b, int M, int N, int K,
                                          int k_chunk, float (&acc)[4][4]) {
    const int BN = GEMM_TILE_ELEMS / BM;
    typedef OperandTile<BM> TA;
    typedef OperandTile<GEMM_TILE_ELEMS / BM> TB;
    __shared__ __align__(16) float As[GEMM_BK][TA::LDS];
    __shared__ __align__(16) float Bs[GEMM_BK][TB::LDS];
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
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
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
    const MmaLane<BM> lane;  // used by the tensor-core product only
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
        if (TF32) {
            mma_k_tile<BM>(As, Bs, lane, acc);
        } else {
            fma_k_tile<BM>(As, Bs, acc);
        }
        __syncthreads();
    }
}

// Hands each in-range element of the tile to `store(m, n, value)`; acc is
// laid out as `fma_k_tile` or `mma_k_tile` left it.
template <int BM, bool TF32, class S>
__device__ __forceinline__ void gemm_store(const float (&acc)[4][4], int M, int N, const S& store) {
    const int BN = GEMM_TILE_ELEMS / BM;
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
    const int tx = threadIdx.x % (BN / 4), ty = threadIdx.x / (BN / 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx * 4 + j;
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}

template <int BM, bool TF32, class LA, class LB, class S>
__device__ __forceinline__ void gemm_shaped(const LA& a, const LB& b, int M, int N, int K,
                                            int k_chunk, const S& store) {
    float acc[4][4];
    gemm_tile<BM, TF32>(a, b, M, N, K, k_chunk, acc);
    gemm_store<BM, TF32>(acc, M, N, store);
}

// The block's tile (or split's partial tile) of a·b, handed to `store`, in
// the tile shape the host chose (`tile_m` rows, 32 or 64), on the tensor
// cores when TF32.
template <bool TF32, class LA, class LB, class S>
__device__ __forceinline__ void gemm(const LA& a, const LB& b, int M, int N, int K,
                                     const GemmTiling& t, const S& store) {
    if (t.tile_m == 32) {
        gemm_shaped<32, TF32>(a, b, M, N, K, (int)t.k_chunk, store);
    } else {
        gemm_shaped<64, TF32>(a, b, M, N, K, (int)t.k_chunk, store);
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

// Sums the `splits` partials of every element and hands the sum to
// `store`, in an order fixed by `splits` alone. Up to
// GEMM_WIDE_REDUCE_SPLITS splits: one thread per element, grid-stride,
// adding the splits in order. From there a chain that long would leave the
// GPU waiting on one load after another (conv1's weight gradient sums 169
// splits on two blocks), so a warp takes each element: lane l adds splits
// l, l + 32, ... in order, then the lanes are added pairwise in a fixed tree
// through shared memory; a block holds GEMM_THREADS / 32 elements, and the
// host launches one block per that many (`GemmPlan::reduce`).
template <class S>
__device__ __forceinline__ void gemm_reduce(const float* ws, int M, int N, int splits,
                                            const S& store) {
    const int total = M * N;
    if (splits >= GEMM_WIDE_REDUCE_SPLITS) {
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
        return;
    }
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        float sum = ws[e];
        for (int s = 1; s < splits; ++s) sum += ws[s * total + e];
        store(e / N, e % N, sum);
    }
}
