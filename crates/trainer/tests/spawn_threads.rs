//! `--spawn threads`: the ranks of one machine as threads of one process
//! train exactly as worker processes do, bit for bit, with no port and no
//! child process.

mod common;

use std::path::Path;

use common::{data_arg, dataset, final_state, run, stderr, trainer};

/// A 2-rank run with `spawn`, checkpointing into `dir`; returns stderr.
fn train(spawn: &str, dir: &Path) -> String {
    let out = run(trainer()
        .args(["--world-size", "2", "--spawn", spawn, "--epochs", "1"])
        .args(["--max-steps", "6", "--threads", "1", "--device", "cpu"])
        .args(["--seed", "5", "--checkpoint-dir"])
        .arg(dir)
        .args(data_arg(dataset())));
    let err = stderr(&out);
    assert!(out.status.success(), "{spawn}: {err}");
    err
}

#[test]
fn threads_train_bitwise_like_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let (threads_dir, processes_dir) = (tmp.path().join("t"), tmp.path().join("p"));
    let threads_log = train("threads", &threads_dir);
    let processes_log = train("processes", &processes_dir);
    assert!(
        threads_log.contains("ranks run as threads of one process")
            && threads_log.contains("gradients through memory")
            && !threads_log.contains("launcher: started rank"),
        "{threads_log}"
    );
    assert!(
        processes_log.contains("launcher: started rank 1"),
        "{processes_log}"
    );
    let (threads, processes) = (final_state(&threads_dir), final_state(&processes_dir));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&threads.params), bits(&processes.params));
    assert_eq!(bits(&threads.exp_avg_sq), bits(&processes.exp_avg_sq));
    assert_eq!(
        bits(&threads.epoch_loss_sum),
        bits(&processes.epoch_loss_sum)
    );
    assert_eq!(threads.optimizer_step, 6);
}

#[test]
fn threads_refuse_what_only_processes_can_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    for (args, needle) in [
        (
            &[
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--node-rank",
                "0",
            ][..],
            "one machine",
        ),
        (
            &[
                "--world-size",
                "2",
                "--max-restarts",
                "1",
                "--checkpoint-dir",
                dir,
            ][..],
            "--resume auto",
        ),
    ] {
        let out = run(trainer().args(["--spawn", "threads"]).args(args));
        assert!(!out.status.success());
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
}
