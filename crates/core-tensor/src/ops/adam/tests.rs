use super::*;
use crate::Cpu;
use crate::ops::GUARD_CLEAR;
use crate::testing::cpu;

fn clear() -> Vec<u32> {
    GUARD_CLEAR.to_vec()
}

#[test]
fn a_tripped_guard_skips_the_update() {
    let (mut p, mut m, mut v) = (vec![1.0f32, 2.0], vec![0.1f32; 2], vec![0.2f32; 2]);
    let tripped = vec![3, 1];
    cpu()
        .adam_step(
            &AdamConfig::default().scalars(4),
            &mut p,
            &vec![f32::NAN, 0.5],
            &mut m,
            &mut v,
            &tripped,
        )
        .unwrap();
    assert_eq!((p, m, v), (vec![1.0, 2.0], vec![0.1; 2], vec![0.2; 2]));
}

/// Two steps on one parameter, worked by hand from the formulas in `mod.rs`:
/// p = 1, g = 0.5 then g = -0.25, lr = 0.1.
#[test]
fn two_steps_match_hand_computation() {
    let cfg = AdamConfig {
        lr: 0.1,
        ..AdamConfig::default()
    };
    let (mut p, mut m, mut v) = (vec![1.0f32], vec![0.0f32], vec![0.0f32]);
    cpu()
        .adam_step(
            &cfg.scalars(1),
            &mut p,
            &vec![0.5],
            &mut m,
            &mut v,
            &clear(),
        )
        .unwrap();
    // m = 0.05, v = 0.00025, m̂ = 0.5, v̂ = 0.25 → p = 1 − 0.1·0.5/(0.5 + 1e-8)
    assert!((m[0] - 0.05).abs() < 1e-9 && (v[0] - 0.00025).abs() < 1e-10);
    assert!((p[0] - 0.9).abs() < 1e-6, "p after step 1 = {}", p[0]);
    cpu()
        .adam_step(
            &cfg.scalars(2),
            &mut p,
            &vec![-0.25],
            &mut m,
            &mut v,
            &clear(),
        )
        .unwrap();
    let m2 = 0.9 * 0.05 + 0.1 * -0.25; // 0.02
    let v2 = 0.999 * 0.00025 + 0.001 * 0.0625; // 0.00031225
    let m_hat = m2 / (1.0 - 0.9f64 * 0.9);
    let v_hat = v2 / (1.0 - 0.999f64 * 0.999);
    let want = 0.9 - 0.1 * m_hat / (v_hat.sqrt() + 1e-8);
    assert!(
        (f64::from(p[0]) - want).abs() < 1e-6,
        "p after step 2 = {}, want {want}",
        p[0]
    );
}

#[test]
fn threads_do_not_change_a_bit() {
    let n = 100_000;
    let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let grads: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let run = |b: &Cpu| {
        let (mut p, mut m, mut v) = (start.clone(), vec![0.0; n], vec![0.0; n]);
        for step in 1..=3 {
            b.adam_step(
                &AdamConfig::default().scalars(step),
                &mut p,
                &grads,
                &mut m,
                &mut v,
                &clear(),
            )
            .unwrap();
        }
        p
    };
    assert_eq!(run(&cpu()), run(&Cpu::new(2).unwrap()));
}

#[test]
fn bad_hyper_parameters_are_rejected() {
    for lr in [-1.0, 0.0, f64::NAN, f64::INFINITY] {
        assert!(
            AdamConfig {
                lr,
                ..AdamConfig::default()
            }
            .validate()
            .is_err(),
            "lr {lr}"
        );
    }
    assert!(AdamConfig::default().validate().is_ok());
}

/// Recorded from PyTorch 2.15, `torch.optim.Adam([p], lr=1e-3)`, three steps:
/// `p = seq(4, .5, .2)`; step t uses `p.grad = seq(4, .3*t, .7)` (t = 1..3).
#[test]
fn three_steps_match_pytorch() {
    use crate::testing::sine;
    let mut p = sine(4, 0.5, 0.2);
    let (mut m, mut v) = (vec![0.0; 4], vec![0.0; 4]);
    for t in 1..=3u64 {
        let g = sine(4, 0.3 * t as f64, 0.7);
        cpu()
            .adam_step(
                &AdamConfig::default().scalars(t),
                &mut p,
                &g,
                &mut m,
                &mut v,
                &clear(),
            )
            .unwrap();
    }
    let want = [0.195_669_32_f32, 0.641_213_2, 0.929_074_35, 0.989_121_9];
    for (i, (&got, want)) in p.iter().zip(want).enumerate() {
        assert!(
            (got - want).abs() <= 1e-7 * want.abs().max(1.0),
            "p[{i}]: got {got}, want {want}"
        );
    }
}
