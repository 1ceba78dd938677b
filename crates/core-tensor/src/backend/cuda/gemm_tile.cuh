// The k loop of the shared SGEMM tile (sgemm.cuh pastes this in after
// `TileShape`, fma.cuh, mma.cuh and cp_async.cuh): where each thread's
// operand elements go, the two stagings that bring them to shared memory
// (registers, or cp.async), and `gemm_tile`, which runs the loop.

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

// Whether this thread's i-th element (tile k j) of the operand tile at kt
// lies inside [0, MN) x [kt, k_end), and what the loader gives for it.
template <class T, class L>
__device__ __forceinline__ bool gemm_inside(const Rows<T, L>& rows, int kt, int k_end, int i,
                                            int j) {
    return rows.inside[i] && kt + j < k_end;
}
template <class T, class L>
__device__ __forceinline__ GemmElem gemm_elem(const L& load, const Rows<T, L>& rows,
                                              const typename L::K* ks, int kt, int i, int j) {
    return load.at(rows.part[i], L::K_TABLE ? ks[j] : load.k_part(kt + j));
}

// Reads this thread's elements of the operand tile at kt into registers.
template <class T, class L>
__device__ __forceinline__ void gemm_fetch(const L& load, const Rows<T, L>& rows,
                                           const typename L::K* ks, int kt, int k_end,
                                           float (&r)[T::PER]) {
#pragma unroll
    for (int i = 0; i < T::PER; ++i) {
        const int j = tile_k<T::R, L::K_FAST>(threadIdx.x, i);
        r[i] = 0.0f;
        // Only inside: the loader's address work is skipped for the rest
        // (the cp.async staging does it for all, which costs it registers).
        if (gemm_inside(rows, kt, k_end, i, j)) {
            const GemmElem e = gemm_elem(load, rows, ks, kt, i, j);
            if (e.there) r[i] = e.base[e.off];
        }
    }
}

// Stores the fetched elements into the operand tile, TF32 rounded to
// nearest when TF32 (the cp.async staging copies them as they are and
// rounds at the fragment loads instead: mma.cuh's ROUND; rounding is the
// same function of the value either way, so the same bits).
template <class T, class L, bool TF32>
__device__ __forceinline__ void gemm_stash(float (*tile)[T::LDS], const float (&r)[T::PER]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < T::PER; ++i) {
        tile[tile_k<T::R, L::K_FAST>(tid, i)][tile_mn<T::R, L::K_FAST>(tid, i)] =
            TF32 ? tf32_round(r[i]) : r[i];
    }
}

// Copies this thread's elements of the operand tile at kt from global
// memory straight into `tile` (cp.async, 4 bytes each, zero fill where an
// element is not there), without waiting: the caller commits the group and
// waits for it before the block reads the tile.
template <class T, class L>
__device__ __forceinline__ void gemm_copy(const L& load, const Rows<T, L>& rows,
                                          const typename L::K* ks, int kt, int k_end,
                                          float (*tile)[T::LDS]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < T::PER; ++i) {
        const int j = tile_k<T::R, L::K_FAST>(tid, i);
        const GemmElem e = gemm_elem(load, rows, ks, kt, i, j);
        const bool there = e.there && gemm_inside(rows, kt, k_end, i, j);
        // Where not there, the operand's base stands in as the source that
        // is not read.
        cp_async_f32(&tile[j][tile_mn<T::R, L::K_FAST>(tid, i)], e.base + (there ? e.off : 0),
                     there);
    }
}

// The staged operand tiles As and Bs of whichever shape runs: one buffer
// per kernel, sized for its staging's copies (`StagedTiles`) of the
// largest shape it holds (FLOATS). A kernel holds the code of every shape of its kind, and a
// static array per shape would add up past the 48 KiB of static shared
// memory.
template <int FLOATS>
__device__ __forceinline__ float* gemm_shared() {
    __shared__ __align__(16) float staged[FLOATS];
    return staged;
}

// The product of one staged k tile: `fma_k_tile` on the CUDA cores, or
// `mma_k_tile` on the tensor cores (only the chosen one is instantiated),
// rounding the fragments to TF32 as it loads them when ROUND (tiles staged
// as loaded).
template <bool TF32>
struct KTileProduct {
    template <class S, bool ROUND>
    static __device__ __forceinline__ void run(
        const float (*As)[S::A::LDS], const float (*Bs)[S::B::LDS],
        const MmaLane<S::BM, S::BN>&,
        float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
        fma_k_tile<S>(As, Bs, acc);
    }
};
template <>
struct KTileProduct<true> {
    template <class S, bool ROUND>
    static __device__ __forceinline__ void run(
        const float (*As)[S::A::LDS], const float (*Bs)[S::B::LDS],
        const MmaLane<S::BM, S::BN>& lane,
        float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
        mma_k_tile<S, ROUND>(As, Bs, lane, acc);
    }
};

