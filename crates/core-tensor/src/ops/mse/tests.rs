use super::*;
use crate::testing::{check_grad, cpu, uniform};

const G: MseGeom = MseGeom {
    batch: 3,
    features: 5,
};

fn loss_sum(y: &[f32], t: &[f32], dy: Option<&mut Vec<f32>>) -> f32 {
    let mut sum = vec![0.0];
    cpu()
        .mse_fwd_bwd(&G, &y.to_vec(), &t.to_vec(), dy, &mut sum)
        .unwrap();
    sum[0]
}

/// torch: `F.mse_loss(y, t)` for y = [1, 2], t = [0, 0] (batch 2, one
/// feature) is 2.5, its gradient `y.grad` = [1, 2].
#[test]
fn matches_pytorchs_mean_reduction() {
    let g = MseGeom {
        batch: 2,
        features: 1,
    };
    let (mut dy, mut sum) = (vec![0.0; 2], vec![0.5]);
    cpu()
        .mse_fwd_bwd(&g, &vec![1.0, 2.0], &vec![0.0; 2], Some(&mut dy), &mut sum)
        .unwrap();
    assert_eq!((sum[0] - 0.5) / 2.0, 2.5);
    assert_eq!(dy, vec![1.0, 2.0]);
}

#[test]
fn the_gradient_is_the_loss_derivative() {
    let (y, t) = (uniform(1, 15, -2.0, 2.0), uniform(2, 15, -2.0, 2.0));
    let mut dy = vec![0.0; 15];
    let sum = loss_sum(&y, &t, Some(&mut dy));
    assert_eq!(sum, loss_sum(&y, &t, None), "the loss without a gradient");
    check_grad("mse dy", &y, &dy, |probe| {
        f64::from(loss_sum(probe, &t, None)) / G.batch as f64
    });
}

#[test]
fn bad_lengths_are_errors() {
    let mut sum = vec![0.0];
    let err = cpu().mse_fwd_bwd(&G, &vec![0.0; 15], &vec![0.0; 14], None, &mut sum);
    assert!(err.is_err());
}
