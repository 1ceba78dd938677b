//! `--recovery live` over NCCL, run without a GPU on `cuda-emu` (see
//! `cuda_emulated.rs`): two emulated GPUs train the toy model, their
//! exact sums (`--reproducible`) over an NCCL communicator of the job's
//! first generation; rank 1 is SIGKILLed mid-run. Rank 0, the same
//! process, goes on in a new generation over a new NCCL communicator (and
//! the launcher's replacement for rank 1 may join it in another), and the
//! model ends on the bytes of one emulated GPU trained undisturbed, the
//! sample ledger on that run's lines. A rank lost while a generation's NCCL
//! communicator forms is a regroup too, not the job's end.
//!
//! `live_nccl_on_the_cuda_emulator` builds the emulator and re-runs this
//! binary with it loaded; there `emulated_*` does the work.

mod common;

use std::path::Path;
use std::process::Command;

use common::live::{Running, ledger, result};

const EMULATED: [&str; 2] = [
    "emulated_a_killed_gpu_costs_a_step_and_the_survivor_goes_on_over_new_nccl",
    "emulated_a_gpu_lost_while_nccl_forms_is_a_regroup_not_the_end",
];

/// Steps of the one capped epoch, and the step after which rank 1 dies.
const STEPS: usize = 200;
const KILLED_AFTER: usize = 30;

#[test]
fn live_nccl_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(2, &EMULATED);
}

/// The toy model on `world` emulated GPUs over NCCL (at world 1 nothing
/// to average), a live job on two, its checkpoints in `dir`.
fn toy_job(world: usize, dir: &Path) -> Command {
    toy_job_waiting(world, dir, 30)
}

/// What one emulated GPU trained undisturbed ends on (in `tmp`): the
/// model's hash and the ledger.
fn one_gpu(tmp: &Path) -> (String, String) {
    let alone = tmp.join("alone");
    let out = common::run(&mut toy_job(1, &alone));
    assert!(out.status.success(), "one GPU: {}", common::stderr(&out));
    result(&alone)
}

/// [`toy_job`], a peer given up after `timeout` seconds.
fn toy_job_waiting(world: usize, dir: &Path, timeout: u32) -> Command {
    let mut cmd = common::trainer();
    cmd.args(["--model", "toy", "--samples", "8192", "--epochs", "1"])
        .args(["--max-steps", &STEPS.to_string(), "--seed", "3"])
        .args(["--device", "cuda", "--backend", "nccl"])
        .args(["--timeout", &timeout.to_string()])
        .args(["--world-size", &world.to_string()])
        .args(["--reproducible", "--global-batch", "32", "--unit", "8"])
        .arg("--checkpoint-dir")
        .arg(dir)
        .arg("--sample-ledger")
        .arg(ledger(dir));
    if world > 1 {
        cmd.args(["--recovery", "live", "--max-restarts", "1"]);
    }
    cmd
}

#[test]
fn emulated_a_killed_gpu_costs_a_step_and_the_survivor_goes_on_over_new_nccl() {
    if !cuda_emu::in_emulator() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let alone = one_gpu(tmp.path());

    let dir = tmp.path().join("live");
    let mut job = Running::start(toy_job(2, &dir), 2);
    job.until_committed(&dir, KILLED_AFTER);
    let killed = job.signal(1, "-KILL");
    let survivor = job.pids[&0].clone();
    let (status, log) = job.finish();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("live recovery: lost rank(s) launched as 1"),
        "{log}"
    );
    // The replacement joined, in the generation after the loss or a later
    // one: rank 0 trained over a second NCCL communicator, with it.
    assert!(log.contains("joined: "), "{log}");
    let over_nccl = (log.lines())
        .filter(|l| l.starts_with("[rank 0] training on") && l.contains("world size 2"))
        .filter(|l| l.contains("gradients over NCCL"))
        .count();
    assert!(
        over_nccl >= 2,
        "{over_nccl} generation(s) of two over NCCL:\n{log}"
    );
    // Rank 0 was never restarted: it went on in the same process.
    assert!(
        log.contains(&format!("started rank 0 (pid {survivor})")),
        "{log}"
    );
    assert_eq!(log.matches("started rank 0").count(), 1, "{log}");
    assert!(
        log.contains(&format!("started rank 1 (pid {killed})")),
        "{log}"
    );
    let (model, steps) = result(&dir);
    assert_eq!(model, alone.0, "the model's hash, one GPU's:\n{log}");
    assert_eq!(steps, alone.1, "the sample ledger:\n{log}");
}

#[test]
fn emulated_a_gpu_lost_while_nccl_forms_is_a_regroup_not_the_end() {
    if !cuda_emu::in_emulator() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let alone = one_gpu(tmp.path());

    // Rank 1 exits as the first generation's NCCL communicator forms: rank
    // 0 waits for it there until --timeout, then, as nothing trained, the
    // next generation forms of both slots from their flags (the launcher's
    // replacement for rank 1 in its slot).
    let dir = tmp.path().join("live");
    let mut job = toy_job_waiting(2, &dir, 10);
    job.env(trainer::run::EXIT_BEFORE_NCCL_ENV, "1:1");
    let out = common::run(&mut job);
    let log = common::stderr(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("live recovery: the same ranks formed again; generation 2: 2 rank(s), going on after global step 0"),
        "{log}"
    );
    assert!(
        log.contains("(generation 1 ended: rank 0: creating the NCCL communicator"),
        "{log}"
    );
    assert!(log.contains("rank 1 failed (exit status: 137)"), "{log}");
    assert_eq!(log.matches("started rank 0").count(), 1, "{log}");
    let (model, steps) = result(&dir);
    assert_eq!(model, alone.0, "the model's hash, one GPU's:\n{log}");
    assert_eq!(steps, alone.1, "the sample ledger:\n{log}");
}
