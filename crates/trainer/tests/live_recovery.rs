//! `--recovery live`: a lost rank costs the step it was in, not a restart.
//! Workers SIGKILLed mid-run (rank 0 among them) or stopped past the
//! timeout: the others go on in a new generation at once, their processes
//! the same; the launcher's replacements join them, healed from their
//! memory; the model ends on the bytes of one rank trained undisturbed, and
//! the sample ledger, which every committed step appends to, is that run's
//! byte for byte (so every sample was trained once).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::live::{Running, ledger, lost_ranks, recovery_rows, result};
use common::{job, run, stderr};

/// Steps of the one capped epoch, and the global batch of each.
const STEPS: usize = 150;
const GLOBAL_BATCH: &str = "32";

/// The job on `world` ranks into `dir` (checkpoints) and its ledger, live
/// on more than one rank with `replacements` for lost ones.
fn live_job(world: usize, dir: &Path, (timeout_s, replacements): (u64, u32)) -> Command {
    let mut cmd = job(world, 1, timeout_s);
    cmd.args([
        "--reproducible",
        "--global-batch",
        GLOBAL_BATCH,
        "--unit",
        "8",
    ])
    .args(["--seed", "3", "--max-steps", &STEPS.to_string()])
    .arg("--checkpoint-dir")
    .arg(dir)
    .arg("--sample-ledger")
    .arg(ledger(dir));
    if world > 1 {
        cmd.args([
            "--recovery",
            "live",
            "--max-restarts",
            &replacements.to_string(),
        ]);
    }
    cmd
}

/// One rank, undisturbed: the bytes every live run must end on.
fn undisturbed(tmp: &Path) -> (String, String) {
    let dir = tmp.join("alone");
    let out = run(&mut live_job(1, &dir, (30, 0)));
    assert!(out.status.success(), "{}", stderr(&out));
    result(&dir)
}

#[test]
fn killed_ranks_cost_a_step_each_and_the_job_ends_on_one_ranks_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = undisturbed(tmp.path());
    let dir = tmp.path().join("live");
    let metrics = tmp.path().join("metrics.jsonl");
    let mut cmd = live_job(4, &dir, (30, 6));
    cmd.arg("--metrics").arg(&metrics);
    let mut job = Running::start(cmd, 4);
    // Three kills, 40 steps apart, rank 0 (the ledger's writer) among them.
    let mut killed = Vec::new();
    for (at, rank) in [(20, 2), (60, 0), (100, 3)] {
        job.until_committed(&dir, at);
        killed.push(job.signal(rank, "-KILL"));
    }
    let survivor = job.pids[&1].clone();
    let (status, log) = job.finish();
    assert!(status.success(), "{log}");
    assert_eq!(result(&dir).0, alone.0, "the model's bytes:\n{log}");
    assert_eq!(result(&dir).1, alone.1, "the sample ledger:\n{log}");
    // Rank 1 was never restarted; each killed rank was replaced once.
    let started = log.matches("launcher: started rank").count();
    assert_eq!(started, 4 + killed.len(), "{log}");
    assert!(
        log.contains(&format!("started rank 1 (pid {survivor})")),
        "{log}"
    );
    assert!(!log.contains("restart 1 of"), "a restart of all:\n{log}");
    let lost = log.matches("live recovery: lost").count();
    let joined = log.matches("joined:").count();
    assert!(lost >= killed.len() && joined >= 1, "{log}");
    // Each recovery is a row of the metrics file, naming the ranks lost.
    let rows = recovery_rows(&metrics);
    let lost = lost_ranks(&rows);
    for rank in [2, 0, 3] {
        assert!(
            lost.contains(&rank),
            "rank {rank} not among the lost: {rows:?}"
        );
    }
}

#[test]
fn a_stopped_rank_0_is_evicted_and_exits_without_writing_when_it_wakes() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = undisturbed(tmp.path());
    let dir = tmp.path().join("live");
    let mut job = Running::start(live_job(3, &dir, (3, 6)), 3);
    job.until_committed(&dir, 20);
    let stopped = job.signal(0, "-STOP");
    // The others time out on it (3 s), evict it, and go on without it.
    let since = Instant::now();
    while !job.log.iter().any(|l| l.contains("live recovery: lost")) {
        job.read();
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "{}",
            job.log.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Command::new("kill")
        .args(["-CONT", &stopped])
        .status()
        .unwrap();
    assert!(sent.success());
    let (status, log) = job.finish();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("was left out of the job's generation"),
        "{log}"
    );
    assert!(log.contains("exit status: 79"), "{log}");
    // Woken, it wrote no ledger line and no checkpoint: the job's files
    // are the undisturbed run's.
    assert_eq!(result(&dir), alone, "{log}");
}

#[test]
fn below_the_minimum_world_the_job_ends_and_its_checkpoint_resumes_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = undisturbed(tmp.path());
    let dir = tmp.path().join("live");
    let mut cmd = live_job(3, &dir, (30, 0));
    cmd.args(["--min-world", "3"]);
    let mut job = Running::start(cmd, 3);
    job.until_committed(&dir, 20);
    job.signal(1, "-KILL");
    let (status, log) = job.finish();
    assert!(!status.success(), "{log}");
    assert!(log.contains("fewer than --min-world 3"), "{log}");
    assert!(log.contains("the last committed step is saved in"), "{log}");
    // The saved step, resumed on one rank, ends where nothing failed.
    let out = run(live_job(1, &dir, (30, 0)).args(["--resume", "auto"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(result(&dir), alone, "{log}");
}

#[test]
fn live_recovery_is_refused_where_it_cannot_keep_its_promise() {
    let live = [
        "--recovery",
        "live",
        "--reproducible",
        "--global-batch",
        "32",
    ];
    let cases: [(&[&str], &str); 3] = [
        (
            &["--world-size", "2", "--recovery", "live"],
            "needs --reproducible --global-batch",
        ),
        (
            &["--world-size", "4", "--pipeline-stages", "2"],
            "a lost stage cannot be healed",
        ),
        (
            &["--world-size", "2", "--spawn", "threads"],
            "lost together",
        ),
    ];
    for (i, (args, says)) in cases.into_iter().enumerate() {
        let mut cmd = common::trainer();
        if i > 0 {
            cmd.args(live);
        }
        let out = run(cmd.args(args));
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    // Under torchrun's variables (no launcher of ours hosting the store).
    let out = run(common::trainer()
        .args(live)
        .envs([("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")])
        .envs([("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")]));
    let err = stderr(&out);
    assert!(
        err.contains("--recovery live needs this binary's own launcher"),
        "{err}"
    );
}
