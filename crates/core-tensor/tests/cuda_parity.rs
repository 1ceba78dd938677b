//! Every op, forward and backward, on each device against the one-thread CPU
//! reference, on fresh random inputs.
//!
//! Each body is generic over `B: Ops` and runs on a two-thread CPU backend
//! (present everywhere) and on CUDA device 0 when there is one. Without a
//! GPU the CUDA runs print that they were skipped; REQUIRE_GPU=1 makes that
//! a failure (the device bundle's run.sh sets it).
//!
//! Tolerances, per op:
//! * exact bits: ReLU, max-pool, dropout, gather, accuracy, Adam, and the
//!   linear bias gradient. Each output is a fixed sequence of correctly
//!   rounded f32 operations on both devices (the Adam kernel spells out
//!   every rounding so the GPU cannot fuse a multiply-add).
//! * GEMM-based ops (conv2d, linear): the sum-of-products bound of
//!   `support::assert_within_sum_bound`; the devices add in different
//!   orders, so a fixed relative tolerance would be either loose or flaky.
//! * cross-entropy: 1e-5 relative to each term's scale. exp/ln differ by a
//!   few ulp between libm and CUDA (≤ 2 ulp for expf), and the batch sum is
//!   a tree on the GPU.

mod support;

use core_tensor::ops::{
    AccuracyKernel, AdamConfig, AdamKernel, ClassGeom, Conv2dGeom, CrossEntropyKernel,
    DropoutKernel, GUARD_CLEAR, GatherKernel, LinearGeom, MaxPool2dKernel, ParamAt, PoolGeom,
    ReluKernel,
};
use core_tensor::{Backend, Cuda, Error, Ops, cuda_available};
use support::{abs, assert_same_bits, assert_within_sum_bound, down, reference, uniform, up};

/// Conv parameters packed as [W | b] in one flat buffer, with an offset so
/// the ranges are honoured rather than assumed to start at 0.
fn conv_params(g: &Conv2dGeom, seed: u64) -> (Vec<f32>, ParamAt) {
    let pad = 3;
    let (wl, bl) = (g.weight_len(), g.out_channels);
    let params = uniform(seed, pad + wl + bl, -1.0, 1.0);
    let at = ParamAt {
        weight: pad..pad + wl,
        bias: pad + wl..pad + wl + bl,
    };
    (params, at)
}

/// Runs conv forward and backward on `dev`; returns (y, grads, dx).
fn conv_run<B: Ops>(
    dev: &B,
    g: &Conv2dGeom,
    x: &[f32],
    params: &[f32],
    at: &ParamAt,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (x_d, p_d, dy_d) = (up(dev, x), up(dev, params), up(dev, dy));
    let mut y = dev.zeros(dy.len()).unwrap();
    dev.conv2d_fwd(g, &x_d, &p_d, at, &mut y).unwrap();
    let mut grads = up(dev, &vec![f32::NAN; params.len()]);
    let mut dx = up(dev, &vec![f32::NAN; x.len()]);
    dev.conv2d_bwd(g, &x_d, &p_d, at, &dy_d, &mut grads, Some(&mut dx))
        .unwrap();
    (down(dev, &y), down(dev, &grads), down(dev, &dx))
}

