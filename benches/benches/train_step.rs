//! Training throughput of one rank: images per second of full training
//! steps (gather, forward, loss, backward, Adam) on the CPU backend.
//!
//! `cargo bench -p benches --bench train_step -- --threads 1 --batch-size 64 --steps 100`
//!
//! Uses the real FashionMNIST when it is installed (the usual places), else
//! a synthetic set of the same size: the kernels' cost does not depend on
//! pixel values. Prints the median step time over `--steps` timed steps
//! after `--warmup` untimed ones, and images/s from it; asserts nothing.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use core_tensor::Cpu;
use core_tensor::ops::AdamConfig;
use fashion_mnist::{FashionMnist, Layout, synth};
use trainer::model::DropoutRates;
use trainer::train::{Silent, TrainConfig, Trainer};

#[derive(Parser, Debug)]
#[command(about = "Training images/s of one rank on the CPU backend")]
struct Args {
    /// CPU threads for the kernels.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Untimed steps first (allocation, caches).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// `cargo bench` passes `--bench`; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn load_data() -> Result<(FashionMnist, &'static str)> {
    if let Ok(dir) = fashion_mnist::locate(None) {
        return Ok((FashionMnist::load(&dir)?, "FashionMNIST"));
    }
    let dir = tempfile::tempdir()?;
    synth::write_dataset(dir.path(), Layout::FASHION_MNIST)?;
    Ok((
        FashionMnist::load(dir.path())?,
        "synthetic data (FashionMNIST not installed)",
    ))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (data, source) = load_data()?;
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: args.batch_size,
        adam: AdamConfig::default(),
        seed: 0,
        max_steps: Some(args.warmup + args.steps),
        dropout: DropoutRates::REFERENCE,
        bucket_mb: 25.0,
    };
    let mut trainer =
        Trainer::new(Cpu::new(args.threads)?, &data, cfg, None).context("building the trainer")?;
    let mut stamps = Vec::with_capacity(args.warmup + args.steps + 1);
    stamps.push(Instant::now());
    trainer.train_epoch(1, &mut Silent, &mut |_| {
        stamps.push(Instant::now());
        Ok(())
    })?;
    let mut step_secs: Vec<f64> = stamps
        .windows(2)
        .skip(args.warmup)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    step_secs.sort_by(f64::total_cmp);
    let median = step_secs[step_secs.len() / 2];
    println!("# train_step: one rank, CPU backend, {source}, dropout on, Adam");
    println!(
        "# {:>7} {:>6} {:>6} {:>12} {:>12} {:>10}",
        "threads", "batch", "steps", "median(ms)", "min(ms)", "img/s"
    );
    println!(
        "  {:>7} {:>6} {:>6} {:>12.2} {:>12.2} {:>10.0}",
        args.threads,
        args.batch_size,
        step_secs.len(),
        median * 1e3,
        step_secs[0] * 1e3,
        args.batch_size as f64 / median
    );
    Ok(())
}
