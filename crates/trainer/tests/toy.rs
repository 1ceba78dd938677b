//! `--model toy`: the DDP tutorial's ToyModel on synthetic data, end to end
//! through the binary (the built-in launcher, the TCP ring, checkpoints).

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

fn toy(args: &[&str]) -> std::process::Output {
    let out = run(trainer()
        .args(["--model", "toy", "--device", "cpu", "--samples", "2048"])
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
