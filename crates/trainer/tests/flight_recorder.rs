//! The flight recorder, end to end with real processes: a rank stopped
//! mid-epoch (SIGSTOP) is named by the launcher's verdict together with the
//! collective the others wait in, over the TCP ring and over NCCL on
//! cuda-emu, and from another node's launcher; SIGUSR2 to the launcher has
//! every rank write its record and stops nothing.
//!
//! `flight_recorder_on_the_cuda_emulator` re-runs this binary with the
//! emulator loaded; there `emulated_nccl_a_stopped_rank_is_named` does the
//! work (in the first run it returns at once).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use comm::flight::{RankRecord, State, record_path};
use common::{free_port, launcher_pid, run, stderr, stdout, trainer};
use launcher::contract::PREEMPTED_EXIT_CODE;

const EMULATED: [&str; 1] = ["emulated_nccl_a_stopped_rank_is_named"];

/// Longest a step of these tests may take before the test calls it a hang.
const PATIENCE: Duration = Duration::from_secs(120);

/// A toy job of `world` ranks that would run for hours, recording in `dir`.
fn endless_toy(world: usize, dir: &Path, timeout_s: u32) -> Command {
    let mut cmd = trainer();
    cmd.args(["--model", "toy", "--samples", "4096", "--epochs", "100000"])
        .args(["--threads", "1", "--grace", "5"])
        .args(["--world-size", &world.to_string()])
        .args(["--timeout", &timeout_s.to_string()])
        .arg("--flight-recorder")
        .arg(dir);
    cmd
}

/// A running launcher and every line it prints (stdout and stderr).
struct Job {
    launcher: Child,
    lines: Receiver<String>,
    log: Vec<String>,
}

impl Job {
    fn start(cmd: &mut Command) -> Job {
        let mut launcher = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let out: Box<dyn std::io::Read + Send> = Box::new(launcher.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(launcher.stderr.take().unwrap());
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                (BufReader::new(stream).lines().map_while(Result::ok))
                    .for_each(|l| drop(tx.send(l)))
            });
        }
        Job {
            launcher,
            lines,
            log: Vec::new(),
        }
    }

    /// Reads lines until one satisfies `found`; what it returns.
    fn wait_for<T>(&mut self, what: &str, found: impl Fn(&str) -> Option<T>) -> T {
        loop {
            let Ok(line) = self.lines.recv_timeout(PATIENCE) else {
                panic!("waiting for {what}:\n{}", self.log.join("\n"));
            };
            let hit = found(&line);
            self.log.push(line);
            if let Some(hit) = hit {
                return hit;
            }
        }
    }

    /// Rank `rank`'s pid, as the launcher announced it.
    fn pid(&mut self, rank: usize) -> String {
        self.wait_for(&format!("rank {rank}'s pid"), |l| launcher_pid(l, rank))
    }

    /// Returns once rank 0 has trained a while: collectives went by.
    fn training(&mut self) {
        self.wait_for("training to start", |l| {
            l.starts_with("[rank 0] training on").then_some(())
        });
        std::thread::sleep(Duration::from_millis(1500));
    }

    /// Returns once this node's rank has joined the job.
    fn training_elsewhere(&mut self) {
        self.wait_for("the rank to join", |l| {
            l.contains(" joined (host").then_some(())
        });
    }

    /// The launcher's end, and everything it printed.
    fn end(mut self) -> (ExitStatus, String) {
        let status = self.launcher.wait().unwrap();
        self.log.extend(self.lines.try_iter());
        // The relays end with the pipes: collect what came after the exit.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push(line);
        }
        (status, self.log.join("\n"))
    }
}

fn send(signal: &str, pid: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), pid])
        .status();
    assert!(sent.unwrap().success(), "kill -{signal} {pid}");
}

/// The verdict line of the launcher's `log`.
fn verdict(log: &str) -> &str {
    log.lines()
        .find_map(|l| l.strip_prefix("launcher: flight recorder: "))
        .unwrap_or_else(|| panic!("no verdict:\n{log}"))
}

/// The collective each communicator's ranks wait in, from the records in
/// `dir` of every rank but `stopped`: the lowest started and not done.
fn waited_in(dir: &Path, world: usize, stopped: usize) -> Vec<(String, u64)> {
    let mut stuck: Vec<(String, u64)> = Vec::new();
    for rank in (0..world).filter(|&r| r != stopped) {
        let record = RankRecord::read(&record_path(dir, rank)).expect("a waiting rank's record");
        assert!(!record.reason.is_empty());
        for group in record.groups {
            let Some(e) = group.entries.iter().find(|e| e.state == State::Started) else {
                continue;
            };
            match stuck.iter_mut().find(|(g, _)| *g == group.group) {
                Some((_, seq)) => *seq = (*seq).min(e.seq),
                None => stuck.push((group.group, e.seq)),
            }
        }
    }
    stuck
}

