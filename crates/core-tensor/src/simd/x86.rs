//! The x86-64 kernels behind [`super::Block`] and [`super::Reduce`], one
//! macro each, instantiated per instruction set. Every accumulator is a
//! named local, which LLVM keeps in a register: arrays of vectors were
//! spilled to the stack and ran at half speed.

use std::arch::x86_64::*;

/// A block kernel: input vectors `$b` at lane offsets `$j·$lanes`, and per
/// output row `$r` one accumulator `$acc` for each input vector `$bv`.
macro_rules! block_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:expr,
     $set1:ident, $load:ident, $store:ident, $fma:ident,
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
                $(
                    let o = out.add($r * out_stride);
                    let start: $vec = if init.is_null() { $set1(0.0) } else { $set1(*init.add($r)) };
                    $(let mut $acc: $vec = if init.is_null() { $load(o.add($jv * $lanes)) } else { start };)+
                )+
                let mut wk = w;
                for &off in offsets {
                    let xp = x.add(off as usize);
                    $(let $b = $load(xp.add($j * $lanes));)+
                    $(
                        let a = $set1(*wk.add($r));
                        $($acc = $fma(a, $bv, $acc);)+
                    )+
                    wk = wk.add(ROWS);
                }
                $(
                    let o = out.add($r * out_stride);
                    $($store(o.add($jv * $lanes), $acc);)+
                )+
            }
        }
    };
}

/// A reduction kernel: row vectors `$a` of rows `$ra`, and per tap `$t` one
/// accumulator `$acc` for each row vector `$av` (of row `$rv`).
macro_rules! reduce_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:expr,
     $zero:ident, $load:ident, $fma:ident, $hsum:ident,
     [$($a:ident $ra:literal),+]
     $([$t:literal; $($acc:ident $av:ident $rv:literal),+])+) => {
        /// # Safety
        /// The CPU has `$feature`; `a + r·a_stride + j` and
        /// `x + offsets[t] + j` are readable for every row `r`, tap `t` and
        /// `j < steps·$lanes`, `offsets` holds one value per tap, and
        /// `out + r·out_stride + t` is readable and writable.
        #[target_feature(enable = $feature)]
        pub(crate) unsafe fn $name(
            a: *const f32,
            a_stride: usize,
            x: *const f32,
            offsets: *const u32,
            steps: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            // SAFETY: the caller's contract covers every pointer below.
            unsafe {
                $($(let mut $acc: $vec = $zero();)+)+
                for s in 0..steps {
                    let at = s * $lanes;
                    $(let $a = $load(a.add($ra * a_stride + at));)+
                    $(
                        let xv = $load(x.add(*offsets.add($t) as usize + at));
                        $($acc = $fma($av, xv, $acc);)+
                    )+
                }
                $($(*out.add($rv * out_stride + $t) += $hsum($acc);)+)+
            }
        }
    };
}

/// The sum of a vector's lanes, pairwise.
#[target_feature(enable = "avx2,fma")]
fn hsum_avx2(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

#[target_feature(enable = "avx512f")]
fn hsum_avx512(v: __m512) -> f32 {
    _mm512_reduce_add_ps(v)
}

block_kernel!(
    block_avx2, "avx2,fma", __m256, 8,
    _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmadd_ps,
    [b0 0, b1 1]
    [0; c00 b0 0, c01 b1 1] [1; c10 b0 0, c11 b1 1] [2; c20 b0 0, c21 b1 1]
    [3; c30 b0 0, c31 b1 1] [4; c40 b0 0, c41 b1 1] [5; c50 b0 0, c51 b1 1]
);

reduce_kernel!(
    reduce_avx2, "avx2,fma", __m256, 8,
    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, hsum_avx2,
    [a0 0, a1 1]
    [0; s00 a0 0, s10 a1 1] [1; s01 a0 0, s11 a1 1] [2; s02 a0 0, s12 a1 1]
    [3; s03 a0 0, s13 a1 1] [4; s04 a0 0, s14 a1 1] [5; s05 a0 0, s15 a1 1]
);

/// The 16-lane shapes: 8 rows × 3 vectors per block, 4 rows × 6 taps per
/// reduction (24 accumulators of AVX-512's 32 registers).
macro_rules! sixteen_lane_kernels {
    ($block:ident, $reduce:ident, $feature:literal, $vec:ty,
     $set1:ident, $zero:ident, $load:ident, $store:ident, $fma:ident, $hsum:ident) => {
        block_kernel!(
            $block, $feature, $vec, 16,
            $set1, $load, $store, $fma,
            [b0 0, b1 1, b2 2]
            [0; c00 b0 0, c01 b1 1, c02 b2 2] [1; c10 b0 0, c11 b1 1, c12 b2 2]
            [2; c20 b0 0, c21 b1 1, c22 b2 2] [3; c30 b0 0, c31 b1 1, c32 b2 2]
            [4; c40 b0 0, c41 b1 1, c42 b2 2] [5; c50 b0 0, c51 b1 1, c52 b2 2]
            [6; c60 b0 0, c61 b1 1, c62 b2 2] [7; c70 b0 0, c71 b1 1, c72 b2 2]
        );
        reduce_kernel!(
            $reduce, $feature, $vec, 16,
            $zero, $load, $fma, $hsum,
            [a0 0, a1 1, a2 2, a3 3]
            [0; s00 a0 0, s10 a1 1, s20 a2 2, s30 a3 3]
            [1; s01 a0 0, s11 a1 1, s21 a2 2, s31 a3 3]
            [2; s02 a0 0, s12 a1 1, s22 a2 2, s32 a3 3]
            [3; s03 a0 0, s13 a1 1, s23 a2 2, s33 a3 3]
            [4; s04 a0 0, s14 a1 1, s24 a2 2, s34 a3 3]
            [5; s05 a0 0, s15 a1 1, s25 a2 2, s35 a3 3]
        );
    };
}

sixteen_lane_kernels!(
    block_avx512,
    reduce_avx512,
    "avx512f",
    __m512,
    _mm512_set1_ps,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_fmadd_ps,
    hsum_avx512
);

#[cfg(test)]
pub(crate) use emu16::{block_emu16, reduce_emu16};

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

    #[target_feature(enable = "avx2,fma")]
    fn zero() -> V16 {
        set1(0.0)
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
    fn hsum(v: V16) -> f32 {
        hsum_avx2(_mm256_add_ps(v.0, v.1))
    }

    sixteen_lane_kernels!(
        block_emu16,
        reduce_emu16,
        "avx2,fma",
        V16,
        set1,
        zero,
        load,
        store,
        fma,
        hsum
    );
}
