//! The x86-64 kernels behind [`super::Block`] and [`super::TapSums`], one
//! macro each, instantiated per instruction set. Every accumulator is a
//! named local, which LLVM keeps in a register: arrays of vectors were
//! spilled to the stack and ran at half speed.
//!
//! Each output element is one chain of fused multiply-adds from zero, in the
//! order of the reduction index, and then added to its start value: the
//! order im2col + `gemm` sums in, so both paths give the same bits.

use std::arch::x86_64::*;

/// A block kernel: input vectors `$b` at lane offsets `$j·$lanes`, and per
/// output row `$r` one accumulator `$acc` for each input vector `$bv`.
macro_rules! block_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:expr,
     $set1:ident, $load:ident, $store:ident, $fma:ident, $add:ident,
     [$($b:ident $j:literal),+]
     $([$r:literal; $($acc:ident $bv:ident $jv:literal),+])+) => {
        /// # Safety
        /// The CPU has `$feature`; `x + offsets[k] + j` is readable for
        /// every tap `k` and `j` in the block, `w` holds one value per tap
        /// and row, `init` is null or holds one per row, and
        /// `out + r·out_stride + j` is writable (and readable when `init` is
        /// null) for every row `r` and `j` in the block.
        #[target_feature(enable = $feature)]
        pub(crate) unsafe fn $name(
            x: *const f32,
            offsets: &[u32],
            w: *const f32,
            init: *const f32,
            out: *mut f32,
            out_stride: usize,
        ) {
            const ROWS: usize = [$($r),+].len();
            // SAFETY: the caller's contract covers every pointer below.
            unsafe {
                $($(let mut $acc: $vec = $set1(0.0);)+)+
                for (k, &off) in offsets.iter().enumerate() {
                    let xp = x.add(off as usize);
                    let wk = w.add(k * ROWS);
                    $(let $b = $load(xp.add($j * $lanes));)+
                    $(
                        let a = $set1(*wk.add($r));
                        $($acc = $fma(a, $bv, $acc);)+
                    )+
                }
                $(
                    let o = out.add($r * out_stride);
                    $(
                        let at = o.add($jv * $lanes);
                        let start = if init.is_null() { $load(at) } else { $set1(*init.add($r)) };
                        $store(at, $add(start, $acc));
                    )+
                )+
            }
        }
    };
}

/// A weight-gradient kernel: `dy` vectors `$b` (output channels at lane
/// offsets `$j·$lanes`) per position, and per tap `$t` (input pointer `$xp`)
/// one accumulator `$acc` for each vector `$bv`.
macro_rules! taps_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:expr,
     $set1:ident, $load:ident, $store:ident, $fma:ident, $add:ident,
     [$($b:ident $j:literal),+]
     $([$t:literal $xp:ident; $($acc:ident $bv:ident $jv:literal),+])+) => {
        /// # Safety
        /// The CPU has `$feature`; for every position `i = oh·cols + ow`
        /// (`oh < rows`, `ow < cols`), `dyt + i·dy_stride + j` is readable
        /// for `j` in the block and `x + offsets[t] + oh·width + ow` for
        /// every tap `t`; `offsets` holds one value per tap, and
        /// `out + t·out_stride + j` is readable and writable.
        #[target_feature(enable = $feature)]
        pub(crate) unsafe fn $name(
            dyt: *const f32,
            dy_stride: usize,
            x: *const f32,
            offsets: *const u32,
            (rows, cols, width): (usize, usize, usize),
            out: *mut f32,
            out_stride: usize,
        ) {
            // SAFETY: the caller's contract covers every pointer below.
            unsafe {
                $(
                    let $xp = x.add(*offsets.add($t) as usize);
                    $(let mut $acc: $vec = $set1(0.0);)+
                )+
                // Each position's pointer from its index: stepping one
                // pointer on would move it past the end of `dyt` after the
                // last position, which `add` must never do.
                for oh in 0..rows {
                    let row = dyt.add(oh * cols * dy_stride);
                    for ow in 0..cols {
                        let d = row.add(ow * dy_stride);
                        let at = oh * width + ow;
                        $(let $b = $load(d.add($j * $lanes));)+
                        $(
                            let a = $set1(*$xp.add(at));
                            $($acc = $fma(a, $bv, $acc);)+
                        )+
                    }
                }
                $(
                    let o = out.add($t * out_stride);
                    $(
                        let at = o.add($jv * $lanes);
                        $store(at, $add($load(at), $acc));
                    )+
                )+
            }
        }
    };
}

