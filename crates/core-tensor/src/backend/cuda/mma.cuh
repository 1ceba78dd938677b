// The tensor-core half of the shared SGEMM tile: sgemm.cuh pastes this in
// after `OperandTile` (build.rs pastes includes recursively), and its
// `_tf32` entry points run `mma_k_tile` on each staged k tile.
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
