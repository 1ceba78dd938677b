//! The layers with a weight and a bias (conv2d, linear): GEMMs whose
//! devices add in different orders, so they are held to the sum-of-products
//! bound, and to the same bits run to run.

use std::fmt::Debug;

use core_tensor::Ops;
use core_tensor::ops::{Conv2dGeom, LinearGeom, ParamAt};

use crate::on_each_device;
use crate::support::{
    abs, assert_same_bits, assert_within_sum_bound, down, reference, uniform, up,
};

/// A layer's two kernels, as the suite drives them: forward into `y`,
/// then backward into `grads` and `dx`.
trait Layer: Debug {
    #[allow(clippy::too_many_arguments)]
    fn fwd_bwd<B: Ops>(
        &self,
        dev: &B,
        x: &B::Storage<f32>,
        params: &B::Storage<f32>,
        at: &ParamAt,
        dy: &B::Storage<f32>,
        y: &mut B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dx: &mut B::Storage<f32>,
    );
}

macro_rules! layer {
    ($geom:ty: $fwd:ident, $bwd:ident) => {
        impl Layer for $geom {
            fn fwd_bwd<B: Ops>(
                &self,
                dev: &B,
                x: &B::Storage<f32>,
                params: &B::Storage<f32>,
                at: &ParamAt,
                dy: &B::Storage<f32>,
                y: &mut B::Storage<f32>,
                grads: &mut B::Storage<f32>,
                dx: &mut B::Storage<f32>,
            ) {
                dev.$fwd(self, x, params, at, y).unwrap();
                dev.$bwd(self, x, params, at, dy, grads, Some(dx)).unwrap();
            }
        }
    };
}

layer!(Conv2dGeom: conv2d_fwd, conv2d_bwd);
layer!(LinearGeom: linear_fwd, linear_bwd);

/// Runs the layer forward and backward on `dev`; returns (y, grads, dx).
fn layer_run<B: Ops>(
    dev: &B,
    g: &impl Layer,
    x: &[f32],
    params: &[f32],
    at: &ParamAt,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (x_d, p_d, dy_d) = (up(dev, x), up(dev, params), up(dev, dy));
    let mut y = dev.zeros(dy.len()).unwrap();
    let mut grads = up(dev, &vec![f32::NAN; params.len()]);
    let mut dx = up(dev, &vec![f32::NAN; x.len()]);
    g.fwd_bwd(dev, &x_d, &p_d, at, &dy_d, &mut y, &mut grads, &mut dx);
    (down(dev, &y), down(dev, &grads), down(dev, &dx))
}

/// Conv parameters packed as [W | b] in one flat buffer, with an offset so
/// the ranges are honoured rather than assumed to start at 0.
fn conv_params(g: &Conv2dGeom, seed: u64) -> (Vec<f32>, ParamAt) {
    let pad = 3;
    let (wl, bl) = (g.weight_len(), g.out_channels);
    let params = uniform(seed, pad + wl + bl, -1.0, 1.0);
    let at = ParamAt {
        weight: pad..pad + wl,
        bias: pad + wl..pad + wl + bl,
    };
    (params, at)
}

