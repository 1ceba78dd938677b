//! What a lost rank costs a `--recovery live` job: the trainer's workers
//! SIGKILLed one after another (rank 0 among them), each recovery's
//! seconds as rank 0's metrics rows give them, the loss's detection, and
//! the replacement's heal (seconds, bytes).
//!
//! `cargo build --release -p trainer && cargo bench -p benches --bench recovery [-- --scale]`
//!
//! By default the FashionMNIST CNN on 4 CPU ranks, the real data,
//! `--reproducible --global-batch 128`, 20 kills of random workers. With
//! `--scale`, `--model toy` at worlds 4, 8, 16 and 32, a few kills each,
//! and every job's final model checked against one rank's undisturbed.
//! The trainer is the release build (`TRAINER_BIN`, else
//! `target/release/trainer`), which this bench does not build. Kills fall
//! once the ledger holds their step and the kill before was healed (its
//! replacement joined), so each finds a full ring. Prints tables, asserts
//! on no time; a job that fails or a model that differs fails the bench.

#[path = "../shared/release_trainer.rs"]
mod release_trainer;

mod job;
mod table;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use job::Kill;

#[derive(Parser, Debug)]
#[command(about = "Recovery time of --recovery live when workers are SIGKILLed")]
struct Args {
    /// `--model toy` at each of `--worlds`, the final bytes checked
    /// against one undisturbed rank's; else the CNN at `--world`.
    #[arg(long)]
    scale: bool,
    /// Ranks of the CNN job.
    #[arg(long, default_value_t = 4)]
    world: usize,
    /// World sizes of `--scale`, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    worlds: Vec<usize>,
    /// Workers killed per job [default: 20; with --scale 4].
    #[arg(long)]
    kills: Option<usize>,
    /// Each kill falls GAP to 2·GAP−1 committed steps after the one before
    /// (or once that kill's replacement joined, if later) [default: 8;
    /// with --scale 25: a toy step is so short that a replacement's start
    /// spans some twenty].
    #[arg(long)]
    gap: Option<usize>,
    /// Seeds the choice of ranks and steps.
    #[arg(long, default_value_t = 48)]
    seed: u64,
    /// The CNN's data (the trainer's default where absent).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Ignored: what `cargo bench` passes to every harness-less bench.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Where each job writes: checkpoints (the final model), ledger, metrics.
struct Outputs {
    dir: PathBuf,
}

impl Outputs {
    fn ledger(&self) -> PathBuf {
        self.dir.with_extension("ledger.jsonl")
    }

    fn metrics(&self) -> PathBuf {
        self.dir.with_extension("metrics.jsonl")
    }

    /// The flags naming them.
    fn flags(&self, cmd: &mut Command) {
        cmd.arg("--checkpoint-dir").arg(&self.dir);
        cmd.arg("--sample-ledger").arg(self.ledger());
        cmd.arg("--metrics").arg(self.metrics());
    }
}

/// `kills` kills of random ranks of `world` (rank 0 among them), each
/// `gap..2·gap` steps after the one before, the first after step 10.
fn plan(world: usize, kills: usize, gap: usize, rng: &mut ChaCha8Rng) -> Vec<Kill> {
    let mut ranks: Vec<usize> = (0..kills).map(|_| rng.random_range(0..world)).collect();
    if !ranks.contains(&0) && kills > 0 {
        let at = rng.random_range(0..kills);
        ranks[at] = 0;
    }
    let mut after_step = 10;
    (ranks.into_iter())
        .map(|rank| {
            after_step += rng.random_range(gap..2 * gap);
            Kill { rank, after_step }
        })
        .collect()
}

/// Steps enough for any plan of `kills` kills, and for the last one's
/// replacement to join.
fn steps(kills: usize, gap: usize) -> usize {
    10 + kills * 2 * gap + 4 * gap
}

/// A trainer job of `world` one-thread ranks for one epoch capped at
/// `steps`, the same bits at any world, live where more than one rank.
fn trainer(bin: &Path, world: usize, steps: usize, replacements: usize) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["--world-size", &world.to_string(), "--threads", "1"])
        .args(["--epochs", "1", "--max-steps", &steps.to_string()])
        .args(["--seed", "3", "--reproducible", "--timeout", "30"]);
    if world > 1 {
        cmd.args(["--recovery", "live"])
            .args(["--max-restarts", &replacements.to_string()]);
    }
    cmd
}

fn cnn(args: &Args, bin: &Path, tmp: &Path, rng: &mut ChaCha8Rng) -> Result<()> {
    let (kills, gap) = (args.kills.unwrap_or(20), args.gap.unwrap_or(8));
    println!("# kills seeded {}, gap {gap} steps", args.seed);
    let plan = plan(args.world, kills, gap, rng);
    let mut cmd = trainer(bin, args.world, steps(kills, gap), kills);
    cmd.args(["--global-batch", "128", "--eval-samples", "500"]);
    if let Some(dir) = &args.data_dir {
        cmd.arg("--data-dir").arg(dir);
    }
    let out = Outputs {
        dir: tmp.join("cnn"),
    };
    out.flags(&mut cmd);
    println!("# {cmd:?}");
    let ran = job::run(
        cmd,
        args.world,
        (&out.dir, out.ledger(), out.metrics()),
        &plan,
    )?;
    table::print_kills(&ran.costs);
    println!(
        "# the job: {:.1} s, model {}",
        ran.seconds,
        job::short_hash(&ran.model)
    );
    Ok(())
}

fn scale(args: &Args, bin: &Path, tmp: &Path, rng: &mut ChaCha8Rng) -> Result<()> {
    let (kills, gap) = (args.kills.unwrap_or(4), args.gap.unwrap_or(25));
    println!("# kills seeded {}, gap {gap} steps", args.seed);
    let steps = steps(kills, gap);
    let toy = |world: usize, dir: &Path| {
        let mut cmd = trainer(bin, world, steps, kills);
        cmd.args(["--model", "toy", "--samples", "16384"]).args([
            "--global-batch",
            "32",
            "--unit",
            "1",
        ]);
        let out = Outputs {
            dir: dir.to_path_buf(),
        };
        out.flags(&mut cmd);
        (cmd, out)
    };
    let (mut alone, out) = toy(1, &tmp.join("alone"));
    let done = alone.stderr(std::process::Stdio::null()).status()?;
    if !done.success() {
        bail!("the undisturbed run failed ({done}): {alone:?}");
    }
    let undisturbed = job::final_model(&out.dir)?;
    println!(
        "# undisturbed: {alone:?}\n# its model {}",
        job::short_hash(&undisturbed)
    );
    table::print_scale_header();
    let mut differs = Vec::new();
    for &world in &args.worlds {
        let (cmd, out) = toy(world, &tmp.join(format!("world{world}")));
        let plan = plan(world, kills, gap, rng);
        let ran = job::run(cmd, world, (&out.dir, out.ledger(), out.metrics()), &plan)?;
        let same = ran.model == undisturbed;
        if !same {
            differs.push(world);
        }
        let hash = job::short_hash(&ran.model);
        table::print_scale_row(world, &ran.costs, ran.seconds, (same, &hash));
    }
    if !differs.is_empty() {
        bail!("world(s) {differs:?} ended on other bytes than the undisturbed run");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let bin = release_trainer::path()?;
    let tmp = tempfile::tempdir()?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    println!("# machine: {}", table::machine());
    match args.scale {
        true => scale(&args, &bin, tmp.path(), &mut rng),
        false => cnn(&args, &bin, tmp.path(), &mut rng),
    }
}
