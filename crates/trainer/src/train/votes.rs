//! Whether the ranks stop after a step. Each rank's stop request is a
//! vote, summed over the job's communicator, so that every rank stops
//! after the same step and the checkpoint there is consistent. A rank
//! whose host takes part in every step (the CPU, or gradients averaged
//! through host memory) votes every step: the vote leaves as the step
//! begins (the sum runs on the communication thread while the step
//! computes) and is read after it. A GPU averaging on the device, which
//! the host never waits for, votes every [`GUARD_READ_EVERY`] steps, when
//! the host reads the device anyway. A live job's rank 0 votes, as well,
//! to let waiting newcomers in (`--recovery live`).

use super::engine::GUARD_READ_EVERY;
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
    pub fn cast(&mut self, step: u64, vote: Vote) -> anyhow::Result<()> {
        self.cast = step.is_multiple_of(self.every);
        match &mut self.handle {
            Some(handle) if self.cast => handle.start_sum_f64(vote.ballot()),
            _ => Ok(()),
        }
    }

    /// What the ranks do after the step just run: any vote counts for
    /// all, a stop before a regroup; a lone rank's `own` vote decides alone.
    pub fn count(&mut self, own: Vote) -> anyhow::Result<Vote> {
        let sum = match &mut self.handle {
            None => own.ballot(),
            Some(_) if !self.cast => return Ok(Vote::GoOn),
            Some(handle) => handle.summed_f64()?,
        };
        Ok(match sum[..] {
            [stop, _] if stop > 0.0 => Vote::Stop,
            [_, regroup] if regroup > 0.0 => Vote::Regroup,
            _ => Vote::GoOn,
        })
    }
}

/// One rank's vote on what follows a step, or the ranks' decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Vote {
    GoOn,
    /// Stop and save (a preemption request).
    Stop,
    /// End this generation of a live job: newcomers wait.
    Regroup,
}

impl Vote {
    /// The vote as the values the ranks sum.
    fn ballot(self) -> Vec<f64> {
        let [stop, regroup] = match self {
            Vote::GoOn => [0.0, 0.0],
            Vote::Stop => [1.0, 0.0],
            Vote::Regroup => [0.0, 1.0],
        };
        vec![stop, regroup]
    }
}
