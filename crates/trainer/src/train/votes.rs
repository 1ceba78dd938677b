//! Whether the ranks stop after a step. Each rank's stop request is a
//! vote, summed over the job's communicator, so that every rank stops
//! after the same step and the checkpoint there is consistent. A rank
//! whose host takes part in every step (the CPU, or gradients averaged
//! through host memory) votes every step: the vote leaves as the step
//! begins (the sum runs on the communication thread while the step
//! computes) and is read after it. A GPU averaging on the device, which
//! the host never waits for, votes every [`GUARD_READ_EVERY`] steps, when
//! the host reads the device anyway.

use super::guard::GUARD_READ_EVERY;
use crate::comm_thread::{CommHandle, CommThread};

/// The votes of one rank's steps.
pub(super) struct StopVotes {
    /// The job's communicator; `None`: one rank, which decides alone.
    handle: Option<CommHandle>,
    /// Steps between votes.
    every: u64,
    /// Whether the step under way carries a vote.
    cast: bool,
}

impl StopVotes {
    /// Votes over `comm` (`None`: one rank), every step if `every_step`.
    pub fn new(comm: Option<&CommThread>, every_step: bool) -> Self {
        Self {
            handle: comm.filter(|c| c.world_size() > 1).map(CommThread::handle),
            every: if every_step { 1 } else { GUARD_READ_EVERY },
            cast: false,
        }
    }

    /// Casts this rank's `vote` in the step about to run, which makes
    /// `step` optimizer steps, if that step counts votes.
    pub fn cast(&mut self, step: u64, vote: bool) -> anyhow::Result<()> {
        self.cast = step.is_multiple_of(self.every);
        match &mut self.handle {
            Some(handle) if self.cast => handle.start_sum_f64(vec![f64::from(u8::from(vote))]),
            _ => Ok(()),
        }
    }

    /// Whether the ranks stop after the step just run: any vote counts for
    /// all; a lone rank's `own` vote decides alone.
    pub fn count(&mut self, own: bool) -> anyhow::Result<bool> {
        match &mut self.handle {
            None => Ok(own),
            Some(_) if !self.cast => Ok(false),
            Some(handle) => Ok(handle.summed_f64()?[0] > 0.0),
        }
    }
}
