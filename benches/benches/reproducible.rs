//! What `--reproducible` costs: images/s and gradient bytes per step with
//! and without it, at world 1, 2 and 4 on the CPU (one thread per rank, 64
//! samples per rank and step), and where the difference goes (the units'
//! forward and backward at batch `--unit` against the rank's batch, and the
//! exact sum with its wire against the float32 ring's wait).
//!
//! `cargo build --release -p trainer && cargo bench -p benches --bench reproducible -- --steps 40 --rounds 3`
//! (`--unit 64`: units of a rank's whole batch, so that only the exact
//! sum and its wire differ from the ring)
//!
//! Runs the trainer binary beside this one (`target/<profile>/trainer`,
//! or `--trainer PATH`) for `--steps` steps per run, the two modes
//! interleaved `--rounds` times so that a shared machine's drift falls on
//! both, and prints the median of each figure from the runs' metrics
//! (`--metrics`: the epoch's img/s, phase seconds, bytes per step).
//! Uses the installed FashionMNIST (or `--data-dir`). Asserts nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Images/s and bytes per step with and without --reproducible")]
struct Args {
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 40)]
    steps: u32,
    /// Runs of each mode at each world size, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// World sizes, comma-separated.
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    worlds: Vec<usize>,
    /// The trainer binary [default: the one beside this benchmark].
    #[arg(long)]
    trainer: Option<PathBuf>,
    /// The `--reproducible` runs' samples per unit [default: the
    /// trainer's]; 64, a rank's whole batch, leaves the units' part out.
    #[arg(long)]
    unit: Option<usize>,
    /// FashionMNIST's directory [default: where the trainer finds it].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// `cargo bench` passes `--bench`; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One run's figures, from its metrics line.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    img_per_s: f64,
    /// Rank 0's seconds in forward and backward, per step.
    compute_s: f64,
    /// Rank 0's seconds waiting for the gradients' sum, per step.
    wait_s: f64,
    bytes_per_step: f64,
}

fn trainer_path(args: &Args) -> Result<PathBuf> {
    if let Some(path) = &args.trainer {
        return Ok(path.clone());
    }
    // target/<profile>/deps/reproducible-HASH → target/<profile>/trainer
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("trainer"))
        .context("no folder above this benchmark")?;
    if !path.exists() {
        bail!(
            "{} does not exist: build the trainer first (cargo build --release -p trainer, or without --release for the dev profile), or pass --trainer",
            path.display()
        );
    }
    Ok(path)
}

fn run(args: &Args, trainer: &Path, world: usize, exact: bool) -> Result<Figures> {
    let dir = tempfile::tempdir()?;
    let metrics = dir.path().join("metrics.jsonl");
    let mut cmd = Command::new(trainer);
    cmd.args(["--world-size", &world.to_string(), "--threads", "1"])
        .args(["--epochs", "1", "--batch-size", "64", "--seed", "3"])
        .args(["--max-steps", &args.steps.to_string(), "--metrics"])
        .arg(&metrics);
    if let Some(data) = &args.data_dir {
        cmd.arg("--data-dir").arg(data);
    }
    if exact {
        cmd.arg("--reproducible");
        if let Some(unit) = args.unit {
            cmd.args(["--unit", &unit.to_string()]);
        }
    }
    let out = cmd.output().context("running the trainer")?;
    if !out.status.success() {
        bail!(
            "the trainer failed (world {world}, reproducible {exact}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(&metrics)?;
    let last = text.lines().last().context("no metrics line")?;
    let line: serde_json::Value = serde_json::from_str(last)?;
    let phase = |name: &str| line["phase_s"][name].as_f64().unwrap_or(0.0);
    let steps = f64::from(args.steps);
    Ok(Figures {
        img_per_s: line["img_per_s"].as_f64().unwrap_or(0.0),
        compute_s: (phase("forward") + phase("backward")) / steps,
        wait_s: phase("allreduce_wait") / steps,
        bytes_per_step: line["grad_bytes_per_step"].as_f64().unwrap_or(0.0),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn medians(runs: &[Figures]) -> Figures {
    let of = |f: fn(&Figures) -> f64| median(runs.iter().map(f).collect());
    Figures {
        img_per_s: of(|r| r.img_per_s),
        compute_s: of(|r| r.compute_s),
        wait_s: of(|r| r.wait_s),
        bytes_per_step: of(|r| r.bytes_per_step),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let trainer = trainer_path(&args)?;
    println!(
        "# --reproducible against the float32 ring: {} steps of 64 samples per rank, 1 thread per rank, --unit {}, {} rounds, medians",
        args.steps,
        args.unit
            .map_or("(the trainer's)".into(), |u| u.to_string()),
        args.rounds
    );
    println!(
        "# {:>5} {:>13} {:>13} {:>8} {:>14} {:>14} {:>11} {:>11} {:>12} {:>12}",
        "world",
        "ring img/s",
        "exact img/s",
        "cost",
        "ring comp ms",
        "exact comp ms",
        "ring wait",
        "exact wait",
        "ring B/step",
        "exact B/step"
    );
    for &world in &args.worlds {
        let (mut ring, mut exact) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds {
            ring.push(run(&args, &trainer, world, false)?);
            exact.push(run(&args, &trainer, world, true)?);
        }
        let (r, e) = (medians(&ring), medians(&exact));
        println!(
            "  {:>5} {:>13.0} {:>13.0} {:>7.1}% {:>14.1} {:>14.1} {:>10.1}ms {:>10.1}ms {:>12.0} {:>12.0}",
            world,
            r.img_per_s,
            e.img_per_s,
            100.0 * (1.0 - e.img_per_s / r.img_per_s),
            1e3 * r.compute_s,
            1e3 * e.compute_s,
            1e3 * r.wait_s,
            1e3 * e.wait_s,
            r.bytes_per_step,
            e.bytes_per_step
        );
    }
    Ok(())
}
