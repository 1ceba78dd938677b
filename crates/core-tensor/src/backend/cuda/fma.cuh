// The CUDA-core half of the shared SGEMM tile: sgemm.cuh pastes this in
// after `TileShape` (build.rs pastes includes recursively), and its `_f32`
// and `_f32w` entry points run `fma_k_tile` on each staged k tile. The
// register block's shape (`RegBlock`) also lays out the accumulators of the
// tensor-core half (mma.cuh) and of `gemm_store`.

// A thread's register block in a BM x BN tile on the CUDA cores: TM rows by
// TN columns, the columns in TN / 4 groups of 4 that lie BN / (TN / 4)
// apart, so that the threads of a warp read one contiguous run of B per
// group (and all of a warp's threads share their rows: a broadcast).
template <int BM, int BN>
struct RegBlock {
    static const int ELEMS = BM * BN / GEMM_THREADS;
    static const int TM = ELEMS == 64 ? 8 : 4;  // 4 x 4 or 8 x 8
    static const int TN = ELEMS / TM;
    static const int GROUPS = TN / 4;
    static const int THREADS_N = BN / TN;
    // The tile column of this thread's column j.
    static __device__ __forceinline__ int col(int tx, int j) {
        return j / 4 * (BN / GROUPS) + tx * 4 + j % 4;
    }
};

// acc += this thread's share of As·Bs on the CUDA cores: a TM x TN block at
// rows TM·ty, columns `RegBlock::col(tx, ·)` of the tile.
template <class S>
__device__ __forceinline__ void fma_k_tile(
    const float (*As)[S::A::LDS], const float (*Bs)[S::B::LDS],
    float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
    typedef RegBlock<S::BM, S::BN> RB;
    const int tx = threadIdx.x % RB::THREADS_N, ty = threadIdx.x / RB::THREADS_N;
#pragma unroll
    for (int k = 0; k < GEMM_BK; ++k) {
        float ai[RB::TM], bj[RB::TN];
#pragma unroll
        for (int q = 0; q < RB::TM / 4; ++q) {
            const float4 av = *reinterpret_cast<const float4*>(&As[k][ty * RB::TM + 4 * q]);
            ai[4 * q] = av.x;
            ai[4 * q + 1] = av.y;
            ai[4 * q + 2] = av.z;
            ai[4 * q + 3] = av.w;
        }
#pragma unroll
        for (int g = 0; g < RB::GROUPS; ++g) {
            const float4 bv = *reinterpret_cast<const float4*>(&Bs[k][RB::col(tx, 4 * g)]);
            bj[4 * g] = bv.x;
            bj[4 * g + 1] = bv.y;
            bj[4 * g + 2] = bv.z;
            bj[4 * g + 3] = bv.w;
        }
#pragma unroll
        for (int i = 0; i < RB::TM; ++i) {
#pragma unroll
            for (int j = 0; j < RB::TN; ++j) acc[i][j] = fmaf(ai[i], bj[j], acc[i][j]);
        }
    }
}
