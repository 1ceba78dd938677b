//! `--sparse-grads`: recsys' embedding gradients as touched rows or as the
//! dense all-reduce give the same weights and optimizer state, bit for bit,
//! at two ranks, on the CPU and on a GPU (`cuda-emu`: the rows' gather and
//! scatter kernels); and `auto` reports which it chose and why.

mod common;

use std::path::{Path, PathBuf};

use common::{run, stderr, trainer};
use trainer::models::recsys::synth::write_ratings;

/// Trains one epoch on two ranks (`extra` names the device and the steps)
/// and returns the checkpoint directory's files (name, bytes) and rank 0's
/// stderr.
fn train(
    ratings: &Path,
    dir: &Path,
    mode: &str,
    extra: &[&str],
) -> (Vec<(PathBuf, Vec<u8>)>, String) {
    let ckpt = dir.join(mode);
    let out = run(trainer()
        .args(["--model", "recsys", "--ratings"])
        .arg(ratings)
        .args(extra)
        .args(["--world-size", "2", "--epochs", "1"])
        .args([
            "--batch-size",
            "64",
            "--sparse-grads",
            mode,
            "--checkpoint-dir",
        ])
        .arg(&ckpt));
    assert!(out.status.success(), "{mode}: {}", stderr(&out));
    let mut files = Vec::new();
    let mut dirs = vec![ckpt.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = common::without_flag_record(&path, std::fs::read(&path).unwrap());
                files.push((path.strip_prefix(&ckpt).unwrap().to_path_buf(), bytes));
            }
        }
    }
    files.sort();
    assert!(!files.is_empty(), "{mode}: no checkpoint written");
    (files, stderr(&out))
}

/// The choice line: (bytes as rows, bytes dense, what was chosen).
fn choice(err: &str) -> (u64, u64, String) {
    let line = err
        .lines()
        .find(|l| l.contains("sparse gradients, first step"))
        .unwrap_or_else(|| panic!("no sparse-gradient line in:\n{err}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let before = |w: &str| words[words.iter().position(|x| *x == w).unwrap() - 2];
    let rows: u64 = before("as").parse().unwrap();
    let dense: u64 = before("dense").parse().unwrap();
    (rows, dense, words.last().unwrap().to_string())
}

/// The same weights as rows (`always`, `auto`) and dense (`never`), with
/// `extra` flags (the device).
fn rows_and_dense_agree(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let ratings = dir.path().join("ratings.csv");
    // 5000 rows of which a step touches at most 256: rows are smaller.
    write_ratings(&ratings, 20_000, 3000, 2000, 3).unwrap();
    let (always, err) = train(&ratings, dir.path(), "always", extra);
    assert_eq!(choice(&err).2, "rows", "{err}");
    let (never, err) = train(&ratings, dir.path(), "never", extra);
    assert!(!err.contains("sparse gradients"), "{err}");
    let (auto, err) = train(&ratings, dir.path(), "auto", extra);
    let (rows, dense, chosen) = choice(&err);
    assert!(rows < dense && chosen == "rows", "{err}");
    assert_eq!(always.len(), never.len());
    for ((name, a), (_, n)) in always.iter().zip(&never) {
        assert!(a == n, "{}: sparse and dense runs differ", name.display());
    }
    assert!(auto == always, "auto (rows) differs from always");
}

#[test]
fn rows_and_dense_all_reduce_give_the_same_weights() {
    rows_and_dense_agree(&["--device", "cpu", "--max-steps", "25"]);
}

/// Re-runs `emulated_gpu_rows_and_dense_give_the_same_weights` on
/// `cuda-emu` (crates/cuda-emu); in the first run it returns at once.
#[test]
fn rows_and_dense_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(1, &["emulated_gpu_rows_and_dense_give_the_same_weights"]);
}

/// Two ranks on one emulated GPU over the TCP ring: the rows travel through
/// the device's row gather and scatter, the dense table through a
/// whole-table copy, with the same weights.
#[test]
fn emulated_gpu_rows_and_dense_give_the_same_weights() {
    if common::emulated_gpu(0).is_some() {
        rows_and_dense_agree(&["--device", "cuda", "--backend", "tcp", "--max-steps", "5"]);
    }
}

#[test]
fn auto_keeps_the_dense_all_reduce_for_a_small_table() {
    let dir = tempfile::tempdir().unwrap();
    let ratings = dir.path().join("ratings.csv");
    // 12 ids (10 users, movies 1 and 4) in tables of 16 rows, all touched
    // by both ranks every step, in rows of one with their biases: three
    // floats a touched row (id, row, bias) as rows, 24 touched rows in all,
    // against four a table row (two, twice) for the dense all-reduce.
    write_ratings(&ratings, 20_000, 10, 2, 4).unwrap();
    let small = [
        "--device",
        "cpu",
        "--max-steps",
        "25",
        "--embedding-dim",
        "1",
    ];
    let (auto, err) = train(&ratings, dir.path(), "auto", &small);
    let (rows, dense, chosen) = choice(&err);
    assert!(rows >= dense && chosen == "dense", "{err}");
    let (never, _) = train(&ratings, dir.path(), "never", &small);
    assert!(auto == never, "auto (dense) differs from never");
}
