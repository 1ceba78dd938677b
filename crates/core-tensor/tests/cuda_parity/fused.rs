//! The fused ops: conv2d + max-pool (`Conv2dPoolKernel`), and conv2d +
//! ReLU and linear + ReLU + dropout (`LayerKernel::layer_relu_fwd` and
//! `layer_relu_bwd` on a GPU that fuses).
//! On a GPU each gives the bits of its own unfused kernels, in every
//! precision and tile; on exact inputs the CPU reference's bits, argmax
//! bytes included.

use core_tensor::ops::conv2d_pool::pool_of;
use core_tensor::ops::{Conv2dGeom, Dropout, Epilogue, LinearGeom, ParamAt};
use core_tensor::{Backend, Cuda, GemmStaging, MatmulPrecision, Ops};

use crate::support::{
    assert_same_bits, down, gpu, gpu_in, gpu_staged, reference, small_integers, uniform, up, wide,
};

/// ReLU and a dropout whose scale (2) keeps small integers exact.
const THEN: Epilogue = Epilogue::ReluDropout(Dropout { p: 0.5, seed: 77 });

/// CNN_MNIST's conv2 (its windows fill every tile); odd 7 x 5 planes whose
/// windows end mid-tile, with a dropped row and column; 32 channels (the
/// 32-row tile); a long K with few tiles, which the plan splits (the
/// unfused product, then the argmax pool).
fn geoms() -> [Conv2dGeom; 4] {
    let conv2 = Conv2dGeom {
        batch: 3,
        in_channels: 32,
        in_h: 26,
        in_w: 26,
        out_channels: 64,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    [
        conv2,
        Conv2dGeom {
            batch: 5,
            in_channels: 3,
            in_h: 9,
            in_w: 7,
            out_channels: 7,
            ..conv2
        },
        Conv2dGeom {
            batch: 2,
            out_channels: 32,
            padding: 1,
            ..conv2
        },
        Conv2dGeom {
            batch: 1,
            in_channels: 96,
            in_h: 6,
            in_w: 6,
            out_channels: 8,
            ..conv2
        },
    ]
}

/// What one forward and backward pass gives: y, argmax, da, grads, dx.
type Run = (Vec<f32>, Vec<u8>, Vec<f32>, Vec<f32>, Vec<f32>);

/// The fused op (or, `fused` false, conv2d then max-pool) on `dev`.
fn run<B: Ops>(
    dev: &B,
    fused: bool,
    g: &Conv2dGeom,
    (x, params, at, dy): (&[f32], &[f32], &ParamAt, &[f32]),
) -> Run {
    let pool = pool_of(g);
    let (x_d, p_d, dy_d) = (up(dev, x), up(dev, params), up(dev, dy));
    let mut y = up(dev, &vec![f32::NAN; pool.output_len()]);
    let mut arg = up(dev, &vec![9u8; pool.output_len()]);
    let mut da = up(dev, &vec![f32::NAN; pool.input_len()]);
    let mut grads = up(dev, &vec![f32::NAN; params.len()]);
    let mut dx = up(dev, &vec![f32::NAN; x.len()]);
    if fused {
        dev.conv2d_pool_fwd(g, THEN, &x_d, &p_d, at, &mut y, &mut arg)
            .unwrap();
        let saved = (&arg, &y, &dy_d);
        let inputs = (&x_d, &p_d, at);
        dev.conv2d_pool_bwd(g, THEN, inputs, saved, &mut da, &mut grads, Some(&mut dx))
            .unwrap();
    } else {
        let mut a = dev.zeros(pool.input_len()).unwrap();
        dev.layer_fwd(g, &x_d, &p_d, at, &mut a).unwrap();
        dev.maxpool2d_fwd(&pool, THEN, &a, &mut y).unwrap();
        dev.maxpool2d_bwd(&pool, THEN, &a, &y, &dy_d, &mut da)
            .unwrap();
        dev.layer_bwd(g, &x_d, &p_d, at, &da, &mut grads, Some(&mut dx))
            .unwrap();
    }
    let grads = down(dev, &grads)[at.weight.start..at.bias.end].to_vec();
    (
        down(dev, &y),
        down(dev, &arg),
        down(dev, &da),
        grads,
        down(dev, &dx),
    )
}

/// Inputs for `g`: uniform, or small integers (exact in every precision).
fn inputs(g: &Conv2dGeom, seed: u64, exact: bool) -> (Vec<f32>, Vec<f32>, ParamAt, Vec<f32>) {
    let values = |s, n| match exact {
        true => small_integers(s, n),
        false => uniform(s, n, -1.0, 1.0),
    };
    let (wl, bl) = (g.weight_len(), g.out_channels);
    let at = ParamAt {
        weight: 2..2 + wl,
        bias: 2 + wl..2 + wl + bl,
    };
    let x = values(seed, g.batch * g.in_image_len());
    let dy = values(seed + 1, pool_of(g).output_len());
    (x, values(seed + 2, at.bias.end), at, dy)
}

fn assert_runs_equal(what: &str, got: &Run, want: &Run) {
    assert_same_bits(&format!("{what} y"), &got.0, &want.0);
    assert_eq!(got.1, want.1, "{what} argmax");
    assert_same_bits(&format!("{what} da"), &got.2, &want.2);
    assert_same_bits(&format!("{what} grads"), &got.3, &want.3);
    assert_same_bits(&format!("{what} dx"), &got.4, &want.4);
}

/// GPU 0 in every precision, float32 tile and staging (those it has).
fn every_gpu(test: &str) -> Vec<Cuda> {
    let mut gpus = vec![gpu(test), gpu(test).map(|g| wide(&g))];
    gpus.extend([MatmulPrecision::Tf32, MatmulPrecision::Bf16].map(|p| gpu_in(test, p)));
    for p in [MatmulPrecision::Fp32, MatmulPrecision::Tf32] {
        gpus.push(gpu_staged(test, p, GemmStaging::CpAsync));
    }
    gpus.into_iter().flatten().collect()
}

/// Fused against unfused on one device, every geometry. The unfused run
/// has no argmax bytes; the fused CPU's, which the CPU's own parity with
/// the unfused kernels covers, stand in.
fn fused_gives_the_unfused_bits(dev: &Cuda) {
    for (i, g) in geoms().iter().enumerate() {
        let (x, params, at, dy) = inputs(g, 40 + 10 * i as u64, false);
        let io = (&x[..], &params[..], &at, &dy[..]);
        let mut unfused = run(dev, false, g, io);
        let fused = run(dev, true, g, io);
        unfused.1.clone_from(&fused.1);
        assert_runs_equal(&format!("{} {g:?}", dev.describe()), &fused, &unfused);
    }
}

#[test]
fn conv2d_pool_fused_gives_the_unfused_bits() {
    let test = "conv2d_pool_fused_gives_the_unfused_bits";
    let gpus = every_gpu(test);
    for dev in &gpus {
        fused_gives_the_unfused_bits(dev);
    }
}

/// On small integers every product is exact, so the GPU's fused op gives
/// the CPU reference's bits: pooled values, argmax bytes (ties are common:
/// the first maximum), routed gradients, dW, db and dx.
#[test]
fn conv2d_pool_matches_the_cpu_on_exact_inputs() {
    let test = "conv2d_pool_matches_the_cpu_on_exact_inputs";
    let gpus = every_gpu(test);
    for (i, g) in geoms().iter().enumerate() {
        let (x, params, at, dy) = inputs(g, 90 + 10 * i as u64, true);
        let io = (&x[..], &params[..], &at, &dy[..]);
        let want = run(&reference(), true, g, io);
        assert!(
            want.1.iter().all(|&k| k < 4),
            "{g:?}: the CPU wrote every argmax"
        );
        for dev in &gpus {
            let got = run(dev, true, g, io);
            assert_runs_equal(&format!("{} {g:?}", dev.describe()), &got, &want);
        }
    }
}

/// conv2d + ReLU on `dev`, fused or as the two kernels.
fn relu_run<B: Ops>(
    dev: &B,
    fused: bool,
    g: &Conv2dGeom,
    x: &[f32],
    params: &[f32],
    at: &ParamAt,
) -> Vec<f32> {
    let (x_d, p_d) = (up(dev, x), up(dev, params));
    let mut y = up(dev, &vec![f32::NAN; g.batch * g.out_image_len()]);
    if fused {
        dev.layer_relu_fwd(g, Dropout::OFF, &x_d, &p_d, at, &mut y)
            .unwrap();
    } else {
        dev.layer_fwd(g, &x_d, &p_d, at, &mut y).unwrap();
        dev.relu_fwd(Dropout::OFF, &mut y).unwrap();
    }
    down(dev, &y)
}

/// CNN_MNIST's conv1, and the geometries above (the last splits K).
fn relu_geoms() -> Vec<Conv2dGeom> {
    let conv1 = Conv2dGeom {
        batch: 3,
        in_channels: 1,
        in_h: 28,
        in_w: 28,
        out_channels: 32,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    [conv1].into_iter().chain(geoms()).collect()
}

/// conv2d + ReLU: the GPU's fused kernel gives its conv2d and ReLU
/// kernels' bits in every precision and tile, and the CPU's on exact
/// inputs.
#[test]
fn conv2d_relu_fused_gives_the_unfused_and_exact_bits() {
    let test = "conv2d_relu_fused_gives_the_unfused_and_exact_bits";
    let gpus = every_gpu(test);
    for (i, g) in relu_geoms().iter().enumerate() {
        for exact in [false, true] {
            let (x, params, at, _) = inputs(g, 200 + 10 * i as u64, exact);
            let want = relu_run(&reference(), false, g, &x, &params, &at);
            for dev in &gpus {
                let what = |part: &str| format!("{} {g:?} {part}", dev.describe());
                let fused = relu_run(dev, true, g, &x, &params, &at);
                let unfused = relu_run(dev, false, g, &x, &params, &at);
                assert_same_bits(&what("fused against unfused"), &fused, &unfused);
                if exact {
                    assert_same_bits(&what("against the CPU"), &fused, &want);
                }
            }
        }
    }
}

/// linear + ReLU + dropout forward and backward on `dev`, fused or as the
/// two kernels each way: y, the masked dy, dW and db, dx.
fn linear_relu_run<B: Ops>(
    dev: &B,
    fused: bool,
    (g, dropout): (&LinearGeom, Dropout),
    (x, params, at): (&[f32], &[f32], &ParamAt),
    dy: &[f32],
) -> [Vec<f32>; 4] {
    let (x_d, p_d, mut dy_d) = (up(dev, x), up(dev, params), up(dev, dy));
    let mut y = up(dev, &vec![f32::NAN; dy.len()]);
    let mut grads = up(dev, &vec![f32::NAN; params.len()]);
    let mut dx = up(dev, &vec![f32::NAN; x.len()]);
    if fused {
        dev.layer_relu_fwd(g, dropout, &x_d, &p_d, at, &mut y)
            .unwrap();
        let io = (&y, &mut dy_d);
        dev.layer_relu_bwd(g, dropout, &x_d, &p_d, at, io, &mut grads, Some(&mut dx))
            .unwrap();
    } else {
        dev.layer_fwd(g, &x_d, &p_d, at, &mut y).unwrap();
        dev.relu_fwd(dropout, &mut y).unwrap();
        dev.relu_bwd(dropout, &y, &mut dy_d).unwrap();
        dev.layer_bwd(g, &x_d, &p_d, at, &dy_d, &mut grads, Some(&mut dx))
            .unwrap();
    }
    let grads = down(dev, &grads)[at.weight.start..at.bias.end].to_vec();
    [down(dev, &y), down(dev, &dy_d), grads, down(dev, &dx)]
}

/// CNN_MNIST's fc1 at batch 2 (K = 9216: 36 splits, summed a warp per
/// element); a shorter K (9 splits, a thread per element); whole tiles of
/// 64 rows, of 32 rows, and wide ones (1030 columns).
fn linear_geoms() -> [LinearGeom; 5] {
    let g = |batch, in_features, out_features| LinearGeom {
        batch,
        in_features,
        out_features,
    };
    [
        g(2, 9216, 128),
        g(3, 2304, 40),
        g(70, 200, 130),
        g(20, 100, 130),
        g(65, 40, 1030),
    ]
}

/// linear + ReLU + dropout: the GPU's fused kernels (forward: the tile's
/// store, or the split reduction's; backward: the mask in the bias
/// gradient's pass) give its linear and ReLU kernels' bits in every
/// precision and tile, with dropout off and on and a NaN in the input, and
/// the CPU's on exact inputs.
#[test]
fn linear_relu_fused_gives_the_unfused_and_exact_bits() {
    let test = "linear_relu_fused_gives_the_unfused_and_exact_bits";
    let gpus = every_gpu(test);
    for (i, g) in linear_geoms().iter().enumerate() {
        let (wl, bl) = (g.in_features * g.out_features, g.out_features);
        let at = ParamAt {
            weight: 1..1 + wl,
            bias: 1 + wl..1 + wl + bl,
        };
        let seed = 300 + 10 * i as u64;
        let cases = [
            (false, Dropout::OFF),
            (false, Dropout { p: 0.3, seed }),
            (true, Dropout { p: 0.5, seed }),
        ];
        // Each geometry leaves out one case in turn (the emulator takes a
        // second or more per run here): every case still meets every
        // device on three or four of the five geometries, and fc1's split
        // reduction keeps the exact inputs and the NaN row.
        for (c, &(exact, dropout)) in cases.iter().enumerate() {
            if c == (i + 1) % cases.len() {
                continue;
            }
            let values = |s, n| match exact {
                true => small_integers(s, n),
                false => uniform(s, n, -1.0, 1.0),
            };
            let mut x = values(seed + 1, g.batch * g.in_features);
            if !exact {
                x[g.in_features + 5] = f32::NAN;
            }
            let params = values(seed + 2, at.bias.end);
            let dy = values(seed + 3, g.batch * g.out_features);
            let (case, io) = ((g, dropout), (&x[..], &params[..], &at));
            let want = linear_relu_run(&reference(), false, case, io, &dy);
            for dev in &gpus {
                let fused = linear_relu_run(dev, true, case, io, &dy);
                let unfused = linear_relu_run(dev, false, case, io, &dy);
                for (k, part) in ["y", "dy", "grads", "dx"].iter().enumerate() {
                    let what = |vs| format!("{} {g:?} {dropout:?} {part} {vs}", dev.describe());
                    assert_same_bits(&what("unfused"), &fused[k], &unfused[k]);
                    if exact {
                        // A product column of zeros sums to -0 on the CPU,
                        // to +0 from the GPU's zeroed accumulators.
                        let signless = |v: &[f32]| v.iter().map(|f| f + 0.0).collect::<Vec<_>>();
                        let cpu = signless(&want[k]);
                        assert_same_bits(&what("the CPU"), &signless(&fused[k]), &cpu);
                    }
                }
                assert!(exact || fused[0].iter().any(|v| v.is_nan()), "a NaN row");
            }
        }
    }
}
