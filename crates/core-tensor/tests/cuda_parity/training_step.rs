//! The losses, the metric, the finiteness guard and the Adam and SGD steps.

use core_tensor::Ops;
use core_tensor::ops::{
    AccuracyKernel, AdamConfig, AdamKernel, ClassGeom, CrossEntropyKernel, GUARD_CLEAR, MseGeom,
    MseKernel, OffsetGeom, OffsetKernel, RowsGeom, SgdKernel,
};

use crate::on_each_device;
use crate::support::{assert_same_bits, down, reference, uniform, up};

fn cross_entropy_matches<B: Ops>(dev: &B) {
    for batch in [1, 300, 1000] {
        let g = ClassGeom { batch, classes: 10 };
        let logits = uniform(600 + batch as u64, batch * 10, -4.0, 4.0);
        let labels: Vec<u8> = (0..batch).map(|i| ((i * 7 + 3) % 10) as u8).collect();
        let (z_d, l_d) = (up(dev, &logits), up(dev, &labels));
        let mut dz_d = dev.zeros(logits.len()).unwrap();
        let mut loss_d = up(dev, &[1.25f32]);
        dev.cross_entropy_fwd_bwd(&g, &z_d, &l_d, &mut dz_d, &mut loss_d)
            .unwrap();
        let (dz, loss) = (down(dev, &dz_d), down(dev, &loss_d)[0]);
        let cpu = reference();
        let mut dz_ref = vec![0.0f32; logits.len()];
        let mut loss_ref = vec![1.25f32];
        cpu.cross_entropy_fwd_bwd(&g, &logits, &labels, &mut dz_ref, &mut loss_ref)
            .unwrap();
        let what = format!("{} cross_entropy batch {batch}", dev.describe());
        // |dlogit| ≤ (softmax + onehot)/batch; 1e-5 of that scale.
        let scale = 1.0 / batch as f32;
        for (i, (&a, &b)) in dz.iter().zip(&dz_ref).enumerate() {
            let tol = 1e-5 * (b.abs() + scale);
            assert!((a - b).abs() <= tol, "{what}: dlogits[{i}] = {a}, want {b}");
        }
        let tol = 1e-5 * loss_ref[0].abs();
        assert!(
            (loss - loss_ref[0]).abs() <= tol,
            "{what}: loss {loss}, want {}",
            loss_ref[0]
        );
    }
}

#[test]
fn cross_entropy() {
    on_each_device!(cross_entropy_matches);
}

fn count_correct_matches<B: Ops>(dev: &B) {
    let batch = 777;
    let g = ClassGeom { batch, classes: 10 };
    let mut logits = uniform(700, batch * 10, -1.0, 1.0);
    // Every third row has a tie for the maximum: the first one counts.
    for row in (0..batch).step_by(3) {
        logits[row * 10 + 2] = 5.0;
        logits[row * 10 + 8] = 5.0;
    }
    let labels: Vec<u8> = (0..batch).map(|i| [2, 8, 1, 5][i % 4]).collect();
    let (z_d, l_d) = (up(dev, &logits), up(dev, &labels));
    let mut correct = up(dev, &[4.0f32]);
    dev.count_correct(&g, &z_d, &l_d, &mut correct).unwrap();
    dev.count_correct(&g, &z_d, &l_d, &mut correct).unwrap();
    let mut want = vec![4.0f32];
    let cpu = reference();
    cpu.count_correct(&g, &logits, &labels, &mut want).unwrap();
    cpu.count_correct(&g, &logits, &labels, &mut want).unwrap();
    assert!(
        want[0] > 4.0 + 100.0,
        "the case must have hits: {}",
        want[0]
    );
    assert_same_bits(
        &format!("{} count_correct", dev.describe()),
        &down(dev, &correct),
        &want,
    );
}

#[test]
fn count_correct() {
    on_each_device!(count_correct_matches);
}

