//! A peer *process* killed with SIGKILL in the middle of all-reduces: the
//! surviving rank must fail with an error naming the lost rank as soon as
//! the OS closes the dead process's sockets, not after the timeout.
//!
//! The binary plays both parts: run normally it is rank 0 and the test; with
//! `PEER_KILLED_PORT` set it is rank 1, all-reducing until it is killed.

mod common;

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use comm::{CommError, Communicator, ReduceOp, TcpCommunicator};
use common::{config, free_port};

const PORT_VAR: &str = "PEER_KILLED_PORT";
const TIMEOUT: Duration = Duration::from_secs(15);
const LEN: usize = 1 << 20;

fn main() -> ExitCode {
    let outcome = match std::env::var(PORT_VAR) {
        Ok(port) => peer(&port),
        Err(_) => survivor(),
    };
    match outcome {
        Ok(()) => {
            println!("test peer_killed::killed_peer_process_is_named_quickly ... ok");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!(
                "test peer_killed::killed_peer_process_is_named_quickly ... FAILED\n{message}"
            );
            ExitCode::FAILURE
        }
    }
}

/// Rank 1: all-reduce until killed (or until rank 0 goes away).
fn peer(port: &str) -> Result<(), String> {
    let port: u16 = port.parse().map_err(|e| format!("{PORT_VAR}: {e}"))?;
    let mut comm =
        TcpCommunicator::connect(&config(1, 2, port, TIMEOUT)).map_err(|e| e.to_string())?;
    let mut buf = vec![1.0_f32; LEN];
    while comm.all_reduce(&mut buf, ReduceOp::Avg).is_ok() {}
    Ok(())
}

/// Rank 0: starts the peer, kills it while both are all-reducing, and
/// checks the error.
fn survivor() -> Result<(), String> {
    let port = free_port();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .env(PORT_VAR, port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the peer: {e}"))?;
    let mut buf = vec![1.0_f32; LEN];
    let mut comm = match connect_and_warm_up(port, &mut buf) {
        Ok(comm) => comm,
        Err(e) => {
            // Best effort: the peer may already be gone.
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    // Kill from another thread while this one is inside all_reduce.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        child.kill().and_then(|()| child.wait())
    });
    let start = Instant::now();
    let mut failure = None;
    for _ in 0..100_000 {
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Avg) {
            failure = Some(e);
            break;
        }
    }
    let elapsed = start.elapsed();
    let status = killer
        .join()
        .map_err(|_| "killer thread panicked".to_string())?;
    status.map_err(|e| format!("killing the peer: {e}"))?;
    let err = failure.ok_or("all-reduce kept succeeding after the peer was killed")?;
    if !matches!(
        err,
        CommError::PeerLost {
            peer: 1,
            op: "all_reduce",
            ..
        }
    ) {
        return Err(format!(
            "expected the loss of rank 1 during all_reduce, got: {err}"
        ));
    }
    if elapsed >= TIMEOUT / 2 {
        return Err(format!(
            "took {elapsed:?}: waited for the timeout instead of noticing the closed socket"
        ));
    }
    Ok(())
}

fn connect_and_warm_up(port: u16, buf: &mut [f32]) -> Result<TcpCommunicator, String> {
    let mut comm =
        TcpCommunicator::connect(&config(0, 2, port, TIMEOUT)).map_err(|e| e.to_string())?;
    for _ in 0..3 {
        comm.all_reduce(buf, ReduceOp::Avg)
            .map_err(|e| e.to_string())?;
    }
    if buf.iter().any(|&x| x != 1.0) {
        return Err("wrong all-reduce result before the kill".to_string());
    }
    Ok(comm)
}
