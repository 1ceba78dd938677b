//! Dropout's mask loops (ReLU, then the mask) compiled for each instruction
//! set and chosen at run time. The mask's 64-bit hash is most of their
//! cost, and the default build's baseline x86-64 has no vector 64-bit
//! multiply: with AVX2 (emulated from 32-bit ones) the loops ran about
//! twice as fast, and AVX-512DQ has the instruction itself. The arithmetic
//! is the scalar code's in every version, so the bits are the same.

use super::Dropout;

/// `values[k] = dropout(max(values[k], 0))`, element `first + k` of the mask.
pub(crate) fn relu_dropout_fwd(dropout: Dropout, first: usize, values: &mut [f32]) {
    if dropout.is_off() {
        // No hash: the plain loop vectorizes in any build.
        values.iter_mut().for_each(|v| *v = relu(*v));
        return;
    }
    match Build::detect() {
        // SAFETY: `detect` saw the features the function is compiled for.
        #[cfg(target_arch = "x86_64")]
        Build::Avx512Dq => unsafe { x86::fwd_avx512(dropout, first, values) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => unsafe { x86::fwd_avx2(dropout, first, values) },
        Build::Baseline => fwd(dropout, first, values),
    }
}

/// `dy[k] = dropout(dy[k]) · [y[k] > 0]`, element `first + k` of the mask.
pub(crate) fn relu_dropout_bwd(dropout: Dropout, first: usize, y: &[f32], dy: &mut [f32]) {
    if dropout.is_off() {
        // A select rather than a branch, so the loop vectorizes.
        for (d, &y) in dy.iter_mut().zip(y) {
            *d = if y > 0.0 { *d } else { 0.0 };
        }
        return;
    }
    match Build::detect() {
        // SAFETY: `detect` saw the features the function is compiled for.
        #[cfg(target_arch = "x86_64")]
        Build::Avx512Dq => unsafe { x86::bwd_avx512(dropout, first, y, dy) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => unsafe { x86::bwd_avx2(dropout, first, y, dy) },
        Build::Baseline => bwd(dropout, first, y, dy),
    }
}

/// The versions of the loops, the best this CPU runs first. Not
/// `simd::Isa`: the AVX-512 version also needs DQ (its 64-bit multiply),
/// and the AVX2 one no FMA.
#[derive(Clone, Copy)]
enum Build {
    #[cfg(target_arch = "x86_64")]
    Avx512Dq,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Baseline,
}

impl Build {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq") {
                return Self::Avx512Dq;
            }
            if is_x86_feature_detected!("avx2") {
                return Self::Avx2;
            }
        }
        Self::Baseline
    }
}

/// `max(v, 0)`, but NaN stays NaN: `max` would turn it into 0 and hide a
/// diverged run.
#[inline(always)]
fn relu(v: f32) -> f32 {
    if v < 0.0 { 0.0 } else { v }
}

#[inline(always)]
fn fwd(dropout: Dropout, first: usize, values: &mut [f32]) {
    for (k, v) in values.iter_mut().enumerate() {
        *v = dropout.apply((first + k) as u64, relu(*v));
    }
}

/// The mask is drawn whatever `y` is, and the ReLU's choice is a select:
/// a branch on `y` mispredicts on about every other value.
#[inline(always)]
fn bwd(dropout: Dropout, first: usize, y: &[f32], dy: &mut [f32]) {
    for (k, (d, &y)) in dy.iter_mut().zip(y).enumerate() {
        let kept = dropout.apply((first + k) as u64, *d);
        *d = if y > 0.0 { kept } else { 0.0 };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Dropout, bwd, fwd};

    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) fn fwd_avx512(dropout: Dropout, first: usize, values: &mut [f32]) {
        fwd(dropout, first, values);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn fwd_avx2(dropout: Dropout, first: usize, values: &mut [f32]) {
        fwd(dropout, first, values);
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) fn bwd_avx512(dropout: Dropout, first: usize, y: &[f32], dy: &mut [f32]) {
        bwd(dropout, first, y, dy);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn bwd_avx2(dropout: Dropout, first: usize, y: &[f32], dy: &mut [f32]) {
        bwd(dropout, first, y, dy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::uniform;

    /// Whichever version this CPU runs (under `cargo xtask miri`, the
    /// AVX2 and the AVX-512 ones) gives the scalar definition's bits, from
    /// any first element, over lengths that leave vector tails.
    #[test]
    fn the_mask_loops_give_the_definitions_bits() {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for (dropout, first, len) in [
            (Dropout { p: 0.25, seed: 5 }, 0, 67),
            (
                Dropout {
                    p: 0.5,
                    seed: u64::MAX,
                },
                1003,
                33,
            ),
            (Dropout::OFF, 7, 19),
        ] {
            let mut x = uniform(8, len, -1.0, 1.0);
            x[3] = f32::NAN;
            let dy = uniform(9, len, -1.0, 1.0);
            let mut y = x.clone();
            relu_dropout_fwd(dropout, first, &mut y);
            let mut got_dy = dy.clone();
            relu_dropout_bwd(dropout, first, &y, &mut got_dy);
            let keeps = |k: usize| dropout.is_off() || dropout.keeps((first + k) as u64);
            let scale = if dropout.is_off() {
                1.0
            } else {
                dropout.scale()
            };
            let want_y: Vec<f32> = (0..len)
                .map(|k| match keeps(k) {
                    true if dropout.is_off() => relu(x[k]),
                    true => relu(x[k]) * scale,
                    false => 0.0,
                })
                .collect();
            let want_dy: Vec<f32> = (0..len)
                .map(|k| match (keeps(k), want_y[k] > 0.0) {
                    (true, true) if dropout.is_off() => dy[k],
                    (true, true) => dy[k] * scale,
                    _ => 0.0,
                })
                .collect();
            assert_eq!(bits(&y), bits(&want_y), "{dropout:?} from {first}: y");
            assert_eq!(
                bits(&got_dy),
                bits(&want_dy),
                "{dropout:?} from {first}: dy"
            );
        }
    }
}
