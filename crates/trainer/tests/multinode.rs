//! Several launchers, one per "machine", make one job: two launchers of two
//! ranks each on loopback (node ranks 0 and 1, the same master) train
//! exactly what one launcher of four ranks trains.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::nodes::{
    Stopped, job, training_launchers, two_launchers, two_launchers_with, two_same_launchers,
    wait_within,
};
use common::{final_state, free_port, launcher_pid, stderr, stderr_lines, stdout};
use trainer::checkpoint::Position;
use trainer::checkpoint::store::PAUSE_ENV;

/// The final checkpoint's tensors, as bits (the files' metadata order varies).
fn tensors(dir: &Path) -> Vec<Vec<u32>> {
    let state = final_state(dir);
    [state.params, state.exp_avg, state.exp_avg_sq]
        .map(|t| t.iter().map(|x| x.to_bits()).collect())
        .into()
}

#[test]
fn two_launchers_of_two_ranks_train_what_one_launcher_of_four_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let out = job(&one)
        .args(["--world-size", "4", "--max-steps", "4"])
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let outs = two_launchers(&two, &["--max-steps", "4"]).map(|l| l.wait_with_output().unwrap());
    for (node, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "node {node}: {}", stderr(out));
    }
    // Node 1's launcher starts global ranks 2 and 3.
    let node1 = stderr(&outs[1]);
    assert!(node1.contains("launcher: started rank 2 "), "{node1}");
    assert!(node1.contains("launcher: started rank 3 "), "{node1}");
    assert!(tensors(&one) == tensors(&two), "the weights differ");

    let three = tmp.path().join("three");
    let outs = two_same_launchers(&three, &["--max-steps", "4"]);
    let said = outs.each_ref().map(stderr);
    for (out, said) in outs.iter().zip(&said) {
        assert!(out.status.success(), "{said}");
    }
    let starts = |rank| {
        said.iter()
            .position(|s| s.contains(&format!("launcher: started rank {rank} ")))
    };
    assert!(
        starts(0).is_some() && starts(2).is_some() && starts(0) != starts(2),
        "{said:?}"
    );
    assert!(tensors(&one) == tensors(&three), "the weights differ");
}

#[test]
fn a_rank_killed_on_one_node_stops_both_and_both_launchers_name_it() {
    let tmp = tempfile::tempdir().unwrap();
    let [node0, mut node1] =
        two_launchers(tmp.path(), &["--max-steps", "100000", "--timeout", "10"]);
    let (lines, relay) = stderr_lines(&mut node1);
    let pid = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("node 1's launcher names rank 3's pid");
        if let Some(pid) = launcher_pid(&line, 3) {
            break pid;
        }
    };
    // Wait until the job trains, then kill rank 3.
    while !lines
        .recv_timeout(Duration::from_secs(60))
        .expect("the job starts")
        .contains("joined")
    {}
    let killed = Instant::now();
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    let out0 = wait_within(node0, Duration::from_secs(30));
    let status1 = node1.wait().unwrap();
    relay.join().unwrap();
    let said1: Vec<String> = lines.try_iter().collect();
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "{:?}",
        killed.elapsed()
    );
    let said0 = stderr(&out0);
    assert!(!out0.status.success() && !status1.success());
    let last0 = said0.lines().last().unwrap_or_default();
    let last1 = said1.last().cloned().unwrap_or_default();
    for last in [last0, last1.as_str()] {
        assert!(
            last.contains("node 1: rank 3 failed (signal: 9"),
            "{last}\nnode 0 said:\n{said0}\nnode 1 said:\n{}",
            said1.join("\n")
        );
    }
}

#[test]
fn with_max_restarts_every_node_restarts_from_the_checkpoint_and_the_result_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let (calm, hit) = (tmp.path().join("calm"), tmp.path().join("hit"));
    let steps = ["--max-steps", "8", "--checkpoint-every", "2"];
    let out = job(&calm)
        .args(["--world-size", "4"])
        .args(steps)
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Every save pauses a second, so that the job still runs when rank 3
    // is killed after the first checkpoint.
    let extra = [&steps[..], &["--max-restarts", "1", "--timeout", "10"]].concat();
    let log = tmp.path().join("launchers.log");
    let [mut node0, mut node1] = two_launchers_with(&hit, &extra, |cmd| {
        let append = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log);
        cmd.env(PAUSE_ENV, "1").stderr(append.unwrap());
    });
    let first = hit.join(Position { epoch: 1, step: 2 }.dir_name());
    common::wait_for_dir(&first, Duration::from_secs(60));
    let pids = Command::new("pgrep")
        .args(["-P", &node1.id().to_string()])
        .output()
        .unwrap();
    let rank3 = stdout(&pids)
        .lines()
        .last()
        .expect("node 1 runs ranks 2 and 3")
        .to_string();
    Command::new("kill").args(["-9", &rank3]).status().unwrap();
    let (status0, status1) = (node0.wait().unwrap(), node1.wait().unwrap());
    assert!(
        status0.success() && status1.success(),
        "{status0} {status1}"
    );
    assert!(tensors(&calm) == tensors(&hit), "the weights differ");
}

