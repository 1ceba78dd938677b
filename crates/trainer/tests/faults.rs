//! A data-parallel job fails fast and says why: a dead rank, a rank that
//! never comes, a taken port, an inconsistent job. Never a hang or a panic.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use comm::launch_var;
use common::{
    data_arg, dataset, free_port, job, launcher_pid, relabelled_dataset, stderr, stderr_lines,
    trainer,
};

/// A worker started as `rank` of `world` by hand, as torchrun would.
fn worker(rank: usize, world: usize, port: u16) -> Command {
    worker_on(dataset(), rank, world, port)
}

/// [`worker`] on the data set in `data`.
fn worker_on(data: &Path, rank: usize, world: usize, port: u16) -> Command {
    let mut cmd = trainer();
    cmd.env(launch_var::RANK, rank.to_string())
        .env(launch_var::WORLD_SIZE, world.to_string())
        .env(launch_var::LOCAL_RANK, rank.to_string())
        .env(launch_var::LOCAL_WORLD_SIZE, world.to_string())
        .env(launch_var::MASTER_ADDR, "127.0.0.1")
        .env(launch_var::MASTER_PORT, port.to_string())
        .args([
            "--epochs",
            "1",
            "--max-steps",
            "2",
            "--threads",
            "1",
            "--timeout",
            "3",
        ])
        .args(data_arg(data));
    cmd
}

/// Waits for `child` at most `limit`, killing it if it is still running.
fn wait_within(mut child: Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status, err);
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("still running after {limit:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_rank_that_never_arrives_fails_the_rendezvous_after_the_join_timeout() {
    let mut alone = worker(0, 2, free_port());
    alone.args(["--rdzv-timeout", "3"]);
    let (status, err) = wait_within(spawn(&mut alone), Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        err.contains("never arrived") && err.contains("[1]"),
        "{err}"
    );
    assert!(
        err.contains("after 3s (the join timeout, --rdzv-timeout)"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A rank that starts later than `--timeout` (a slow boot, a container
/// pull) joins within `--rdzv-timeout`, and the job trains: only a
/// collective is held to `--timeout`.
#[test]
fn a_rank_later_than_the_collective_timeout_joins_within_the_join_timeout() {
    let port = free_port();
    let rank0 = spawn(&mut worker(0, 2, port));
    // Two collective timeouts late.
    std::thread::sleep(Duration::from_secs(6));
    let rank1 = spawn(&mut worker(1, 2, port));
    for (rank, child) in [rank0, rank1].into_iter().enumerate() {
        let (status, err) = wait_within(child, Duration::from_secs(60));
        assert!(status.success(), "rank {rank}: {err}");
    }
}

#[test]
fn a_master_port_in_use_is_a_clear_error() {
    let taken = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (status, err) = wait_within(spawn(&mut worker(0, 2, port)), Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        err.contains(&format!("MASTER_PORT {port}")) && err.contains("already in use"),
        "{err}"
    );
}

#[test]
fn a_rank_outside_the_world_is_a_clear_error() {
    let out = worker(2, 2, free_port()).output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("RANK=\"2\" is invalid: must be less than WORLD_SIZE=2"),
        "{err}"
    );
}

#[test]
fn ranks_disagreeing_on_the_world_size_both_fail() {
    let port = free_port();
    let first = spawn(&mut worker(0, 2, port));
    let second = spawn(&mut worker(1, 3, port));
    for (status, err) in [
        wait_within(first, Duration::from_secs(30)),
        wait_within(second, Duration::from_secs(30)),
    ] {
        assert!(!status.success());
        assert!(err.contains("WORLD_SIZE mismatch"), "{err}");
    }
}

#[test]
fn a_rank_given_other_training_flags_fails_naming_the_flag_and_both_values() {
    // --seed and --batch-size too: this check is the only one that
    // compares them between ranks.
    for (flag, theirs, mine) in [
        ("--lr", "0.001", "0.1"),
        ("--bucket-mb", "25", "1"),
        ("--seed", "0", "1"),
        ("--batch-size", "64", "32"),
    ] {
        let port = free_port();
        let first = spawn(worker(0, 2, port).args([flag, theirs]));
        let second = spawn(worker(1, 2, port).args([flag, mine]));
        let (status, err) = wait_within(second, Duration::from_secs(30));
        assert!(!status.success());
        assert!(
            err.contains(&format!(
                "rank 1 has {flag} {mine} but rank 0 has {flag} {theirs}: every rank needs the same flags"
            )),
            "{err}"
        );
        let (status, err) = wait_within(first, Duration::from_secs(30));
        assert!(!status.success(), "rank 0 trained on alone: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Each rank reads its own copy of the data (on another host it may be
/// another version): ranks whose training data differ fail before a step.
#[test]
fn a_rank_given_other_training_data_fails_before_training() {
    let other = relabelled_dataset();
    let port = free_port();
    let first = spawn(&mut worker(0, 2, port));
    let second = spawn(&mut worker_on(other.path(), 1, 2, port));
    let (status, err) = wait_within(second, Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        err.contains("rank 1 has training data (60000 samples, fingerprint ")
            && err.contains("but rank 0 has training data (60000 samples, fingerprint ")
            && err.contains("every rank needs the same data set"),
        "{err}"
    );
    let (status, err) = wait_within(first, Duration::from_secs(30));
    assert!(!status.success(), "rank 0 trained on alone: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_killed_worker_stops_the_whole_launch_with_the_lost_rank_named() {
    let mut launcher = job(2, 1, 10)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, _relay) = stderr_lines(&mut launcher);
    let mut seen = Vec::new();
    let mut pid = None;
    // Wait until rank 1 has joined the ring, i.e. training is under way.
    while !seen
        .iter()
        .any(|l: &String| l.contains("[rank 1] rank 1/2 joined"))
    {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("rank 1 never joined");
        if let Some(found) = launcher_pid(&line, 1) {
            pid = Some(found);
        }
        seen.push(line);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let pid = pid.expect("the launcher names each worker's pid");
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    let killed_at = Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "launcher still running: a hang"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    seen.extend(lines.try_iter());
    let err = seen.join("\n");
    assert!(!status.success(), "{err}");
    assert!(
        killed_at.elapsed() < Duration::from_secs(10),
        "took {:?}",
        killed_at.elapsed()
    );
    assert!(
        err.contains("[rank 0] error:") && err.contains("lost connection to rank 1"),
        "{err}"
    );
    assert!(err.contains("rank 1 failed (signal: 9"), "{err}");
    // The survivor says by its exit code that it only lost its peer.
    assert!(err.contains("rank 0 failed (exit status: 69)"), "{err}");
}
