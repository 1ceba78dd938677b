use super::*;
use crate::testing::{check_grad, cpu, dot, uniform};

#[test]
fn forward_clamps_negatives_and_keeps_nan() {
    let mut x = vec![-2.0, -0.0, 0.5, 3.0, f32::NAN];
    cpu().relu_fwd(Dropout::OFF, &mut x).unwrap();
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
    cpu().relu_bwd(Dropout::OFF, &y, &mut dy).unwrap();
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
    cpu().relu_fwd(Dropout::OFF, &mut y).unwrap();
    let mut dx = r.clone();
    cpu().relu_bwd(Dropout::OFF, &y, &mut dx).unwrap();
    check_grad("relu", &x, &dx, |x| {
        let mut y = x.to_vec();
        cpu().relu_fwd(Dropout::OFF, &mut y).unwrap();
        dot(&r, &y)
    });
}

/// With dropout, ReLU's output is dropout's map of the plain ReLU, and its
/// gradient that map of the plain gradient: one pass gives the two
/// kernels' bits.
#[test]
fn dropout_after_relu_is_the_mask_of_the_plain_relu() {
    let d = Dropout { p: 0.5, seed: 4 };
    let mut x = uniform(5, 1000, -1.0, 1.0);
    x[3] = f32::NAN;
    let dy = uniform(6, x.len(), -1.0, 1.0);
    let (mut plain, mut y) = (x.clone(), x.clone());
    cpu().relu_fwd(Dropout::OFF, &mut plain).unwrap();
    cpu().relu_fwd(d, &mut y).unwrap();
    let (mut plain_dy, mut got_dy) = (dy.clone(), dy.clone());
    cpu().relu_bwd(Dropout::OFF, &plain, &mut plain_dy).unwrap();
    cpu().relu_bwd(d, &y, &mut got_dy).unwrap();
    for i in 0..x.len() {
        let want_y = if d.keeps(i as u64) {
            plain[i] * 2.0
        } else {
            0.0
        };
        assert_eq!(y[i].to_bits(), want_y.to_bits(), "y[{i}]");
        let want_dy = if d.keeps(i as u64) && plain[i] > 0.0 {
            plain_dy[i] * 2.0
        } else {
            0.0
        };
        assert_eq!(got_dy[i].to_bits(), want_dy.to_bits(), "dy[{i}]");
    }
}
