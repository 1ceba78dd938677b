//! What the watch over one attempt has seen and decided so far, and how
//! it takes on what another node reported.

use std::time::{Duration, Instant};

use crate::attempt::Graces;
use crate::contract::describe;
use crate::group::Elsewhere;
use crate::workers::{Worker, forward};

use super::OWN_CAUSE_GRACE;

/// What the watch over one attempt has seen and decided so far.
pub(super) struct Watch {
    /// "node K: " in a job of several machines, else empty.
    pub node: String,
    pub graces: Graces,
    /// When the workers still running are stopped.
    pub deadline: Option<Instant>,
    /// The signal that stops this attempt: the launcher's own, a worker's
    /// interruption, or another node's.
    pub received: Option<i32>,
    pub first_failure: Option<usize>,
    /// Every rank seen failing on its own (before the launcher stopped any).
    pub failed_alone: Vec<usize>,
    /// A failure another node reported first: the cause of any here.
    pub elsewhere: Option<String>,
    /// False once a node's launcher is gone: its ranks cannot come back.
    pub restartable: bool,
    /// Failed workers of a live job that the others went on without, no
    /// replacement being left.
    pub given_up: Vec<usize>,
    /// A live job's training ended on node 0 while workers here ran.
    pub over: bool,
}

impl Watch {
    /// Nothing has ended the attempt yet: the next failure is its cause.
    pub fn undecided(&self) -> bool {
        let ended = self.over || self.received.is_some();
        self.first_failure.is_none() && self.elsewhere.is_none() && !ended
    }

    /// Stops the workers still running `wait` from now, or sooner if so set.
    pub fn stop_within(&mut self, wait: Duration) {
        let until = Instant::now() + wait;
        self.deadline = Some(self.deadline.map_or(until, |d| d.min(until)));
    }

    /// `signal` stops the attempt (the first one stands), the workers
    /// getting `wait` to stop on it.
    pub fn signalled(&mut self, signal: i32, wait: Duration) {
        self.received.get_or_insert(signal);
        self.stop_within(wait);
    }

    /// Takes on what another node reported: its failure or its lost
    /// launcher as the cause of any failure here, its signal as this node's.
    pub fn adopt(&mut self, workers: &[Worker], news: Elsewhere) {
        match news {
            Elsewhere::Failed { cause, restartable } => {
                tell!("launcher: {cause}; stopping this node's ranks");
                self.stop_within(self.graces.failure);
                self.elsewhere = Some(cause);
                self.restartable &= restartable;
            }
            Elsewhere::Departed(cause) => {
                tell!("launcher: {cause}; stopping this node's ranks");
                // Every rank here will only lose its peers.
                self.stop_within(self.graces.failure.min(OWN_CAUSE_GRACE));
                self.elsewhere = Some(cause);
                self.restartable = false;
            }
            // This node's ranks re-form the job over the machines left.
            Elsewhere::WentOnWithout(cause) => tell!("launcher: {cause}"),
            Elsewhere::Over => {
                tell!(
                    "launcher: {}the live job's training ended on node 0; this node's ranks still running (joined too late to train, or ending too) get {:?} to end",
                    self.node,
                    self.graces.failure
                );
                self.over = true;
                self.stop_within(self.graces.failure);
            }
            Elsewhere::Signalled(signal) => {
                tell!(
                    "launcher: {}another node's launcher got {}: passing it to this node's workers",
                    self.node,
                    describe(signal)
                );
                forward(workers, signal);
                self.signalled(signal, self.graces.signal);
            }
        }
    }
}
