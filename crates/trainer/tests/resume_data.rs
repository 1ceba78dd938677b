//! A checkpoint records the training data it was trained on (a
//! fingerprint), end to end: resumed mid-epoch on other data it is refused
//! with the file named, how the data differ and what to do instead
//! (`--resume PATH`, `--resume auto`, and the launcher's restarts alike);
//! at an epoch boundary other data are accepted with a note; a checkpoint
//! from before fingerprints resumes as it did.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{data_arg, dataset, relabelled_dataset, run, stderr, trainer};
use trainer::checkpoint::{CheckpointDir, Position, Settings, TrainingState};
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, cnn_layout};

const MID: Position = Position { epoch: 1, step: 2 };
const BOUNDARY: Position = Position { epoch: 2, step: 0 };

/// A one-thread CNN run of `epochs` epochs of 4 steps on `data`.
fn cnn(data: &Path, epochs: &str) -> Command {
    let mut cmd = trainer();
    cmd.args(["--epochs", epochs, "--max-steps", "4", "--threads", "1"])
        .args(data_arg(data));
    cmd
}

/// Epoch 1 on the test data, checkpointed after step 2 and at its end.
fn saved(dir: &Path) -> (PathBuf, PathBuf) {
    let out = run(cnn(dataset(), "1")
        .args(["--checkpoint-every", "2", "--checkpoint-dir"])
        .arg(dir));
    assert!(out.status.success(), "{}", stderr(&out));
    (dir.join(MID.dir_name()), dir.join(BOUNDARY.dir_name()))
}

/// The last line of a run that must have failed, without a panic.
fn refusal(out: &Output) -> String {
    let err = stderr(out);
    assert!(!out.status.success(), "not refused: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err.lines().last().unwrap_or_default().to_string()
}

#[test]
fn a_mid_epoch_checkpoint_is_refused_on_other_data_and_an_epoch_boundary_one_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let (mid, boundary) = saved(&tmp.path().join("ckpt"));
    let other = relabelled_dataset();

    let out = run(cnn(other.path(), "1").arg("--resume").arg(&mid));
    // EX_CONFIG: the job's configuration, which no restart mends.
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let last = refusal(&out);
    let want = format!(
        "error: rank 0: --resume {mid}: the checkpoint was saved mid-epoch (epoch 1, step 2) on other training data than this run's: the same number of samples (60000) but different contents (data fingerprint ",
        mid = mid.display()
    );
    assert!(last.starts_with(&want), "{last}");
    let fix = format!(
        "Resume it with the data it was saved with, or start from its weights with --init-from {} and a new --checkpoint-dir (a fresh epoch 1 and optimizer)",
        mid.join("model.safetensors").display()
    );
    assert!(last.ends_with(&fix), "{last}");

    // The same checkpoint on its own data resumes.
    let out = run(cnn(dataset(), "1").arg("--resume").arg(&mid));
    assert!(out.status.success(), "{}", stderr(&out));

    // At an epoch boundary the next epoch trains on the other data.
    let out = run(cnn(other.path(), "2").arg("--resume").arg(&boundary));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("note: this run's training data differ from the checkpoint's (the same number of samples (60000) but different contents")
            && err.contains("it was saved at an epoch boundary, so epoch 2 starts on this run's data"),
        "{err}"
    );
    assert!(
        err.contains(&format!("resuming from {}", boundary.display())),
        "{err}"
    );
}

/// `--resume auto` applies the same rule to the checkpoint it picks, and a
/// count that differs is named (the toy's --samples here).
#[test]
fn resume_auto_refuses_a_mid_epoch_checkpoint_of_another_sample_count() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let toy = |samples: &str| {
        let mut cmd = trainer();
        cmd.args(["--model", "toy", "--samples", samples, "--batch-size", "16"])
            .args(["--epochs", "1", "--max-steps", "4", "--threads", "1"])
            .args(["--checkpoint-every", "2", "--checkpoint-dir"])
            .arg(&dir);
        cmd
    };
    let out = run(&mut toy("256"));
    assert!(out.status.success(), "{}", stderr(&out));
    // The newest is then the mid-epoch one.
    std::fs::remove_dir_all(dir.join(BOUNDARY.dir_name())).unwrap();
    let mid = dir.join(MID.dir_name());

    let last = refusal(&run(toy("320").args(["--resume", "auto"])));
    let want = format!(
        "error: rank 0: --resume auto chose {}: the checkpoint was saved mid-epoch (epoch 1, step 2) on other training data than this run's: it was trained on 256 samples, this run has 320;",
        mid.display()
    );
    assert!(last.starts_with(&want), "{last}");
    assert!(mid.is_dir(), "the refused checkpoint must stay");

    let out = run(toy("256").args(["--resume", "auto"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A refused resume is the job's configuration: the launcher does not
/// restart it (a restart would resume the given checkpoint again and be
/// refused again; before, `--resume auto` over the empty directory even
/// started fresh on the other data).
#[test]
fn a_refused_resume_is_not_restarted() {
    let tmp = tempfile::tempdir().unwrap();
    let (mid, _) = saved(&tmp.path().join("ckpt"));
    let other = relabelled_dataset();
    let fresh = tmp.path().join("restarted");
    let out = run(cnn(other.path(), "1")
        .arg("--resume")
        .arg(&mid)
        .args(["--max-restarts", "1", "--checkpoint-dir"])
        .arg(&fresh));
    let last = refusal(&out);
    let err = stderr(&out);
    assert!(!err.contains("restart 1 of 1"), "{err}");
    let refused = err
        .lines()
        .filter(|l| l.starts_with("[rank 0] error: ") && l.contains("on other training data"))
        .count();
    assert_eq!(refused, 1, "one attempt: {err}");
    assert!(
        last.ends_with("(not restarted: a restart would meet the same cause)"),
        "{last}"
    );
    let written = CheckpointDir::new(&fresh, 3).list().unwrap();
    assert!(written.is_empty(), "trained anyway: {written:?}");
}

/// A checkpoint written before data fingerprints resumes mid-epoch, on
/// whatever data, with a note that it cannot be checked.
#[test]
fn a_checkpoint_without_a_fingerprint_resumes_with_a_note() {
    let tmp = tempfile::tempdir().unwrap();
    let params = CnnMnist::new(DropoutRates::REFERENCE).init_params(0);
    let n = params.len();
    let state = TrainingState {
        hook: None,
        position: MID,
        optimizer_step: 2,
        params,
        exp_avg: vec![0.0; n],
        exp_avg_sq: vec![0.0; n],
        epoch_loss_sum: vec![1.0],
        epoch_correct: vec![1.0],
        epoch_train_seconds: 1.0,
        epoch_visited: None,
        settings: Settings::default(),
    };
    let old = CheckpointDir::new(tmp.path(), 3)
        .save(&state, cnn_layout())
        .unwrap();
    let out = run(cnn(dataset(), "1").arg("--resume").arg(&old));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("note: the checkpoint does not record its training data (written before data fingerprints), so this run cannot check that it continues epoch 1, step 2 on the same data"),
        "{err}"
    );
}
