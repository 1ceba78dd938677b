// The bf16 tile of the shared SGEMM (`_bf16` entry points, the host's
// `MatmulPrecision::Bf16`, the trainer's `--bf16`): mixed precision as
// PyTorch's autocast does it. Operands are rounded to bf16 (8 significant
// bits, to nearest even) as they are staged, products are summed in float32
// by mma.sync m16n8k16 on the tensor cores (compute capability 8.0 and
// later; the host refuses bf16 below), and everything outside the products
// (weights, gradients, Adam) stays float32. sgemm.cuh pastes this in and
// `gemm` dispatches GEMM_BF16 here.
//
// It shares the loaders, `gemm_fetch`, the split-K plan and the stores with
// the other kinds, but not their staging: the operands are staged as bf16,
// half the bytes, in pairs along k, the layout the fragments read. A k pair
// p of row mn is one 32-bit word, Ws[p][mn], its lower half k = 2p (the
// fragments' packing), so each fragment register is one 32-bit load. A
// row of LDS = R + 8 words puts the 32 lanes' fragment loads (word
// [p0 + t][g]) in 32 different banks. The rounding has to pass through
// registers, so this staging cannot copy global memory to shared as is
// (cp.async); it keeps the fetch-stash double buffering of `gemm_tile`.
//
// Each warp owns a 32 x 16 sub-tile of C: 2 x 2 products of 16 x 8.
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating
// point type"), lane = 4·g + t, two bf16 per register, lower half first:
//   A (16 x 16): a0 (g, 2t..2t+1)  a1 (g + 8, 2t..)  a2 (g, 2t + 8..)  a3 (g + 8, 2t + 8..)
//   B (16 x 8):  b0 (k = 2t..2t+1, n = g)           b1 (k = 2t + 8.., n = g)
//   C (16 x 8):  c0 (g, 2t)  c1 (g, 2t + 1)  c2 (g + 8, 2t)  c3 (g + 8, 2t + 1)
// cuda-emu defines CUDA_EMU and supplies both functions in C++.
#ifndef CUDA_EMU
// x rounded to the nearest bf16, ties to even, as its 16 bits.
__device__ __forceinline__ unsigned short bf16_bits(float x) {
#if __CUDA_ARCH__ >= 800
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
#else
    return 0;  // never runs: bf16 is refused below compute capability 8.0
#endif
}

// d += a·b for the calling warp.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4],
                                                  const unsigned (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();  // never runs: bf16 is refused below compute capability 8.0
#endif
}
#endif

// An R-row operand tile staged as bf16 pairs: PAIRS rows of LDS words.
template <int R>
struct Bf16Tile {
    static const int PAIRS = GEMM_BK / 2;
    static const int LDS = R + 8;
    static const int WORDS = PAIRS * LDS;
};

// A warp's place in a BM-row tile: its sub-tile's corner (wm, wn), and the
// lane's (g, t).
template <int BM>
struct Bf16Lane {
    int wm, wn, g, t;
    __device__ Bf16Lane() {
        const int warps_n = GEMM_TILE_ELEMS / BM / 16;
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        wm = warp / warps_n * 32;
        wn = warp % warps_n * 16;
        g = lane / 4;
        t = lane % 4;
    }
};

// Rounds this thread's elements to bf16 into their halves of the words.
template <int R, class L>
__device__ __forceinline__ void bf16_stash(unsigned short* tile,
                                           const float (&r)[OperandTile<R, 4>::PER]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < OperandTile<R, 4>::PER; ++i) {
        const int k = tile_k<R, L::K_FAST>(tid, i), mn = tile_mn<R, L::K_FAST>(tid, i);
        tile[(k / 2 * Bf16Tile<R>::LDS + mn) * 2 + k % 2] = bf16_bits(r[i]);
    }
}

// acc += this warp's share of As·Bs; acc[2·mi + ni] is the C fragment of the
// 16 x 8 product (mi, ni) of the warp's sub-tile.
template <int BM>
__device__ __forceinline__ void bf16_mma_k_tile(const unsigned* As, const unsigned* Bs,
                                                const Bf16Lane<BM>& l, float (&acc)[4][4]) {
    const int lda = Bf16Tile<BM>::LDS, ldb = Bf16Tile<GEMM_TILE_ELEMS / BM>::LDS;
#pragma unroll
    for (int p0 = 0; p0 < Bf16Tile<BM>::PAIRS; p0 += 8) {
        unsigned a[2][4], b[2][2];
        const int lo = p0 + l.t, hi = p0 + l.t + 4;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int m = l.wm + mi * 16 + l.g;
            a[mi][0] = As[lo * lda + m];
            a[mi][1] = As[lo * lda + m + 8];
            a[mi][2] = As[hi * lda + m];
            a[mi][3] = As[hi * lda + m + 8];
        }
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
            const int n = l.wn + ni * 8 + l.g;
            b[ni][0] = Bs[lo * ldb + n];
            b[ni][1] = Bs[hi * ldb + n];
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int ni = 0; ni < 2; ++ni) mma_m16n8k16_bf16(acc[2 * mi + ni], a[mi], b[ni]);
        }
    }
}

