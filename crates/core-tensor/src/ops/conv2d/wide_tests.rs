use super::*;
use crate::ops::conv2d::tests::{max_rel_error, naive_conv, naive_conv_bwd};
use crate::simd::Block;
use crate::testing::uniform;

/// `(y, dW, dx)` of a whole batch through [`Wide`] and [`WideBwd`], one
/// image at a time as the CPU backend's threads do.
fn run(isa: Isa, g: &Conv2dGeom, x: &[f32], w: &[f32], b: &[f32], dy: &[f32]) -> [Vec<f32>; 3] {
    let (in_len, out_len) = (g.in_image_len(), g.out_image_len());
    let layout = Layout::new(isa, g);
    let (fwd, bwd) = (Wide::new(&layout, w, b), WideBwd::new(&layout, w, true));
    let (mut y, mut dx) = (vec![0.0; g.batch * out_len], vec![0.0; x.len()]);
    let (mut scratch, mut padded, mut s) = (Vec::new(), Vec::new(), bwd.scratch());
    for n in 0..g.batch {
        let y_n = &mut y[n * out_len..(n + 1) * out_len];
        fwd.forward(layout.image(x, n * in_len, &mut padded), &mut scratch, y_n);
        let dx_n = &mut dx[n * in_len..(n + 1) * in_len];
        let dy_n = &dy[n * out_len..(n + 1) * out_len];
        let x_n = layout.image(x, n * in_len, &mut padded);
        bwd.image(x_n, dy_n, &mut s, Some(dx_n));
    }
    let mut dw = vec![0.0; w.len()];
    bwd.dw_into(&s, &mut dw);
    [y, dw, dx]
}

