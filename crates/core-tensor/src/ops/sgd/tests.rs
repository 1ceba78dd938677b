use super::*;
use crate::ops::GUARD_CLEAR;
use crate::testing::cpu;

#[test]
fn a_step_subtracts_lr_times_the_gradient() {
    let mut p = vec![1.0f32, -2.0, 0.5];
    let g = vec![0.5f32, -0.25, 0.0];
    cpu()
        .sgd_step(0.1, &mut p, &g, &GUARD_CLEAR.to_vec())
        .unwrap();
    // torch: p.add_(g, alpha=-0.1) → [0.95, -1.975, 0.5]
    assert_eq!(p, vec![1.0 + -0.1f32 * 0.5, -2.0 + -0.1f32 * -0.25, 0.5]);
    assert_eq!(p, vec![0.95, -1.975, 0.5]);
}

#[test]
fn a_tripped_guard_skips_the_update() {
    let mut p = vec![1.0f32, 2.0];
    cpu()
        .sgd_step(0.1, &mut p, &vec![f32::NAN, 0.5], &vec![3, 1])
        .unwrap();
    assert_eq!(p, vec![1.0, 2.0]);
}

#[test]
fn bad_lengths_and_rates_are_errors() {
    let mut p = vec![1.0f32; 3];
    let err = cpu().sgd_step(0.1, &mut p, &vec![0.0; 2], &GUARD_CLEAR.to_vec());
    assert!(err.is_err());
    for lr in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(validate_lr(lr).is_err(), "{lr}");
    }
    assert!(validate_lr(1e-3).is_ok());
}
