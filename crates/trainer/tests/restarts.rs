//! `--max-restarts`: a worker killed mid-run makes the launcher stop the
//! job and start it again from the newest checkpoint, and the job ends
//! exactly where an undisturbed one does: the same final checkpoint, bit
//! for bit, and the same epoch numbers.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{final_state, job, launcher_pid, run, stderr, stderr_lines};
use trainer::checkpoint::Position;
use trainer::checkpoint::store::PAUSE_ENV;

/// Two ranks, 8 steps, checkpoints after steps 2, 4 and 6 and at the end,
/// and the samples of each step in `<metrics>.ledger`.
fn checkpointed_job(dir: &Path, metrics: &Path) -> Command {
    let mut cmd = job(2, 1, 10);
    cmd.args([
        "--max-steps",
        "8",
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
    ])
    .arg(dir)
    .arg("--metrics")
    .arg(metrics)
    .arg("--sample-ledger")
    .arg(metrics.with_extension("ledger"));
    cmd
}

fn losses(metrics: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(metrics).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].to_string())
        .collect()
}

#[test]
fn a_killed_worker_is_restarted_from_the_newest_checkpoint_and_the_result_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let (calm, hit) = (tmp.path().join("calm"), tmp.path().join("hit"));
    let out = run(&mut checkpointed_job(&calm, &tmp.path().join("calm.jsonl")));
    assert!(out.status.success(), "{}", stderr(&out));

    // Every save pauses a second, so that the run is still going when the
    // test, having seen the first checkpoint, kills rank 1.
    let mut launcher = checkpointed_job(&hit, &tmp.path().join("hit.jsonl"))
        .args(["--max-restarts", "1"])
        .env(PAUSE_ENV, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, relay) = stderr_lines(&mut launcher);
    let mut log = Vec::new();
    let pid = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the launcher names rank 1's pid");
        let pid = launcher_pid(&line, 1);
        log.push(line);
        if let Some(pid) = pid {
            break pid;
        }
    };
    let first = hit.join(Position { epoch: 1, step: 2 }.dir_name());
    common::wait_for_dir(&first, Duration::from_secs(60));
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = launcher.wait().unwrap();
    relay.join().unwrap();
    log.extend(lines.try_iter());
    let log = log.join("\n");

    assert!(status.success(), "{log}");
    assert!(log.contains("launcher: rank 1 failed (signal: 9"), "{log}");
    assert!(
        log.contains("; restart 1 of 1 from the newest valid checkpoint (")
            && log.contains("[rank 0] resuming from"),
        "{log}"
    );
    let (want, got) = (final_state(&calm), final_state(&hit));
    assert_eq!(got.optimizer_step, 8);
    assert!(
        got == want,
        "the restarted job ended with a different final checkpoint\n{log}"
    );
    // The ledger holds the steps the model was trained on: each once, each
    // with the undisturbed run's samples, none of them twice.
    let ledger = |name| std::fs::read_to_string(tmp.path().join(name)).unwrap();
    let hit_ledger = ledger("hit.ledger");
    assert_eq!(hit_ledger, ledger("calm.ledger"), "{log}");
    let mut seen = std::collections::HashSet::new();
    for (n, line) in hit_ledger.lines().enumerate() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["global_step"], n + 1);
        for sample in line["samples"].as_array().unwrap() {
            assert!(seen.insert(sample.as_u64().unwrap()), "{sample} twice");
        }
    }
    assert_eq!(seen.len(), 8 * 2 * 64);
    // The epoch's numbers are the undisturbed ones, reported once.
    assert_eq!(
        losses(&tmp.path().join("hit.jsonl")),
        losses(&tmp.path().join("calm.jsonl")),
        "{log}"
    );
}
