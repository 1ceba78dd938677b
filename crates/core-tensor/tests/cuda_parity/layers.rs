//! The layers with a weight and a bias (conv2d, linear): GEMMs whose
//! devices add in different orders, so they are held to the sum-of-products
//! bound, and to the same bits run to run.

use std::fmt::Debug;

use core_tensor::ops::{Conv2dGeom, LinearGeom, ParamAt};
use core_tensor::{Backend, Cuda, MatmulPrecision, Ops};

use crate::on_each_device;
use crate::support::{
    TF32_PRODUCT_ERROR, abs, assert_same_bits, assert_within_rounded_sum_bound,
    assert_within_sum_bound, down, gpu, gpu_in, reference, small_integers, uniform, up, wide,
};

/// A layer's two kernels, as the suite drives them: forward into `y`,
/// then backward into `grads` and `dx`.
pub(crate) trait Layer: Debug {
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

/// `Layer` for a geometry every `Ops` has the `LayerKernel` of.
macro_rules! layer {
    ($($geom:ty),*) => {$(
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
                dev.layer_fwd(self, x, params, at, y).unwrap();
                dev.layer_bwd(self, x, params, at, dy, grads, Some(dx)).unwrap();
            }
        }
    )*};
}

layer!(Conv2dGeom, LinearGeom);

