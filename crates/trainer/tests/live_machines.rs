//! `--recovery live` over machines: two launchers of an elastic job
//! (`--nnodes 1:2 --nproc-per-node 2`). The second machine is lost (its
//! launcher killed, its ranks with it); the first machine's ranks go on at
//! once, the same processes; the machine's launcher, started again, takes
//! the lost machine's place in the running attempt, its ranks join as
//! newcomers healed from the live ranks' memory (no checkpoint is written
//! before the end, so none could be read), and the job ends on the bytes,
//! and the sample ledger, of one rank trained undisturbed.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::live::{committed, ledger, result};
use common::{free_port, launcher_pid, stderr_lines, trainer};

/// The toy model's samples: 6144 global batches of 64, long enough for a
/// machine to come back while the job runs.
const SAMPLES: &str = "393216";

/// The job's flags but its layout: the same bytes on any.
fn toy(dir: &Path) -> Command {
    let mut cmd = trainer();
    cmd.args(["--model", "toy", "--samples", SAMPLES, "--epochs", "1"])
        .args(["--threads", "1", "--device", "cpu", "--seed", "3"])
        .args(["--reproducible", "--global-batch", "64", "--unit", "16"])
        .args(["--timeout", "10"])
        .arg("--checkpoint-dir")
        .arg(dir)
        .arg("--sample-ledger")
        .arg(ledger(dir));
    cmd
}

/// One of the live job's two machines, meeting at `port`.
fn machine(dir: &Path, metrics: &Path, port: u16) -> (Child, Receiver<String>) {
    let mut child = toy(dir)
        .args(["--recovery", "live", "--max-restarts", "2"])
        .args(["--nnodes", "1:2", "--nproc-per-node", "2"])
        .args(["--rdzv-endpoint", &format!("127.0.0.1:{port}")])
        .args(["--heartbeat-timeout", "5"])
        .arg("--metrics")
        .arg(metrics)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a launcher");
    let (lines, _relay) = stderr_lines(&mut child);
    (child, lines)
}

/// Reads `lines` into `log` until one contains `needle`, failing after two
/// minutes.
fn wait_for(lines: &Receiver<String>, log: &mut Vec<String>, needle: &str) -> String {
    common::wait_for_line(lines, log, needle, Duration::from_secs(120))
}

fn signal(pid: &str, signal: &str) {
    let sent = Command::new("kill").args([signal, pid]).status().unwrap();
    assert!(sent.success(), "kill {signal} {pid}");
}

/// What a launcher said to the end, after it exited successfully.
fn finish(mut child: Child, lines: &Receiver<String>, mut log: Vec<String>) -> String {
    let status = child.wait().unwrap();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        log.push(line);
    }
    let log = log.join("\n");
    assert!(status.success(), "{status}:\n{log}");
    log
}

#[test]
fn a_machine_lost_and_back_rejoins_the_running_job_and_it_ends_on_one_ranks_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let alone = tmp.path().join("alone");
    let out = toy(&alone).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tmp.path().join("live");
    let metrics = tmp.path().join("metrics.jsonl");
    let port = free_port();
    let (node0, lines0) = machine(&dir, &metrics, port);
    let mut log0 = Vec::new();
    wait_for(&lines0, &mut log0, "launcher: seat 0 of an elastic job");
    let (mut node1, lines1) = machine(&dir, &metrics, port);
    let mut log1 = Vec::new();
    wait_for(&lines1, &mut log1, "launcher: seat 1 of an elastic job");
    let pid = |line: &str, rank| launcher_pid(line, rank).unwrap();
    let rank0 = pid(&wait_for(&lines0, &mut log0, "started rank 0 "), 0);
    let rank1 = pid(&wait_for(&lines0, &mut log0, "started rank 1 "), 1);

    // The second machine is lost mid-epoch: its launcher killed, its
    // ranks with it.
    wait_for(&lines0, &mut log0, "world size 4");
    let since = Instant::now();
    while committed(&dir) < 100 {
        assert!(since.elapsed() < Duration::from_secs(120), "no step 100");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&node1.id().to_string(), "-KILL");
    node1.wait().unwrap();
    // Rank 0's word and its launcher's, in either order.
    let lost = [
        "live recovery: lost rank(s) launched as 2, 3",
        "the live job's ranks go on without its ranks",
    ];
    for needle in lost {
        if !log0.iter().any(|line| line.contains(needle)) {
            wait_for(&lines0, &mut log0, needle);
        }
    }
    // The first machine's ranks are held while the second comes back, so
    // that the job cannot end before the newcomers are there (they wait at
    // the store until rank 0 lets them in); both are held, so neither
    // times out on the other.
    for pid in [&rank0, &rank1] {
        signal(pid, "-STOP");
    }
    let (back, lines_back) = machine(&dir, &metrics, port);
    let mut log_back = Vec::new();
    wait_for(&lines0, &mut log0, "takes the place of node 1");
    wait_for(&lines_back, &mut log_back, "started rank 3 ");
    std::thread::sleep(Duration::from_secs(3));
    for pid in [&rank0, &rank1] {
        signal(pid, "-CONT");
    }

    let said0 = finish(node0, &lines0, log0);
    let said_back = finish(back, &lines_back, log_back);
    assert_eq!(
        result(&dir),
        result(&alone),
        "the model and ledger:\n{said0}"
    );
    // The first machine's ranks are the processes it started first.
    assert_eq!(
        said0.matches("launcher: started rank").count(),
        2,
        "{said0}"
    );
    assert!(!said0.contains("restart 1 of"), "a restart:\n{said0}");
    assert!(
        said0.contains("live recovery: joined: rank(s) launched as 2, 3"),
        "{said0}"
    );
    assert!(said_back.contains("started rank 2 "), "{said_back}");
    // Nothing but the final checkpoint was ever written: the newcomers
    // were healed from memory.
    let saved: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("ckpt-"))
        .collect();
    assert_eq!(saved, ["ckpt-e0002-s000000"], "{said0}");
}
