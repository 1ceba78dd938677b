//! The checkpoint flags end to end: a kill in the middle of a save leaves
//! the previous checkpoint loadable and `--resume auto` picks it; a
//! non-finite loss stops training with the step named and the last good
//! checkpoint intact; damaged or mismatched checkpoints, and flags that do
//! not go together, are one-line errors.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{data_arg, dataset, run, stderr, trainer};
use trainer::checkpoint::lock::LOCK_FILE;
use trainer::checkpoint::store::PAUSE_ENV;
use trainer::checkpoint::{CheckpointDir, MODEL_FILE, Position, Settings, TrainingState, load};
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, cnn_layout};

fn layout() -> core_tensor::FlatLayout {
    cnn_layout().clone()
}

/// A quick single-rank run writing checkpoints into `dir`.
fn quick(dir: &Path, epochs: &str) -> Command {
    let mut cmd = trainer();
    cmd.args([
        "--epochs",
        epochs,
        "--max-steps",
        "4",
        "--threads",
        "1",
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
    ])
    .arg(dir)
    .args(data_arg(dataset()));
    cmd
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "no {what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_kill_during_a_save_leaves_the_previous_checkpoint_for_resume_auto() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpts");
    // Epoch 1: checkpoints after steps 2 and 4 (the epoch's end).
    let out = run(&mut quick(&dir, "1"));
    assert!(out.status.success(), "{}", stderr(&out));
    let previous = dir.join(Position { epoch: 2, step: 0 }.dir_name());
    // Epoch 2 pauses halfway through writing its first checkpoint: kill it there.
    let mut child = quick(&dir, "2")
        .args(["--resume", "auto"])
        .env(PAUSE_ENV, "60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let half_written = dir.join(".tmp-ckpt-e0002-s000002").join(MODEL_FILE);
    wait_for("save in progress", Duration::from_secs(60), || {
        std::fs::metadata(&half_written).is_ok_and(|m| m.len() > 0)
    });
    child.kill().unwrap();
    child.wait().unwrap();

    let state = load(&previous, &layout()).expect("the previous checkpoint survives the kill");
    assert_eq!(
        (state.position, state.optimizer_step),
        (Position { epoch: 2, step: 0 }, 4)
    );
    let newest = CheckpointDir::new(&dir, 3).newest_valid(&layout()).unwrap();
    assert_eq!(newest.found.map(|(path, _)| path), Some(previous.clone()));
    assert!(
        newest.skipped.is_empty(),
        "the half-written save must not look like a checkpoint"
    );

    let out = run(quick(&dir, "2").args(["--resume", "auto"]));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("resuming from {}", previous.display())),
        "{err}"
    );
    assert!(err.contains("left over from an interrupted save"), "{err}");
    assert!(
        dir.join(Position { epoch: 3, step: 0 }.dir_name()).is_dir(),
        "{err}"
    );
    assert!(!dir.join(".tmp-ckpt-e0002-s000002").exists());
}

#[test]
fn a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpts");
    // Step 1 moves every weight by ~1e30; step 2's activations overflow.
    let out = run(trainer()
        .args([
            "--lr",
            "1e30",
            "--epochs",
            "1",
            "--max-steps",
            "4",
            "--threads",
            "1",
            "--checkpoint-every",
            "1",
            "--checkpoint-dir",
        ])
        .arg(&dir)
        .args(data_arg(dataset())));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.lines()
            .last()
            .unwrap()
            .starts_with("error: rank 0: epoch 1, step 2: non-finite "),
        "{err}"
    );
    let listed: Vec<Position> = CheckpointDir::new(&dir, 3)
        .list()
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(listed, [Position { epoch: 1, step: 1 }], "{err}");
    load(&dir.join(listed[0].dir_name()), &layout()).expect("the last good checkpoint loads");
}

/// A run of `args` that must fail with one line naming each of `needles`.
fn assert_one_line_error(args: &[&std::ffi::OsStr], needles: &[&str]) {
    let out = run(trainer()
        .args(args)
        .args(["--epochs", "1", "--max-steps", "1", "--threads", "1"])
        .args(data_arg(dataset())));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("note:")).collect();
    assert!(
        !out.status.success() && !err.contains("panicked"),
        "{args:?}: {err}"
    );
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {err}");
    for needle in needles {
        assert!(
            lines[0].contains(needle),
            "{args:?}: `{needle}` not in: {err}"
        );
    }
}

