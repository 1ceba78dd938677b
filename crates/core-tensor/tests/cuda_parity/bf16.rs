//! The bf16 products (`MatmulPrecision::Bf16`, the trainer's `--bf16`):
//! within the documented tolerance of float32, and exactly float32's sums
//! of the inputs rounded to bf16 to nearest even.

use core_tensor::ops::{LinearGeom, ParamAt};
use core_tensor::{MatmulPrecision, Ops};

use crate::layers::{
    Layer, conv_geoms, conv_params, conv2d_within, layer_run, linear_geoms, linear_within,
    small_integer_products_are_exact,
};
use crate::support::{
    BF16_PRODUCT_ERROR, abs, assert_within_rounded_sum_bound, gpu_in, reference, uniform,
};

/// bf16 on the tensor cores: within the sum bound widened by the inputs'
/// rounding to bf16 (`BF16_PRODUCT_ERROR`), for every shape the float32
/// kernels are checked on.
#[test]
fn conv2d_and_linear_in_bf16() {
    if let Some(gpu) = gpu_in("conv2d_and_linear_in_bf16", MatmulPrecision::Bf16) {
        conv2d_within(&gpu, BF16_PRODUCT_ERROR);
        linear_within(&gpu, BF16_PRODUCT_ERROR);
    }
}

/// Integers in [-3, 3] are exact in bf16, and so is every sum of their
/// products: the reference's bits, whatever fragment or tile maps them.
#[test]
fn small_integer_products_in_bf16() {
    if let Some(gpu) = gpu_in("small_integer_products_in_bf16", MatmulPrecision::Bf16) {
        small_integer_products_are_exact(&gpu);
    }
}

/// `x` rounded to the nearest bf16, ties to even, as `cvt.rn.bf16.f32`
/// (finite inputs only).
fn bf16_round(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// Uniform values in [-1, 1), every third one moved to a tie between two
/// bf16 (its low 16 bits 0x8000), where to-nearest-even and away-from-zero
/// part.
fn with_ties(seed: u64, n: usize) -> Vec<f32> {
    let mut v = uniform(seed, n, -1.0, 1.0);
    for x in v.iter_mut().step_by(3) {
        *x = f32::from_bits(x.to_bits() & 0xffff_0000 | 0x8000);
    }
    v
}

/// The layer in bf16 on `dev` against the reference on the inputs rounded
/// to bf16 (the bias is not a product's operand and stays): the products are
/// then exact on both, so only the order of the float32 sums may differ,
/// and the bound is float32's (with one rounding per product allowed for
/// the tensor cores' accumulation). A product left in float32 or TF32, or
/// rounded another way, is off by up to 2⁻⁸ of a term where a short sum
/// (conv1's 10 terms, a linear of 33 inputs) allows about 2⁻¹⁸.
fn rounded_inputs_run<B: Ops>(
    dev: &B,
    g: &impl Layer,
    (x, params, at, dy): (&[f32], &[f32], &ParamAt, &[f32]),
    terms: [usize; 3],
) {
    let round = |v: &[f32]| v.iter().map(|&x| bf16_round(x)).collect::<Vec<_>>();
    let (x_r, dy_r) = (round(x), round(dy));
    let mut params_r = params.to_vec();
    params_r[at.weight.clone()].copy_from_slice(&round(&params[at.weight.clone()]));
    let (y, grads, dx) = layer_run(dev, g, x, params, at, dy);
    let (y_ref, grads_ref, dx_ref) = layer_run(&reference(), g, &x_r, &params_r, at, &dy_r);
    let (y_abs, grads_abs, dx_abs) = layer_run(
        &reference(),
        g,
        &abs(&x_r),
        &abs(&params_r),
        at,
        &abs(&dy_r),
    );
    let w = at.weight.clone();
    let one_rounding = f64::powi(2.0, -24);
    let what = |part: &str| format!("{} {part} {g:?} on bf16-rounded inputs", dev.describe());
    let checks = [
        ("y", &y[..], &y_ref[..], &y_abs[..], terms[0]),
        (
            "dW",
            &grads[w.clone()],
            &grads_ref[w.clone()],
            &grads_abs[w],
            terms[1],
        ),
        ("dx", &dx[..], &dx_ref[..], &dx_abs[..], terms[2]),
    ];
    for (part, got, want, abs_sum, n) in checks {
        assert_within_rounded_sum_bound(&what(part), got, want, abs_sum, n, one_rounding);
    }
}

#[test]
fn bf16_products_round_their_inputs_to_nearest_even() {
    let Some(gpu) = gpu_in(
        "bf16_products_round_their_inputs_to_nearest_even",
        MatmulPrecision::Bf16,
    ) else {
        return;
    };
    for (i, g) in conv_geoms().iter().enumerate() {
        let seed = 800 + i as u64;
        let x = with_ties(seed, g.batch * g.in_image_len());
        let dy = with_ties(seed + 1, g.batch * g.out_image_len());
        let (mut params, at) = conv_params(g, seed + 2);
        params[at.weight.clone()].copy_from_slice(&with_ties(seed + 3, at.weight.len()));
        let terms = [
            g.patch_len() + 1,
            g.batch * g.out_h() * g.out_w(),
            g.out_channels * g.kernel * g.kernel,
        ];
        rounded_inputs_run(&gpu, g, (&x, &params, &at, &dy), terms);
    }
    for (i, g) in linear_geoms().iter().enumerate() {
        let seed = 900 + i as u64;
        let LinearGeom {
            batch,
            in_features,
            out_features,
        } = *g;
        let x = with_ties(seed, batch * in_features);
        let dy = with_ties(seed + 1, batch * out_features);
        let wl = in_features * out_features;
        let params = with_ties(seed + 2, wl + out_features);
        let at = ParamAt {
            weight: 0..wl,
            bias: wl..wl + out_features,
        };
        let terms = [in_features + 1, batch, out_features];
        rounded_inputs_run(&gpu, g, (&x, &params, &at, &dy), terms);
    }
}
