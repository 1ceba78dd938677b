//! The ops computed element by element or window by window, the same
//! correctly rounded operations on every device: equal bit for bit.

use std::sync::Arc;

use core_tensor::Ops;
use core_tensor::ops::{
    Dropout, EmbeddingGeom, EmbeddingKernel, Epilogue, GatherKernel, MaxPool2dKernel, PoolGeom,
    ReluKernel, RowsGeom, RowsKernel,
};

use crate::on_each_device;
use crate::support::{assert_same_bits, down, reference, uniform, up};

fn relu_matches<B: Ops>(dev: &B) {
    let mut x = uniform(300, 10_001, -1.0, 1.0);
    x[5] = f32::NAN;
    x[6] = 0.0;
    x[7] = -0.0;
    let dy = uniform(301, x.len(), -1.0, 1.0);
    let cpu = reference();
    for dropout in [Dropout::OFF, Dropout { p: 0.5, seed: 7 }] {
        let mut y = up(dev, &x);
        dev.relu_fwd(dropout, &mut y).unwrap();
        let mut dx = up(dev, &dy);
        dev.relu_bwd(dropout, &y, &mut dx).unwrap();
        let (mut y_ref, mut dx_ref) = (x.clone(), dy.clone());
        cpu.relu_fwd(dropout, &mut y_ref).unwrap();
        cpu.relu_bwd(dropout, &y_ref, &mut dx_ref).unwrap();
        let y = down(dev, &y);
        let what = format!("{} relu, {dropout:?}", dev.describe());
        assert_same_bits(&format!("{what}: y"), &y, &y_ref);
        assert_same_bits(&format!("{what}: dx"), &down(dev, &dx), &dx_ref);
    }
}

#[test]
fn relu() {
    on_each_device!(relu_matches);
}

fn maxpool2d_matches<B: Ops>(dev: &B) {
    // Odd height and width: the last row and column are dropped.
    let g = PoolGeom {
        batch: 2,
        channels: 3,
        in_h: 9,
        in_w: 7,
    };
    let mut x = uniform(400, g.input_len(), -1.0, 1.0);
    // Ties (the first maximum wins) and a NaN (it wins).
    x[1] = x[0];
    x[7 * 2 + 2] = x[7 * 2 + 3];
    x[7 * 3 + 3] = f32::NAN;
    let dy = uniform(401, g.output_len(), -1.0, 1.0);
    let (x_d, dy_d) = (up(dev, &x), up(dev, &dy));
    let cpu = reference();
    let model = Dropout {
        p: 0.25,
        seed: u64::MAX,
    };
    let epilogues = [
        Epilogue::Identity,
        Epilogue::ReluDropout(Dropout::OFF),
        Epilogue::ReluDropout(model),
    ];
    for then in epilogues {
        let mut y = dev.zeros(g.output_len()).unwrap();
        dev.maxpool2d_fwd(&g, then, &x_d, &mut y).unwrap();
        let mut dx = up(dev, &vec![f32::NAN; x.len()]);
        dev.maxpool2d_bwd(&g, then, &x_d, &y, &dy_d, &mut dx)
            .unwrap();
        let mut y_ref = vec![0.0; g.output_len()];
        cpu.maxpool2d_fwd(&g, then, &x, &mut y_ref).unwrap();
        let mut dx_ref = vec![0.0; x.len()];
        cpu.maxpool2d_bwd(&g, then, &x, &y_ref, &dy, &mut dx_ref)
            .unwrap();
        let what = format!("{} maxpool, {then:?}", dev.describe());
        assert_same_bits(&format!("{what}: y"), &down(dev, &y), &y_ref);
        assert_same_bits(&format!("{what}: dx"), &down(dev, &dx), &dx_ref);
    }
}

#[test]
fn maxpool2d() {
    on_each_device!(maxpool2d_matches);
}

/// Dropout, in the ReLU's epilogue over positive values: the CPU's mask,
/// bit for bit, forward and backward, and its drop rate.
fn dropout_matches<B: Ops>(dev: &B) {
    let x = uniform(500, 100_003, 0.5, 1.0);
    let cpu = reference();
    for (p, seed) in [(0.5, 7u64), (0.25, u64::MAX), (0.0, 3)] {
        let dropout = Dropout { p, seed };
        let mut fwd = up(dev, &x);
        dev.relu_fwd(dropout, &mut fwd).unwrap();
        let (y, mut bwd) = (up(dev, &x), up(dev, &x));
        dev.relu_bwd(dropout, &y, &mut bwd).unwrap();
        let mut want = x.clone();
        cpu.relu_fwd(dropout, &mut want).unwrap();
        let what = format!("{} dropout p={p} seed={seed}", dev.describe());
        assert_same_bits(&format!("{what} fwd"), &down(dev, &fwd), &want);
        assert_same_bits(&format!("{what} bwd"), &down(dev, &bwd), &want);
        let dropped = want.iter().filter(|v| **v == 0.0).count() as f32 / x.len() as f32;
        assert!((dropped - p).abs() < 0.01, "{what}: dropped {dropped}");
    }
    let refused = Dropout { p: 1.0, seed: 0 };
    let (window, mut pooled) = (up(dev, &[1.0; 4]), dev.zeros(1).unwrap());
    let g = PoolGeom {
        batch: 1,
        channels: 1,
        in_h: 2,
        in_w: 2,
    };
    let errors = [
        dev.relu_fwd(refused, &mut up(dev, &x)).unwrap_err(),
        dev.maxpool2d_fwd(&g, Epilogue::ReluDropout(refused), &window, &mut pooled)
            .unwrap_err(),
    ];
    for err in errors {
        assert!(err.to_string().contains("outside [0, 1)"), "{err}");
    }
}