// The operand tiles of stage `s` of a staging buffer holding copies of
// S's (as many as `gemm_tile` asserts): rows of LDS floats, a multiple of
// 4, so that every tile starts 16-byte aligned.
template <class S, int FLOATS>
struct Staged {
    float (*As)[S::A::LDS];
    float (*Bs)[S::B::LDS];
    __device__ Staged(int s) {
        float* base = gemm_shared<FLOATS>() + s * S::FLOATS;
        As = reinterpret_cast<float(*)[S::A::LDS]>(base);
        Bs = reinterpret_cast<float(*)[S::B::LDS]>(base + GEMM_BK * S::A::LDS);
    }
};

// This thread's TM x TN elements of the tile at (m0, n0) = (BM·blockIdx.y,
// BN·blockIdx.x) over the block's k range (split blockIdx.z of k_chunk), in
// the layout of `fma_k_tile` or `mma_k_tile` (`gemm_store` maps them), with
// the operand tiles staged in a buffer of FLOATS.
//
// Two stagings, the same values in the same shared layout, so the same
// bits (STAGING picks, at compile time: a kernel holds one; docs/gpu.md,
// "cp.async staging"):
//   registers: each thread loads its elements of the next k tile into
//     registers while the block multiplies this one, and stores them to
//     shared memory after the barrier; one buffer.
//   cp.async (compute capability 8.0 and later): each thread issues the
//     copies of the k tile GEMM_STAGES - 1 ahead straight into shared
//     memory (no registers, no store), in GEMM_STAGES buffers, and waits
//     for the oldest group before the barrier that precedes its product.
template <class S, int FLOATS, GemmStaging STAGING, class LA, class LB>
__device__ __forceinline__ void gemm_tile(
    const LA& a, const LB& b, int M, int N, int K, int k_chunk,
    float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
    typedef typename S::A TA;
    typedef typename S::B TB;
    typedef RegBlock<S::BM, S::BN> RB;
    static_assert(StagedTiles<STAGING>::N * S::FLOATS <= FLOATS,
                  "the stages fit the staging buffer");
    // The k halves of a coming tile's addresses, double-buffered: one buffer
    // is read by a fetch while the other is filled.
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
    const MmaLane<S::BM, S::BN> lane;  // read by the tensor-core product only
    if (STAGING == GEMM_CP_ASYNC) {
        // Tile q (at k_begin + q·BK) goes to stage q % GEMM_STAGES, one
        // commit group per tile (empty past the end, so that every wait
        // counts the same). Before tile q + STAGES - 1 is issued into the
        // stage tile q - 1 was multiplied from, a barrier; its k halves are
        // filled before that barrier and read after it, and refilled only
        // after the next one, so one table buffer serves.
        int issued = k_begin;
#pragma unroll
        for (int q = 0; q < GEMM_STAGES - 1; ++q) {
            if (issued < k_end) {
                gemm_k_parts(a, 0, issued, k_end, a_ks[0]);
                gemm_k_parts(b, GEMM_BK, issued, k_end, b_ks[0]);
                __syncthreads();
                const Staged<S, FLOATS> st(q);
                gemm_copy<TA>(a, a_rows, a_ks[0], issued, k_end, st.As);
                gemm_copy<TB>(b, b_rows, b_ks[0], issued, k_end, st.Bs);
                issued += GEMM_BK;
                __syncthreads();
            }
            cp_async_commit();
        }
        int stage = 0;
        for (int kt = k_begin; kt < k_end; kt += GEMM_BK) {
            const bool more = issued < k_end;
            if (more) {
                gemm_k_parts(a, 0, issued, k_end, a_ks[0]);
                gemm_k_parts(b, GEMM_BK, issued, k_end, b_ks[0]);
            }
            __syncthreads();
            if (more) {
                const Staged<S, FLOATS> st((stage + GEMM_STAGES - 1) % GEMM_STAGES);
                gemm_copy<TA>(a, a_rows, a_ks[0], issued, k_end, st.As);
                gemm_copy<TB>(b, b_rows, b_ks[0], issued, k_end, st.Bs);
                issued += GEMM_BK;
            }
            cp_async_commit();
            cp_async_wait<GEMM_STAGES - 1>();  // this thread's copies of tile kt
            __syncthreads();                   // everyone's
            const Staged<S, FLOATS> st(stage);
            KTileProduct<S::TF32>::template run<S, true>(st.As, st.Bs, lane, acc);
            stage = (stage + 1) % GEMM_STAGES;
        }
        cp_async_wait<0>();  // none left pending: the newest groups are empty
        return;
    }
    const Staged<S, FLOATS> st(0);
    gemm_k_parts(a, 0, k_begin, k_end, a_ks[0]);
    gemm_k_parts(b, GEMM_BK, k_begin, k_end, b_ks[0]);
    __syncthreads();
    float ra[TA::PER], rb[TB::PER];
    gemm_fetch<TA>(a, a_rows, a_ks[0], k_begin, k_end, ra);
    gemm_fetch<TB>(b, b_rows, b_ks[0], k_begin, k_end, rb);
    int buf = 0;
    for (int kt = k_begin; kt < k_end; kt += GEMM_BK) {
        const bool more = kt + GEMM_BK < k_end;
        gemm_stash<TA, LA, S::TF32>(st.As, ra);
        gemm_stash<TB, LB, S::TF32>(st.Bs, rb);
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
        KTileProduct<S::TF32>::template run<S, false>(st.As, st.Bs, lane, acc);
        __syncthreads();
    }
}
