//! A job of several machines (two launchers on loopback) under the faults a
//! busy cluster brings: strangers at its rendezvous port, and launchers
//! stopped past --heartbeat-timeout and resumed.

mod common;

use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::Duration;

use common::nodes::{Stopped, job, two_launchers, wait_within, workers_of};
use common::{free_port, stderr, stderr_lines};

/// A 2 x 2 job of endless steps with `extra` flags, once it trains: both
/// launchers, the rendezvous endpoint, and node 1's stderr as it comes
/// (from a thread that ends with it).
fn running_job(
    dir: &std::path::Path,
    extra: &[&str],
) -> ([Child; 2], String, (Receiver<String>, JoinHandle<()>)) {
    let [node0, mut node1] = two_launchers(dir, &[&["--max-steps", "100000"], extra].concat());
    let (lines, relay) = stderr_lines(&mut node1);
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
        (lines, relay),
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

/// Node `victim`'s launcher (its ranks train on) is stopped until the
/// other node has ended the job on its silence, then resumed: it ends
/// promptly, naming its own stop as the likely cause rather than blaming
/// the node that left, and restarts nothing. What it said.
fn resume_a_launcher_after_the_job_ended_without_it(victim: usize) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--timeout", "20", "--heartbeat-timeout", "2"];
    let ([node0, node1], _, (lines, relay)) =
        running_job(tmp.path(), &[&flags[..], &["--max-restarts", "1"]].concat());
    let (victim_launcher, other) = if victim == 0 {
        (node0, node1)
    } else {
        (node1, node0)
    };
    let stopped = Stopped::new(vec![victim_launcher.id().to_string()]);
    let out = wait_within(other, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    stopped.resume();
    let out = wait_within(victim_launcher, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    relay.join().unwrap();
    let said = if victim == 0 {
        stderr(&out)
    } else {
        lines.try_iter().collect::<Vec<_>>().join("\n")
    };
    assert!(!said.contains("restart 1 of 1"), "{said}");
    said
}

#[test]
fn a_launcher_resumed_after_the_job_ended_on_its_silence_names_its_own_stop() {
    for victim in [1, 0] {
        let said = resume_a_launcher_after_the_job_ended_without_it(victim);
        let last = said.lines().last().unwrap_or_default();
        let other = 1 - victim;
        assert!(
            last.starts_with(&format!(
                "error: node {victim}: this launcher was itself stopped"
            )) && last.contains(&format!("node {other}'s launcher (host "))
                && !last.contains("killed, or its machine lost"),
            "{said}"
        );
    }
}

/// Node 1's launcher alone is stopped (its ranks train on) until node 0
/// ends the job on its silence, and resumed at once, while node 0 still
/// gives its own ranks their grace: node 1 reads node 0's verdict as its
/// own, not as news of some "node 1's launcher". Resumed too late on a
/// loaded machine (node 0 gone first), it names its own stop instead, the
/// other first-person line (the test above); either way never the third
/// person.
#[test]
fn a_launcher_resumed_while_node_0_is_up_reads_the_verdict_on_its_silence_as_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--timeout", "20", "--heartbeat-timeout", "2"];
    let ([mut node0, node1], _, (lines, relay)) = running_job(tmp.path(), &flags);
    let (said0, relay0) = stderr_lines(&mut node0);
    let stopped = Stopped::new(vec![node1.id().to_string()]);
    loop {
        let line = said0
            .recv_timeout(Duration::from_secs(30))
            .expect("node 0 names the silent node");
        if line.contains("node 1's launcher") && line.contains("sent no heartbeat") {
            break;
        }
    }
    stopped.resume();
    let out1 = wait_within(node1, Duration::from_secs(60));
    wait_within(node0, Duration::from_secs(60));
    relay.join().unwrap();
    relay0.join().unwrap();
    let said = lines.try_iter().collect::<Vec<_>>().join("\n");
    let while_up = "launcher: node 1: node 0 heard no heartbeat from this launcher for ";
    let after_end = "error: node 1: this launcher was itself stopped";
    assert!(
        (said.contains(while_up) || said.contains(after_end))
            && !said.contains("node 1's launcher"),
        "{said}"
    );
    assert_eq!(out1.status.code(), Some(1), "{said}");
}

/// Node 1's workers stopped, its launcher alive (its heartbeat goes on):
/// node 0's ranks time out on them, and both launchers end within a bound,
/// node 1 saying that its ranks were hung and killed, not failed on their
/// own.
#[test]
fn stopped_workers_under_a_live_launcher_end_the_job_and_are_named_hung() {
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--timeout", "3", "--heartbeat-timeout", "2"];
    let ([node0, node1], _, (lines, relay)) = running_job(tmp.path(), &flags);
    let _stopped = Stopped::new(workers_of(&node1, 2));
    let out0 = wait_within(node0, Duration::from_secs(30));
    let out1 = wait_within(node1, Duration::from_secs(30));
    relay.join().unwrap();
    let said0 = stderr(&out0);
    let said1: Vec<String> = lines.try_iter().collect();
    let last1 = said1.last().cloned().unwrap_or_default();
    assert_eq!(out0.status.code(), Some(1), "{said0}");
    assert_eq!(out1.status.code(), Some(1), "{last1}");
    let last0 = said0.lines().last().unwrap_or_default();
    assert!(
        last0.contains("timed out after 3s (the collective timeout, --timeout) waiting for rank"),
        "{said0}"
    );
    for rank in [2, 3] {
        assert!(
            last1.contains(&format!(
                "node 1: rank {rank} was still running after the grace (hung, stopped"
            )),
            "{}",
            said1.join("\n")
        );
    }
}

/// Two launchers claim node 1 while the rendezvous of three nodes is under
/// way: every launcher ends at once, each naming the taken seat and the fix
/// in the launchers' words (not a lost node 0, not a worker's RANK).
#[test]
fn two_launchers_claiming_one_node_during_the_rendezvous_are_named_by_every_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let launcher = |node_rank: &str| {
        let child = job(dir.path())
            .args(["--nnodes", "3", "--nproc_per_node", "1", "--timeout", "20"])
            .args(["--master_addr", "127.0.0.1", "--master_port", &port])
            .args(["--node_rank", node_rank])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        child
    };
    let launchers = [launcher("0"), launcher("1"), launcher("1")];
    for out in launchers.map(|l| wait_within(l, Duration::from_secs(30))) {
        let said = stderr(&out);
        let last = said.lines().last().unwrap_or_default();
        assert!(!out.status.success(), "{said}");
        assert!(
            last.contains(&format!(
                "the launchers at 127.0.0.1:{port} already have a node 1"
            )) && last.contains("--node-rank")
                && !last.contains("is gone"),
            "{said}"
        );
    }
}

