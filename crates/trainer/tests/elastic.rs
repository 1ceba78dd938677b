//! An elastic job (`--nnodes 1:2`): two launchers of two ranks each on
//! loopback; one machine lost mid-epoch, the other finishes the run alone
//! at world size 2 from the newest checkpoint, and the epoch still trains
//! on every sample once; the machine, back, stands by for a restart.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::{free_port, stderr_lines, trainer};
use trainer::checkpoint::Position;
use trainer::checkpoint::store::PAUSE_ENV;

/// The toy model's samples: 32 steps of 4 ranks x 16, or 64 of 2 x 16.
const SAMPLES: u64 = 2048;

/// A launcher of an elastic job of one or two machines with two ranks
/// each, checkpointing every 4 steps into `dir`, its metrics in `metrics`.
fn launcher(dir: &Path, metrics: &Path, port: &str) -> Child {
    trainer()
        .args(["--model", "toy", "--samples", &SAMPLES.to_string()])
        .args(["--batch-size", "16", "--epochs", "1", "--threads", "1"])
        .args(["--device", "cpu", "--seed", "3", "--timeout", "10"])
        .args([
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
        ])
        .args(["--rdzv-endpoint", &format!("127.0.0.1:{port}")])
        .args(["--heartbeat-timeout", "5"])
        .arg("--checkpoint-dir")
        .arg(dir)
        .args(["--checkpoint-every", "4"])
        .arg("--metrics")
        .arg(metrics)
        // Every save pauses, so that the epoch still runs when the test has
        // seen the first checkpoint and kills a machine.
        .env(PAUSE_ENV, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting a launcher")
}

/// The lines before the first of `lines` that contains `needle`, failing
/// after a minute.
fn wait_for(lines: &Receiver<String>, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    common::wait_for_line(lines, &mut seen, needle, Duration::from_secs(60));
    seen.pop();
    seen
}

#[test]
fn a_lost_machine_leaves_the_other_to_finish_the_epoch_at_world_size_two() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, metrics) = (tmp.path().join("ckpt"), tmp.path().join("run.jsonl"));
    let port = free_port().to_string();
    // The first launcher binds the rendezvous port: seat 0, node 0.
    let mut node0 = launcher(&dir, &metrics, &port);
    let (lines0, relay0) = stderr_lines(&mut node0);
    wait_for(
        &lines0,
        "launcher: seat 0 of an elastic job of 1:2 machines",
    );
    let mut node1 = launcher(&dir, &metrics, &port);
    let (lines1, relay1) = stderr_lines(&mut node1);
    wait_for(
        &lines1,
        "launcher: seat 1 of an elastic job of 1:2 machines",
    );
    let started = wait_for(&lines0, "launcher: started rank 0 ");
    assert!(
        started
            .iter()
            .any(|l| l.contains("attempt 0 runs on 2 of 1:2 machines")),
        "{started:#?}"
    );

    // Mid-epoch: 4 of its 32 steps saved. The machine is lost: its
    // launcher killed, its workers with it.
    common::wait_for_dir(
        &dir.join(Position { epoch: 1, step: 4 }.dir_name()),
        Duration::from_secs(60),
    );
    assert!(node1.try_wait().unwrap().is_none(), "node 1 ended early");
    Command::new("kill")
        .args(["-KILL", &node1.id().to_string()])
        .status()
        .unwrap();
    node1.wait().unwrap();
    relay1.join().unwrap();

    let before = wait_for(&lines0, "attempt 1 runs on 1 of 1:2 machines").join("\n");
    assert!(
        before.contains("an elastic job goes on without it, on the 1 machine(s) left")
            && before.contains("restart 1 of 1"),
        "{before}"
    );
    // The machine comes back while the smaller job runs: it stands by for
    // a restart that never comes, and leaves when the job ends.
    let mut back = launcher(&dir, &metrics, &port);
    let (lines_back, relay_back) = stderr_lines(&mut back);
    wait_for(
        &lines_back,
        "without this one; standing by for the next restart",
    );

    let status = node0.wait().unwrap();
    relay0.join().unwrap();
    let said: Vec<String> = lines0.try_iter().collect();
    let said = said.join("\n");
    assert!(status.success(), "{status}: {before}\n{said}");
    let status = back.wait().unwrap();
    relay_back.join().unwrap();
    let left: Vec<String> = lines_back.try_iter().collect();
    assert!(status.success(), "{status}: {left:#?}");
    assert!(
        left.iter()
            .any(|l| l.contains("the job ended without this machine")),
        "{left:#?}"
    );
    // Only two ranks in the second attempt.
    assert!(
        said.contains("started rank 1 ") && !said.contains("started rank 2 "),
        "{said}"
    );

    // The epoch's record, written by the attempt that ended it: every
    // sample once, none lost with the machine, none read twice, though the
    // epoch began on 4 ranks and ended on 2.
    let text = std::fs::read_to_string(&metrics).unwrap();
    let epoch: serde_json::Value = (text.lines())
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|row| row.get("images").is_some())
        .unwrap_or_else(|| panic!("no epoch record in {text}"));
    assert_eq!(epoch["images"], SAMPLES, "{epoch}");
    assert_eq!(epoch["world_size"], 2, "{epoch}");
}
