//! Training throughput of one rank: images per second of full training
//! steps (gather, forward, loss, backward, Adam) on the CPU backend.
//!
//! `cargo bench -p benches --bench train_step -- --threads 1 --batch-size 64 --steps 100`
//!
//! Uses the real FashionMNIST when it is installed (the usual places), else
//! a synthetic set of the same size: the kernels' cost does not depend on
//! pixel values. Prints the median step time over `--steps` timed steps
//! after `--warmup` untimed ones, and images/s from it; asserts nothing.
//!
//! `--monitor-rounds R` also measures what the trainer's monitoring costs:
//! R rounds, each timing the steps without and then with the background
//! sampler (memory, CPU; NVML where a GPU is watched) running, and prints
//! both medians over all rounds and the difference (interleaved, so that a
//! shared machine's drift falls on both sides).

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use core_tensor::Cpu;
use core_tensor::ops::AdamConfig;
use fashion_mnist::{FashionMnist, Layout, synth};
use trainer::model::DropoutRates;
use trainer::monitor::Monitor;
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
    /// Rounds of monitoring off / on to compare (0: no comparison).
    #[arg(long, default_value_t = 0)]
    monitor_rounds: usize,
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

/// The seconds of each timed step of one epoch, with `monitor` watching.
fn step_seconds(args: &Args, data: &FashionMnist, monitor: Monitor) -> Result<Vec<f64>> {
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: args.batch_size,
        adam: AdamConfig::default(),
        seed: 0,
        max_steps: Some(args.warmup + args.steps),
        dropout: DropoutRates::REFERENCE,
        bucket_mb: 25.0,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    };
    let mut trainer =
        Trainer::new(Cpu::new(args.threads)?, data, cfg, None).context("building the trainer")?;
    trainer.watch(monitor);
    let mut stamps = Vec::with_capacity(args.warmup + args.steps + 1);
    stamps.push(Instant::now());
    trainer.train_epoch(1, &mut Silent, &mut |_| {
        stamps.push(Instant::now());
        Ok(())
    })?;
    Ok(stamps
        .windows(2)
        .skip(args.warmup)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect())
}

fn median(mut secs: Vec<f64>) -> f64 {
    secs.sort_by(f64::total_cmp);
    secs[secs.len() / 2]
}

/// Median step time with the monitor off and on, over interleaved rounds.
fn monitor_overhead(args: &Args, data: &FashionMnist) -> Result<()> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..args.monitor_rounds {
        off.extend(step_seconds(args, data, Monitor::off())?);
        let (monitor, _) = Monitor::start(None)?;
        on.extend(step_seconds(args, data, monitor)?);
    }
    let (off, on) = (median(off), median(on));
    println!(
        "# monitoring overhead, {} rounds of {} steps each way",
        args.monitor_rounds, args.steps
    );
    println!(
        "# {:>14} {:>14} {:>10}",
        "off median(ms)", "on median(ms)", "overhead"
    );
    println!(
        "  {:>14.3} {:>14.3} {:>9.2}%",
        off * 1e3,
        on * 1e3,
        100.0 * (on - off) / off
    );
    let (seconds, busy) = sampler_cpu_share(std::time::Duration::from_secs(5))?;
    println!(
        "# the sampler thread alone: {:.2} ms of CPU in {seconds:.0} s, {:.4}% of one core",
        busy * 1e3,
        100.0 * busy / seconds
    );
    Ok(())
}

/// The CPU seconds the monitor's sampler thread uses while it runs for
/// `wall` (its `/proc/self/task/TID/schedstat`, in nanoseconds).
fn sampler_cpu_share(wall: std::time::Duration) -> Result<(f64, f64)> {
    let (monitor, _) = Monitor::start(None)?;
    std::thread::sleep(wall);
    let mut busy = None;
    for task in std::fs::read_dir("/proc/self/task")? {
        let dir = task?.path();
        if std::fs::read_to_string(dir.join("comm"))?.trim() == "monitor" {
            let schedstat = std::fs::read_to_string(dir.join("schedstat"))?;
            let ns: f64 = schedstat.split_whitespace().next().unwrap_or("0").parse()?;
            busy = Some(ns * 1e-9);
        }
    }
    drop(monitor);
    Ok((wall.as_secs_f64(), busy.context("no thread named monitor")?))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (data, source) = load_data()?;
    let mut step_secs = step_seconds(&args, &data, Monitor::off())?;
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
    if args.monitor_rounds > 0 {
        monitor_overhead(&args, &data)?;
    }
    Ok(())
}