#[test]
fn dropout() {
    on_each_device!(dropout_matches);
}

fn gather_matches<B: Ops>(dev: &B) {
    let (samples, pixels) = (100, 784);
    let images: Vec<u8> = (0..samples * pixels)
        .map(|i| (i * 31 % 256) as u8)
        .collect();
    let labels: Vec<u8> = (0..samples).map(|i| (i % 10) as u8).collect();
    let indices: Vec<u32> = (0..samples as u32)
        .map(|i| (i * 37 + 11) % samples as u32)
        .collect();
    let positions = 10..42;
    let batch = positions.len();
    let (images, labels) = (Arc::new(images), Arc::new(labels));
    let (im_d, lb_d) = (dev.share(&images).unwrap(), dev.share(&labels).unwrap());
    let ix_d = up(dev, &indices);
    let mut x = dev.zeros(batch * pixels).unwrap();
    let mut y = dev.zeros(batch).unwrap();
    dev.gather_batch(
        &im_d,
        &lb_d,
        pixels,
        &ix_d,
        positions.clone(),
        Some(&mut x),
        Some(&mut y),
    )
    .unwrap();
    let (mut x_ref, mut y_ref) = (vec![0.0; batch * pixels], vec![0u8; batch]);
    reference()
        .gather_batch(
            &images,
            &labels,
            pixels,
            &indices,
            positions.clone(),
            Some(&mut x_ref),
            Some(&mut y_ref),
        )
        .unwrap();
    let what = |half: &str| format!("{} gather {half}", dev.describe());
    assert_same_bits(&what("x"), &down(dev, &x), &x_ref);
    assert_eq!(down(dev, &y), y_ref, "{}", what("y"));
    // Each half alone (a pipeline stage's gather) writes what the whole
    // gather does.
    let mut x = dev.zeros(batch * pixels).unwrap();
    dev.gather_batch(
        &im_d,
        &lb_d,
        pixels,
        &ix_d,
        positions.clone(),
        Some(&mut x),
        None,
    )
    .unwrap();
    assert_same_bits(&what("x alone"), &down(dev, &x), &x_ref);
    let mut y = dev.zeros(batch).unwrap();
    dev.gather_batch(&im_d, &lb_d, pixels, &ix_d, positions, None, Some(&mut y))
        .unwrap();
    assert_eq!(down(dev, &y), y_ref, "{}", what("y alone"));
}

#[test]
fn gather() {
    on_each_device!(gather_matches);
}

/// Forward copies rows; backward sums repeated ids in batch order on every
/// device, so both are exact.
fn embedding_matches<B: Ops>(dev: &B) {
    let g = EmbeddingGeom {
        batch: 700,
        dim: 32,
        rows: 50,
        offset: 7,
    };
    let params = uniform(400, 7 + 50 * 32 + 5, -1.0, 1.0);
    let ids: Vec<u32> = (0..700u32).map(|i| (i * 37 + i / 3) % 50).collect();
    let dout = uniform(401, 700 * 32, -1.0, 1.0);
    let cpu = reference();
    let (ids_d, params_d) = (up(dev, &ids), up(dev, &params));
    let mut out_d = dev.zeros(700 * 32).unwrap();
    dev.embedding_fwd(&g, &ids_d, &params_d, &mut out_d)
        .unwrap();
    let mut out = vec![0.0f32; 700 * 32];
    cpu.embedding_fwd(&g, &ids, &params, &mut out).unwrap();
    let what = format!("{} embedding", dev.describe());
    assert_same_bits(&format!("{what} fwd"), &down(dev, &out_d), &out);
    let mut grads_d = up(dev, &params);
    dev.embedding_bwd(&g, &ids_d, &up(dev, &dout), &mut grads_d)
        .unwrap();
    let mut grads = params.clone();
    cpu.embedding_bwd(&g, &ids, &dout, &mut grads).unwrap();
    assert_same_bits(&format!("{what} bwd"), &down(dev, &grads_d), &grads);
    let mut added_d = up(dev, &params);
    dev.embedding_bwd_add(&g, &ids_d, &up(dev, &dout), &mut added_d)
        .unwrap();
    let mut added = params.clone();
    cpu.embedding_bwd_add(&g, &ids, &dout, &mut added).unwrap();
    assert_same_bits(&format!("{what} bwd_add"), &down(dev, &added_d), &added);
}

