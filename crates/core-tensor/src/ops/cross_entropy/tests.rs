use super::*;
use crate::testing::{check_grad, cpu, uniform};

const G: ClassGeom = ClassGeom {
    batch: 4,
    classes: 10,
};

fn loss_and_grad(logits: &[f32], labels: &[u8]) -> (f32, Vec<f32>) {
    let mut dlogits = vec![0.0; logits.len()];
    let mut loss_sum = vec![0.0];
    cpu()
        .cross_entropy_fwd_bwd(
            &G,
            &logits.to_vec(),
            &labels.to_vec(),
            &mut dlogits,
            &mut loss_sum,
        )
        .unwrap();
    (loss_sum[0] / G.batch as f32, dlogits)
}

#[test]
fn uniform_logits_give_log_of_the_class_count() {
    let (loss, grad) = loss_and_grad(&[0.3; 40], &[0, 1, 2, 9]);
    assert!((loss - 10f32.ln()).abs() < 1e-6, "loss {loss}");
    assert!((grad[0] - (0.1 - 1.0) / 4.0).abs() < 1e-7);
    assert!((grad[1] - 0.1 / 4.0).abs() < 1e-7);
}

#[test]
fn huge_logits_stay_finite() {
    let mut logits = vec![0.0; 40];
    logits[3] = 1e4;
    let (loss, grad) = loss_and_grad(&logits, &[3, 0, 0, 0]);
    assert!(loss.is_finite() && grad.iter().all(|g| g.is_finite()));
}

#[test]
fn gradient_passes_the_finite_difference_check() {
    let logits = uniform(1, 40, -3.0, 3.0);
    let labels = [7, 0, 3, 3];
    let (_, grad) = loss_and_grad(&logits, &labels);
    check_grad("cross_entropy", &logits, &grad, |z| {
        f64::from(loss_and_grad(z, &labels).0)
    });
}

#[test]
fn loss_sum_accumulates_and_bad_labels_are_errors() {
    let logits = vec![0.0; 40];
    let mut d = vec![0.0; 40];
    let mut sum = vec![1.0];
    cpu()
        .cross_entropy_fwd_bwd(&G, &logits, &vec![1, 2, 3, 4], &mut d, &mut sum)
        .unwrap();
    assert!((sum[0] - (1.0 + 4.0 * 10f32.ln())).abs() < 1e-5);
    let err = cpu()
        .cross_entropy_fwd_bwd(&G, &logits, &vec![1, 2, 3, 10], &mut d, &mut sum)
        .unwrap_err();
    assert!(err.to_string().contains("label 10"), "{err}");
}

/// Recorded from PyTorch 2.15:
/// `z = (3*seq(30, .9, .2)).reshape(3,10); F.cross_entropy(z, tensor([2,7,0]))`,
/// the loss and `z.grad[0]` (seq as in the conv2d reference test).
#[test]
fn matches_pytorch_reference_values() {
    let g = ClassGeom {
        batch: 3,
        classes: 10,
    };
    let z: Vec<f32> = crate::testing::sine(30, 0.9, 0.2)
        .iter()
        .map(|v| 3.0 * v)
        .collect();
    let (mut d, mut sum) = (vec![0.0; 30], vec![0.0]);
    cpu()
        .cross_entropy_fwd_bwd(&g, &z, &vec![2, 7, 0], &mut d, &mut sum)
        .unwrap();
    assert!(
        (sum[0] / 3.0 - 3.3984616).abs() < 1e-5,
        "loss {}",
        sum[0] / 3.0
    );
    let want = [
        0.0092045, 0.0735019, -0.2557322, 0.0103962, 0.0008091, 0.0002526, 0.0007633, 0.0096702,
        0.0751746, 0.0759599,
    ];
    for (i, (&got, want)) in d.iter().zip(want).enumerate() {
        assert!(
            (got - want).abs() < 2e-7,
            "grad[0][{i}]: got {got}, want {want}"
        );
    }
}
