//! Where a run writes is checked before it trains: a bad `--checkpoint-dir`
//! or `--metrics` fails at once naming the path and the fix, and missing
//! directories are created for both, saying so.

mod common;

use std::path::Path;
use std::process::Command;

use common::{job, run, stderr};

/// A one-step run, alone or as a two-rank launcher.
fn short_run(world_size: usize) -> Command {
    let mut cmd = job(world_size, 1, 10);
    cmd.args(["--max-steps", "1"]);
    cmd
}

fn fails_before_training(cmd: &mut Command, needles: &[&str]) {
    let out = run(cmd);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "expected {needle:?} in:\n{err}");
    }
    assert!(!err.contains("training on"), "it trained first:\n{err}");
    assert!(
        !err.contains("launcher: started"),
        "it started workers:\n{err}"
    );
}

#[test]
fn a_file_where_the_checkpoint_directory_should_be_fails_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("ckpt");
    std::fs::write(&file, b"not a directory").unwrap();
    for world_size in [1, 2] {
        fails_before_training(
            short_run(world_size).arg("--checkpoint-dir").arg(&file),
            &[
                &file.display().to_string(),
                "is a file",
                "give another path",
            ],
        );
    }
}

#[test]
fn a_directory_where_the_metrics_file_should_be_fails_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    for world_size in [1, 2] {
        fails_before_training(
            short_run(world_size).arg("--metrics").arg(tmp.path()),
            &[&tmp.path().display().to_string(), "is a directory"],
        );
    }
}

#[test]
fn an_unwritable_place_fails_at_once() {
    // Under a file nothing can be created, even by root.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let under = file.join("ckpt");
    fails_before_training(
        short_run(1).arg("--checkpoint-dir").arg(&under),
        &[&under.display().to_string(), "cannot create"],
    );
    fails_before_training(
        short_run(1).arg("--metrics").arg(under.join("m.jsonl")),
        &["--metrics", "cannot create"],
    );
}

#[test]
fn missing_parents_are_created_the_same_way_for_both_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runs/a/ckpt");
    let metrics = tmp.path().join("runs/b/metrics.jsonl");
    let out = run(short_run(1)
        .arg("--checkpoint-dir")
        .arg(&dir)
        .arg("--metrics")
        .arg(&metrics));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let said = |path: &Path, flag: &str| {
        err.lines().any(|l| {
            l.starts_with("note: created ")
                && l.contains(&path.display().to_string())
                && l.contains(flag)
        })
    };
    assert!(said(&dir, "--checkpoint-dir"), "{err}");
    assert!(said(metrics.parent().unwrap(), "--metrics"), "{err}");
    assert!(dir.is_dir() && metrics.is_file());
}