/// With a job token every launcher and every rank proves it holds it: two
/// launchers sharing `TRAINER_AUTH_TOKEN` train together; one holding
/// another token is refused at the launchers' rendezvous (and node 0 gives
/// up on it after --rdzv-timeout).
#[test]
fn launchers_share_the_job_token_and_a_stranger_is_refused() {
    const TOKEN: &str = "aa";
    let token = TOKEN.repeat(32);
    let tmp = tempfile::tempdir().unwrap();
    let with = |dir: &Path, second: String| {
        let tokens = [token.clone(), second];
        let node = std::cell::Cell::new(0);
        let flags = [
            "--max-steps",
            "2",
            "--timeout",
            "10",
            "--rdzv-timeout",
            "10",
        ];
        two_launchers_with(dir, &flags, |cmd| {
            cmd.env("TRAINER_AUTH_TOKEN", &tokens[node.get()]);
            node.set(node.get() + 1);
        })
        .map(|l| wait_within(l, Duration::from_secs(120)))
    };
    let shared = with(&tmp.path().join("shared"), token.clone());
    for (node, out) in shared.iter().enumerate() {
        assert!(out.status.success(), "node {node}: {}", stderr(out));
    }
    let stranger = with(&tmp.path().join("stranger"), "bb".repeat(32));
    let said = stderr(&stranger[1]);
    assert!(!stranger[1].status.success(), "{said}");
    assert!(said.contains("token did not match"), "{said}");
    assert!(!said.contains(&token), "a secret was printed: {said}");
}

/// A launcher still waiting for node 0 (no workers yet) acts on SIGTERM at
/// once, exiting 75 as a preempted job does, instead of waiting out its
/// --rdzv-timeout.
#[test]
fn a_launcher_waiting_for_node_0_stops_at_once_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let waiting = job(&dir.path().join("ckpt"))
        .args(["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "1"])
        .args(["--master-addr", "127.0.0.1", "--master-port", &port])
        .args(["--rdzv-timeout", "120"])
        .spawn()
        .unwrap();
    // Long enough for its handlers; far shorter than its --rdzv-timeout.
    std::thread::sleep(Duration::from_secs(2));
    let killed = Command::new("kill")
        .args(["-TERM", &waiting.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = wait_within(waiting, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("while waiting for the other nodes"), "{err}");
}

/// Ctrl-C to one machine's launcher stops the whole job as Ctrl-C: every
/// launcher exits 130 and none restarts, though the other machine's ranks
/// lost theirs (its launcher passes the signal on).
#[test]
fn sigint_to_one_nodes_launcher_stops_every_node_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let (node0, mut node1, (_, relay)) =
        training_launchers(tmp.path(), &["--timeout", "10", "--max-restarts", "1"]);
    let pid = node1.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status().unwrap();
    let out0 = wait_within(node0, Duration::from_secs(60));
    let status1 = node1.wait().unwrap();
    relay.join().unwrap();
    let said0 = stderr(&out0);
    assert_eq!(status1.code(), Some(130));
    assert_eq!(out0.status.code(), Some(130), "{said0}");
    assert!(
        said0.contains("another node's launcher got SIGINT"),
        "{said0}"
    );
    assert!(!said0.contains("restart"), "{said0}");
}

/// SIGKILL to machine `victim`'s launcher (its ranks die with it): the
/// other machine's launcher ends the job within seconds, not after its
/// --timeout, naming the lost launcher, and restarts nothing though
/// restarts are left: those ranks cannot come back. What it said.
fn kill_a_launcher(victim: usize) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let (mut node0, mut node1, (lines, relay)) =
        training_launchers(tmp.path(), &["--timeout", "20", "--max-restarts", "2"]);
    let killed = Instant::now();
    let said = if victim == 0 {
        node0.kill().unwrap();
        node0.wait().unwrap();
        let status = node1.wait().unwrap();
        relay.join().unwrap();
        assert!(!status.success());
        lines.try_iter().collect::<Vec<_>>().join("\n")
    } else {
        node1.kill().unwrap();
        node1.wait().unwrap();
        relay.join().unwrap();
        let out = wait_within(node0, Duration::from_secs(60));
        assert!(!out.status.success());
        stderr(&out)
    };
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "waited out the --timeout: {:?}\n{said}",
        killed.elapsed()
    );
    assert!(!said.contains("restart 1 of 2"), "{said}");
    said
}

#[test]
fn a_killed_launcher_ends_the_job_on_the_other_node_without_a_restart() {
    let said = kill_a_launcher(1);
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: node 1's launcher (host ") && last.contains("is gone"),
        "{said}"
    );
    let said = kill_a_launcher(0);
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: node 1: node 0's launcher is gone"),
        "{said}"
    );
}

