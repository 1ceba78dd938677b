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

/// A table of 5 rows of 3 at offset 2 of a flat buffer of 21.
const TABLE: RowsGeom = RowsGeom {
    count: 3,
    dim: 3,
    rows: 5,
    offset: 2,
};

/// Parameters, gradients and both moments of a flat buffer of 21, all
/// different, the second moment positive; row 3 of the table (elements
/// 11..14) starts with zero moments and tiny gradients, where `ε` weighs
/// as much as `√v` and dense Adam's `√v/√(1 − β2ᵗ) + ε` differs.
fn state() -> [Vec<f32>; 4] {
    use crate::testing::sine;
    let mut v: Vec<f32> = sine(21, 0.4, 0.9).iter().map(|x| x * x).collect();
    let (mut g, mut m) = (sine(21, 0.3, 0.7), sine(21, 0.1, 0.3));
    for i in 11..14 {
        (g[i], m[i], v[i]) = (g[i] * 1e-7, 0.0, 0.0);
    }
    [sine(21, 0.5, 0.2), g, m, v]
}

/// SparseAdam's steps as `torch/optim/_functional.py` writes them, on the
/// values of the rows a sparse gradient holds (`grad_values`), in f64 from
/// the f32 inputs: each row's element, computed independently of the kernel.
fn sparse_adam_reference(cfg: &AdamConfig, t: i32, p: f32, g: f32, m: f32, v: f32) -> [f64; 3] {
    let (p, g, m, v) = (p as f64, g as f64, m as f64, v as f64);
    let m = m + (g - m) * (1.0 - cfg.beta1);
    let v = v + (g * g - v) * (1.0 - cfg.beta2);
    let bias_correction1 = 1.0 - cfg.beta1.powi(t);
    let bias_correction2 = 1.0 - cfg.beta2.powi(t);
    let step_size = cfg.lr * bias_correction2.sqrt() / bias_correction1;
    [p - step_size * m / (v.sqrt() + cfg.eps), m, v]
}

#[test]
fn the_lazy_step_moves_the_named_rows_as_sparse_adam_and_no_other_bit() {
    let cfg = AdamConfig {
        lr: 0.01,
        ..AdamConfig::default()
    };
    let [start, grads, m0, v0] = state();
    let (mut p, mut m, mut v) = (start.clone(), m0.clone(), v0.clone());
    // The fourth id lies past `count`: never read.
    let ids = vec![1, 3, 4, 0];
    cpu()
        .sparse_adam_step(
            &cfg.sparse_scalars(7),
            &TABLE,
            &ids,
            &mut p,
            &grads,
            &mut m,
            &mut v,
            &clear(),
        )
        .unwrap();
    let named: Vec<usize> = [1, 3, 4]
        .iter()
        .flat_map(|r| 2 + r * 3..2 + r * 3 + 3)
        .collect();
    for i in 0..21 {
        let got = [p[i], m[i], v[i]];
        if !named.contains(&i) {
            let was = [start[i], m0[i], v0[i]];
            assert_eq!(got.map(f32::to_bits), was.map(f32::to_bits), "element {i}");
            continue;
        }
        let want = sparse_adam_reference(&cfg, 7, start[i], grads[i], m0[i], v0[i]);
        // A few roundings of the magnitudes involved.
        let scale = [grads[i], m0[i], v0[i]]
            .iter()
            .map(|x| x.abs() as f64)
            .sum::<f64>();
        for (what, got, want) in [
            ("p", got[0], want[0]),
            ("m", got[1], want[1]),
            ("v", got[2], want[2]),
        ] {
            let tol = 3e-7 * (want.abs() + scale);
            assert!(
                (got as f64 - want).abs() <= tol,
                "{what}[{i}] = {got}, want {want}"
            );
        }
        assert_ne!(p[i], start[i], "element {i} moved");
    }
}

#[test]
fn the_lazy_step_refuses_bad_ids_and_short_buffers_and_keeps_a_tripped_guard() {
    let [mut p, grads, mut m, mut v] = state();
    let before = p.clone();
    let s = AdamConfig::default().sparse_scalars(1);
    let mut run = |g: &RowsGeom, ids: Vec<u32>, guard: Vec<u32>| {
        cpu().sparse_adam_step(&s, g, &ids, &mut p, &grads, &mut m, &mut v, &guard)
    };
    for (ids, what) in [
        (vec![0, 5, 6], "id 5 (at 1) is not below the table's 5 rows"),
        (vec![3, 1, 4], "ids must increase: 3 then 1 at 1"),
        (vec![0, 1], "ids holds 2 ids, fewer than the 3 rows"),
    ] {
        let err = run(&TABLE, ids, clear()).unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
    let past = RowsGeom { rows: 7, ..TABLE };
    let err = run(&past, vec![0, 1, 2], clear()).unwrap_err();
    assert!(
        err.to_string().contains("not inside the 21 parameters"),
        "{err}"
    );
    run(&TABLE, vec![0, 1, 2], vec![1, 0]).unwrap();
    assert_eq!(p, before);
}

/// Adam over a range is Adam over that slice, and nothing outside it moves.
#[test]
fn a_ranged_step_is_the_step_of_its_slice() {
    let [start, grads, m0, v0] = state();
    let s = AdamConfig::default().scalars(3);
    let (mut p, mut m, mut v) = (start.clone(), m0.clone(), v0.clone());
    cpu()
        .adam_step_range(&s, 4..17, &mut p, &grads, &mut m, &mut v, &clear())
        .unwrap();
    let (mut ps, mut ms, mut vs) = (
        start[4..17].to_vec(),
        m0[4..17].to_vec(),
        v0[4..17].to_vec(),
    );
    cpu()
        .adam_step(
            &s,
            &mut ps,
            &grads[4..17].to_vec(),
            &mut ms,
            &mut vs,
            &clear(),
        )
        .unwrap();
    assert_eq!(
        (&p[4..17], &m[4..17], &v[4..17]),
        (&ps[..], &ms[..], &vs[..])
    );
    assert_eq!((&p[..4], &p[17..]), (&start[..4], &start[17..]));
    let err = cpu().adam_step_range(&s, 4..22, &mut p, &grads, &mut m, &mut v, &clear());
    assert!(err.unwrap_err().to_string().contains("4..22"));
}
