//! The rendered script's requeue decision, run in bash with stand-ins for
//! `srun` and `scontrol`: a preempted run (exit 75) that saved a checkpoint
//! is requeued, at most `--max-requeues` times as SLURM_RESTART_COUNT
//! counts them; one that saved nothing is not; the log says which.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use super::tests::{TRAINER, args, job, paths};
use super::*;

/// `srun`: saves the checkpoint directory `FAKE_SAVE` names (if any) in the
/// `--checkpoint-dir` it is given, then exits with `FAKE_EXIT`.
const FAKE_SRUN: &str = r#"#!/bin/bash
dir=""
while [ $# -gt 0 ]; do
    if [ "$1" = --checkpoint-dir ]; then dir="$2"; fi
    shift
done
if [ -n "${FAKE_SAVE:-}" ]; then mkdir -p "$dir/$FAKE_SAVE"; fi
exit "$FAKE_EXIT"
"#;

/// `scontrol`: one node for `show hostnames`; a requeue is written down.
const FAKE_SCONTROL: &str = r#"#!/bin/bash
case "$1" in
    show) echo node1 ;;
    requeue) echo "$2" >> "$FAKE_REQUEUED" ;;
esac
"#;

/// What one run of a job script did.
#[derive(Debug)]
struct Run {
    status: i32,
    log: String,
    requeued: bool,
}

/// A job script and the stand-in tools it runs with.
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn with(script: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("srun", FAKE_SRUN),
            ("scontrol", FAKE_SCONTROL),
            ("job.sbatch", script),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Cluster { dir }
    }

    /// Runs the script as SLURM starts it after `restarts` requeues, its
    /// ranks saving `save` (a checkpoint's directory name, or nothing)
    /// and exiting with `exit`; `env` adds to its environment.
    fn run(&self, restarts: u32, (save, exit): (&str, i32), env: &[(&str, &Path)]) -> Run {
        let bin = self.dir.path();
        let requeued = bin.join(format!("requeued-{restarts}"));
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .arg(bin.join("job.sbatch"))
            .env("PATH", path)
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOB_NODELIST", "node1")
            .env("SLURM_NTASKS", "2")
            .env("SLURM_RESTART_COUNT", restarts.to_string())
            .env("FAKE_SAVE", save)
            .env("FAKE_EXIT", exit.to_string())
            .env("FAKE_REQUEUED", &requeued)
            .env_remove("CHECKPOINT_DIR")
            .env_remove("MAX_REQUEUES")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        Run {
            status: out.status.code().unwrap_or(-1),
            log: String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
            requeued: requeued.exists(),
        }
    }
}

/// The script of a trainer job that may requeue itself `max` times.
fn trainer_script(max: u32, trainer_args: &[&str]) -> String {
    let mut job = job(1, Ranks::Tasks(2));
    job.max_requeues = max;
    script(&job, &paths(TRAINER), &args(trainer_args))
}

#[test]
fn a_run_that_saved_is_requeued_until_max_requeues_then_not() {
    let checkpoints = tempfile::tempdir().unwrap();
    let cluster = Cluster::with(&trainer_script(2, &[]));
    let env = [("CHECKPOINT_DIR", checkpoints.path())];
    // Each run gets further and saves a checkpoint of its own.
    for restarts in 0..=2 {
        let save = format!("ckpt-e0001-s00000{restarts}");
        let run = cluster.run(restarts, (&save, 75), &env);
        assert_eq!(run.status, 75, "{run:?}");
        if restarts < 2 {
            assert!(run.requeued, "{run:?}");
            let said = format!(
                "job 4242 preempted: requeueing it (requeue {} of at most 2)",
                restarts + 1
            );
            assert!(run.log.contains(&said), "{said}: {run:?}");
        } else {
            assert!(!run.requeued, "requeued a third time: {run:?}");
            assert!(
                run.log.contains(
                    "job 4242 preempted: not requeued, it was requeued 2 time(s) already"
                ),
                "{run:?}"
            );
        }
    }
}

#[test]
fn a_run_that_saved_nothing_is_not_requeued() {
    let checkpoints = tempfile::tempdir().unwrap();
    let dir = checkpoints.path().join("ck");
    // Its own --checkpoint-dir: the script looks there.
    let cluster = Cluster::with(&trainer_script(
        3,
        &["--checkpoint-dir", dir.to_str().unwrap()],
    ));
    let nothing = "preempted before it saved a checkpoint: not requeued";
    // Stopped before the first save: not even the directory exists.
    let run = cluster.run(0, ("", 75), &[]);
    assert!(!run.requeued && run.log.contains(nothing), "{run:?}");
    assert_eq!(run.status, 75);
    // A requeued run stopped before its first save: an earlier run's
    // checkpoint, and a save under way (hidden), are not progress.
    std::fs::create_dir_all(dir.join("ckpt-e0001-s000003")).unwrap();
    let run = cluster.run(1, (".tmp-ckpt-e0001-s000009", 75), &[]);
    assert!(!run.requeued && run.log.contains(nothing), "{run:?}");
    // The same run, once it saved, is requeued.
    let run = cluster.run(1, ("ckpt-e0001-s000009", 75), &[]);
    assert!(run.requeued, "{run:?}");
}

#[test]
fn only_exit_75_requeues_and_zero_requeues_means_never() {
    let checkpoints = tempfile::tempdir().unwrap();
    let env = [("CHECKPOINT_DIR", checkpoints.path())];
    let cluster = Cluster::with(&trainer_script(3, &[]));
    for (exit, save) in [(0, "ckpt-e0002-s000000"), (1, "ckpt-e0002-s000001")] {
        let run = cluster.run(0, (save, exit), &env);
        assert_eq!(run.status, exit, "{run:?}");
        assert!(!run.requeued && !run.log.contains("preempted"), "{run:?}");
    }
    let never = Cluster::with(&trainer_script(0, &[]));
    let run = never.run(0, ("ckpt-e0003-s000001", 75), &env);
    assert!(!run.requeued, "{run:?}");
    assert!(run.log.contains("requeued 0 time(s) already"), "{run:?}");
}

#[test]
fn another_program_is_requeued_by_the_count_alone() {
    // It names no checkpoint directory: what it saved cannot be told.
    let rendered = script(&job(1, Ranks::Tasks(1)), &paths("/opt/preempted-once"), &[]);
    let cluster = Cluster::with(&rendered);
    let run = cluster.run(0, ("", 75), &[]);
    assert!(run.requeued, "{run:?}");
    let run = cluster.run(3, ("", 75), &[]);
    assert!(!run.requeued, "{run:?}");
}
