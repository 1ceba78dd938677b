//! Helpers shared by the op tests: seeded random inputs and a central
//! finite-difference gradient check.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Cpu;
use crate::ops::ParamAt;

/// A one-thread CPU backend, the reference every test compares against.
pub fn cpu() -> Cpu {
    Cpu::new(1).expect("one thread always starts")
}

/// `n` values uniform in `[lo, hi)`, reproducible from `seed`.
pub fn uniform(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// One layer's parameter buffer, `weight` values then `bias` ones, uniform
/// in `[lo, hi)` from `seed`, and where the two sit in it.
pub fn layer_params(
    seed: u64,
    (weight, bias): (usize, usize),
    lo: f32,
    hi: f32,
) -> (Vec<f32>, ParamAt) {
    let at = ParamAt {
        weight: 0..weight,
        bias: weight..weight + bias,
    };
    (uniform(seed, weight + bias, lo, hi), at)
}

/// Asserts that `analytic` is the gradient of `loss` at `x`, comparing with
/// central differences on (up to) 40 evenly spread coordinates.
///
/// `loss` is evaluated in f64 over f32 kernels, so the step is large (1e-2)
/// and the tolerance loose; a wrong gradient is off by O(1), not by 1e-3.
pub fn check_grad(what: &str, x: &[f32], analytic: &[f32], loss: impl Fn(&[f32]) -> f64) {
    assert_eq!(x.len(), analytic.len(), "{what}: gradient length");
    let eps = 1e-2f32;
    let stride = (x.len() / 40).max(1);
    let mut probe = x.to_vec();
    for i in (0..x.len()).step_by(stride) {
        probe[i] = x[i] + eps;
        let up = loss(&probe);
        probe[i] = x[i] - eps;
        let down = loss(&probe);
        probe[i] = x[i];
        let numeric = (up - down) / (2.0 * f64::from(eps));
        let exact = f64::from(analytic[i]);
        let tol = 2e-3 + 1e-2 * exact.abs().max(numeric.abs());
        assert!(
            (numeric - exact).abs() <= tol,
            "{what}[{i}]: analytic {exact}, numeric {numeric}"
        );
    }
}

/// `Σ r·y` in f64: a scalar loss whose gradient with respect to `y` is `r`.
pub fn dot(r: &[f32], y: &[f32]) -> f64 {
    r.iter()
        .zip(y)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// Asserts `got ≈ want` element-wise within `rel` of the larger magnitude
/// (magnitudes below 0.1 count as 0.1, so cancellation near zero is not
/// mistaken for an error).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * g.abs().max(w.abs()).max(1e-1);
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, want {w}");
    }
}

/// `sin(a·i + b)` for `i < n`: inputs that a PyTorch snippet can rebuild
/// exactly, for tests against recorded PyTorch outputs.
pub fn sine(n: usize, a: f64, b: f64) -> Vec<f32> {
    (0..n).map(|i| (a * i as f64 + b).sin() as f32).collect()
}
