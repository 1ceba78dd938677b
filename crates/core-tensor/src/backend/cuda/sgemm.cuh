// The tiled SGEMM core shared by the linear and conv2d kernels. build.rs
// pastes this file in place of `#include "sgemm.cuh"`, so NVRTC sees one
// self-contained source per op.
//
// C[M, N] = A[M, K] · B[K, N], one 64x64 tile of C per block of 256 threads,
// each thread owning a 4x4 register block. A and B are "loaders" that read
// one element of an implicit matrix (im2col of an image, a transposed
// weight) without materialising it. An element's address is split in two
// halves so that no integer division runs per element:
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
// The host mirrors GEMM_BM/GEMM_BN/GEMM_BK/GEMM_THREADS in gemm.rs.

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 16
#define GEMM_THREADS 256
// Row stride of the shared tiles: 68 floats keeps rows 16-byte aligned for
// the float4 reads, and turns the 16-way bank conflict of K-fast stores
// (stride 64) into a 2-way one.
#define GEMM_LDS (GEMM_BM + 4)

__device__ __forceinline__ int gemm_min(int a, int b) { return a < b ? a : b; }

// Where thread `tid` stores its i-th element of a 64x16 operand tile.
template <bool K_FAST>
__device__ __forceinline__ int tile_mn(int tid, int i) {
    return K_FAST ? tid / GEMM_BK + i * (GEMM_THREADS / GEMM_BK) : tid % GEMM_BM;
}
template <bool K_FAST>
__device__ __forceinline__ int tile_k(int tid, int i) {
    return K_FAST ? tid % GEMM_BK : tid / GEMM_BM + i * (GEMM_THREADS / GEMM_BM);
}

// This thread's four elements of the operand tile at (mn0, ·): the mn half
// of each address and whether it lies inside [0, MN).
template <class L>
struct Rows {
    typename L::Mn part[4];
    bool inside[4];
};

template <class L>
__device__ __forceinline__ Rows<L> gemm_rows(const L& load, int mn0, int MN) {
    Rows<L> rows;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int mn = mn0 + tile_mn<L::K_FAST>(threadIdx.x, i);
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

// Reads this thread's four elements of the operand tile at kt into
// registers; elements outside [0, MN) x [kt, k_end) read as zero.
template <class L>
__device__ __forceinline__ void gemm_fetch(const L& load, const Rows<L>& rows,
                                           const typename L::K* ks, int kt, int k_end,
                                           float (&r)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = tile_k<L::K_FAST>(threadIdx.x, i);
        if (rows.inside[i] && kt + j < k_end) {
            r[i] = load.at(rows.part[i], L::K_TABLE ? ks[j] : load.k_part(kt + j));
        } else {
            r[i] = 0.0f;
        }
    }
}

template <class L>
__device__ __forceinline__ void gemm_stash(float (*tile)[GEMM_LDS], const float (&r)[4]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        tile[tile_k<L::K_FAST>(tid, i)][tile_mn<L::K_FAST>(tid, i)] = r[i];
    }
}

// acc[i][j] = C(m0 + 4·ty + i, n0 + 4·tx + j) over this block's k range
// (split blockIdx.z of k_chunk), with (m0, n0) = (64·blockIdx.y, 64·blockIdx.x).
template <class LA, class LB>
__device__ __forceinline__ void gemm_tile(const LA& a, const LB& b, int M, int N, int K,
                                          int k_chunk, float (&acc)[4][4]) {
    __shared__ __align__(16) float As[GEMM_BK][GEMM_LDS];
    __shared__ __align__(16) float Bs[GEMM_BK][GEMM_LDS];
    // The k halves of the next tile's addresses, double-buffered: one buffer
    // is read by this tile's fetch while the other is filled for the next.
    __shared__ typename LA::K a_ks[2][GEMM_BK];
    __shared__ typename LB::K b_ks[2][GEMM_BK];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int k_begin = blockIdx.z * k_chunk;
    const int k_end = gemm_min(K, k_begin + k_chunk);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    if (k_begin >= k_end) return;
    const Rows<LA> a_rows = gemm_rows(a, m0, M);
    const Rows<LB> b_rows = gemm_rows(b, n0, N);
    gemm_k_parts(a, 0, k_begin, k_end, a_ks[0]);
    gemm_k_parts(b, GEMM_BK, k_begin, k_end, b_ks[0]);
    __syncthreads();
    float ra[4], rb[4];
    gemm_fetch(a, a_rows, a_ks[0], k_begin, k_end, ra);
    gemm_fetch(b, b_rows, b_ks[0], k_begin, k_end, rb);
    int buf = 0;
    for (int kt = k_begin; kt < k_end; kt += GEMM_BK) {
        const bool more = kt + GEMM_BK < k_end;
        gemm_stash<LA>(As, ra);
        gemm_stash<LB>(Bs, rb);
        if (more) {
            gemm_k_parts(a, 0, kt + GEMM_BK, k_end, a_ks[buf ^ 1]);
            gemm_k_parts(b, GEMM_BK, kt + GEMM_BK, k_end, b_ks[buf ^ 1]);
        }
        __syncthreads();
        // The next tile's global reads are in flight while this one computes.
        if (more) {
            buf ^= 1;
            gemm_fetch(a, a_rows, a_ks[buf], kt + GEMM_BK, k_end, ra);
            gemm_fetch(b, b_rows, b_ks[buf], kt + GEMM_BK, k_end, rb);
        }
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
        __syncthreads();
    }
}

// Hands each in-range element of the tile to `store(m, n, value)`.
template <class S>
__device__ __forceinline__ void gemm_store(const float (&acc)[4][4], int M, int N, const S& store) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = blockIdx.y * GEMM_BM + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = blockIdx.x * GEMM_BN + tx * 4 + j;
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}

// An operand whose element (mn, k) lies at p[mn_part + k_part]: both halves
// are plain offsets.
// Loaders derive from it and add `mn_part`/`k_part` returning ints.
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

// Sums the `splits` partials of every element in split order and hands the
// sum to `store`; one thread per element, grid-stride.
template <class S>
__device__ __forceinline__ void gemm_reduce(const float* ws, int M, int N, int splits,
                                            const S& store) {
    const int total = M * N;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        float sum = ws[e];
        for (int s = 1; s < splits; ++s) sum += ws[s * total + e];
        store(e / N, e % N, sum);
    }
}