fn conv2d_matches<B: Ops>(dev: &B) {
    let base = Conv2dGeom {
        batch: 3,
        in_channels: 3,
        in_h: 9,
        in_w: 8,
        out_channels: 5,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    let geoms = [
        base,
        Conv2dGeom {
            stride: 2,
            padding: 1,
            ..base
        },
        Conv2dGeom {
            kernel: 2,
            padding: 2,
            in_w: 5,
            ..base
        },
        // The model's conv1 and conv2 (conv2's weight gradient splits K).
        Conv2dGeom {
            batch: 4,
            in_channels: 1,
            in_h: 28,
            in_w: 28,
            out_channels: 32,
            ..base
        },
        Conv2dGeom {
            batch: 4,
            in_channels: 32,
            in_h: 26,
            in_w: 26,
            out_channels: 64,
            ..base
        },
        // More than one 64-row tile of output channels.
        Conv2dGeom {
            batch: 2,
            out_channels: 70,
            padding: 1,
            ..base
        },
    ];
    for (i, g) in geoms.iter().enumerate() {
        let seed = 100 + i as u64;
        let x = uniform(seed, g.batch * g.in_image_len(), -1.0, 1.0);
        let dy = uniform(seed + 1, g.batch * g.out_image_len(), -1.0, 1.0);
        let (params, at) = conv_params(g, seed + 2);
        let what = |part: &str| format!("{} conv2d {part} {g:?}", dev.describe());
        let (y, grads, dx) = layer_run(dev, g, &x, &params, &at, &dy);
        let (y_ref, grads_ref, dx_ref) = layer_run(&reference(), g, &x, &params, &at, &dy);
        // Σ|terms| per output: the same op on absolute values.
        let (y_abs, grads_abs, dx_abs) =
            layer_run(&reference(), g, &abs(&x), &abs(&params), &at, &abs(&dy));
        let pixels = g.batch * g.out_h() * g.out_w();
        assert_within_sum_bound(&what("y"), &y, &y_ref, &y_abs, g.patch_len() + 1);
        let (w, b) = (at.weight.clone(), at.bias.clone());
        assert_within_sum_bound(
            &what("dW"),
            &grads[w.clone()],
            &grads_ref[w.clone()],
            &grads_abs[w],
            pixels,
        );
        assert_within_sum_bound(
            &what("db"),
            &grads[b.clone()],
            &grads_ref[b.clone()],
            &grads_abs[b],
            pixels,
        );
        let taps = g.out_channels * g.kernel * g.kernel;
        assert_within_sum_bound(&what("dx"), &dx, &dx_ref, &dx_abs, taps);
        // Deterministic: a second run gives the same bits.
        let (y2, grads2, dx2) = layer_run(dev, g, &x, &params, &at, &dy);
        assert_same_bits(&what("y rerun"), &y2, &y);
        assert_same_bits(
            &what("grads rerun"),
            &grads2[at.weight.start..at.bias.end],
            &grads[at.weight.start..at.bias.end],
        );
        assert_same_bits(&what("dx rerun"), &dx2, &dx);
    }
}

#[test]
fn conv2d() {
    on_each_device!(conv2d_matches);
}

fn linear_matches<B: Ops>(dev: &B) {
    let geoms = [
        LinearGeom {
            batch: 7,
            in_features: 33,
            out_features: 17,
        },
        // The model's fc1 (forward splits K = 9216) and fc2.
        LinearGeom {
            batch: 16,
            in_features: 9216,
            out_features: 128,
        },
        LinearGeom {
            batch: 64,
            in_features: 128,
            out_features: 10,
        },
        // Tiles in every direction, ragged edges.
        LinearGeom {
            batch: 130,
            in_features: 70,
            out_features: 65,
        },
    ];
    for (i, g) in geoms.iter().enumerate() {
        let seed = 200 + i as u64;
        let x = uniform(seed, g.batch * g.in_features, -1.0, 1.0);
        let dy = uniform(seed + 1, g.batch * g.out_features, -1.0, 1.0);
        let wl = g.in_features * g.out_features;
        let params = uniform(seed + 2, 1 + wl + g.out_features, -1.0, 1.0);
        let at = ParamAt {
            weight: 1..1 + wl,
            bias: 1 + wl..1 + wl + g.out_features,
        };
        let what = |part: &str| format!("{} linear {part} {g:?}", dev.describe());
        let (y, grads, dx) = layer_run(dev, g, &x, &params, &at, &dy);
        let (y_ref, grads_ref, dx_ref) = layer_run(&reference(), g, &x, &params, &at, &dy);
        let (y_abs, grads_abs, dx_abs) =
            layer_run(&reference(), g, &abs(&x), &abs(&params), &at, &abs(&dy));
        assert_within_sum_bound(&what("y"), &y, &y_ref, &y_abs, g.in_features + 1);
        let w = at.weight.clone();
        assert_within_sum_bound(
            &what("dW"),
            &grads[w.clone()],
            &grads_ref[w.clone()],
            &grads_abs[w],
            g.batch,
        );
        // One sequential sum per column on every device: the same bits.
        assert_same_bits(
            &what("db"),
            &grads[at.bias.clone()],
            &grads_ref[at.bias.clone()],
        );
        assert_within_sum_bound(&what("dx"), &dx, &dx_ref, &dx_abs, g.out_features);
        let (y2, grads2, dx2) = layer_run(dev, g, &x, &params, &at, &dy);
        assert_same_bits(&what("y rerun"), &y2, &y);
        assert_same_bits(&what("grads rerun"), &grads2[1..], &grads[1..]);
        assert_same_bits(&what("dx rerun"), &dx2, &dx);
    }
}

#[test]
fn linear() {
    on_each_device!(linear_matches);
}
