//! One job per `--checkpoint-dir` (`checkpoint::lock`): a second job on the
//! directory of a running one is refused at its start, naming the first,
//! before it trains or writes anything, `--resume auto` included; the first
//! trains as if alone. A job that ended, or was SIGKILLed, leaves the
//! directory free, and a `--max-restarts` restart keeps it held.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{job, launcher_pid, stderr, stderr_lines};
use trainer::checkpoint::store::PAUSE_ENV;
use trainer::checkpoint::{CheckpointDir, Position, load};
use trainer::models::cnn::cnn_layout;

/// `world` ranks, 6 steps of seed `seed`, checkpoints every 2 into `dir`.
fn checkpointed(world: usize, dir: &Path, seed: u64) -> Command {
    let mut cmd = job(world, 1, 10);
    cmd.args(["--max-steps", "6", "--checkpoint-every", "2", "--seed"])
        .arg(seed.to_string())
        .arg("--checkpoint-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// The seed every checkpoint in `dir` was trained with, oldest first.
fn seeds(dir: &Path) -> Vec<u64> {
    let listed = CheckpointDir::new(dir, 3).list().unwrap();
    assert!(!listed.is_empty(), "no checkpoint in {}", dir.display());
    let seed = |path: &Path| load(path, cnn_layout()).unwrap().settings.seed;
    listed.iter().map(|(_, path)| seed(path)).collect()
}

/// Asserts that `out` is a refusal at the start, in one `error:` line
/// naming `dir` and the holder's pid, and returns that line.
fn refused(out: &Output, dir: &Path, holder_pid: u32) -> String {
    let text = stderr(out);
    assert!(!out.status.success(), "{text}");
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    let line = errors[0];
    let named = format!("{} is in use by another job", dir.display());
    assert!(line.contains(&named), "{text}");
    assert!(line.contains(&format!("pid {holder_pid} ")), "{text}");
    assert!(line.contains("another --checkpoint-dir"), "{text}");
    for started in ["launcher: started rank", "Epoch", "step"] {
        assert!(!text.contains(started), "trained before refusing: {text}");
    }
    line.to_string()
}

fn wait_output(child: Child) -> Output {
    child.wait_with_output().expect("waiting for a trainer")
}

#[test]
fn two_jobs_started_together_one_trains_alone_and_the_other_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let started: Vec<(u64, Child)> = [11, 12]
        .map(|seed| (seed, checkpointed(2, &dir, seed).spawn().unwrap()))
        .into();
    let ended: Vec<(u64, u32, Output)> = (started.into_iter())
        .map(|(seed, child)| (seed, child.id(), wait_output(child)))
        .collect();
    let (won, lost): (Vec<_>, Vec<_>) = ended.iter().partition(|(_, _, o)| o.status.success());
    assert_eq!(
        (won.len(), lost.len()),
        (1, 1),
        "{}\n---\n{}",
        stderr(&ended[0].2),
        stderr(&ended[1].2)
    );
    let (seed, pid, _) = won[0];
    // Its launcher held the directory for its workers.
    let line = refused(&lost[0].2, &dir, *pid);
    assert!(line.contains("by a launcher, pid"), "{line}");
    assert!(seeds(&dir).iter().all(|s| s == seed), "{:?}", seeds(&dir));
    // And it ended where it would have alone, bit for bit.
    let alone = tmp.path().join("alone");
    let out = checkpointed(2, &alone, *seed).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let model = |dir: &Path| {
        let end = dir.join(Position { epoch: 2, step: 0 }.dir_name());
        std::fs::read(end.join(trainer::checkpoint::MODEL_FILE)).unwrap()
    };
    assert!(model(&dir) == model(&alone), "another model than alone");
}

#[test]
fn a_second_job_is_refused_while_the_first_runs_and_takes_the_directory_once_it_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    // The first job stops for a minute in the middle of its first save.
    let mut first = checkpointed(1, &dir, 21)
        .env(PAUSE_ENV, "60")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let saving = dir.join(format!(
        ".tmp-{}",
        Position { epoch: 1, step: 2 }.dir_name()
    ));
    common::wait_for_dir(&saving, Duration::from_secs(60));

    let mut second = checkpointed(1, &dir, 22);
    second.args(["--resume", "auto"]);
    let out = second.output().unwrap();
    let line = refused(&out, &dir, first.id());
    assert!(
        line.contains("by rank 0, pid") && line.contains("since 20"),
        "{line}"
    );
    // Refused before it touched the directory: a start clears what an
    // interrupted save left, and this one is the first's, mid-write.
    assert!(saving.is_dir(), "the second job removed the first's save");

    // A crash releases the directory: the kernel held the lock.
    first.kill().unwrap();
    first.wait().unwrap();
    let out = second.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("removed"), "{}", stderr(&out));
    // And a job that ended left it free.
    let out = second.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(seeds(&dir).iter().all(|&s| s == 22), "{:?}", seeds(&dir));
}

#[test]
fn a_restarted_job_keeps_its_directory_and_a_stranger_is_refused_meanwhile() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    // Every save pauses a second: the job still runs when its rank 0 is
    // killed after the first checkpoint.
    let mut launcher = checkpointed(2, &dir, 31)
        .args(["--max-restarts", "1"])
        .env(PAUSE_ENV, "1")
        .spawn()
        .unwrap();
    let (lines, relay) = stderr_lines(&mut launcher);
    let mut log = Vec::new();
    let mut next = || {
        let line = (lines.recv_timeout(Duration::from_secs(60)))
            .unwrap_or_else(|_| panic!("the launcher went silent:\n{}", log.join("\n")));
        log.push(line.clone());
        line
    };
    let rank_0 = loop {
        if let Some(pid) = launcher_pid(&next(), 0) {
            break pid;
        }
    };
    common::wait_for_dir(
        &dir.join(Position { epoch: 1, step: 2 }.dir_name()),
        Duration::from_secs(60),
    );
    let killed = Command::new("kill").args(["-9", &rank_0]).status().unwrap();
    assert!(killed.success());
    while !next().contains("restart 1 of 1") {}

    let mut stranger = checkpointed(1, &dir, 32);
    let out = stranger.args(["--resume", "auto"]).output().unwrap();
    let line = refused(&out, &dir, launcher.id());
    assert!(line.contains("by a launcher, pid"), "{line}");

    let status = launcher.wait().unwrap();
    relay.join().unwrap();
    log.extend(lines.try_iter());
    let log = log.join("\n");
    assert!(status.success(), "{log}");
    // The restarted rank 0 went on under its launcher's hold.
    assert!(!log.contains("in use by another job"), "{log}");
    let end = CheckpointDir::new(&dir, 3).list().unwrap();
    assert_eq!(end.last().unwrap().0, Position { epoch: 2, step: 0 });
    assert!(seeds(&dir).iter().all(|&s| s == 31), "{:?}", seeds(&dir));
}