fn adam_matches<B: Ops>(dev: &B) {
    let n = 50_001;
    let cfg = AdamConfig {
        lr: 3e-3,
        ..AdamConfig::default()
    };
    let start = uniform(800, n, -1.0, 1.0);
    let mut p_d = up(dev, &start);
    let (mut m_d, mut v_d) = (dev.zeros(n).unwrap(), dev.zeros(n).unwrap());
    let (mut p, mut m, mut v) = (start.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let cpu = reference();
    let clear = GUARD_CLEAR.to_vec();
    let clear_d = dev.upload(&clear).unwrap();
    for step in 1..=5 {
        let grads = uniform(800 + step, n, -1.0, 1.0);
        let s = cfg.scalars(step);
        dev.adam_step(&s, &mut p_d, &up(dev, &grads), &mut m_d, &mut v_d, &clear_d)
            .unwrap();
        cpu.adam_step(&s, &mut p, &grads, &mut m, &mut v, &clear)
            .unwrap();
        let what = format!("{} adam step {step}", dev.describe());
        assert_same_bits(&format!("{what} params"), &down(dev, &p_d), &p);
        assert_same_bits(&format!("{what} m"), &down(dev, &m_d), &m);
        assert_same_bits(&format!("{what} v"), &down(dev, &v_d), &v);
    }
    assert!(
        p.iter().zip(&start).all(|(a, b)| a != b),
        "every parameter moved"
    );
    // A tripped guard leaves everything as it was, on every device.
    let tripped = dev.upload(&[5u32, 0]).unwrap();
    let before = down(dev, &p_d);
    let grads = up(dev, &uniform(900, n, -1.0, 1.0));
    dev.adam_step(
        &cfg.scalars(6),
        &mut p_d,
        &grads,
        &mut m_d,
        &mut v_d,
        &tripped,
    )
    .unwrap();
    assert_same_bits("params after a tripped guard", &down(dev, &p_d), &before);
}

/// 300 of a table's 2,000 rows, three steps (with room for 50 more ids):
/// the CPU's bits, every other row untouched; then a tripped guard.
fn sparse_adam_matches<B: Ops>(dev: &B) {
    let g = RowsGeom {
        count: 300,
        dim: 32,
        rows: 2000,
        offset: 9,
    };
    let n = 9 + 2000 * 32 + 3;
    let cfg = AdamConfig {
        lr: 3e-3,
        ..AdamConfig::default()
    };
    let start = uniform(810, n, -1.0, 1.0);
    let (mut p_d, mut m_d, mut v_d) = (
        up(dev, &start),
        dev.zeros(n).unwrap(),
        dev.zeros(n).unwrap(),
    );
    let (mut p, mut m, mut v) = (start.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let cpu = reference();
    let clear = GUARD_CLEAR.to_vec();
    let clear_d = dev.upload(&clear).unwrap();
    for step in 1..=3u64 {
        let mut ids: Vec<u32> = (0..350u32).map(|i| i * 5 + (i + step as u32) % 3).collect();
        ids[349] = 0; // past `count`: never read
        let ids_d = up(dev, &ids);
        let grads = uniform(810 + step, n, -1.0, 1.0);
        let s = cfg.sparse_scalars(step);
        dev.sparse_adam_step(
            &s,
            &g,
            &ids_d,
            &mut p_d,
            &up(dev, &grads),
            &mut m_d,
            &mut v_d,
            &clear_d,
        )
        .unwrap();
        cpu.sparse_adam_step(&s, &g, &ids, &mut p, &grads, &mut m, &mut v, &clear)
            .unwrap();
        let what = format!("{} sparse adam step {step}", dev.describe());
        assert_same_bits(&format!("{what} params"), &down(dev, &p_d), &p);
        assert_same_bits(&format!("{what} m"), &down(dev, &m_d), &m);
        assert_same_bits(&format!("{what} v"), &down(dev, &v_d), &v);
    }
    let moved = p.iter().zip(&start).filter(|(a, b)| a != b).count();
    assert!(
        moved > 300 * 32 && moved <= 900 * 32,
        "{moved} moved: only rows named"
    );
    let tripped = dev.upload(&[5u32, 0]).unwrap();
    let ids_d = up(dev, &(0..300u32).collect::<Vec<_>>());
    let grads = up(dev, &uniform(900, n, -1.0, 1.0));
    let s = cfg.sparse_scalars(4);
    dev.sparse_adam_step(
        &s, &g, &ids_d, &mut p_d, &grads, &mut m_d, &mut v_d, &tripped,
    )
    .unwrap();
    assert_same_bits("params after a tripped guard", &down(dev, &p_d), &p);
}

#[test]
fn sparse_adam() {
    on_each_device!(sparse_adam_matches);
}

/// The gradient bit for bit; the loss sum within float reordering.
fn mse_matches<B: Ops>(dev: &B) {
    for (batch, features) in [(1, 1), (300, 5), (1000, 1)] {
        let g = MseGeom { batch, features };
        let n = batch * features;
        let (y, t) = (uniform(700, n, -3.0, 3.0), uniform(701, n, 1.0, 5.0));
        let (y_d, t_d) = (up(dev, &y), up(dev, &t));
        let mut dy_d = dev.zeros(n).unwrap();
        let (mut sum_d, mut fwd_d) = (up(dev, &[0.5f32]), up(dev, &[0.5f32]));
        dev.mse_fwd_bwd(&g, &y_d, &t_d, Some(&mut dy_d), &mut sum_d)
            .unwrap();
        dev.mse_fwd_bwd(&g, &y_d, &t_d, None, &mut fwd_d).unwrap();
        let (mut dy, mut sum) = (vec![0.0f32; n], vec![0.5f32]);
        reference()
            .mse_fwd_bwd(&g, &y, &t, Some(&mut dy), &mut sum)
            .unwrap();
        let what = format!("{} mse {batch}x{features}", dev.describe());
        assert_same_bits(&format!("{what} dy"), &down(dev, &dy_d), &dy);
        for got in [down(dev, &sum_d)[0], down(dev, &fwd_d)[0]] {
            let tol = 1e-5 * sum[0].abs();
            assert!(
                (got - sum[0]).abs() <= tol,
                "{what}: loss {got}, want {}",
                sum[0]
            );
        }
    }
}

/// Both directions bit for bit: each output is a fixed sequence of rounded
/// additions (forward) or a copy (backward).
fn offset_matches<B: Ops>(dev: &B) {
    for (batch, k) in [(1, 1), (300, 2), (1000, 3)] {
        let g = OffsetGeom { batch, k };
        let (o, y0, dy) = (
            uniform(720, batch * k, -1.0, 1.0),
            uniform(721, batch, 1.0, 5.0),
            uniform(722, batch, -1.0, 1.0),
        );
        let (o_d, dy_d, mut y_d) = (up(dev, &o), up(dev, &dy), up(dev, &y0));
        let mut d_d = dev.zeros(batch * k).unwrap();
        dev.offset_fwd(&g, &o_d, &mut y_d).unwrap();
        dev.offset_bwd(&g, &dy_d, &mut d_d).unwrap();
        let (mut y, mut d) = (y0.clone(), vec![0.0f32; batch * k]);
        reference().offset_fwd(&g, &o, &mut y).unwrap();
        reference().offset_bwd(&g, &dy, &mut d).unwrap();
        let what = format!("{} offset {batch}x{k}", dev.describe());
        assert_same_bits(&format!("{what} y"), &down(dev, &y_d), &y);
        assert_same_bits(&format!("{what} d_offsets"), &down(dev, &d_d), &d);
    }
}

fn sgd_matches<B: Ops>(dev: &B) {
    let n = 50_001;
    let start = uniform(810, n, -1.0, 1.0);
    let mut p_d = up(dev, &start);
    let mut p = start.clone();
    let cpu = reference();
    let clear = GUARD_CLEAR.to_vec();
    let clear_d = dev.upload(&clear).unwrap();
    for step in 1..=3 {
        let grads = uniform(810 + step, n, -1.0, 1.0);
        dev.sgd_step(0.01, &mut p_d, &up(dev, &grads), &clear_d)
            .unwrap();
        cpu.sgd_step(0.01, &mut p, &grads, &clear).unwrap();
        let what = format!("{} sgd step {step} params", dev.describe());
        assert_same_bits(&what, &down(dev, &p_d), &p);
    }
    assert!(
        p.iter().zip(&start).filter(|(a, b)| a != b).count() > n / 2,
        "the parameters moved"
    );
    let tripped = dev.upload(&[5u32, 0]).unwrap();
    let before = down(dev, &p_d);
    dev.sgd_step(
        0.01,
        &mut p_d,
        &up(dev, &uniform(820, n, -1.0, 1.0)),
        &tripped,
    )
    .unwrap();
    assert_same_bits("params after a tripped guard", &down(dev, &p_d), &before);
}

/// The guard on each device equals the CPU's: the first bad step, and the
/// smallest bad index whatever order the GPU's threads run in.
fn guard_finite_matches<B: Ops>(dev: &B) {
    let n = 300_001;
    let mut values = uniform(850, n, -1.0, 1.0);
    let mut guard = dev.upload(&GUARD_CLEAR).unwrap();
    let loss = dev.upload(&[1.0f32]).unwrap();
    dev.guard_finite(1, &loss, &up(dev, &values), &mut guard)
        .unwrap();
    assert_eq!(down_u32(dev, &guard), GUARD_CLEAR.to_vec(), "all finite");
    for (i, bad) in [
        (n - 1, f32::NAN),
        (200_000, f32::INFINITY),
        (70_001, f32::NAN),
    ] {
        values[i] = bad;
    }
    dev.guard_finite(2, &loss, &up(dev, &values), &mut guard)
        .unwrap();
    assert_eq!(down_u32(dev, &guard), vec![2, 70_001], "{}", dev.describe());
    values[5] = f32::NAN;
    dev.guard_finite(3, &loss, &up(dev, &values), &mut guard)
        .unwrap();
    assert_eq!(
        down_u32(dev, &guard),
        vec![2, 70_001],
        "the first step is kept"
    );
    let mut fresh = dev.upload(&GUARD_CLEAR).unwrap();
    let bad_loss = dev.upload(&[f32::NAN]).unwrap();
    dev.guard_finite(9, &bad_loss, &up(dev, &[0.0; 3]), &mut fresh)
        .unwrap();
    assert_eq!(down_u32(dev, &fresh), vec![9, u32::MAX], "the loss alone");
}

/// A step checked in parts (`--sparse-adam`'s dense ranges and the rows of
/// a table it used), in either order of the calls: each device keeps the
/// CPU's smallest bad index over all of them, the rows no id names and the
/// values outside the ranges unread.
fn guard_finite_parts_match<B: Ops>(dev: &B) {
    let (dim, rows, offset) = (32, 5_000, 1_000);
    let n = offset + rows * dim + 3_000;
    let table = RowsGeom {
        count: 0,
        dim,
        rows,
        offset,
    };
    let ids: Vec<u32> = (0..rows as u32).filter(|r| r % 3 == 1).collect();
    let used = RowsGeom {
        count: ids.len(),
        ..table
    };
    let dense = [0..offset, table.table().end..n];
    let at = |row: usize, d: usize| offset + row * dim + d;
    let mut values = uniform(860, n, -1.0, 1.0);
    // Unread: rows 0 and 3 999 (not named), and nothing outside the parts.
    for i in [at(0, 5), at(3_999, 0)] {
        values[i] = f32::NAN;
    }
    let cases: [(&[usize], [u32; 2]); 4] = [
        (&[], GUARD_CLEAR),
        (&[n - 1, at(4_000, 31)], [7, at(4_000, 31) as u32]),
        (&[n - 1, at(4_000, 31), at(1, 9)], [7, at(1, 9) as u32]),
        (&[at(4_000, 31), at(1, 9), 999], [7, 999]),
    ];
    let (ids_d, loss) = (up(dev, &ids), up(dev, &[0.5f32]));
    for (bad, want) in cases {
        let mut values = values.clone();
        bad.iter().for_each(|&i| values[i] = f32::INFINITY);
        let values_d = up(dev, &values);
        for rows_first in [false, true] {
            let mut guard = dev.upload(&GUARD_CLEAR).unwrap();
            let check_rows = |guard: &mut B::Storage<u32>| {
                dev.guard_finite_rows(7, &used, &ids_d, &values_d, guard)
                    .unwrap()
            };
            if rows_first {
                check_rows(&mut guard);
            }
            for range in dense.clone() {
                dev.guard_finite_range(7, &loss, &values_d, range, &mut guard)
                    .unwrap();
            }
            if !rows_first {
                check_rows(&mut guard);
            }
            let what = format!("{} {bad:?} rows first {rows_first}", dev.describe());
            assert_eq!(down_u32(dev, &guard), want.to_vec(), "{what}");
        }
    }
}

#[test]
fn guard_finite_parts() {
    on_each_device!(guard_finite_parts_match);
}

fn down_u32<B: Ops>(dev: &B, buf: &B::Storage<u32>) -> Vec<u32> {
    dev.download(buf).unwrap()
}

#[test]
fn guard_finite() {
    on_each_device!(guard_finite_matches);
}

#[test]
fn adam() {
    on_each_device!(adam_matches);
}

#[test]
fn sgd() {
    on_each_device!(sgd_matches);
}

#[test]
fn mse() {
    on_each_device!(mse_matches);
}

#[test]
fn offset() {
    on_each_device!(offset_matches);
}