fn conv2d_matches<B: Ops>(dev: &B) {
    let base = Conv2dGeom {
        batch: 3,
        in_channels: 3,
        in_h: 9,
        in_w: 8,
        out_channels: 5,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    let geoms = [
        base,
        Conv2dGeom {
            stride: 2,
            padding: 1,
            ..base
        },
        Conv2dGeom {
            kernel: 2,
            padding: 2,
            in_w: 5,
            ..base
        },
        // The model's conv1 and conv2 (conv2's weight gradient splits K).
        Conv2dGeom {
            batch: 4,
            in_channels: 1,
            in_h: 28,
            in_w: 28,
            out_channels: 32,
            ..base
        },
        Conv2dGeom {
            batch: 4,
            in_channels: 32,
            in_h: 26,
            in_w: 26,
            out_channels: 64,
            ..base
        },
        // More than one 64-row tile of output channels.
        Conv2dGeom {
            batch: 2,
            out_channels: 70,
            padding: 1,
            ..base
        },
    ];
    for (i, g) in geoms.iter().enumerate() {
        let seed = 100 + i as u64;
        let x = uniform(seed, g.batch * g.in_image_len(), -1.0, 1.0);
        let dy = uniform(seed + 1, g.batch * g.out_image_len(), -1.0, 1.0);
        let (params, at) = conv_params(g, seed + 2);
        let what = |part: &str| format!("{} conv2d {part} {g:?}", dev.describe());
        let (y, grads, dx) = conv_run(dev, g, &x, &params, &at, &dy);
        let (y_ref, grads_ref, dx_ref) = conv_run(&reference(), g, &x, &params, &at, &dy);
        // Σ|terms| per output: the same op on absolute values.
        let (y_abs, grads_abs, dx_abs) =
            conv_run(&reference(), g, &abs(&x), &abs(&params), &at, &abs(&dy));
        let pixels = g.batch * g.out_h() * g.out_w();
        assert_within_sum_bound(&what("y"), &y, &y_ref, &y_abs, g.patch_len() + 1);
        let (w, b) = (at.weight.clone(), at.bias.clone());
        assert_within_sum_bound(
            &what("dW"),
            &grads[w.clone()],
            &grads_ref[w.clone()],
            &grads_abs[w],
            pixels,
        );
        assert_within_sum_bound(
            &what("db"),
            &grads[b.clone()],
            &grads_ref[b.clone()],
            &grads_abs[b],
            pixels,
        );
        let taps = g.out_channels * g.kernel * g.kernel;
        assert_within_sum_bound(&what("dx"), &dx, &dx_ref, &dx_abs, taps);
        // Deterministic: a second run gives the same bits.
        let (y2, grads2, dx2) = conv_run(dev, g, &x, &params, &at, &dy);
        assert_same_bits(&what("y rerun"), &y2, &y);
        assert_same_bits(
            &what("grads rerun"),
            &grads2[at.weight.start..at.bias.end],
            &grads[at.weight.start..at.bias.end],
        );
        assert_same_bits(&what("dx rerun"), &dx2, &dx);
    }
}

#[test]
fn conv2d() {
    on_each_device!(conv2d_matches);
}

/// Runs linear forward and backward on `dev`; returns (y, grads, dx).
fn linear_run<B: Ops>(
    dev: &B,
    g: &LinearGeom,
    x: &[f32],
    params: &[f32],
    at: &ParamAt,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (x_d, p_d, dy_d) = (up(dev, x), up(dev, params), up(dev, dy));
    let mut y = dev.zeros(dy.len()).unwrap();
    dev.linear_fwd(g, &x_d, &p_d, at, &mut y).unwrap();
    let mut grads = up(dev, &vec![f32::NAN; params.len()]);
    let mut dx = up(dev, &vec![f32::NAN; x.len()]);
    dev.linear_bwd(g, &x_d, &p_d, at, &dy_d, &mut grads, Some(&mut dx))
        .unwrap();
    (down(dev, &y), down(dev, &grads), down(dev, &dx))
}

fn linear_matches<B: Ops>(dev: &B) {
    let geoms = [
        LinearGeom {
            batch: 7,
            in_features: 33,
            out_features: 17,
        },
        // The model's fc1 (forward splits K = 9216) and fc2.
        LinearGeom {
            batch: 16,
            in_features: 9216,
            out_features: 128,
        },
        LinearGeom {
            batch: 64,
            in_features: 128,
            out_features: 10,
        },
        // Tiles in every direction, ragged edges.
        LinearGeom {
            batch: 130,
            in_features: 70,
            out_features: 65,
        },
    ];
    for (i, g) in geoms.iter().enumerate() {
        let seed = 200 + i as u64;
        let x = uniform(seed, g.batch * g.in_features, -1.0, 1.0);
        let dy = uniform(seed + 1, g.batch * g.out_features, -1.0, 1.0);
        let wl = g.in_features * g.out_features;
        let params = uniform(seed + 2, 1 + wl + g.out_features, -1.0, 1.0);
        let at = ParamAt {
            weight: 1..1 + wl,
            bias: 1 + wl..1 + wl + g.out_features,
        };
        let what = |part: &str| format!("{} linear {part} {g:?}", dev.describe());
        let (y, grads, dx) = linear_run(dev, g, &x, &params, &at, &dy);
        let (y_ref, grads_ref, dx_ref) = linear_run(&reference(), g, &x, &params, &at, &dy);
        let (y_abs, grads_abs, dx_abs) =
            linear_run(&reference(), g, &abs(&x), &abs(&params), &at, &abs(&dy));
        assert_within_sum_bound(&what("y"), &y, &y_ref, &y_abs, g.in_features + 1);
        let w = at.weight.clone();
        assert_within_sum_bound(
            &what("dW"),
            &grads[w.clone()],
            &grads_ref[w.clone()],
            &grads_abs[w],
            g.batch,
        );
        // One sequential sum per column on every device: the same bits.
        assert_same_bits(
            &what("db"),
            &grads[at.bias.clone()],
            &grads_ref[at.bias.clone()],
        );
        assert_within_sum_bound(&what("dx"), &dx, &dx_ref, &dx_abs, g.out_features);
        let (y2, grads2, dx2) = linear_run(dev, g, &x, &params, &at, &dy);
        assert_same_bits(&what("y rerun"), &y2, &y);
        assert_same_bits(&what("grads rerun"), &grads2[1..], &grads[1..]);
        assert_same_bits(&what("dx rerun"), &dx2, &dx);
    }
}

#[test]
fn linear() {
    on_each_device!(linear_matches);
}

fn relu_matches<B: Ops>(dev: &B) {
    let mut x = uniform(300, 10_001, -1.0, 1.0);
    x[5] = f32::NAN;
    x[6] = 0.0;
    x[7] = -0.0;
    let dy = uniform(301, x.len(), -1.0, 1.0);
    let mut y = up(dev, &x);
    dev.relu_fwd(&mut y).unwrap();
    let mut dx = up(dev, &dy);
    dev.relu_bwd(&y, &mut dx).unwrap();
    let cpu = reference();
    let (mut y_ref, mut dx_ref) = (x.clone(), dy.clone());
    cpu.relu_fwd(&mut y_ref).unwrap();
    cpu.relu_bwd(&y_ref, &mut dx_ref).unwrap();
    let y = down(dev, &y);
    assert!(y[5].is_nan(), "ReLU must keep NaN");
    assert_same_bits(&format!("{} relu y", dev.describe()), &y, &y_ref);
    assert_same_bits(
        &format!("{} relu dx", dev.describe()),
        &down(dev, &dx),
        &dx_ref,
    );
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
    let mut y = dev.zeros(g.output_len()).unwrap();
    dev.maxpool2d_fwd(&g, &x_d, &mut y).unwrap();
    let mut dx = up(dev, &vec![f32::NAN; x.len()]);
    dev.maxpool2d_bwd(&g, &x_d, &dy_d, &mut dx).unwrap();
    let cpu = reference();
    let mut y_ref = vec![0.0; g.output_len()];
    cpu.maxpool2d_fwd(&g, &x, &mut y_ref).unwrap();
    let mut dx_ref = vec![0.0; x.len()];
    cpu.maxpool2d_bwd(&g, &x, &dy, &mut dx_ref).unwrap();
    assert_same_bits(
        &format!("{} maxpool y", dev.describe()),
        &down(dev, &y),
        &y_ref,
    );
    assert_same_bits(
        &format!("{} maxpool dx", dev.describe()),
        &down(dev, &dx),
        &dx_ref,
    );
}

#[test]
fn maxpool2d() {
    on_each_device!(maxpool2d_matches);
}

fn dropout_matches<B: Ops>(dev: &B) {
    let x = uniform(500, 100_003, -1.0, 1.0);
    let cpu = reference();
    for (p, seed) in [(0.5, 7u64), (0.25, u64::MAX), (0.0, 3)] {
        let mut fwd = up(dev, &x);
        dev.dropout_fwd(p, seed, &mut fwd).unwrap();
        let mut bwd = up(dev, &x);
        dev.dropout_bwd(p, seed, &mut bwd).unwrap();
        let mut want = x.clone();
        cpu.dropout_fwd(p, seed, &mut want).unwrap();
        let what = format!("{} dropout p={p} seed={seed}", dev.describe());
        // The same mask bit for bit, hence the same values.
        assert_same_bits(&format!("{what} fwd"), &down(dev, &fwd), &want);
        assert_same_bits(&format!("{what} bwd"), &down(dev, &bwd), &want);
        let dropped = want.iter().filter(|v| **v == 0.0).count() as f32 / x.len() as f32;
        assert!((dropped - p).abs() < 0.01, "{what}: dropped {dropped}");
    }
    let mut any = up(dev, &x);
    assert!(dev.dropout_fwd(1.0, 0, &mut any).is_err());
}

#[test]
fn dropout() {
    on_each_device!(dropout_matches);
}

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
    let (im_d, lb_d, ix_d) = (up(dev, &images), up(dev, &labels), up(dev, &indices));
    let mut x = dev.zeros(batch * pixels).unwrap();
    let mut y = dev.zeros(batch).unwrap();
    dev.gather_batch(
        &im_d,
        &lb_d,
        pixels,
        &ix_d,
        positions.clone(),
        &mut x,
        &mut y,
    )
    .unwrap();
    let (mut x_ref, mut y_ref) = (vec![0.0; batch * pixels], vec![0u8; batch]);
    reference()
        .gather_batch(
            &images, &labels, pixels, &indices, positions, &mut x_ref, &mut y_ref,
        )
        .unwrap();
    assert_same_bits(
        &format!("{} gather x", dev.describe()),
        &down(dev, &x),
        &x_ref,
    );
    assert_eq!(down(dev, &y), y_ref, "{} gather y", dev.describe());
}

