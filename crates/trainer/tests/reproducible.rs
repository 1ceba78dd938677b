//! `--reproducible`: the same model bytes at any layout — world sizes,
//! thread counts, ranks as threads, accumulation, pipeline stages alone and
//! with replicas, and a run stopped and resumed on another world — and on
//! every CPU (the reference hash); and today's default summation, whose
//! bytes depend on the layout but not on the CPU (its own recorded hashes).

mod common;

use std::path::Path;

use common::{data_arg, dataset, job, run, stderr, trainer};

/// Steps of every run (an epoch of the synthetic set is 469 global batches
/// of 128; each run stops after these).
const STEPS: &str = "6";

/// The SHA-256 of the table's `model.safetensors`: six steps of
/// `--reproducible --global-batch 64 --unit 16 --seed 3` on the synthetic
/// data set. Recorded on an AMD EPYC (AVX2), 2026-12-01; a run on any other
/// CPU (AVX-512 included) must give the same bytes.
const REFERENCE: &str = "e01d9e1df9e816f2e3aebcb7343b93058dbd5be872f52881fa32ccd2f850c9a9";

fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// The newest checkpoint's model in `dir`.
fn newest_model(dir: &Path) -> std::path::PathBuf {
    let mut ckpts: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.safetensors").exists())
        .collect();
    ckpts.sort();
    ckpts.pop().expect("a checkpoint").join("model.safetensors")
}

/// Where the run into checkpoint directory `dir` writes its sample ledger.
fn ledger(dir: &Path) -> std::path::PathBuf {
    dir.with_extension("ledger.jsonl")
}

/// Trains the table's run on `world` ranks with `extra` flags into `dir`:
/// its model's hash, and its ledger.
fn train(dir: &Path, world: usize, extra: &[&str]) -> (String, String) {
    let mut cmd = trainer();
    cmd.args([
        "--world-size",
        &world.to_string(),
        "--epochs",
        "1",
        "--timeout",
        "60",
    ])
    .args(data_arg(dataset()));
    if !extra.contains(&"--threads") {
        cmd.args(["--threads", "1"]);
    }
    cmd.args(["--reproducible", "--global-batch", "64", "--seed", "3"])
        .args(["--max-steps", STEPS, "--checkpoint-dir"])
        .arg(dir)
        .arg("--sample-ledger")
        .arg(ledger(dir))
        .args(extra);
    let out = run(&mut cmd);
    assert!(
        out.status.success(),
        "world {world} {extra:?}: {}",
        stderr(&out)
    );
    let samples = std::fs::read_to_string(ledger(dir)).unwrap();
    (sha256(&newest_model(dir)), samples)
}

#[test]
fn every_layout_ends_on_the_same_bytes_as_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name);
    let alone = train(&dir("w1"), 1, &[]);
    assert_eq!(
        alone.0, REFERENCE,
        "one rank: not the recorded bytes (another CPU?)"
    );
    let layouts: [(&str, usize, &[&str]); 6] = [
        ("w3", 3, &[]),
        // 2 stages of one replica; 2 stages x 2 replicas.
        ("w2-pipeline", 2, &["--pipeline-stages", "2"]),
        ("w4-pipeline", 4, &["--pipeline-stages", "2"]),
        ("w1-threads2", 1, &["--threads", "2"]),
        ("w2-as-threads", 2, &["--spawn", "threads"]),
        (
            "w1-accumulate",
            1,
            &["--accumulate-steps", "4", "--batch-size", "16"],
        ),
    ];
    for (name, world, extra) in layouts {
        let (bytes, samples) = train(&dir(name), world, extra);
        assert_eq!(bytes, alone.0, "{name}: other bytes");
        // Each step trained the same samples, whoever trained them.
        assert_eq!(samples, alone.1, "{name}: another sample ledger");
    }
    // Stopped after 3 steps on one rank, resumed on two.
    let resumed = dir("resumed");
    let mut first = job(1, 1, 60);
    first
        .args(["--reproducible", "--global-batch", "64", "--seed", "3"])
        .args([
            "--max-steps",
            STEPS,
            "--checkpoint-every",
            "3",
            "--checkpoint-dir",
        ])
        .arg(&resumed)
        .arg("--sample-ledger")
        .arg(ledger(&resumed));
    assert!(run(&mut first).status.success());
    std::fs::remove_dir_all(resumed.join("ckpt-e0002-s000000")).unwrap();
    // The resumed run keeps the ledger's lines up to its checkpoint.
    let again = train(&resumed, 2, &["--resume", "auto"]);
    assert_eq!(again.0, alone.0, "resumed on two ranks: other bytes");
    assert_eq!(again.1, alone.1, "resumed on two ranks: another ledger");
}