/// Runs the layer forward and backward on `dev`; returns (y, grads, dx).
pub(crate) fn layer_run<B: Ops>(
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
pub(crate) fn conv_params(g: &Conv2dGeom, seed: u64) -> (Vec<f32>, ParamAt) {
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
    conv2d_within(dev, 0.0);
}

/// Conv2d on `dev` against the reference, each product of the device's
/// GEMMs off by up to `product_error` relative (0 for float32).
pub(crate) fn conv2d_within<B: Ops>(dev: &B, product_error: f64) {
    for (i, g) in conv_geoms().iter().enumerate() {
        let seed = 100 + i as u64;
        let x = uniform(seed, g.batch * g.in_image_len(), -1.0, 1.0);
        let dy = uniform(seed + 1, g.batch * g.out_image_len(), -1.0, 1.0);
        let (params, at) = conv_params(g, seed + 2);
        let pixels = g.batch * g.out_h() * g.out_w();
        let terms = Terms {
            y: g.patch_len() + 1,
            dw: pixels,
            dx: g.out_channels * g.kernel * g.kernel,
        };
        let [grads, grads_ref, grads_abs] =
            check_gemm_layer(dev, g, (&x, &params, &at, &dy), terms, product_error);
        // The bias gradient is a plain sum on every device, no GEMM.
        let b = at.bias.clone();
        assert_within_sum_bound(
            &format!("{} db {g:?}", dev.describe()),
            &grads[b.clone()],
            &grads_ref[b.clone()],
            &grads_abs[b],
            pixels,
        );
    }
}

/// How many terms each GEMM output of a layer sums: y (the bias counted),
/// dW and dx.
struct Terms {
    y: usize,
    dw: usize,
    dx: usize,
}

/// Runs `g` on `dev` and on the reference, holds y, dW and dx to the sum
/// bound (widened by `product_error`) and a rerun to the same bits, and
/// returns the gradients of the device, the reference and the reference on
/// absolute values, for the caller's bias check.
fn check_gemm_layer<B: Ops>(
    dev: &B,
    g: &impl Layer,
    (x, params, at, dy): (&[f32], &[f32], &ParamAt, &[f32]),
    terms: Terms,
    product_error: f64,
) -> [Vec<f32>; 3] {
    let what = |part: &str| format!("{} {part} {g:?}", dev.describe());
    let bound = |part: &str, got: &[f32], want: &[f32], abs_sum: &[f32], terms: usize| {
        assert_within_rounded_sum_bound(&what(part), got, want, abs_sum, terms, product_error)
    };
    let (y, grads, dx) = layer_run(dev, g, x, params, at, dy);
    let (y_ref, grads_ref, dx_ref) = layer_run(&reference(), g, x, params, at, dy);
    // Σ|terms| per output: the same op on absolute values.
    let (y_abs, grads_abs, dx_abs) =
        layer_run(&reference(), g, &abs(x), &abs(params), at, &abs(dy));
    bound("y", &y, &y_ref, &y_abs, terms.y);
    let w = at.weight.clone();
    let dw = (&grads[w.clone()], &grads_ref[w.clone()], &grads_abs[w]);
    bound("dW", dw.0, dw.1, dw.2, terms.dw);
    bound("dx", &dx, &dx_ref, &dx_abs, terms.dx);
    // Deterministic: a second run gives the same bits.
    let (y2, grads2, dx2) = layer_run(dev, g, x, params, at, dy);
    assert_same_bits(&what("y rerun"), &y2, &y);
    let both = at.weight.start..at.bias.end;
    assert_same_bits(&what("grads rerun"), &grads2[both.clone()], &grads[both]);
    assert_same_bits(&what("dx rerun"), &dx2, &dx);
    [grads, grads_ref, grads_abs]
}

/// Strides, padding, the model's two convolutions, more than one tile of
/// output channels, a long split-K reduce, and bias gradients summed in
/// slices of 4096 pixels (`conv2d_bwd_bias_partial_f32`) that end unevenly.
pub(crate) fn conv_geoms() -> [Conv2dGeom; 10] {
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
    [
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
        // The same in the wide tiles too: 4·18·18 = 5·256 + 16 pixels.
        Conv2dGeom {
            batch: 4,
            in_h: 20,
            in_w: 20,
            out_channels: 70,
            ..base
        },
        // conv1 at batch 16: its weight gradient's K splits 42 ways, past
        // the point where a warp sums each element.
        Conv2dGeom {
            batch: 16,
            in_channels: 1,
            in_h: 28,
            in_w: 28,
            out_channels: 32,
            ..base
        },
        // Bias gradients of 19·676 = 3·4096 + 556 pixels per channel: four
        // slices, the last short, each thread's pixels in one or two planes.
        Conv2dGeom {
            batch: 19,
            in_channels: 1,
            in_h: 28,
            in_w: 28,
            out_channels: 3,
            ..base
        },
        // 15000 planes of 3x3: 135000 = 32·4096 + 3928 pixels per channel,
        // so 33 slices (a lane of the second pass adds two), and a thread's
        // 256-pixel step crosses 28 planes.
        Conv2dGeom {
            batch: 15_000,
            in_channels: 1,
            in_h: 5,
            in_w: 5,
            out_channels: 2,
            ..base
        },
    ]
}

#[test]
fn conv2d() {
    on_each_device!(conv2d_matches);
}

fn linear_matches<B: Ops>(dev: &B) {
    linear_within(dev, 0.0);
}

/// Fc1, fc2, and shapes with tiles in every direction.
pub(crate) fn linear_geoms() -> [LinearGeom; 4] {
    [
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
    ]
}

/// Linear on `dev` against the reference, as [`conv2d_within`].
pub(crate) fn linear_within<B: Ops>(dev: &B, product_error: f64) {
    for (i, g) in linear_geoms().iter().enumerate() {
        let seed = 200 + i as u64;
        let x = uniform(seed, g.batch * g.in_features, -1.0, 1.0);
        let dy = uniform(seed + 1, g.batch * g.out_features, -1.0, 1.0);
        let wl = g.in_features * g.out_features;
        let params = uniform(seed + 2, 1 + wl + g.out_features, -1.0, 1.0);
        let at = ParamAt {
            weight: 1..1 + wl,
            bias: 1 + wl..1 + wl + g.out_features,
        };
        let terms = Terms {
            y: g.in_features + 1,
            dw: g.batch,
            dx: g.out_features,
        };
        let [grads, grads_ref, _] =
            check_gemm_layer(dev, g, (&x, &params, &at, &dy), terms, product_error);
        // One sequential sum per column on every device: the same bits.
        assert_same_bits(
            &format!("{} db {g:?}", dev.describe()),
            &grads[at.bias.clone()],
            &grads_ref[at.bias.clone()],
        );
    }
}

#[test]
fn linear() {
    on_each_device!(linear_matches);
}

/// TF32 on the tensor cores: within the sum bound widened by the inputs'
/// rounding to TF32, for every shape the float32 kernels are checked on.
#[test]
fn conv2d_and_linear_in_tf32() {
    if let Some(gpu) = gpu_in("conv2d_and_linear_in_tf32", MatmulPrecision::Tf32) {
        conv2d_within(&gpu, TF32_PRODUCT_ERROR);
        linear_within(&gpu, TF32_PRODUCT_ERROR);
    }
}

/// Small integers are exact in TF32 and every sum of their products is an
/// exact float32 integer, so every device and precision must give the
/// reference's bits: a fragment or tile mapped to the wrong element cannot
/// hide inside a rounding bound.
pub(crate) fn small_integer_products_are_exact<B: Ops>(dev: &B) {
    for (i, g) in conv_geoms().iter().enumerate() {
        let seed = 300 + i as u64;
        let x = small_integers(seed, g.batch * g.in_image_len());
        let dy = small_integers(seed + 1, g.batch * g.out_image_len());
        let (_, at) = conv_params(g, seed + 2);
        let params = small_integers(seed + 2, at.bias.end);
        exact_run(dev, g, (&x, &params, &at, &dy));
    }
    for (i, g) in linear_geoms().iter().enumerate() {
        let seed = 400 + i as u64;
        let x = small_integers(seed, g.batch * g.in_features);
        let dy = small_integers(seed + 1, g.batch * g.out_features);
        let wl = g.in_features * g.out_features;
        let params = small_integers(seed + 2, wl + g.out_features);
        let at = ParamAt {
            weight: 0..wl,
            bias: wl..wl + g.out_features,
        };
        exact_run(dev, g, (&x, &params, &at, &dy));
    }
}

/// `g` on `dev` gives the reference's bits.
fn exact_run<B: Ops>(
    dev: &B,
    g: &impl Layer,
    (x, params, at, dy): (&[f32], &[f32], &ParamAt, &[f32]),
) {
    let what = |part: &str| format!("{} {part} {g:?}", dev.describe());
    let (y, grads, dx) = layer_run(dev, g, x, params, at, dy);
    let (y_ref, grads_ref, dx_ref) = layer_run(&reference(), g, x, params, at, dy);
    assert_same_bits(&what("y"), &y, &y_ref);
    assert_same_bits(
        &what("grads"),
        &grads[at.weight.start..at.bias.end],
        &grads_ref[at.weight.start..at.bias.end],
    );
    assert_same_bits(&what("dx"), &dx, &dx_ref);
}

#[test]
fn small_integer_products() {
    on_each_device!(small_integer_products_are_exact);
    if let Some(gpu) = gpu_in("small_integer_products", MatmulPrecision::Tf32) {
        small_integer_products_are_exact(&gpu);
    }
    let gpus = [
        gpu("small_integer_products"),
        gpu_in("small_integer_products", MatmulPrecision::Tf32),
    ];
    for gpu in gpus.into_iter().flatten() {
        small_integer_products_are_exact(&wide(&gpu));
    }
}

/// The wide tiles (64 x 256) sum in the square tiles' order on the same K
/// splits, so every conv and linear shape gives the square tiles' bits. The
/// wide tile takes conv2's forward pass at batch 4 (whole tiles), 70
/// channels (ragged rows and columns, K = 27) and fc1's weight gradient.
#[test]
fn wide_fp32_tiles_give_the_square_tiles_bits() {
    if let Some(square) = gpu("wide_fp32_tiles_give_the_square_tiles_bits") {
        gives_the_same_bits(&square, &wide(&square));
    }
}

/// As [`wide_fp32_tiles_give_the_square_tiles_bits`], on the tensor cores:
/// each output's C fragment takes the same mma per k step in either tile.
#[test]
fn wide_tf32_tiles_give_the_square_tiles_bits() {
    let test = "wide_tf32_tiles_give_the_square_tiles_bits";
    if let Some(square) = gpu_in(test, MatmulPrecision::Tf32) {
        gives_the_same_bits(&square, &wide(&square));
    }
}

/// Every conv and linear shape on `other` gives `base`'s bits.
pub(crate) fn gives_the_same_bits(base: &Cuda, other: &Cuda) {
    for (i, g) in conv_geoms().iter().enumerate() {
        let x = uniform(500 + i as u64, g.batch * g.in_image_len(), -1.0, 1.0);
        let dy = uniform(600 + i as u64, g.batch * g.out_image_len(), -1.0, 1.0);
        let (params, at) = conv_params(g, 700 + i as u64);
        same_bits(base, other, g, (&x, &params, &at, &dy));
    }
    for (i, g) in linear_geoms().iter().enumerate() {
        let x = uniform(800 + i as u64, g.batch * g.in_features, -1.0, 1.0);
        let dy = uniform(900 + i as u64, g.batch * g.out_features, -1.0, 1.0);
        let wl = g.in_features * g.out_features;
        let params = uniform(1000 + i as u64, wl + g.out_features, -1.0, 1.0);
        let at = ParamAt {
            weight: 0..wl,
            bias: wl..wl + g.out_features,
        };
        same_bits(base, other, g, (&x, &params, &at, &dy));
    }
}

/// `g` on `other` gives `base`'s bits.
fn same_bits(
    base: &Cuda,
    other: &Cuda,
    g: &impl Layer,
    (x, params, at, dy): (&[f32], &[f32], &ParamAt, &[f32]),
) {
    let what = |part: &str| format!("{} {part} {g:?}", other.describe());
    let (y, grads, dx) = layer_run(base, g, x, params, at, dy);
    let (other_y, other_grads, other_dx) = layer_run(other, g, x, params, at, dy);
    assert_same_bits(&what("y"), &other_y, &y);
    assert_same_bits(&what("grads"), &other_grads, &grads);
    assert_same_bits(&what("dx"), &other_dx, &dx);
}
