//! Each kernel against its documented sum, one scalar fused multiply-add at
//! a time, bit for bit, on every instruction set this CPU runs; and nothing
//! written outside the block. Small enough for Miri, which runs these with
//! AVX-512 enabled on any x86-64 CPU (`cargo xtask miri`): the only check of
//! the AVX-512 kernels themselves on a machine without it.

use super::*;
use crate::testing::uniform;

/// `Σ terms` as the kernels take it: one chain of fused multiply-adds from
/// zero, in order.
fn chain(terms: impl Iterator<Item = (f32, f32)>) -> f32 {
    terms.fold(0.0, |acc, (a, b)| a.mul_add(b, acc))
}

#[test]
fn a_block_is_its_documented_sum() {
    for isa in Isa::testable() {
        let (rows, tile) = (isa.rows(), isa.tile());
        // Unordered taps, as a correlation's offsets need not be.
        let taps = Taps::new(vec![0, 13, 3, 9, 1]);
        let (x_at, out_at, out_stride) = (2, 3, tile + 5);
        let x = uniform(1, x_at + taps.max() + tile + 4, -1.0, 1.0);
        let w = uniform(2, taps.offsets().len() * rows, -1.0, 1.0);
        let init = uniform(3, rows, -1.0, 1.0);
        for init in [Some(&init[..]), None] {
            let before = uniform(4, out_at + (rows - 1) * out_stride + tile + 6, -1.0, 1.0);
            let mut out = before.clone();
            let block = Block {
                x: &x,
                x_at,
                taps: &taps,
                w: &w,
                init,
                out_at,
                out_stride,
            };
            block.run(isa, &mut out);
            let mut want = before.clone();
            for (r, j) in (0..rows).flat_map(|r| (0..tile).map(move |j| (r, j))) {
                let at = out_at + r * out_stride + j;
                let terms = taps.offsets().iter().enumerate();
                let sum = chain(terms.map(|(k, &o)| (w[k * rows + r], x[x_at + o as usize + j])));
                want[at] = init.map_or(before[at], |init| init[r]) + sum;
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&out),
                bits(&want),
                "{isa:?}, init {:?}",
                init.is_some()
            );
        }
    }
}

#[test]
fn tap_sums_are_their_documented_sums() {
    for isa in Isa::testable() {
        let (taps, channels) = (isa.taps(), isa.channels());
        let (rows, cols, width) = (3, 5, 7);
        let offsets: Vec<u32> = (0..taps as u32).map(|t| (t * 5) % 11).collect();
        let (dy_at, dy_stride, out_at, out_stride) = (1, channels + 3, 2, channels + 4);
        let dyt = uniform(
            5,
            dy_at + (rows * cols - 1) * dy_stride + channels + 2,
            -1.0,
            1.0,
        );
        let x = uniform(6, 11 + (rows - 1) * width + cols + 3, -1.0, 1.0);
        let before = uniform(
            7,
            out_at + (taps - 1) * out_stride + channels + 5,
            -1.0,
            1.0,
        );
        let mut out = before.clone();
        let sums = TapSums {
            dyt: &dyt,
            dy_at,
            dy_stride,
            x: &x,
            offsets: &offsets,
            rows,
            cols,
            width,
            out_at,
            out_stride,
        };
        sums.run(isa, &mut out);
        let mut want = before.clone();
        for (t, j) in (0..taps).flat_map(|t| (0..channels).map(move |j| (t, j))) {
            let positions = (0..rows).flat_map(|oh| (0..cols).map(move |ow| (oh, ow)));
            let sum = chain(positions.map(|(oh, ow)| {
                let i = oh * cols + ow;
                let xv = x[offsets[t] as usize + oh * width + ow];
                (xv, dyt[dy_at + i * dy_stride + j])
            }));
            let at = out_at + t * out_stride + j;
            want[at] = before[at] + sum;
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&want), "{isa:?}");
    }
}