block_kernel!(
    block_avx2, "avx2,fma", __m256, 8,
    _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps, _mm256_add_ps,
    [b0 0, b1 1]
    [0; c00 b0 0, c01 b1 1]
    [1; c10 b0 0, c11 b1 1]
    [2; c20 b0 0, c21 b1 1]
    [3; c30 b0 0, c31 b1 1]
    [4; c40 b0 0, c41 b1 1]
    [5; c50 b0 0, c51 b1 1]
);

taps_kernel!(
    taps_avx2, "avx2,fma", __m256, 8,
    _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps, _mm256_add_ps,
    [b0 0, b1 1]
    [0 x0; s00 b0 0, s01 b1 1]
    [1 x1; s10 b0 0, s11 b1 1]
    [2 x2; s20 b0 0, s21 b1 1]
    [3 x3; s30 b0 0, s31 b1 1]
    [4 x4; s40 b0 0, s41 b1 1]
    [5 x5; s50 b0 0, s51 b1 1]
);

/// The 16-lane shapes: 8 rows × 3 vectors per block, 12 taps × 2 vectors
/// per weight-gradient block (24 accumulators of AVX-512's 32 registers).
macro_rules! sixteen_lane_kernels {
    ($block:ident, $taps:ident, $feature:literal, $vec:ty,
     $set1:ident, $load:ident, $store:ident, $fma:ident, $add:ident) => {
        block_kernel!(
            $block, $feature, $vec, 16,
            $set1, $load, $store, $fma, $add,
            [b0 0, b1 1, b2 2]
            [0; c00 b0 0, c01 b1 1, c02 b2 2]
            [1; c10 b0 0, c11 b1 1, c12 b2 2]
            [2; c20 b0 0, c21 b1 1, c22 b2 2]
            [3; c30 b0 0, c31 b1 1, c32 b2 2]
            [4; c40 b0 0, c41 b1 1, c42 b2 2]
            [5; c50 b0 0, c51 b1 1, c52 b2 2]
            [6; c60 b0 0, c61 b1 1, c62 b2 2]
            [7; c70 b0 0, c71 b1 1, c72 b2 2]
        );
        taps_kernel!(
            $taps, $feature, $vec, 16,
            $set1, $load, $store, $fma, $add,
            [b0 0, b1 1]
            [0 x0; s00 b0 0, s01 b1 1]
            [1 x1; s10 b0 0, s11 b1 1]
            [2 x2; s20 b0 0, s21 b1 1]
            [3 x3; s30 b0 0, s31 b1 1]
            [4 x4; s40 b0 0, s41 b1 1]
            [5 x5; s50 b0 0, s51 b1 1]
            [6 x6; s60 b0 0, s61 b1 1]
            [7 x7; s70 b0 0, s71 b1 1]
            [8 x8; s80 b0 0, s81 b1 1]
            [9 x9; s90 b0 0, s91 b1 1]
            [10 x10; s100 b0 0, s101 b1 1]
            [11 x11; s110 b0 0, s111 b1 1]
        );
    };
}

sixteen_lane_kernels!(
    block_avx512,
    taps_avx512,
    "avx512f",
    __m512,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps
);

#[cfg(test)]
pub(crate) use emu16::{block_emu16, taps_emu16};

/// Sixteen lanes as two AVX2 vectors, for testing the 16-lane kernels'
/// shapes where AVX-512 is missing (only these wrappers differ).
#[cfg(test)]
mod emu16 {
    use super::*;

    #[derive(Clone, Copy)]
    pub struct V16(__m256, __m256);

    #[target_feature(enable = "avx2,fma")]
    fn set1(v: f32) -> V16 {
        V16(_mm256_set1_ps(v), _mm256_set1_ps(v))
    }

    /// # Safety
    /// 16 floats at `p` are readable.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(p: *const f32) -> V16 {
        // SAFETY: the caller's contract.
        unsafe { V16(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }

    /// # Safety
    /// 16 floats at `p` are writable.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store(p: *mut f32, v: V16) {
        // SAFETY: the caller's contract.
        unsafe {
            _mm256_storeu_ps(p, v.0);
            _mm256_storeu_ps(p.add(8), v.1);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn fma(a: V16, b: V16, c: V16) -> V16 {
        V16(
            _mm256_fmadd_ps(a.0, b.0, c.0),
            _mm256_fmadd_ps(a.1, b.1, c.1),
        )
    }

    #[target_feature(enable = "avx2,fma")]
    fn add(a: V16, b: V16) -> V16 {
        V16(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
    }

    sixteen_lane_kernels!(
        block_emu16,
        taps_emu16,
        "avx2,fma",
        V16,
        set1,
        load,
        store,
        fma,
        add
    );
}
