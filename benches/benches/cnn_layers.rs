//! Where a training step's time goes: the median device time of each kernel
//! call of CNN_MNIST's forward and backward pass at one batch size, with the
//! layer shapes of `trainer::model::CnnMnist`, on the CPU backend or a GPU.
//!
//! `cargo bench -p benches --bench cnn_layers -- --threads 1 --batch-size 64 --reps 30`
//! `cargo bench -p benches --bench cnn_layers -- --device cuda --batch-size 512 [--tf32|--bf16]`
//! `cargo bench -p benches --bench cnn_layers -- --device cuda [--tf32] --gemm-staging cp-async`
//!
//! Each call is timed between two [`Backend::mark`]s: the host clock on the
//! CPU, CUDA events on the GPU's compute stream (so a GPU figure is the
//! kernels' time, launch gaps included, without host synchronisation in
//! it). Inputs are random: the kernels' cost does not depend on the values.
//! Where the backend fuses (a GPU, unless `--no-fusion`), conv1's forward
//! pass and its ReLU are one op (`conv1+relu fwd` replaces `conv1 fwd` and
//! `relu fwd (conv1)`), conv2, its max-pool and the epilogue another
//! (`conv2+pool` rows replace the `conv2` and `maxpool` ones), and fc1
//! with its ReLU and dropout a third (`fc1+relu` rows replace the `fc1` and
//! `relu (fc1)` ones). Prints one line per call and their sum; asserts
//! nothing.

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use core_tensor::ops::conv2d_pool::pool_of;
use core_tensor::ops::{Conv2dGeom, Dropout, Epilogue, LinearGeom, ParamAt, PoolGeom};
use core_tensor::{Backend, Cpu, Cuda, Fp32Tile, GemmStaging, MatmulPrecision, Ops, Products};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Device {
    Cpu,
    Cuda,
}

#[derive(Parser, Debug)]
#[command(about = "Median time of each CNN_MNIST kernel call on the CPU backend or a GPU")]
struct Args {
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// CPU threads (`--device cpu`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Timed repetitions of each call (after one untimed).
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// TF32 tensor cores for the conv and linear products (`--device cuda`).
    #[arg(long)]
    tf32: bool,
    /// bf16 products with float32 sums on the tensor cores (`--device cuda`).
    #[arg(long)]
    bf16: bool,
    /// The products' tile, float32 or TF32 (`--device cuda`): `square`
    /// (64 x 64) or `wide` (64 x 256, 8 x 8 per thread or 64 x 32 per warp);
    /// the same bits.
    #[arg(long, value_name = "TILE", value_parser = Fp32Tile::parse)]
    fp32_tile: Option<Fp32Tile>,
    /// How the float32 and TF32 products stage their tiles (`--device
    /// cuda`): `registers` or `cp-async` (compute capability 8.0+); the
    /// same bits. Not with `--bf16`, whose products stage through registers.
    #[arg(long, value_name = "STAGING", value_parser = GemmStaging::parse)]
    gemm_staging: Option<GemmStaging>,
    /// The fused ops' kernels (conv1 + ReLU; conv2, max-pool, ReLU and
    /// dropout; fc1 + ReLU + dropout) as separate kernels (`--device cuda`;
    /// the CPU has no fused ones).
    #[arg(long)]
    no_fusion: bool,
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

/// Median and minimum (ms, ms) of one call.
type Timing = (f64, f64);

/// The backend, its buffers and the timing loop.
struct Bench<'b, B: Ops> {
    b: &'b B,
    reps: usize,
}

