use super::*;
use crate::testing::{check_grad, cpu, dot, uniform};

#[test]
fn forward_clamps_negatives_and_keeps_nan() {
    let mut x = vec![-2.0, -0.0, 0.5, 3.0, f32::NAN];
    cpu().relu_fwd(&mut x).unwrap();
    assert_eq!(&x[..4], &[0.0, -0.0, 0.5, 3.0]);
    assert!(
        x[4].is_nan(),
        "a NaN must survive so that divergence is detected"
    );
}

#[test]
fn backward_masks_by_the_output() {
    let y = vec![0.0, 1.0, 0.0, 2.0];
    let mut dy = vec![5.0, 6.0, 7.0, 8.0];
    cpu().relu_bwd(&y, &mut dy).unwrap();
    assert_eq!(dy, vec![0.0, 6.0, 0.0, 8.0]);
}

#[test]
fn backward_passes_the_finite_difference_check() {
    // Values kept away from the kink at 0, where the derivative is undefined.
    let x: Vec<f32> = uniform(1, 64, 0.05, 1.0)
        .iter()
        .enumerate()
        .map(|(i, v)| if i % 2 == 0 { -v } else { *v })
        .collect();
    let r = uniform(2, 64, -1.0, 1.0);
    let mut y = x.clone();
    cpu().relu_fwd(&mut y).unwrap();
    let mut dx = r.clone();
    cpu().relu_bwd(&y, &mut dx).unwrap();
    check_grad("relu", &x, &dx, |x| {
        let mut y = x.to_vec();
        cpu().relu_fwd(&mut y).unwrap();
        dot(&r, &y)
    });
}
