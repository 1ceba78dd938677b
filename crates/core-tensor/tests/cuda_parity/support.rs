//! The devices the parity suite runs on, and its comparisons.

use std::sync::OnceLock;

use core_tensor::{Backend, Cpu, Cuda, Elem, Fp32Tile, GemmStaging, MatmulPrecision, Products};
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

/// GPU 0 with its matmuls in `precision`, as [`gpu`] (skipped, or under
/// REQUIRE_GPU=1 a failure, when there is no GPU or it cannot do them).
pub fn gpu_in(test: &str, precision: MatmulPrecision) -> Option<Cuda> {
    gpu_staged(test, precision, GemmStaging::Registers)
}

/// [`gpu_in`] with the products' tiles staged by `staging`.
pub fn gpu_staged(test: &str, precision: MatmulPrecision, staging: GemmStaging) -> Option<Cuda> {
    let products = Products::new(precision, Fp32Tile::Square, staging).expect("products");
    match Cuda::with_products(0, products) {
        Ok(gpu) => Some(gpu),
        Err(e) => skip_gpu(test, &e.with_causes()),
    }
}

/// `gpu` with its float32 or TF32 products in the wide tiles.
pub fn wide(gpu: &Cuda) -> Cuda {
    let wide = gpu.clone().with_fp32_tile(Fp32Tile::Wide);
    wide.expect("float32 and TF32 products take the wide tiles")
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

/// The NaN rule of every comparison here: a device must give a NaN exactly
/// where the reference does, and any NaN equals any other (payload and sign
/// are not compared). `Some(both are NaN)` when either is; `None` when
/// neither is, and the comparison's own test decides.
///
/// Why not one NaN bit pattern for every kernel output: the devices make
/// different NaNs, and neither is cheap to change. A GPU's float32
/// arithmetic yields one NaN, 0x7fffffff, whatever went in; an x86 core
/// keeps the first NaN operand's payload (quietened) and makes 0xffc00000
/// for an invalid operation (0·∞); a copy keeps a NaN's bits on both. So
/// on an H100 the max-pool's NaN came out of the dropout's scaling as
/// 0x7fffffff where the CPU kept 0x7fc00000 (docs/gpu.md). Which operand's
/// payload x86 keeps even depends on the order the compiler gives a
/// commutative operation's operands, so the CPU's NaN is not a property of
/// the source either. One pattern would cost a compare and a blend on every
/// output of every CPU loop, and a pass of its own over what `gemm-f32`
/// writes, to buy bits nobody sees: the trainer's finiteness guard stops on
/// any non-finite value whatever its bits (`isfinite`), so a NaN never
/// reaches the parameters and no checkpoint holds one. What is observable,
/// where NaNs are, stays compared element by element. The rule holds while
/// no kernel and no host code reads a NaN's bits (a payload or the sign of
/// a NaN turned into a number, an index or an order); none does.
fn nan_rule(got: f32, want: f32) -> Option<bool> {
    (got.is_nan() || want.is_nan()).then_some(got.is_nan() && want.is_nan())
}

/// Bit-for-bit equality (the sign of zero included) under [`nan_rule`]:
/// for ops whose every operation is one correctly rounded step on both
/// devices.
pub fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            nan_rule(g, w).unwrap_or(g.to_bits() == w.to_bits()),
            "{what}[{i}]: got {g} ({:#010x}), want {w} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
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

/// The same for bf16 (8 significant bits, 7 stored: a relative rounding
/// error of at most u = 2⁻⁸ per input): (1 + 2⁻⁸)² − 1, about 0.0079. Over
/// K terms the sum is then within (0.0079 + 4γ_K)·Σ|aᵢbᵢ| of float32's.
pub const BF16_PRODUCT_ERROR: f64 = 2.0 / 256.0 + 1.0 / (256.0 * 256.0);

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
        if let Some(both) = nan_rule(g, w) {
            assert!(both, "{what}[{i}]: got {g}, want {w}");
            continue;
        }
        // 1.001 covers the rounding of `abs_sum` itself.
        let tol = (order + product_error) * f64::from(a) * 1.001 + f64::from(f32::MIN_POSITIVE);
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(
            err <= tol,
            "{what}[{i}]: got {g}, want {w} (|Δ| = {err:e} > {tol:e} for {terms} terms)"
        );
    }
}

/// The NaN rule as the comparisons apply it: NaNs of any payload and sign
/// pass for each other; a NaN never passes for a number, nor a number for
/// a NaN; and zero's sign still counts.
#[test]
fn nans_pass_for_nans_only() {
    let rust = f32::NAN; // 0x7fc00000, what the CPU's max-pool writes
    let cuda = f32::from_bits(0x7fff_ffff);
    let x86_invalid = f32::from_bits(0xffc0_0000);
    assert_same_bits(
        "NaNs",
        &[rust, cuda, x86_invalid],
        &[cuda, x86_invalid, rust],
    );
    assert_within_sum_bound("NaNs", &[cuda, 1.0], &[rust, 1.0], &[1.0, 1.0], 1);
    fn within(got: f32, want: f32) {
        assert_within_sum_bound("x", &[got], &[want], &[1.0], 1);
    }
    let fails = |check: fn()| std::panic::catch_unwind(check).is_err();
    assert!(fails(|| assert_same_bits("x", &[f32::NAN], &[1.0])));
    assert!(fails(|| assert_same_bits("x", &[1.0], &[f32::NAN])));
    assert!(fails(|| assert_same_bits("x", &[-0.0], &[0.0])));
    assert!(fails(|| within(f32::NAN, 1.0)));
    assert!(fails(|| within(1.0, f32::NAN)));
}