// The block's BM x BN tile (BM·BN = GEMM_TILE_ELEMS) of a·b over its k
// range, handed to `store`: `gemm_tile` and `gemm_store` for bf16 products,
// staged in `gemm_shared<FLOATS>()`.
template <int BM, int BN, int FLOATS, class LA, class LB, class S>
__device__ __forceinline__ void gemm_bf16_shaped(const LA& a, const LB& b, int M, int N, int K,
                                                 int k_chunk, const S& store) {
    static_assert(Bf16Tile<BM>::WORDS + Bf16Tile<BN>::WORDS <= FLOATS,
                  "the bf16 tiles fit the staging buffer");
    unsigned* As = reinterpret_cast<unsigned*>(gemm_shared<FLOATS>());
    unsigned* Bs = As + Bf16Tile<BM>::WORDS;
    __shared__ typename LA::K a_ks[2][GEMM_BK];
    __shared__ typename LB::K b_ks[2][GEMM_BK];
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int k_begin = blockIdx.z * k_chunk;
    const int k_end = gemm_min(K, k_begin + k_chunk);
    float acc[4][4] = {};
    const Bf16Lane<BM> l;
    if (k_begin < k_end) {
        const Rows<OperandTile<BM, 4>, LA> a_rows = gemm_rows<OperandTile<BM, 4>>(a, m0, M);
        const Rows<OperandTile<BN, 4>, LB> b_rows = gemm_rows<OperandTile<BN, 4>>(b, n0, N);
        gemm_k_parts(a, 0, k_begin, k_end, a_ks[0]);
        gemm_k_parts(b, GEMM_BK, k_begin, k_end, b_ks[0]);
        __syncthreads();
        float ra[OperandTile<BM, 4>::PER], rb[OperandTile<BN, 4>::PER];
        gemm_fetch<OperandTile<BM, 4>>(a, a_rows, a_ks[0], k_begin, k_end, ra);
        gemm_fetch<OperandTile<BN, 4>>(b, b_rows, b_ks[0], k_begin, k_end, rb);
        int buf = 0;
        for (int kt = k_begin; kt < k_end; kt += GEMM_BK) {
            const bool more = kt + GEMM_BK < k_end;
            bf16_stash<BM, LA>(reinterpret_cast<unsigned short*>(As), ra);
            bf16_stash<BN, LB>(reinterpret_cast<unsigned short*>(Bs), rb);
            if (more) {
                gemm_k_parts(a, 0, kt + GEMM_BK, k_end, a_ks[buf ^ 1]);
                gemm_k_parts(b, GEMM_BK, kt + GEMM_BK, k_end, b_ks[buf ^ 1]);
            }
            __syncthreads();
            // The next tile's global reads are in flight while this one computes.
            if (more) {
                buf ^= 1;
                gemm_fetch<OperandTile<BM, 4>>(a, a_rows, a_ks[buf], kt + GEMM_BK, k_end, ra);
                gemm_fetch<OperandTile<BN, 4>>(b, b_rows, b_ks[buf], kt + GEMM_BK, k_end, rb);
            }
            bf16_mma_k_tile<BM>(As, Bs, l, acc);
            __syncthreads();
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int m = m0 + l.wm + i / 2 * 16 + l.g + r / 2 * 8;
            const int n = n0 + l.wn + i % 2 * 8 + 2 * l.t + r % 2;
            if (m < M && n < N) store(m, n, acc[i][r]);
        }
    }
}

// `gemm`'s bf16 kind: the tensor cores' two shapes, as the host's plan says,
// staged in the words of the larger (32 x 128: 1408 against 1152).
template <class LA, class LB, class S>
__device__ __forceinline__ void gemm_bf16(const LA& a, const LB& b, int M, int N, int K,
                                          const GemmTiling& t, const S& store) {
    const int F = Bf16Tile<32>::WORDS + Bf16Tile<128>::WORDS;
    if (t.tile_m == 32) {
        gemm_bf16_shaped<32, 128, F>(a, b, M, N, K, (int)t.k_chunk, store);
    } else {
        gemm_bf16_shaped<64, 64, F>(a, b, M, N, K, (int)t.k_chunk, store);
    }
}
