//! Where a CPU training step's time goes: the median time of each kernel
//! call of CNN_MNIST's forward and backward pass at one batch size, on the
//! CPU backend, with the layer shapes of `trainer::model::CnnMnist`.
//!
//! `cargo bench -p benches --bench cnn_layers -- --threads 1 --batch-size 64 --reps 30`
//!
//! Inputs are random: the kernels' cost does not depend on the values.
//! Prints one line per call and their sum; asserts nothing.

use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use core_tensor::Cpu;
use core_tensor::ops::{
    Conv2dGeom, Conv2dKernel, LinearGeom, LinearKernel, MaxPool2dKernel, ParamAt, PoolGeom,
    ReluKernel,
};

#[derive(Parser, Debug)]
#[command(about = "Median time of each CNN_MNIST kernel call on the CPU backend")]
struct Args {
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Timed repetitions of each call (after one untimed).
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// Time only the calls whose name starts with this (e.g. `conv2`).
    #[arg(long, default_value = "")]
    only: String,
    /// `cargo bench` passes `--bench`; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Values in [-1, 1) from a fixed linear congruential sequence.
fn filled(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A parameter buffer holding one layer, weight first.
fn layer_params(weight: usize, bias: usize) -> (Vec<f32>, ParamAt) {
    let at = ParamAt {
        weight: 0..weight,
        bias: weight..weight + bias,
    };
    (filled(weight + bias, 7), at)
}

/// Median and minimum milliseconds of `f` over `reps` calls (on a shared
/// machine the minimum is the least disturbed).
fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    f()?;
    let mut secs = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        secs.push(t.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    Ok((secs[secs.len() / 2] * 1e3, secs[0] * 1e3))
}

fn conv_rows(
    cpu: &Cpu,
    a: &Args,
    name: &str,
    g: Conv2dGeom,
    dx: bool,
) -> Result<Vec<(String, (f64, f64))>> {
    let (params, at) = layer_params(g.weight_len(), g.out_channels);
    let x = filled(g.batch * g.in_image_len(), 1);
    let dy = filled(g.batch * g.out_image_len(), 2);
    let (mut y, mut grads) = (vec![0.0; dy.len()], vec![0.0; params.len()]);
    let mut dxb = vec![0.0; x.len()];
    let fwd = median_ms(a.reps, || Ok(cpu.conv2d_fwd(&g, &x, &params, &at, &mut y)?))?;
    let bwd = median_ms(a.reps, || {
        let dx = dx.then_some(&mut dxb);
        Ok(cpu.conv2d_bwd(&g, &x, &params, &at, &dy, &mut grads, dx)?)
    })?;
    Ok(vec![
        (format!("{name} fwd"), fwd),
        (format!("{name} bwd"), bwd),
    ])
}

fn linear_rows(
    cpu: &Cpu,
    a: &Args,
    name: &str,
    g: LinearGeom,
) -> Result<Vec<(String, (f64, f64))>> {
    let (params, at) = layer_params(g.in_features * g.out_features, g.out_features);
    let x = filled(g.batch * g.in_features, 3);
    let dy = filled(g.batch * g.out_features, 4);
    let (mut y, mut grads) = (vec![0.0; dy.len()], vec![0.0; params.len()]);
    let mut dx = vec![0.0; x.len()];
    let fwd = median_ms(a.reps, || Ok(cpu.linear_fwd(&g, &x, &params, &at, &mut y)?))?;
    let bwd = median_ms(a.reps, || {
        Ok(cpu.linear_bwd(&g, &x, &params, &at, &dy, &mut grads, Some(&mut dx))?)
    })?;
    Ok(vec![
        (format!("{name} fwd"), fwd),
        (format!("{name} bwd"), bwd),
    ])
}

fn main() -> Result<()> {
    let a = Args::parse();
    let cpu = Cpu::new(a.threads)?;
    let n = a.batch_size;
    let conv = |in_channels, side, out_channels| Conv2dGeom {
        batch: n,
        in_channels,
        in_h: side,
        in_w: side,
        out_channels,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    let want = |name: &str| name.starts_with(&a.only);
    let mut rows = Vec::new();
    if want("conv1") {
        rows.extend(conv_rows(&cpu, &a, "conv1", conv(1, 28, 32), false)?);
    }
    if want("conv2") {
        rows.extend(conv_rows(&cpu, &a, "conv2", conv(32, 26, 64), true)?);
    }
    let pool = PoolGeom {
        batch: n,
        channels: 64,
        in_h: 24,
        in_w: 24,
    };
    let (a2, dpool) = (filled(pool.input_len(), 5), filled(pool.output_len(), 6));
    let (mut pooled, mut da2) = (vec![0.0; pool.output_len()], vec![0.0; a2.len()]);
    if want("maxpool") {
        let fwd = median_ms(a.reps, || Ok(cpu.maxpool2d_fwd(&pool, &a2, &mut pooled)?))?;
        let bwd = median_ms(a.reps, || {
            Ok(cpu.maxpool2d_bwd(&pool, &a2, &dpool, &mut da2)?)
        })?;
        rows.extend([("maxpool fwd".into(), fwd), ("maxpool bwd".into(), bwd)]);
    }
    if want("relu") {
        let mut act = a2.clone();
        let fwd = median_ms(a.reps, || Ok(cpu.relu_fwd(&mut act)?))?;
        let bwd = median_ms(a.reps, || Ok(cpu.relu_bwd(&a2, &mut da2)?))?;
        rows.extend([
            ("relu fwd (conv2)".into(), fwd),
            ("relu bwd (conv2)".into(), bwd),
        ]);
    }
    let fc = |in_features, out_features| LinearGeom {
        batch: n,
        in_features,
        out_features,
    };
    if want("fc1") {
        rows.extend(linear_rows(&cpu, &a, "fc1", fc(9216, 128))?);
    }
    if want("fc2") {
        rows.extend(linear_rows(&cpu, &a, "fc2", fc(128, 10))?);
    }
    println!(
        "# cnn_layers: CPU backend, {} thread(s), batch {n}, median of {} calls",
        a.threads, a.reps
    );
    println!("# {:<18} {:>10} {:>10}", "call", "median(ms)", "min(ms)");
    for (name, (median, min)) in &rows {
        println!("  {name:<18} {median:>10.3} {min:>10.3}");
    }
    let sum = |f: fn(&(f64, f64)) -> f64| rows.iter().map(|r| f(&r.1)).sum::<f64>();
    println!(
        "  {:<18} {:>10.3} {:>10.3}",
        "sum",
        sum(|r| r.0),
        sum(|r| r.1)
    );
    Ok(())
}
