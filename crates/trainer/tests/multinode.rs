//! Several launchers, one per "machine", make one job: two launchers of two
//! ranks each on loopback (node ranks 0 and 1, the same master) train
//! exactly what one launcher of four ranks trains.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{data_arg, dataset, final_state, free_port, stderr, trainer};

/// One epoch of 4 steps, checkpointed at its end into `dir`.
fn job(dir: &Path) -> Command {
    let mut cmd = trainer();
    cmd.args([
        "--epochs",
        "1",
        "--max-steps",
        "4",
        "--threads",
        "1",
        "--timeout",
        "30",
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
fn two_launchers(dir: &Path, node_ranks: [Option<usize>; 2]) -> [Output; 2] {
    let port = free_port().to_string();
    let launchers = node_ranks.map(|node_rank| {
        let mut cmd = job(dir);
        cmd.args(["--nnodes", "2", "--nproc_per_node", "2"]).args([
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            &port,
        ]);
        if let Some(k) = node_rank {
            cmd.args(["--node_rank", &k.to_string()]);
        }
        cmd.spawn().expect("starting a launcher")
    });
    launchers.map(|l| l.wait_with_output().expect("waiting for a launcher"))
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
        .args(["--world-size", "4"])
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let outs = two_launchers(&two, [Some(0), Some(1)]);
    for (node, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "node {node}: {}", stderr(out));
    }
    // Node 1's launcher starts global ranks 2 and 3.
    let node1 = stderr(&outs[1]);
    assert!(node1.contains("launcher: started rank 2 "), "{node1}");
    assert!(node1.contains("launcher: started rank 3 "), "{node1}");
    assert!(tensors(&one) == tensors(&two), "the weights differ");
}