impl<B: Ops> Bench<'_, B> {
    fn random(&self, len: usize, seed: u64) -> Result<B::Storage<f32>> {
        Ok(self.b.upload(&filled(len, seed))?)
    }

    fn zeros(&self, len: usize) -> Result<B::Storage<f32>> {
        Ok(self.b.zeros(len)?)
    }

    /// A parameter buffer holding one layer, weight first.
    fn layer_params(&self, weight: usize, bias: usize) -> Result<(B::Storage<f32>, ParamAt)> {
        let at = ParamAt {
            weight: 0..weight,
            bias: weight..weight + bias,
        };
        Ok((self.random(weight + bias, 7)?, at))
    }

    /// Median and minimum milliseconds of `f` between two marks, over
    /// `reps` calls after one untimed (on a shared machine the minimum is
    /// the least disturbed).
    fn time(&self, mut f: impl FnMut() -> core_tensor::Result<()>) -> Result<Timing> {
        f()?;
        self.b.synchronize()?;
        let (mut start, mut end) = (self.b.mark()?, self.b.mark()?);
        let mut secs = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            self.b.record_mark(&mut start)?;
            f()?;
            self.b.record_mark(&mut end)?;
            secs.push(self.b.seconds_between(&start, &end)?);
        }
        secs.sort_by(f64::total_cmp);
        Ok((secs[secs.len() / 2] * 1e3, secs[0] * 1e3))
    }

    fn conv(&self, name: &str, g: Conv2dGeom, dx: bool) -> Result<Vec<(String, Timing)>> {
        let b = self.b;
        let (params, at) = self.layer_params(g.weight_len(), g.out_channels)?;
        let x = self.random(g.batch * g.in_image_len(), 1)?;
        let dy = self.random(g.batch * g.out_image_len(), 2)?;
        let (mut y, mut grads) = (self.zeros(B::len(&dy))?, self.zeros(B::len(&params))?);
        let mut dxb = self.zeros(B::len(&x))?;
        let fwd = self.time(|| b.layer_fwd(&g, &x, &params, &at, &mut y))?;
        let bwd = self.time(|| {
            let dx = dx.then_some(&mut dxb);
            b.layer_bwd(&g, &x, &params, &at, &dy, &mut grads, dx)
        })?;
        Ok(vec![
            (format!("{name} fwd"), fwd),
            (format!("{name} bwd"), bwd),
        ])
    }

    fn linear(&self, name: &str, g: LinearGeom) -> Result<Vec<(String, Timing)>> {
        let b = self.b;
        let (params, at) = self.layer_params(g.in_features * g.out_features, g.out_features)?;
        let x = self.random(g.batch * g.in_features, 3)?;
        let dy = self.random(g.batch * g.out_features, 4)?;
        let (mut y, mut grads) = (self.zeros(B::len(&dy))?, self.zeros(B::len(&params))?);
        let mut dx = self.zeros(B::len(&x))?;
        let fwd = self.time(|| b.layer_fwd(&g, &x, &params, &at, &mut y))?;
        let bwd =
            self.time(|| b.layer_bwd(&g, &x, &params, &at, &dy, &mut grads, Some(&mut dx)))?;
        Ok(vec![
            (format!("{name} fwd"), fwd),
            (format!("{name} bwd"), bwd),
        ])
    }

    /// Max-pool with its epilogue (ReLU, then dropout), on conv2's output.
    fn pool(&self, pool: PoolGeom) -> Result<Vec<(String, Timing)>> {
        let b = self.b;
        let a2 = self.random(pool.input_len(), 5)?;
        let dpool = self.random(pool.output_len(), 6)?;
        let (mut pooled, mut da2) = (
            self.zeros(pool.output_len())?,
            self.zeros(pool.input_len())?,
        );
        let then = Epilogue::ReluDropout(Dropout { p: 0.25, seed: 1 });
        let fwd = self.time(|| b.maxpool2d_fwd(&pool, then, &a2, &mut pooled))?;
        let bwd = self.time(|| b.maxpool2d_bwd(&pool, then, &a2, &pooled, &dpool, &mut da2))?;
        Ok(vec![
            ("maxpool fwd".into(), fwd),
            ("maxpool bwd".into(), bwd),
        ])
    }

    /// conv1's forward pass and its ReLU as one op (`LayerKernel::layer_relu_fwd`).
    fn conv_relu(&self, g: Conv2dGeom) -> Result<(String, Timing)> {
        let b = self.b;
        let (params, at) = self.layer_params(g.weight_len(), g.out_channels)?;
        let x = self.random(g.batch * g.in_image_len(), 1)?;
        let mut y = self.zeros(g.batch * g.out_image_len())?;
        let fwd = self.time(|| b.layer_relu_fwd(&g, Dropout::OFF, &x, &params, &at, &mut y))?;
        Ok(("conv1+relu fwd".into(), fwd))
    }

    /// fc1, its ReLU and dropout as one op (`LayerKernel::layer_relu_fwd`), forward
    /// and backward (which masks `dy` in place: each call masks the last
    /// one's, at the same cost).
    fn linear_relu(&self, g: LinearGeom, dropout: Dropout) -> Result<Vec<(String, Timing)>> {
        let b = self.b;
        let (params, at) = self.layer_params(g.in_features * g.out_features, g.out_features)?;
        let x = self.random(g.batch * g.in_features, 3)?;
        let mut dy = self.random(g.batch * g.out_features, 4)?;
        let (mut y, mut grads) = (self.zeros(B::len(&dy))?, self.zeros(B::len(&params))?);
        let mut dx = self.zeros(B::len(&x))?;
        let fwd = self.time(|| b.layer_relu_fwd(&g, dropout, &x, &params, &at, &mut y))?;
        let bwd = self.time(|| {
            let (saved, dx) = ((&y, &mut dy), Some(&mut dx));
            b.layer_relu_bwd(&g, dropout, &x, &params, &at, saved, &mut grads, dx)
        })?;
        Ok(vec![
            ("fc1+relu fwd".into(), fwd),
            ("fc1+relu bwd".into(), bwd),
        ])
    }

    /// conv2, its max-pool and the epilogue as one op (`Conv2dPoolKernel`).
    fn conv_pool(&self, g: Conv2dGeom) -> Result<Vec<(String, Timing)>> {
        let b = self.b;
        let pool = pool_of(&g);
        let (params, at) = self.layer_params(g.weight_len(), g.out_channels)?;
        let x = self.random(g.batch * g.in_image_len(), 1)?;
        let dpool = self.random(pool.output_len(), 6)?;
        let (mut pooled, mut arg) = (self.zeros(pool.output_len())?, b.zeros(pool.output_len())?);
        let (mut da2, mut grads) = (self.zeros(pool.input_len())?, self.zeros(B::len(&params))?);
        let mut dx = self.zeros(B::len(&x))?;
        let then = Epilogue::ReluDropout(Dropout { p: 0.25, seed: 1 });
        let fwd =
            self.time(|| b.conv2d_pool_fwd(&g, then, &x, &params, &at, &mut pooled, &mut arg))?;
        let bwd = self.time(|| {
            let saved = (&arg, &pooled, &dpool);
            let dx = Some(&mut dx);
            b.conv2d_pool_bwd(
                &g,
                then,
                (&x, &params, &at),
                saved,
                &mut da2,
                &mut grads,
                dx,
            )
        })?;
        Ok(vec![
            ("conv2+pool fwd".into(), fwd),
            ("conv2+pool bwd".into(), bwd),
        ])
    }

    /// The ReLU `layer`'s output of `len` values takes, with its dropout.
    fn relu(&self, layer: &str, len: usize, dropout: Dropout) -> Result<Vec<(String, Timing)>> {
        let b = self.b;
        let mut act = self.random(len, 5)?;
        let mut dact = self.random(len, 6)?;
        let fwd = self.time(|| b.relu_fwd(dropout, &mut act))?;
        let bwd = self.time(|| b.relu_bwd(dropout, &act, &mut dact))?;
        Ok(vec![
            (format!("relu fwd ({layer})"), fwd),
            (format!("relu bwd ({layer})"), bwd),
        ])
    }
}