/// The SHA-256 of `model.safetensors` after six steps of the default
/// summation (`--batch-size 64 --seed 3`, the synthetic data set, as the
/// table above), one per
/// layout: each layout sums in its own order, so each has its own bytes, but
/// no CPU may change them (the pipeline's did, before gemm's SIMD-lane sums
/// became fixed chains). Recorded on an AMD EPYC Zen 4 (family 25 model 17,
/// AVX-512), 2026-12-03, where the 60-step checkpoints on the real data are
/// those of an AMD EPYC (AVX2) and an Intel Xeon (AVX-512).
const DEFAULT_SUMMATION: [(&str, usize, &[&str], &str); 4] = [
    (
        "w1",
        1,
        &["--threads", "1"],
        "9750aa8ff09a78394d3bacf17ba013f32e2d711b41fc0205999478f3d243bf60",
    ),
    (
        "w1-threads2",
        1,
        &["--threads", "2"],
        "ba4114449fdfdb21efdf03d827ff626ad1ff239640736c2efd752e17c0bab503",
    ),
    (
        "w2",
        2,
        &["--threads", "1"],
        "75db7818176dff99f3017954374eb00a3aa6d1ebe6b5b0f8ddf91bfb61ef9f95",
    ),
    (
        "w2-pipeline",
        2,
        &["--threads", "1", "--pipeline-stages", "2"],
        "a2c9f3c0750995b7204fdcf3546201a7129700e2686d64e706863dba1b13d116",
    ),
];

#[test]
fn the_default_summation_keeps_its_recorded_bytes_on_every_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, world, extra, want) in DEFAULT_SUMMATION {
        let dir = tmp.path().join(name);
        let out = run(trainer()
            .args(["--world-size", &world.to_string(), "--epochs", "1"])
            .args(["--timeout", "60", "--batch-size", "64", "--seed", "3"])
            .args(["--max-steps", STEPS])
            .args(data_arg(dataset()))
            .args(extra)
            .arg("--checkpoint-dir")
            .arg(&dir));
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_eq!(
            sha256(&newest_model(&dir)),
            want,
            "{name}: not the recorded bytes (another CPU?)"
        );
    }
}

#[test]
fn bad_reproducible_flags_are_one_line_naming_the_flag() {
    let refused = |args: &[&str]| {
        let out = run(trainer()
            .args(["--max-steps", "1", "--threads", "1"])
            .args(data_arg(dataset()))
            .args(args));
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = stderr(&out);
        let last = err
            .lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or("");
        (last.to_string(), err)
    };
    let (line, _) = refused(&["--reproducible", "--global-batch", "100"]);
    assert!(line.contains("not a multiple of --unit 16"), "{line}");
    let (line, _) = refused(&["--reproducible", "--comm-hook", "bf16", "--world-size", "2"]);
    assert!(line.contains("--comm-hook bf16"), "{line}");
    let (line, err) = refused(&["--global-batch", "128"]);
    assert!(err.contains("--reproducible"), "{line}");
    let (line, _) = refused(&[
        "--reproducible",
        "--global-batch",
        "32",
        "--world-size",
        "3",
    ]);
    assert!(line.contains("--global-batch 48 or more"), "{line}");
    // A pipeline's micro-batches are its 4 units of the global batch.
    let (line, _) = refused(&[
        "--reproducible",
        "--global-batch",
        "64",
        "--pipeline-stages",
        "2",
        "--world-size",
        "2",
        "--micro-batches",
        "2",
    ]);
    assert!(
        line.contains("--micro-batches 2 with --reproducible"),
        "{line}"
    );
}