/// Shapes that leave partial blocks everywhere: channel counts that are not
/// multiples of any block's rows, tap counts not multiples of a reduction's,
/// planes whose wide rows end mid-block, one input channel (conv1), 1×1
/// kernels; and CNN_MNIST's conv2.
fn shapes() -> Vec<Conv2dGeom> {
    let base = Conv2dGeom {
        batch: 3,
        in_channels: 5,
        in_h: 9,
        in_w: 11,
        out_channels: 7,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    vec![
        base,
        Conv2dGeom {
            kernel: 2,
            in_h: 4,
            in_w: 5,
            out_channels: 13,
            ..base
        },
        Conv2dGeom {
            kernel: 1,
            in_channels: 2,
            out_channels: 9,
            ..base
        },
        Conv2dGeom {
            in_channels: 1,
            in_h: 28,
            in_w: 28,
            out_channels: 32,
            batch: 2,
            ..base
        },
        Conv2dGeom {
            in_channels: 32,
            in_h: 26,
            in_w: 26,
            out_channels: 64,
            batch: 2,
            ..base
        },
    ]
}

#[test]
fn every_pass_matches_the_definition_on_every_instruction_set() {
    for isa in Isa::testable() {
        for (i, g) in shapes().iter().enumerate() {
            let seed = 40 + 3 * i as u64;
            let x = uniform(seed, g.batch * g.in_image_len(), -1.0, 1.0);
            let w = uniform(seed + 1, g.weight_len(), -0.5, 0.5);
            let b = uniform(seed + 2, g.out_channels, -0.5, 0.5);
            let dy = uniform(seed + 3, g.batch * g.out_image_len(), -1.0, 1.0);
            let [y, dw, dx] = run(isa, g, &x, &w, &b, &dy);
            let (want_dx, want_dw) = naive_conv_bwd(g, &x, &w, &dy);
            let errors = [
                ("y", max_rel_error(&y, &naive_conv(g, &x, &w, &b))),
                ("dW", max_rel_error(&dw, &want_dw)),
                ("dx", max_rel_error(&dx, &want_dx)),
            ];
            for (what, err) in errors {
                assert!(
                    err <= 1e-5,
                    "{isa:?}, {g:?}: {what} max relative error {err}"
                );
            }
        }
    }
}

#[test]
fn the_same_inputs_give_the_same_bits() {
    for isa in Isa::testable() {
        let g = &shapes()[0];
        let x = uniform(1, g.batch * g.in_image_len(), -1.0, 1.0);
        let w = uniform(2, g.weight_len(), -0.5, 0.5);
        let b = uniform(3, g.out_channels, -0.5, 0.5);
        let dy = uniform(4, g.batch * g.out_image_len(), -1.0, 1.0);
        assert_eq!(
            run(isa, g, &x, &w, &b, &dy),
            run(isa, g, &x, &w, &b, &dy),
            "{isa:?}"
        );
    }
}

#[test]
fn a_block_that_would_read_past_its_input_is_refused() {
    let Some(isa) = Isa::detect() else {
        eprintln!("SKIPPED: this CPU has no AVX2; the wide kernels never run");
        return;
    };
    let taps = Taps::new(vec![0, 5]);
    let w = vec![0.0; 2 * isa.rows()];
    let mut out = vec![0.0; isa.rows() * isa.tile()];
    let x = vec![0.0; isa.tile() + 4];
    let refused = std::panic::catch_unwind(move || {
        Block {
            x: &x,
            x_at: 0,
            taps: &taps,
            w: &w,
            init: None,
            out_at: 0,
            out_stride: isa.tile(),
        }
        .run(isa, &mut out)
    })
    .expect_err("the block ran");
    let said = refused.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(said.contains("reads past its input"), "{said}");
}

/// `Σ_k terms(k)` as the kernels take it: one chain of fused multiply-adds
/// from zero, in `k`'s order.
fn chain(terms: impl Iterator<Item = (f32, f32)>) -> f32 {
    terms.fold(0.0, |acc, (a, b)| a.mul_add(b, acc))
}

/// Every pass by its summation order, one scalar at a time: outputs are a
/// chain over taps (in `(c, kh, kw)` order) plus the bias; `dW` per image a
/// chain over positions, added image by image; `dx` per kernel tap a chain
/// over output channels, added tap by tap.
fn in_order(g: &Conv2dGeom, x: &[f32], w: &[f32], b: &[f32], dy: &[f32]) -> [Vec<f32>; 3] {
    let (k, (oh_n, ow_n), patch) = (g.kernel, (g.out_h(), g.out_w()), g.patch_len());
    let (c_n, o_n, (h, wd)) = (g.in_channels, g.out_channels, (g.in_h, g.in_w));
    let xi = |n: usize, c: usize, i: usize, j: usize| x[((n * c_n + c) * h + i) * wd + j];
    let dyi = |n: usize, o: usize, i: usize, j: usize| dy[((n * o_n + o) * oh_n + i) * ow_n + j];
    let taps = |t: usize| (t / (k * k), t / k % k, t % k);
    let mut y = Vec::new();
    for (n, o, i, j) in indices(g.batch, o_n, oh_n, ow_n) {
        let terms = (0..patch).map(|t| {
            let (c, kh, kw) = taps(t);
            (w[o * patch + t], xi(n, c, i + kh, j + kw))
        });
        y.push(b[o] + chain(terms));
    }
    let mut dw = vec![0.0f32; w.len()];
    for n in 0..g.batch {
        for (o, t) in (0..o_n).flat_map(|o| (0..patch).map(move |t| (o, t))) {
            let (c, kh, kw) = taps(t);
            let positions = (0..oh_n).flat_map(|i| (0..ow_n).map(move |j| (i, j)));
            dw[o * patch + t] +=
                chain(positions.map(|(i, j)| (dyi(n, o, i, j), xi(n, c, i + kh, j + kw))));
        }
    }
    let mut dx = Vec::new();
    for (n, c, i, j) in indices(g.batch, c_n, h, wd) {
        let mut acc = 0.0f32;
        for (kh, kw) in (0..k).flat_map(|kh| (0..k).map(move |kw| (kh, kw))) {
            let (Some(oi), Some(oj)) = (i.checked_sub(kh), j.checked_sub(kw)) else {
                continue;
            };
            if oi < oh_n && oj < ow_n {
                acc += chain(
                    (0..o_n).map(|o| (w[o * patch + c * k * k + kh * k + kw], dyi(n, o, oi, oj))),
                );
            }
        }
        dx.push(acc);
    }
    [y, dw, dx]
}

/// Every index of a `[a][b][c][d]` array, in memory order.
fn indices(
    a: usize,
    b: usize,
    c: usize,
    d: usize,
) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    (0..a).flat_map(move |p| {
        (0..b).flat_map(move |q| (0..c).flat_map(move |r| (0..d).map(move |s| (p, q, r, s))))
    })
}

/// Each output is one chain of fused multiply-adds in its reduction index's
/// order, added to its start value after, on every instruction set, so the
/// vector width never changes a bit (and the order is im2col + `gemm`'s
/// where `gemm` does not split the sum, which keeps the CPU–GPU parity
/// tolerances where they were).
#[test]
fn every_pass_sums_in_its_documented_order() {
    for isa in Isa::testable() {
        for g in &shapes() {
            let x = uniform(7, g.batch * g.in_image_len(), -1.0, 1.0);
            let w = uniform(8, g.weight_len(), -0.5, 0.5);
            let b = uniform(9, g.out_channels, -0.5, 0.5);
            let dy = uniform(10, g.batch * g.out_image_len(), -1.0, 1.0);
            let got = run(isa, g, &x, &w, &b, &dy);
            let want = in_order(g, &x, &w, &b, &dy);
            for ((what, got), want) in ["y", "dW", "dx"].iter().zip(&got).zip(&want) {
                assert!(got == want, "{isa:?}, {g:?}: {what}");
            }
        }
    }
}