/// A checkpoint as this binary's defaults would write it, but for `settings`.
fn checkpoint(dir: &Path, position: Position, settings: Settings) -> PathBuf {
    let params = CnnMnist::new(DropoutRates::REFERENCE).init_params(0);
    let n = params.len();
    let state = TrainingState {
        hook: None,
        position,
        optimizer_step: 3,
        params,
        exp_avg: vec![0.0; n],
        exp_avg_sq: vec![0.0; n],
        epoch_loss_sum: vec![1.0; settings.world_size],
        epoch_correct: vec![1.0; settings.world_size],
        epoch_train_seconds: 1.0,
        epoch_visited: None,
        settings,
    };
    CheckpointDir::new(dir, 3).save(&state, &layout()).unwrap()
}

#[test]
fn bad_checkpoints_and_flags_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let defaults = Settings {
        // As written before data fingerprints: resumable on any data.
        data: None,
        ..Settings::default()
    };
    let mid = Position { epoch: 1, step: 3 };
    let os = |s: &'static str| std::ffi::OsStr::new(s);

    let truncated = checkpoint(&tmp.path().join("a"), mid, defaults.clone());
    let model = truncated.join(MODEL_FILE);
    std::fs::write(&model, &std::fs::read(&model).unwrap()[..1000]).unwrap();
    assert_one_line_error(
        &[os("--resume"), truncated.as_os_str()],
        &["--resume", "model.safetensors", "truncated"],
    );

    let batch = checkpoint(
        &tmp.path().join("c"),
        mid,
        Settings {
            batch_size: 32,
            ..defaults.clone()
        },
    );
    assert_one_line_error(
        &[os("--resume"), batch.as_os_str()],
        &["--batch-size 32 per rank, this run has 64"],
    );

    let not_weights = truncated.with_file_name("none.safetensors");
    std::fs::write(&not_weights, b"<html>").unwrap();
    assert_one_line_error(
        &[os("--init-from"), not_weights.as_os_str()],
        &[
            "--init-from",
            "none.safetensors",
            "not a complete safetensors file",
        ],
    );

    // A fresh start must not mix its checkpoints with an earlier run's.
    let used = tmp.path().join("c");
    assert_one_line_error(
        &[os("--checkpoint-dir"), used.as_os_str()],
        &["already holds checkpoints", "--resume auto"],
    );

    assert_one_line_error(
        &[os("--max-restarts"), os("1")],
        &["--max-restarts needs --checkpoint-dir"],
    );
}

/// A checkpoint that takes longer to write than --timeout (a slow shared
/// file system) is waited for, not taken for a lost rank: the ranks keep
/// meeting while rank 0 writes. (A 3 s timeout, not 1: on a loaded
/// machine an ordinary step's wait once took longer than 1 s.)
#[test]
fn a_save_slower_than_the_timeout_does_not_fail_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let out = run(common::job(2, 1, 3)
        .args([
            "--max-steps",
            "4",
            "--checkpoint-every",
            "2",
            "--checkpoint-dir",
        ])
        .arg(&ckpt)
        .env(PAUSE_ENV, "4.5"));
    assert!(out.status.success(), "{}", stderr(&out));
    let (mid, end) = (
        Position { epoch: 1, step: 2 },
        Position { epoch: 2, step: 0 },
    );
    for position in [mid, end] {
        let at = ckpt.join(position.dir_name());
        assert!(at.join(MODEL_FILE).is_file(), "{}", at.display());
    }
}

/// A save that fails half-way (here the test hook's bad value; a full
/// disk in life) leaves no partial checkpoint behind to fill the disk.
#[test]
fn a_failed_save_removes_its_partial_files() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let out = run(quick(&ckpt, "1").env(PAUSE_ENV, "not-a-number"));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not a number of seconds"),
        "{}",
        stderr(&out)
    );
    // The job's lock file aside (`checkpoint::lock`), which stays.
    let left: Vec<_> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != LOCK_FILE)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `--resume auto` over a directory of checkpoints this run cannot resume
/// (another model's here) is refused: starting fresh there would write over
/// them and prune them.
#[test]
fn resume_auto_never_starts_fresh_over_checkpoints_it_cannot_resume() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let out = run(&mut quick(&ckpt, "1"));
    assert!(out.status.success(), "{}", stderr(&out));
    let before: Vec<_> = (CheckpointDir::new(&ckpt, 3).list().unwrap())
        .into_iter()
        .map(|(_, path)| path)
        .collect();
    assert!(!before.is_empty());
    let out = run(trainer()
        .args([
            "--model",
            "toy",
            "--samples",
            "256",
            "--epochs",
            "1",
            "--max-steps",
            "2",
        ])
        .args(["--threads", "1", "--resume", "auto", "--checkpoint-dir"])
        .arg(&ckpt));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("this run can resume none of them"), "{err}");
    for path in &before {
        load(path, &layout()).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    }
}