#[test]
fn gather() {
    on_each_device!(gather_matches);
}

/// Input the CPU rejects is an error on every device: at once on the CPU, at
/// the next synchronization on a GPU; and the backend stays usable.
fn invalid_input_is_an_error<B: Ops>(dev: &B) {
    let g = ClassGeom {
        batch: 4,
        classes: 10,
    };
    let logits = up(dev, &uniform(900, 40, -1.0, 1.0));
    let mut dz = dev.zeros(40).unwrap();
    let mut loss = dev.zeros(1).unwrap();
    let bad = up(dev, &[1u8, 10, 2, 3]);
    let err = dev
        .cross_entropy_fwd_bwd(&g, &logits, &bad, &mut dz, &mut loss)
        .and_then(|()| dev.synchronize())
        .unwrap_err();
    assert!(err.to_string().contains("label"), "{err}");
    let good = up(dev, &[1u8, 9, 2, 3]);
    dev.cross_entropy_fwd_bwd(&g, &logits, &good, &mut dz, &mut loss)
        .unwrap();
    dev.synchronize().unwrap();

    let (images, labels) = (up(dev, &[7u8; 6]), up(dev, &[1u8; 3]));
    let indices = up(dev, &[0u32, 3]);
    let (mut x, mut y) = (dev.zeros(4).unwrap(), dev.zeros(2).unwrap());
    let err = dev
        .gather_batch(&images, &labels, 2, &indices, 0..2, &mut x, &mut y)
        .and_then(|()| dev.synchronize())
        .unwrap_err();
    assert!(err.to_string().contains("sample index"), "{err}");
    dev.synchronize().unwrap();
}

