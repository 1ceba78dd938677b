//! A job of several machines (two launchers on loopback) under the faults a
//! busy cluster brings: strangers at its rendezvous port, and launchers
//! stopped past --heartbeat-timeout and resumed.

mod common;

use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::nodes::{job, two_launchers, wait_within};
use common::{stderr, stderr_lines};

/// A 2 x 2 job of endless steps with `extra` flags, once it trains: both
/// launchers, the rendezvous endpoint, and node 1's stderr as it comes.
fn running_job(dir: &std::path::Path, extra: &[&str]) -> ([Child; 2], String, Receiver<String>) {
    let [node0, mut node1] = two_launchers(dir, &[&["--max-steps", "100000"], extra].concat());
    let (lines, _relay) = stderr_lines(&mut node1);
    let mut endpoint = None;
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the job starts");
        if let Some(at) = line.strip_prefix("launcher: node 1 of 2, rendezvous at ") {
            endpoint = Some(at.to_string());
        }
        if line.contains("joined") {
            break;
        }
    }
    (
        [node0, node1],
        endpoint.expect("node 1 names the rendezvous"),
        lines,
    )
}

/// A launcher of another job (or the same command started twice) at the
/// port of a job that runs is refused alone, naming the cause and the fix;
/// the job goes on, and ends as one on Ctrl-C.
#[test]
fn a_stranger_launcher_at_a_running_jobs_port_is_refused_alone_and_the_job_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let ([node0, node1], endpoint, _lines) = running_job(tmp.path(), &["--timeout", "10"]);
    let (addr, port) = endpoint.rsplit_once(':').unwrap();
    for (node_rank, taken) in [(Some("1"), "a node 1"), (None, "all 2 nodes")] {
        let mut stranger = job(&tmp.path().join("stranger"));
        stranger
            .args(["--nnodes", "2", "--nproc_per_node", "2", "--timeout", "10"])
            .args(["--master_addr", addr, "--master_port", port]);
        if let Some(k) = node_rank {
            stranger.args(["--node_rank", k]);
        }
        let out = wait_within(stranger.spawn().unwrap(), Duration::from_secs(30));
        let said = stderr(&out);
        let last = said.lines().last().unwrap_or_default();
        assert!(!out.status.success(), "{said}");
        assert!(
            last.contains(&format!("the launchers at {endpoint} already have {taken}"))
                && last.contains("another job holds this rendezvous port"),
            "{said}"
        );
    }
    // Both launchers still run their ranks.
    std::thread::sleep(Duration::from_secs(2));
    let pid1 = node1.id().to_string();
    let mut running = [node0, node1];
    for node in &mut running {
        assert!(node.try_wait().unwrap().is_none(), "the job ended");
    }
    Command::new("kill").args(["-INT", &pid1]).status().unwrap();
    let [node0, node1] = running;
    let out0 = wait_within(node0, Duration::from_secs(60));
    let out1 = wait_within(node1, Duration::from_secs(60));
    assert_eq!(out1.status.code(), Some(130));
    assert_eq!(out0.status.code(), Some(130), "{}", stderr(&out0));
}
