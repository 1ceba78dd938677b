//! `--model recsys` out of core: peak RSS against the ratings file's size,
//! and training ratings/s at world sizes 1 and 2.
//!
//! `cargo build --release -p trainer && cargo bench -p benches --bench recsys -- --rows 1000000,8000000`
//!
//! For each row count, writes a generated MovieLens-format file (the same
//! users and movies, so the model is the same size) into a temp dir, runs
//! the release trainer (`TRAINER_BIN`, else `target/release/trainer`) one
//! epoch under `/usr/bin/time -v` for each world size, and prints the
//! maximum resident set size (of the process and its waited-for children:
//! the largest one rank) and the epoch line's ratings/s. Asserts nothing.

#[path = "shared/release_trainer.rs"]
mod release_trainer;

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Parser;
use trainer::models::recsys::synth::write_ratings;

#[derive(Parser, Debug)]
#[command(about = "Peak RSS and ratings/s of --model recsys against file size")]
struct Args {
    /// Ratings per file, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,8000000")]
    rows: Vec<u64>,
    /// World sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    world: Vec<u32>,
    #[arg(long, default_value_t = 10_000)]
    users: u32,
    #[arg(long, default_value_t = 5_000)]
    movies: u32,
    #[arg(long, default_value_t = 1024)]
    batch_size: u32,
    /// Ignored: what `cargo bench` passes to every harness-less bench.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let bin = release_trainer::path()?;
    let dir = tempfile::tempdir()?;
    println!(
        "# users {} movies {} batch {} epochs 1 --device cpu",
        args.users, args.movies, args.batch_size
    );
    println!(
        "{:>10} {:>10} {:>6} {:>12} {:>12}",
        "rows", "file(MiB)", "world", "maxRSS(MiB)", "ratings/s"
    );
    for &rows in &args.rows {
        let path = dir.path().join(format!("ratings-{rows}.csv"));
        write_ratings(&path, rows, args.users, args.movies, 1)?;
        let mib = std::fs::metadata(&path)?.len() as f64 / (1 << 20) as f64;
        for &world in &args.world {
            let out = Command::new("/usr/bin/time")
                .arg("-v")
                .arg(&bin)
                .args(["--model", "recsys", "--device", "cpu", "--epochs", "1"])
                .args(["--batch-size", &args.batch_size.to_string()])
                .args(["--world-size", &world.to_string(), "--ratings"])
                .arg(&path)
                .output()
                .context("running /usr/bin/time -v trainer")?;
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            if !out.status.success() {
                bail!("the trainer failed: {stderr}");
            }
            let rss_kib: f64 = stderr
                .lines()
                .find_map(|l| {
                    l.trim()
                        .strip_prefix("Maximum resident set size (kbytes): ")
                })
                .context("no maximum RSS in /usr/bin/time's report")?
                .parse()?;
            let rate: f64 = stdout
                .lines()
                .find_map(|l| l.split(" | ").last()?.strip_suffix(" samples/s"))
                .context("no epoch line")?
                .trim()
                .parse()?;
            println!(
                "{rows:>10} {mib:>10.1} {world:>6} {:>12.1} {rate:>12.0}",
                rss_kib / 1024.0
            );
        }
    }
    Ok(())
}