/// Every call `a.only` selects, in the order of a training step.
fn rows<B: Ops>(b: &B, a: &Args) -> Result<Vec<(String, Timing)>> {
    let bench = Bench { b, reps: a.reps };
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
    let fc = |in_features, out_features| LinearGeom {
        batch: n,
        in_features,
        out_features,
    };
    let want = |name: &str| name.starts_with(&a.only);
    let mut rows = Vec::new();
    let fused = b.fuses();
    if want("conv1") {
        let mut conv1 = bench.conv("conv1", conv(1, 28, 32), false)?;
        if fused {
            conv1[0] = bench.conv_relu(conv(1, 28, 32))?;
        }
        rows.extend(conv1);
    }
    if want("relu") {
        let relu = bench.relu("conv1", n * 32 * 26 * 26, Dropout::OFF)?;
        // Fused, the forward ReLU is in `conv1+relu fwd`.
        rows.extend(relu.into_iter().skip(usize::from(fused)));
    }
    if want("conv2") && fused {
        rows.extend(bench.conv_pool(conv(32, 26, 64))?);
    }
    if want("conv2") && !fused {
        rows.extend(bench.conv("conv2", conv(32, 26, 64), true)?);
    }
    let pool = PoolGeom {
        batch: n,
        channels: 64,
        in_h: 24,
        in_w: 24,
    };
    if want("maxpool") && !fused {
        rows.extend(bench.pool(pool)?);
    }
    let hidden = Dropout { p: 0.5, seed: 2 };
    if want("fc1") && fused {
        rows.extend(bench.linear_relu(fc(9216, 128), hidden)?);
    }
    if want("fc1") && !fused {
        rows.extend(bench.linear("fc1", fc(9216, 128))?);
    }
    if want("relu") && !fused {
        rows.extend(bench.relu("fc1", n * 128, hidden)?);
    }
    if want("fc2") {
        rows.extend(bench.linear("fc2", fc(128, 10))?);
    }
    Ok(rows)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let (described, rows) = match a.device {
        Device::Cpu if a.tf32 || a.bf16 => bail!("--tf32 and --bf16 are for --device cuda"),
        Device::Cpu if a.fp32_tile.is_some() => bail!("--fp32-tile is for --device cuda"),
        Device::Cpu if a.no_fusion => bail!("--no-fusion is for --device cuda"),
        Device::Cpu if a.gemm_staging.is_some() => bail!("--gemm-staging is for --device cuda"),
        Device::Cuda if a.bf16 && a.fp32_tile.is_some() => {
            bail!("--fp32-tile chooses the float32 and TF32 products' tile; bf16 ones keep theirs")
        }
        Device::Cuda if a.bf16 && a.gemm_staging.is_some() => bail!(
            "--gemm-staging chooses how the float32 and TF32 products stage their tiles; \
             bf16 ones stage through registers"
        ),
        Device::Cpu => {
            let cpu = Cpu::new(a.threads)?;
            (cpu.describe(), rows(&cpu, &a)?)
        }
        Device::Cuda => {
            let precision =
                MatmulPrecision::from_flags(a.tf32, a.bf16).map_err(anyhow::Error::msg)?;
            let staging = a.gemm_staging.unwrap_or_default();
            let tile = a.fp32_tile.unwrap_or_default();
            let products = Products::new(precision, tile, staging).map_err(anyhow::Error::msg)?;
            let cuda = Cuda::with_products(0, products)
                .context("--device cuda: no usable GPU 0")?
                .with_fusion(!a.no_fusion);
            (cuda.describe(), rows(&cuda, &a)?)
        }
    };
    println!(
        "# cnn_layers: {described}, batch {}, median of {} calls",
        a.batch_size, a.reps
    );
    println!("# {:<18} {:>10} {:>10}", "call", "median(ms)", "min(ms)");
    for (name, (median, min)) in &rows {
        println!("  {name:<18} {median:>10.3} {min:>10.3}");
    }
    let sum = |f: fn(&Timing) -> f64| rows.iter().map(|r| f(&r.1)).sum::<f64>();
    println!(
        "  {:<18} {:>10.3} {:>10.3}",
        "sum",
        sum(|r| r.0),
        sum(|r| r.1)
    );
    Ok(())
}
