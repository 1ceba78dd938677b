//! `--recovery live` at 32 ranks: `--model toy` on 32 worker processes,
//! 10 of them SIGKILLed one after another at moments a seeded generator
//! picks (rank 0, the ledger's writer, among them); the job ends on the
//! bytes and the sample ledger of one rank trained undisturbed.

mod common;

use std::path::Path;
use std::process::Command;

use common::live::{Running, ledger, lost_ranks, recovery_rows, result};
use common::{run, stderr, trainer};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const WORLD: usize = 32;
const KILLS: usize = 10;
/// Steps of the capped epoch: room for the kills, a few seconds of toy
/// steps on 32 processes sharing two cores.
const STEPS: usize = 240;

/// The toy job on `world` ranks, checkpointing into `dir`, with its
/// ledger; live with room for every kill's replacement.
fn toy_job(world: usize, dir: &Path) -> Command {
    let mut cmd = trainer();
    cmd.args(["--model", "toy", "--samples", "8192", "--seed", "3"])
        .args(["--world-size", &world.to_string(), "--threads", "1"])
        .args(["--epochs", "1", "--max-steps", &STEPS.to_string()])
        .args(["--reproducible", "--global-batch", "32", "--unit", "1"])
        .args(["--timeout", "30", "--checkpoint-dir"])
        .arg(dir)
        .arg("--sample-ledger")
        .arg(ledger(dir));
    if world > 1 {
        cmd.args(["--recovery", "live", "--max-restarts", &KILLS.to_string()]);
    }
    cmd
}

/// Which ranks die, and after which committed step: distinct ranks, rank
/// 0 among them, each kill 5 to 20 steps after the one before (so the
/// replacement of the last is often still joining when the next falls).
fn kills(seed: u64) -> Vec<(usize, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ranks: Vec<usize> = (1..WORLD).collect();
    ranks.shuffle(&mut rng);
    ranks.truncate(KILLS - 1);
    ranks.insert(rng.random_range(0..KILLS), 0);
    let mut at = 10;
    (ranks.into_iter())
        .map(|rank| {
            at += rng.random_range(5..=20);
            (at, rank)
        })
        .collect()
}

#[test]
fn ten_of_32_ranks_killed_and_the_job_ends_on_one_ranks_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = tmp.path().join("alone");
    let out = run(&mut toy_job(1, &alone));
    assert!(out.status.success(), "{}", stderr(&out));
    let alone = result(&alone);
    let dir = tmp.path().join("live");
    let metrics = tmp.path().join("metrics.jsonl");
    let mut cmd = toy_job(WORLD, &dir);
    cmd.arg("--metrics").arg(&metrics);
    let plan = kills(48);
    assert!(plan.last().unwrap().0 < STEPS - 10, "{plan:?}");
    let mut job = Running::start(cmd, WORLD);
    for &(at, rank) in &plan {
        job.until_committed(&dir, at);
        job.signal(rank, "-KILL");
    }
    let (status, log) = job.finish();
    assert!(status.success(), "{plan:?}\n{log}");
    assert_eq!(result(&dir).0, alone.0, "the model's bytes:\n{log}");
    assert_eq!(result(&dir).1, alone.1, "the sample ledger:\n{log}");
    // Each kill cost one worker and its replacement; no restart of all.
    let started = log.matches("launcher: started rank").count();
    assert_eq!(started, WORLD + KILLS, "{log}");
    assert!(!log.contains("restart 1 of"), "a restart of all:\n{log}");
    let lost = lost_ranks(&recovery_rows(&metrics));
    for (_, rank) in &plan {
        assert!(lost.contains(rank), "rank {rank} not among {lost:?}");
    }
}
