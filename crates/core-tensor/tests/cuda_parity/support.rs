//! The devices the parity suite runs on, and its comparisons.

use std::sync::OnceLock;

use core_tensor::{Backend, Cpu, Cuda, Elem, MatmulPrecision};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The reference every device is compared with: the one-thread CPU backend.
pub fn reference() -> Cpu {
    Cpu::new(1).expect("one CPU thread always starts")
}

/// A two-thread CPU backend: a second device present on every machine, so
/// every test body runs (and can fail) even where there is no GPU.
pub fn cpu2() -> Cpu {
    Cpu::new(2).expect("two CPU threads start")
}

/// GPU 0, shared by the tests of this binary (one context, one compile);
/// `None`, after saying so, when there is none — unless REQUIRE_GPU=1, which
/// turns a missing GPU into a failure.
pub fn gpu(test: &str) -> Option<Cuda> {
    static GPU: OnceLock<Result<Cuda, String>> = OnceLock::new();
    match GPU.get_or_init(|| Cuda::new(0).map_err(|e| e.with_causes())) {
        Ok(gpu) => Some(gpu.clone()),
        Err(e) => skip_gpu(test, e),
    }
}

/// A GPU backend of its own, for tests that trip the fault word (which a
/// shared backend would report to whichever test synchronizes next).
pub fn own_gpu(test: &str) -> Option<Cuda> {
    match Cuda::new(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => skip_gpu(test, &e.with_causes()),
    }
}

fn skip_gpu(test: &str, why: &str) -> Option<Cuda> {
    assert!(
        std::env::var("REQUIRE_GPU").map_or(true, |v| v != "1"),
        "REQUIRE_GPU=1, but no usable GPU: {why}"
    );
    println!("{test}: CUDA skipped: {why}");
    None
}

/// GPU 0 with TF32 matmuls, as [`gpu`] (skipped, or under REQUIRE_GPU=1 a
/// failure, when there is no GPU or it cannot do TF32).
pub fn gpu_tf32(test: &str) -> Option<Cuda> {
    match Cuda::with_precision(0, MatmulPrecision::Tf32) {
        Ok(gpu) => Some(gpu),
        Err(e) => skip_gpu(test, &e.with_causes()),
    }
}

/// Runs a generic test body on every device under test.
#[macro_export]
macro_rules! on_each_device {
    ($body:ident) => {{
        $body(&$crate::support::cpu2());
        if let Some(gpu) = $crate::support::gpu(stringify!($body)) {
            $body(&gpu);
        }
    }};
}

/// `n` values uniform in `[lo, hi)`, reproducible from `seed`.
pub fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// `n` integers in `[-3, 3]` as f32: exact in TF32, and every sum of their
/// products the layers form is an exact float32 integer in any order.
pub fn small_integers(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-3i8..=3) as f32).collect()
}

pub fn abs(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| x.abs()).collect()
}

pub fn up<B: Backend, T: Elem>(dev: &B, host: &[T]) -> B::Storage<T> {
    dev.upload(host).expect("upload")
}

pub fn down<B: Backend, T: Elem>(dev: &B, storage: &B::Storage<T>) -> Vec<T> {
    dev.download(storage).expect("download")
}

/// Bit-for-bit equality (NaN payloads and the sign of zero included): for
/// ops whose every operation is one correctly rounded step on both devices.
pub fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}[{i}]: got {g}, want {w}");
    }
}

/// For sums of products computed in a different order (tiled GEMMs, split
/// K, tree reductions): any order of a `terms`-term f32 dot product is within
/// γ·Σ|aᵢbᵢ| of the exact value, γ = terms·u/(1 − terms·u) with u = 2⁻²⁴, so
/// two orders differ by at most twice that. `abs_sum` is Σ|aᵢbᵢ| per
/// element, computed by the reference on the inputs' absolute values. A
/// wrong index or a lost term is off by a whole term, orders above this.
pub fn assert_within_sum_bound(
    what: &str,
    got: &[f32],
    want: &[f32],
    abs_sum: &[f32],
    terms: usize,
) {
    assert_within_rounded_sum_bound(what, got, want, abs_sum, terms, 0.0);
}

/// The relative error of one product of two inputs rounded to TF32 (10
/// stored mantissa bits, to nearest): (1 + 2⁻¹¹)² − 1.
pub const TF32_PRODUCT_ERROR: f64 = 2.0 / 2048.0 + 1.0 / (2048.0 * 2048.0);

/// [`assert_within_sum_bound`] for a device whose products carry a relative
/// error of up to `product_error` (its inputs rounded to a narrower type):
/// that adds product_error·Σ|aᵢbᵢ|. Its accumulation may also truncate
/// rather than round (tensor cores), so the order term is doubled too.
pub fn assert_within_rounded_sum_bound(
    what: &str,
    got: &[f32],
    want: &[f32],
    abs_sum: &[f32],
    terms: usize,
    product_error: f64,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let u = f64::powi(2.0, -24);
    let n = terms as f64;
    let gamma = n * u / (1.0 - n * u);
    let order = if product_error > 0.0 { 4.0 } else { 2.0 } * gamma;
    for (i, ((&g, &w), &a)) in got.iter().zip(want).zip(abs_sum).enumerate() {
        // 1.001 covers the rounding of `abs_sum` itself.
        let tol = (order + product_error) * f64::from(a) * 1.001 + f64::from(f32::MIN_POSITIVE);
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(
            err <= tol,
            "{what}[{i}]: got {g}, want {w} (|Δ| = {err:e} > {tol:e} for {terms} terms)"
        );
    }
}