/// SIGSTOPs rank 1 of `cmd`'s job mid-epoch: the job fails, and the
/// verdict names rank 1 as stopped, and the collective the others waited
/// in (of one of the communicators they waited in).
fn a_stopped_rank_is_named(cmd: &mut Command, dir: &Path, world: usize) {
    let mut job = Job::start(cmd);
    let stopped = job.pid(1);
    job.training();
    send("STOP", &stopped);
    let (status, log) = job.end();
    assert!(!status.success(), "{log}");
    let said = verdict(&log);
    println!("the verdict: {said}");
    assert!(said.contains("rank 1 (node 0) is stopped"), "{said}\n{log}");
    let stuck = waited_in(dir, world, 1);
    assert!(!stuck.is_empty(), "no rank waits in a collective:\n{log}");
    assert!(
        (stuck.iter()).any(|(_, seq)| said.contains(&format!("#{seq} "))),
        "{said} names none of {stuck:?}"
    );
    assert!(!said.contains("rank 0 (node"), "{said}");
}

#[test]
fn a_stopped_rank_is_named_with_the_collective_it_held_up_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = endless_toy(3, dir.path(), 3);
    cmd.args(["--device", "cpu"]);
    a_stopped_rank_is_named(&mut cmd, dir.path(), 3);
    // The records alone, read again: the rank is named, less the
    // launcher's word on why it wrote none.
    let report = run(trainer()
        .args(["flight-report", "--nproc-per-node", "3"])
        .arg(dir.path()));
    assert!(report.status.success(), "{}", stderr(&report));
    let said = stdout(&report);
    assert!(said.contains("rank 0 (host "), "{said}");
    assert!(
        said.contains("verdict: rank 1 (node 0) wrote no record"),
        "{said}"
    );
    let missing = run(trainer()
        .args(["flight-report"])
        .arg(dir.path().join("none")));
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("no such directory"),
        "{}",
        stderr(&missing)
    );
}

/// Two launchers, one rank each, each with a directory of its own: node
/// 1's launcher hands node 0 its word on its stopped rank through the
/// launchers' store, and node 0's verdict names it.
#[test]
fn a_stopped_rank_on_another_node_is_named_by_node_0() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let mut launchers = [0, 1].map(|node| {
        let mut cmd = endless_toy(2, &dir.path().join(format!("node{node}")), 3);
        cmd.args(["--device", "cpu", "--heartbeat-timeout", "2"])
            .args(["--nnodes", "2", "--nproc-per-node", "1", "--node-rank"])
            .arg(node.to_string())
            .args(["--master-addr", "127.0.0.1", "--master-port", &port])
            .env(comm::AUTH_TOKEN_VAR, "ab".repeat(32));
        Job::start(&mut cmd)
    });
    let stopped = launchers[1].pid(1);
    launchers[1].training_elsewhere();
    launchers[0].training();
    send("STOP", &stopped);
    let [node0, node1] = launchers;
    let (status0, log0) = node0.end();
    let (status1, log1) = node1.end();
    assert!(!status0.success() && !status1.success(), "{log0}\n{log1}");
    let said = verdict(&log0);
    println!("the verdict: {said}");
    assert!(
        said.starts_with("rank 1 (node 1) is stopped"),
        "{said}\n{log0}\n{log1}"
    );
    assert!(!dir.path().join("node0/rank-1.json").exists());
    assert!(!log1.contains("launcher: flight recorder: "), "{log1}");
}

#[test]
fn sigusr2_to_the_launcher_dumps_every_rank_and_stops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut job = Job::start(endless_toy(2, dir.path(), 30).args(["--device", "cpu"]));
    job.training();
    let launcher = job.launcher.id().to_string();
    send("USR2", &launcher);
    job.wait_for("the SIGUSR2 verdict", |l| {
        l.starts_with("launcher: flight recorder (SIGUSR2): ")
            .then_some(())
    });
    for rank in 0..2 {
        let record = RankRecord::read(&record_path(dir.path(), rank)).unwrap();
        assert_eq!((record.rank, record.reason.as_str()), (rank, "SIGUSR2"));
        let job_ring = &record.groups[0];
        assert_eq!(job_ring.group, "job");
        assert!(job_ring.entries.iter().any(|e| e.state == State::Done));
    }
    // Still training: a preemption request now stops it as one.
    send("TERM", &launcher);
    let (status, log) = job.end();
    assert_eq!(status.code(), Some(PREEMPTED_EXIT_CODE), "{log}");
    assert!(!log.contains("launcher: flight recorder: "), "{log}");
}

#[test]
fn flight_recorder_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(2, &EMULATED);
}

#[test]
fn emulated_nccl_a_stopped_rank_is_named() {
    if !cuda_emu::in_emulator() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = endless_toy(2, dir.path(), 10);
    cmd.args(["--device", "cuda", "--backend", "nccl"]);
    a_stopped_rank_is_named(&mut cmd, dir.path(), 2);
}
