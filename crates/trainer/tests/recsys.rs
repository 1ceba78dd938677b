//! `--model recsys`: the MovieLens recommender on generated ratings files,
//! end to end through the binary; bad files are one clear error.

mod common;

use std::path::Path;

use common::{run, stderr, stdout, trainer};
use trainer::model::recsys::synth::write_ratings;

fn recsys(ratings: &Path, args: &[&str]) -> std::process::Output {
    let out = run(trainer()
        .args(["--model", "recsys", "--device", "cpu", "--ratings"])
        .arg(ratings)
        .args(args));
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out
}

/// The `key value` pairs of rank 0's epoch lines.
fn column(out: &std::process::Output, key: &str) -> Vec<f64> {
    stdout(out)
        .lines()
        .filter_map(|l| l.split(&format!("| {key} ")).nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// The ratings' standard deviation, from the start-up line.
fn ratings_std(out: &std::process::Output) -> f64 {
    let err = stderr(out);
    let at = err.find("std ").expect("the start line names the std");
    err[at + 4..].split(')').next().unwrap().parse().unwrap()
}

#[test]
fn the_test_rmse_falls_well_under_the_ratings_std() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 60_000, 300, 200, 1).unwrap();
    let out = recsys(
        &path,
        &[
            "--world-size",
            "2",
            "--epochs",
            "10",
            "--batch-size",
            "64",
            "--lr",
            "0.01",
        ],
    );
    let rmse = column(&out, "test_rmse");
    let std = ratings_std(&out);
    assert_eq!(rmse.len(), 10, "{}", stdout(&out));
    assert!(
        rmse[9] < 0.6 * std,
        "test RMSE {rmse:?} against the ratings' std {std}"
    );
}

/// A run resumed from a mid-epoch checkpoint streams past the batches
/// already trained and prints the same epochs as the run that wrote it.
#[test]
fn a_mid_epoch_checkpoint_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 20_000, 100, 80, 2).unwrap();
    let (first, second) = (dir.path().join("a"), dir.path().join("b"));
    let common = ["--world-size", "2", "--epochs", "2", "--checkpoint-dir"];
    let mut args: Vec<&str> = common.to_vec();
    args.extend([
        first.to_str().unwrap(),
        "--checkpoint-every",
        "30",
        "--keep",
        "100",
    ]);
    let straight = recsys(&path, &args);
    let mid = first.join("ckpt-e0001-s000030");
    let mut args: Vec<&str> = common.to_vec();
    args.extend([second.to_str().unwrap(), "--resume", mid.to_str().unwrap()]);
    let resumed = recsys(&path, &args);
    for key in ["loss", "rmse", "test_rmse"] {
        let want = column(&straight, key);
        assert_eq!(want.len(), 2, "{}", stdout(&straight));
        assert_eq!(column(&resumed, key), want, "{key}: {}", stderr(&resumed));
    }
}

#[test]
fn bad_ratings_files_are_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let header = "userId,movieId,rating,timestamp\n";
    let cases = [
        (dir.path().join("missing.csv"), "cannot open"),
        (file("empty.csv", ""), "empty"),
        (file("header.csv", "a,b\n1,2,3,4\n"), "header"),
        (
            file("bad.csv", &format!("{header}1,2,4.0,5\n1,x,3,4\n")),
            "line 3",
        ),
        (
            file("big.csv", &format!("{header}99999999,2,4.0,5\n")),
            "beyond the limit",
        ),
        (file("short.csv", &format!("{header}1,2\n")), "line 2"),
        (
            file("huge.csv", &format!("{header}1,2,3e38,5\n")),
            "line 2: the rating 3",
        ),
        (
            file("endless.csv", &format!("{header}{}", "7".repeat(10_000))),
            "line 2 is longer than 4096 bytes",
        ),
        (dir.path().to_path_buf(), "is a directory"),
    ];
    let binary = dir.path().join("binary.csv");
    std::fs::write(&binary, [0xff_u8, 0xfe, 0x00, b'\n']).unwrap();
    let cases = cases.into_iter().chain([(binary, "line 1 is not UTF-8")]);
    for (path, needle) in cases {
        let out = run(trainer()
            .args([
                "--model",
                "recsys",
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--ratings",
            ])
            .arg(&path));
        let err = stderr(&out);
        assert!(
            !out.status.success() && !err.contains("panicked"),
            "{path:?}: {err}"
        );
        assert!(err.contains(needle), "{path:?}: `{needle}` not in {err}");
    }
}