#[test]
fn invalid_input() {
    invalid_input_is_an_error(&support::cpu2());
    if let Some(gpu) = support::own_gpu("invalid_input") {
        invalid_input_is_an_error(&gpu);
        // The driver cannot allocate zero bytes: a typed error, not its code.
        let err = gpu.zeros::<f32>(0).unwrap_err();
        assert!(err.to_string().contains("at least one element"), "{err}");
    }
}

/// `cuda_available` answers on every machine; never a panic.
#[test]
fn cuda_availability_is_an_answer() {
    match cuda_available() {
        Ok(0) => assert!(matches!(Cuda::new(0), Err(Error::NoCudaDevice { .. }))),
        Ok(count) => {
            let err = Cuda::new(count).unwrap_err();
            assert!(matches!(err, Error::NoCudaDevice { ordinal, .. } if ordinal == count));
            println!("{count} CUDA device(s)");
        }
        Err(e) => {
            assert!(e.to_string().contains("libcuda"), "{e}");
            assert!(Cuda::new(0).is_err());
            println!("no CUDA driver: {e}");
        }
    }
    if std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1") {
        assert!(
            cuda_available().is_ok_and(|n| n > 0),
            "REQUIRE_GPU=1, but no GPU"
        );
    }
}

/// The whole suite again on `cuda-emu` (crates/cuda-emu), the CPU stand-in
/// for the CUDA driver, with REQUIRE_GPU=1: every launch, argument list and
/// kernel of the CUDA backend runs and is compared with the CPU, on a
/// machine without a GPU.
#[test]
fn suite_on_the_cuda_emulator() {
    cuda_emu::rerun_on_emulator(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &["--skip", "suite_on_the_cuda_emulator"],
        &[("REQUIRE_GPU", "1")],
        12,
    );
}
