// The tensor-core half of the shared SGEMM tile: sgemm.cuh pastes this in
// after `OperandTile` (build.rs pastes includes recursively), and its
// `_tf32` entry points run `mma_k_tile` on each staged k tile.
//
// mma.sync m16n8k8 with TF32 inputs (a 10-bit mantissa: operands are rounded
// to nearest as the register staging stores them, or with ROUND as the
// fragments are loaded, for the cp.async staging, which copies them as they
// are) and float32 accumulation, on compute
// capability 8.0 and later (the host refuses TF32 below). Each warp owns a
// WM x WN sub-tile of C, MI x NI products of 16 x 8 (`MmaLane`): 32 x 16 in
// the square tiles, 64 x 32 in the wide one. Fragments (PTX ISA,
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

// A staged operand, rounded to TF32 when ROUND.
template <bool ROUND>
__device__ __forceinline__ float mma_operand(float x) {
    return ROUND ? tf32_round(x) : x;
}

// A tensor-core warp's sub-tile of a BM x BN tile: WM x WN, 32 x 16 in the
// square tiles (8 warps of 4 products), 64 x 32 in the wide one (16
// products); each A fragment feeds NI products, each B fragment MI. Its
// corner (wm, wn) and the lane's (g, t).
template <int BM, int BN>
struct MmaLane {
    static const int WM = BM * BN > GEMM_TILE_ELEMS ? 64 : 32;
    static const int WN = BM * BN / (GEMM_THREADS / 32) / WM;
    static const int MI = WM / 16, NI = WN / 8;
    int wm, wn, g, t;
    __device__ MmaLane() {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        wm = warp / (BN / WN) * WM;
        wn = warp % (BN / WN) * WN;
        g = lane / 4;
        t = lane % 4;
    }
};

// acc += this warp's share of As·Bs on the tensor cores. The C fragment of
// product p = NI·mi + ni is the four floats 4p .. 4p + 3 of acc read row by
// row (a row of TN = 4 or 8 floats holds one or two fragments whole).
template <class S, bool ROUND>
__device__ __forceinline__ void mma_k_tile(
    const float (*As)[S::A::LDS], const float (*Bs)[S::B::LDS], const MmaLane<S::BM, S::BN>& l,
    float (&acc)[RegBlock<S::BM, S::BN>::TM][RegBlock<S::BM, S::BN>::TN]) {
    typedef MmaLane<S::BM, S::BN> W;
    const int TN = RegBlock<S::BM, S::BN>::TN;
#pragma unroll
    for (int k0 = 0; k0 < GEMM_BK; k0 += 8) {
        float a[W::MI][4], b[W::NI][2];
#pragma unroll
        for (int mi = 0; mi < W::MI; ++mi) {
            const int m = l.wm + mi * 16 + l.g;
            a[mi][0] = mma_operand<ROUND>(As[k0 + l.t][m]);
            a[mi][1] = mma_operand<ROUND>(As[k0 + l.t][m + 8]);
            a[mi][2] = mma_operand<ROUND>(As[k0 + l.t + 4][m]);
            a[mi][3] = mma_operand<ROUND>(As[k0 + l.t + 4][m + 8]);
        }
#pragma unroll
        for (int ni = 0; ni < W::NI; ++ni) {
            const int n = l.wn + ni * 8 + l.g;
            b[ni][0] = mma_operand<ROUND>(Bs[k0 + l.t][n]);
            b[ni][1] = mma_operand<ROUND>(Bs[k0 + l.t + 4][n]);
        }
#pragma unroll
        for (int p = 0; p < W::MI * W::NI; ++p) {
            float d[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) d[r] = acc[(4 * p + r) / TN][(4 * p + r) % TN];
            mma_m16n8k8_tf32(d, a[p / W::NI], b[p % W::NI]);
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[(4 * p + r) / TN][(4 * p + r) % TN] = d[r];
        }
    }
}
