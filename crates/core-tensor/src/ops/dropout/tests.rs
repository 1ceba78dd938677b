//! Dropout through the kernel it runs in, ReLU, on positive inputs (which
//! ReLU passes unchanged).

use super::*;
use crate::ops::ReluKernel;
use crate::testing::{check_grad, cpu, dot, uniform};

#[test]
fn mask_is_a_pure_function_of_seed_and_index() {
    let d = Dropout { p: 0.5, seed: 7 };
    let mut a = vec![1.0; 1000];
    let mut b = vec![1.0; 1000];
    cpu().relu_fwd(d, &mut a).unwrap();
    cpu().relu_fwd(d, &mut b).unwrap();
    assert_eq!(a, b);
    for (i, v) in a.iter().enumerate() {
        let want = if d.keeps(i as u64) { 2.0 } else { 0.0 };
        assert_eq!(*v, want, "element {i}");
    }
    let mut c = vec![1.0; 1000];
    cpu().relu_fwd(Dropout { seed: 8, ..d }, &mut c).unwrap();
    assert_ne!(a, c, "another seed gives another mask");
}

#[test]
fn drops_about_p_and_rescales_the_rest() {
    let mut x = vec![1.0; 100_000];
    cpu()
        .relu_fwd(Dropout { p: 0.25, seed: 3 }, &mut x)
        .unwrap();
    let dropped = x.iter().filter(|&&v| v == 0.0).count() as f64 / x.len() as f64;
    assert!((dropped - 0.25).abs() < 0.01, "dropped fraction {dropped}");
    assert!(x.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
}

#[test]
fn backward_applies_the_same_mask() {
    let d = Dropout { p: 0.5, seed: 11 };
    let x = uniform(1, 200, 0.05, 1.0);
    let r = uniform(2, 200, -1.0, 1.0);
    let mut y = x.clone();
    cpu().relu_fwd(d, &mut y).unwrap();
    let mut dx = r.clone();
    cpu().relu_bwd(d, &y, &mut dx).unwrap();
    check_grad("dropout", &x, &dx, |x| {
        let mut y = x.to_vec();
        cpu().relu_fwd(d, &mut y).unwrap();
        dot(&r, &y)
    });
}

#[test]
fn p_zero_is_identity_and_p_out_of_range_is_an_error() {
    let mut x = vec![1.5, 2.0];
    cpu().relu_fwd(Dropout::OFF, &mut x).unwrap();
    assert_eq!(x, vec![1.5, 2.0]);
    for p in [1.0, -0.1, f32::NAN] {
        let d = Dropout { p, seed: 1 };
        let err = cpu().relu_fwd(d, &mut x).unwrap_err();
        assert!(err.to_string().contains("outside [0, 1)"), "{err}");
        let err = cpu().relu_bwd(d, &x.clone(), &mut x).unwrap_err();
        assert!(err.to_string().contains("outside [0, 1)"), "{err}");
    }
}
