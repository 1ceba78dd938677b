//! A live job's replacements: a failed worker's place taken by a new one
//! while the others go on (`OnFailure::Replace`).

use std::process::ExitStatus;

use crate::contract::{MISCONFIGURED_EXIT_CODE, PEER_LOST_EXIT_CODE};
use crate::error::LaunchError;
use crate::workers::{Worker, stop};

/// A live job's replacements for its failed workers
/// ([`OnFailure::Replace`](crate::spec::OnFailure::Replace)).
pub(crate) struct Replacements<'a> {
    /// Starts the worker at a local rank again.
    pub start: &'a mut dyn FnMut(usize) -> Result<Worker, LaunchError>,
    /// Replacements left, of `max` (`--max-restarts`).
    pub left: u32,
    pub max: u32,
}

impl Replacements<'_> {
    /// Whether the others go on without a worker that ended with `status`:
    /// not when it says that the job is lost (every rank holding its state
    /// gone) or misconfigured, which only a restart of all, or none, meets.
    pub(super) fn go_on_without(status: ExitStatus) -> bool {
        !matches!(
            status.code(),
            Some(PEER_LOST_EXIT_CODE | MISCONFIGURED_EXIT_CODE)
        )
    }

    /// Starts a replacement for `workers[i]`, which failed, while any are
    /// left; the others go on either way. False: it was given up.
    pub(super) fn replace(&mut self, workers: &mut [Worker], i: usize, node: &str) -> bool {
        workers[i].settle();
        let failed = format!("{node}{}", workers[i].describe_failure());
        if self.left == 0 {
            tell!(
                "launcher: {failed}; the others go on without it (no replacement left: --max-restarts {})",
                self.max
            );
            return false;
        }
        match (self.start)(i) {
            Ok(worker) => {
                self.left -= 1;
                tell!(
                    "launcher: {failed}; the others go on without it, and its replacement (pid {}) joins them: replacement {} of {} (--max-restarts)",
                    worker.child.id(),
                    self.max - self.left,
                    self.max
                );
                let mut old = std::mem::replace(&mut workers[i], worker);
                stop(std::slice::from_mut(&mut old));
                true
            }
            Err(e) => {
                tell!(
                    "launcher: {failed}; the others go on without it (its replacement did not start: {e})"
                );
                false
            }
        }
    }
}