#[test]
fn embedding() {
    on_each_device!(embedding_matches);
}

/// 300 of a table's 2,000 rows (every seventh, and more), into buffers
/// with room for 50 more: the gathered rows and the scattered table are the
/// CPU's bits, the buffers' tails and the other rows untouched.
fn rows_match<B: Ops>(dev: &B) {
    let g = RowsGeom {
        count: 300,
        dim: 32,
        rows: 2000,
        offset: 9,
    };
    let flat = uniform(500, 9 + 2000 * 32 + 3, -1.0, 1.0);
    let mut ids: Vec<u32> = (0..350u32).map(|i| i * 5 + i % 3).collect();
    ids[349] = 0; // past `count`: never read
    let compact = uniform(501, 350 * 32, -1.0, 1.0);
    let cpu = reference();
    let what = format!("{} rows", dev.describe());
    let ids_d = up(dev, &ids);
    let mut out_d = up(dev, &compact);
    dev.rows_gather(&g, &ids_d, &up(dev, &flat), &mut out_d)
        .unwrap();
    let mut out = compact.clone();
    cpu.rows_gather(&g, &ids, &flat, &mut out).unwrap();
    assert_same_bits(&format!("{what} gather"), &down(dev, &out_d), &out);
    let mut flat_d = up(dev, &flat);
    dev.rows_scatter(&g, &ids_d, &up(dev, &compact), &mut flat_d)
        .unwrap();
    let mut want = flat.clone();
    cpu.rows_scatter(&g, &ids, &compact, &mut want).unwrap();
    assert_same_bits(&format!("{what} scatter"), &down(dev, &flat_d), &want);
    let changed = want.iter().zip(&flat).filter(|(a, b)| a != b).count();
    assert_eq!(changed, 300 * 32, "only the rows named change");
}

#[test]
fn rows() {
    on_each_device!(rows_match);
}

fn accumulate_matches<B: Ops>(dev: &B) {
    use core_tensor::ops::{AccumulateKernel, SumInto};
    let len = 10_007;
    let (mut g, acc) = (uniform(600, len, -1.0, 1.0), uniform(601, len, -1.0, 1.0));
    g[3] = f32::NAN;
    let cpu = reference();
    for into in [SumInto::Acc, SumInto::Grads] {
        let range = 5..len - 2;
        let (mut g_d, mut acc_d) = (up(dev, &g), up(dev, &acc));
        dev.accumulate(0.3, &mut g_d, &mut acc_d, range.clone(), into)
            .unwrap();
        let (mut g_ref, mut acc_ref) = (g.clone(), acc.clone());
        cpu.accumulate(0.3, &mut g_ref, &mut acc_ref, range, into)
            .unwrap();
        let what = format!("{} accumulate into {into:?}", dev.describe());
        assert_same_bits(&format!("{what}: grads"), &down(dev, &g_d), &g_ref);
        assert_same_bits(&format!("{what}: acc"), &down(dev, &acc_d), &acc_ref);
    }
}

#[test]
fn accumulate() {
    on_each_device!(accumulate_matches);
}

fn half_cast_matches<B: Ops>(dev: &B) {
    use core_tensor::ops::{Half, HalfCastKernel};
    let mut x = uniform(700, 10_007, -70_000.0, 70_000.0);
    // Ties, subnormals and overflow of both formats, and a NaN.
    x[..8].copy_from_slice(&[
        1.0 + 2f32.powi(-8),
        65520.0,
        3.0e-8,
        -6e-8,
        1e-40,
        0.0,
        -0.0,
        f32::NAN,
    ]);
    for v in x.iter_mut().skip(8).step_by(3) {
        *v *= 1e-9;
    }
    let cpu = reference();
    for format in [Half::Bf16, Half::Fp16] {
        let range = 3..x.len() - 5;
        let mut halves = dev.zeros(x.len()).unwrap();
        dev.to_half(format, &up(dev, &x), &mut halves, range.clone())
            .unwrap();
        let mut back = up(dev, &vec![7.0f32; x.len()]);
        dev.widen_half(format, &halves, &mut back, range.clone())
            .unwrap();
        let mut halves_ref = vec![0u16; x.len()];
        cpu.to_half(format, &x, &mut halves_ref, range.clone())
            .unwrap();
        let mut back_ref = vec![7.0f32; x.len()];
        cpu.widen_half(format, &halves_ref, &mut back_ref, range)
            .unwrap();
        let what = format!("{} {format:?}", dev.describe());
        let bits: Vec<u16> = dev.download(&halves).unwrap();
        let differ = (bits.iter().zip(&halves_ref).enumerate())
            .find(|(i, (a, b))| a != b && !(x[*i].is_nan()));
        assert!(
            differ.is_none(),
            "{what}: 16-bit values differ at {differ:?}"
        );
        assert_same_bits(&format!("{what}: back"), &down(dev, &back), &back_ref);
    }
}

#[test]
fn half_cast() {
    on_each_device!(half_cast_matches);
}
