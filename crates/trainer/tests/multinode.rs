//! Several launchers, one per "machine", make one job: two launchers of two
//! ranks each on loopback (node ranks 0 and 1, the same master) train
//! exactly what one launcher of four ranks trains.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    data_arg, dataset, final_state, free_port, launcher_pid, stderr, stderr_lines, trainer,
};

/// One epoch (of `--max-steps`), checkpointed at its end into `dir`.
fn job(dir: &Path) -> Command {
    let mut cmd = trainer();
    cmd.args([
        "--epochs",
        "1",
        "--threads",
        "1",
        "--seed",
        "7",
        "--checkpoint-dir",
    ])
    .arg(dir)
    .args(data_arg(dataset()))
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    cmd
}

/// Launchers for nodes 0 and 1 of a 2 x 2 job, started together.
fn two_launchers(dir: &Path, extra: &[&str]) -> [Child; 2] {
    let port = free_port().to_string();
    [0, 1].map(|node_rank: usize| {
        job(dir)
            .args(["--nnodes", "2", "--nproc_per_node", "2"])
            .args(["--master_addr", "127.0.0.1", "--master_port", &port])
            .args(["--node_rank", &node_rank.to_string()])
            .args(extra)
            .spawn()
            .expect("starting a launcher")
    })
}

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

/// `child`'s output, failing the test if it runs longer than `limit`.
fn wait_within(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("a launcher still runs after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}
