//! `--model toy`: the DDP tutorial's ToyModel on synthetic data, end to end
//! through the binary (the built-in launcher, the TCP ring, checkpoints),
//! cut into a pipeline on CPU ranks and on GPUs.
//!
//! `toy_pipelines_on_the_cuda_emulator` builds the emulator and re-runs
//! this binary with it loaded; there the `emulated_*` test does the work.

mod common;

use common::{run, stderr, stdout, trainer};

/// The epoch losses a run printed (rank 0's lines).
fn losses(out: &std::process::Output) -> Vec<f64> {
    stdout(out)
        .lines()
        .filter_map(|l| l.split("| loss ").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// CPU ranks.
const CPU: [&str; 2] = ["--device", "cpu"];

fn toy(args: &[&str]) -> std::process::Output {
    toy_on(&CPU, args)
}

fn toy_on(device: &[&str], args: &[&str]) -> std::process::Output {
    let out = run(trainer()
        .args(["--model", "toy", "--samples", "2048"])
        .args(device)
        .args(args));
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out
}

#[test]
fn the_loss_falls_on_two_ranks() {
    let out = toy(&["--world-size", "2", "--epochs", "4", "--batch-size", "16"]);
    let losses = losses(&out);
    assert_eq!(losses.len(), 4, "{}", stdout(&out));
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "the loss does not fall every epoch: {losses:?}"
    );
    assert!(losses[3] < 0.98 * losses[0], "{losses:?}");
    assert!(!stdout(&out).contains("acc"), "the toy has no accuracy");
}

/// A checkpointed run resumed for a third epoch ends where a straight run
/// of three epochs does; a toy checkpoint is refused as the CNN's.
#[test]
fn checkpoints_resume_exactly_and_name_their_model() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().to_str().unwrap();
    let straight = losses(&toy(&["--world-size", "2", "--epochs", "3"]));
    toy(&[
        "--world-size",
        "2",
        "--epochs",
        "2",
        "--checkpoint-dir",
        ckpt,
    ]);
    let resumed = toy(&[
        "--world-size",
        "2",
        "--epochs",
        "3",
        "--checkpoint-dir",
        ckpt,
        "--resume",
        "auto",
    ]);
    assert_eq!(losses(&resumed), straight[2..], "{}", stderr(&resumed));
    let newest = dir.path().join("ckpt-e0003-s000000");
    let out = run(trainer()
        .args(["--device", "cpu", "--epochs", "4", "--resume"])
        .arg(&newest));
    let err = stderr(&out);
    assert!(!out.status.success(), "a toy checkpoint resumed as the CNN");
    assert!(err.contains("--model toy"), "{err}");
    // The launcher's restart checks know no model's layout: a toy
    // checkpoint given by path resumes under --max-restarts too.
    let newest = dir.path().join("ckpt-e0004-s000000");
    let newest = newest.to_str().unwrap();
    let more = [
        "--epochs",
        "4",
        "--checkpoint-dir",
        ckpt,
        "--resume",
        newest,
    ];
    toy(&[&["--world-size", "2", "--max-restarts", "1"][..], &more].concat());
    assert!(dir.path().join("ckpt-e0005-s000000").is_dir());
}

#[test]
fn toy_flags_elsewhere_are_one_line_errors() {
    for args in [
        &["--samples", "10"][..],
        &["--model", "toy", "--no-dropout"],
    ] {
        let out = run(trainer().args(args).args(["--epochs", "1"]));
        let err = stderr(&out);
        assert!(
            !out.status.success() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
        assert!(err.contains("--model"), "{args:?}: {err}");
    }
}

/// The SHA-256 of `model.safetensors` after six steps of the toy (seed 3,
/// 2048 samples) run on `device` with `args`, written under `dir`.
fn model_hash(dir: &std::path::Path, device: &[&str], args: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let ckpt = dir.join(args.join("_"));
    let steps = ["--epochs", "1", "--max-steps", "6", "--seed", "3"];
    let to = ["--checkpoint-dir", ckpt.to_str().unwrap()];
    toy_on(device, &[&steps[..], args, &to].concat());
    let model = ckpt.join("ckpt-e0002-s000000").join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    format!("{:x}", Sha256::digest(&bytes))
}

/// The toy gains pipelining by implementing the `Layered` seam alone: cut
/// into net1 + ReLU | net2 + loss, with one micro-batch a pipeline ends
/// with the bytes of the whole toy on as many replicas; with
/// `--reproducible` (a micro-batch a unit) with those of one rank.
#[test]
fn a_pipeline_of_the_toy_ends_with_the_whole_toys_bytes() {
    pipelines_end_with_the_whole_toys_bytes(&CPU);
}

/// The same on emulated GPUs (one a rank), activations and gradients
/// going GPU to GPU over NCCL.
#[test]
fn emulated_a_pipeline_of_the_toy_ends_with_the_whole_toys_bytes() {
    if !cuda_emu::in_emulator() {
        return;
    }
    let gpus = ["--device", "cuda", "--backend", "nccl", "--timeout", "300"];
    pipelines_end_with_the_whole_toys_bytes(&gpus);
}

#[test]
fn toy_pipelines_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(
        4,
        &["emulated_a_pipeline_of_the_toy_ends_with_the_whole_toys_bytes"],
    );
}

fn pipelines_end_with_the_whole_toys_bytes(device: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let hash = |args: &[&str]| model_hash(dir.path(), device, args);
    let batch = ["--batch-size", "16"];
    let pipeline = |world| {
        let layout = ["--world-size", world, "--pipeline-stages", "2"];
        [&batch[..], &layout, &["--micro-batches", "1"]].concat()
    };
    let one_rank = hash(&batch);
    assert_eq!(hash(&pipeline("2")), one_rank, "2 stages x 1 replica");
    let two_replicas = hash(&[&batch[..], &["--world-size", "2"]].concat());
    assert_ne!(
        two_replicas, one_rank,
        "two replicas train on other samples"
    );
    assert_eq!(hash(&pipeline("4")), two_replicas, "2 stages x 2 replicas");
    let exact = ["--reproducible", "--global-batch", "64", "--unit", "16"];
    let grid = ["--world-size", "4", "--pipeline-stages", "2"];
    assert_eq!(hash(&[&exact[..], &grid].concat()), hash(&exact));
}

/// `--world-size 4 --pipeline-stages 2` trains the toy as two pipelines of
/// two stages, four micro-batches each by default, and the loss falls.
#[test]
fn the_toy_trains_as_two_pipelines_of_two_replicas() {
    let out = toy(&[
        "--world-size",
        "4",
        "--pipeline-stages",
        "2",
        "--epochs",
        "3",
        "--batch-size",
        "16",
    ]);
    let err = stderr(&out);
    for needle in [
        "pipeline: 2 stages x 2 data-parallel replicas, 4 micro-batches per batch",
        "stage 0: net1",
        "stage 1: net2",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from:\n{err}");
    }
    let losses = losses(&out);
    assert_eq!(losses.len(), 3, "{}", stdout(&out));
    assert!(losses[2] < losses[0], "{losses:?}");
}