/// SIGTERM to one node's launcher while the other machine is frozen: the
/// signalled launcher's ranks cannot save (their peers are stopped) and it
/// exits 128 + 15 as documented, but says which node held them up.
#[test]
fn a_signal_while_the_other_machine_is_frozen_names_the_frozen_node() {
    for (victim, said) in [
        (1, "launcher: node 1's launcher (host "),
        (0, "launcher: node 1: node 0's launcher (host "),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let flags = ["--timeout", "6", "--heartbeat-timeout", "2"];
        let ([node0, node1], _, (lines, relay)) = running_job(tmp.path(), &flags);
        // Training, past the rendezvous (where a signal ends a rank at once).
        std::thread::sleep(Duration::from_secs(2));
        let (frozen, signalled) = if victim == 0 {
            (node0, node1)
        } else {
            (node1, node0)
        };
        let stopped = Stopped::machine_of(&frozen, 2);
        let pid = signalled.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let out = wait_within(signalled, Duration::from_secs(30));
        drop(stopped);
        let _ = wait_within(frozen, Duration::from_secs(30));
        relay.join().unwrap();
        let story = if victim == 1 {
            stderr(&out)
        } else {
            lines.try_iter().collect::<Vec<_>>().join("\n")
        };
        assert_eq!(out.status.code(), Some(143), "{story}");
        assert!(story.contains(said), "{said}: {story}");
    }
}

/// Node 0 stopped past --rdzv-timeout while it waits for the others:
/// resumed, it reports the missing node and its own stop, which ran out
/// the clock.
#[test]
fn node_0_stopped_during_the_rendezvous_names_its_own_stop() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("127.0.0.1:{}", free_port());
    let node0 = job(dir.path())
        .args(["--nnodes=2", "--nproc_per_node=1", "--node_rank=0"])
        .args(["--rdzv-timeout", "2", "--heartbeat-timeout", "1"])
        .args(["--rdzv_endpoint", &endpoint])
        .spawn()
        .unwrap();
    // Waiting for node 1 by then (its --rdzv-timeout not yet out).
    std::thread::sleep(Duration::from_secs(1));
    let stopped = Stopped::new(vec![node0.id().to_string()]);
    std::thread::sleep(Duration::from_secs(3));
    stopped.resume();
    let out = wait_within(node0, Duration::from_secs(30));
    let said = stderr(&out);
    let last = said.lines().last().unwrap_or_default();
    assert!(!out.status.success(), "{said}");
    assert!(
        last.contains("node(s) [1] of 2 did not join")
            && last.contains("this launcher was itself stopped (or starved) for"),
        "{said}"
    );
}
