//! One attempt of a node's workers: how long they get, and how it ended;
//! and the ports their stores listen on.

use std::net::TcpListener;
use std::time::Duration;

use comm::launch_var;

use crate::contract::RunEnd;
use crate::error::{Doing, LaunchError};
use crate::verdict::Silence;

/// How often the launcher checks on its workers.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// A failed attempt: the first failure alone, and the whole story.
pub(crate) struct Failure {
    pub first: String,
    pub message: String,
    /// False when no restart can help: another node's launcher is gone.
    pub restartable: bool,
    /// What the launcher knows of its workers that wrote no flight record.
    pub silent: Vec<(usize, Silence)>,
}

/// How one attempt ended.
pub(crate) enum Outcome {
    /// Every worker exited with 0, or some with [`PREEMPTED_EXIT_CODE`](crate::contract::PREEMPTED_EXIT_CODE).
    Ended(RunEnd),
    Failed(Failure),
}

/// How long workers get: to notice a failed peer, and to stop on a signal.
#[derive(Clone, Copy)]
pub(crate) struct Graces {
    pub failure: Duration,
    pub signal: Duration,
}

/// The store's port on one machine: `MASTER_PORT`, else a free one.
pub(crate) fn local_port() -> Result<u16, LaunchError> {
    match std::env::var(launch_var::MASTER_PORT) {
        Ok(p) => p.parse::<u16>().map_err(|_| {
            LaunchError::Flags(format!(
                "{}={p:?} is not a port number",
                launch_var::MASTER_PORT
            ))
        }),
        Err(_) => free_port(),
    }
}

/// A port nobody listens on right now, for rank 0's store.
pub(crate) fn free_port() -> Result<u16, LaunchError> {
    let finding = || "finding a free port for the rendezvous".to_string();
    let listener = TcpListener::bind("127.0.0.1:0").doing(finding)?;
    Ok(listener.local_addr().doing(finding)?.port())
}