/// Node 0 starts no worker before every node has joined: a launcher of
/// another job (another --rdzv-id) ends it at once with both ids named,
/// and a node that never comes ends it after --rdzv-timeout, named.
#[test]
fn node_0_waits_for_every_node_and_names_a_stranger_or_a_missing_one() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let launcher = |id: &str| {
        job(dir.path())
            .args(["--nnodes=2", "--nproc_per_node=1", "--timeout", "20"])
            .args(["--rdzv_id", id, "--rdzv_endpoint", &endpoint])
            .spawn()
            .unwrap()
    };
    let ours = launcher("ours");
    std::thread::sleep(Duration::from_millis(500));
    let theirs = wait_within(launcher("theirs"), Duration::from_secs(30));
    let ours = wait_within(ours, Duration::from_secs(10));
    let (said, they_said) = (stderr(&ours), stderr(&theirs));
    assert!(!ours.status.success() && !theirs.status.success());
    assert!(
        said.contains(r#"came with --rdzv-id "theirs", not this job's "ours""#),
        "{said}"
    );
    assert!(!said.contains("started rank"), "{said}");
    assert!(
        they_said.contains(r#"is not node 0's "ours""#),
        "{they_said}"
    );

    let alone = job(dir.path())
        .args(["--nnodes=2", "--nproc_per_node=1", "--rdzv-timeout", "2"])
        .args(["--rdzv_endpoint", &format!("127.0.0.1:{}", free_port())])
        .spawn()
        .unwrap();
    let said = stderr(&wait_within(alone, Duration::from_secs(30)));
    assert!(
        said.contains("node(s) [1] of 2 did not join the launchers")
            && said.contains("within 2s (the join timeout, --rdzv-timeout)"),
        "{said}"
    );
    assert!(!said.contains("started rank"), "{said}");
}

/// `--timeout` and `--heartbeat-timeout` of the frozen-machine tests: the
/// heartbeat well inside the ranks' own wait.
const SHORT_HEARTBEAT: [&str; 4] = ["--timeout", "20", "--heartbeat-timeout", "2"];

/// Machine `victim` of a training 2 x 2 job with `flags` (`--timeout T
/// --heartbeat-timeout H`) freezes (its launcher and workers stopped with
/// SIGSTOP, their connections open): the other machine's launcher ends the
/// job within seconds of H, exiting 1, its last line starting with
/// `said[0]` and holding the rest of `said`, and restarts nothing though
/// restarts are left.
fn freeze_a_machine(victim: usize, flags: [&str; 4], said: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let flags = [&flags[..], &["--max-restarts", "2"]].concat();
    let (mut node0, mut node1, (lines, relay)) = training_launchers(tmp.path(), &flags);
    // The wait is a hang check: without heartbeats the ranks would time
    // out after T and restart, twice.
    let limit = Duration::from_secs(30);
    let (story, out) = if victim == 0 {
        let frozen = Stopped::machine_of(&node0, 2);
        let out = wait_within(node1, limit);
        drop(frozen);
        node0.wait().unwrap();
        relay.join().unwrap();
        (lines.try_iter().collect::<Vec<_>>().join("\n"), out)
    } else {
        let frozen = Stopped::machine_of(&node1, 2);
        let out = wait_within(node0, limit);
        drop(frozen);
        node1.wait().unwrap();
        relay.join().unwrap();
        (stderr(&out), out)
    };
    assert!(!story.contains("restart 1 of 2"), "{story}");
    let last = story.lines().last().unwrap_or_default();
    assert!(last.starts_with(said[0]), "{story}");
    for needle in &said[1..] {
        assert!(last.contains(needle), "{needle}: {story}");
    }
    assert_eq!(out.status.code(), Some(1), "{story}");
}

#[test]
fn a_frozen_node_1_is_named_by_node_0_which_ends_the_job_without_a_restart() {
    let said = [
        "error: node 1's launcher (host ",
        "sent no heartbeat for",
        "kill -CONT",
    ];
    freeze_a_machine(1, SHORT_HEARTBEAT, &said);
}

#[test]
fn a_frozen_node_0_is_named_by_node_1_which_ends_without_a_restart() {
    let said = [
        "error: node 1: node 0's launcher (host ",
        "stopped answering for 2.0 s",
        "kill -CONT",
    ];
    freeze_a_machine(0, SHORT_HEARTBEAT, &said);
}

/// Node 0's ranks time out on a frozen node 1's before its silence passes
/// --heartbeat-timeout: node 0 waits for the late node's verdict rather
/// than restart on its ranks' timeouts.
#[test]
fn a_frozen_node_is_named_even_when_its_peers_time_out_first() {
    let flags = ["--timeout", "4", "--heartbeat-timeout", "8"];
    let said = ["error: node 1's launcher (host ", "sent no heartbeat for"];
    freeze_a_machine(1, flags, &said);
}
