//! The loop's part in a live job (`--recovery live`; `crate::run`'s
//! generations): rank 0 asks between steps whether newcomers wait, and when
//! a generation ends the replica's state at its last committed step is kept
//! in memory, as a checkpoint taken there would hold it, for the next
//! generation's rank 0 to start from and heal the others with.

use anyhow::{Context, bail};
use core_tensor::Ops;

use super::{EpochShare, Trainer};
use crate::checkpoint::{Position, TrainingState};
use crate::model::Model;

/// What a member of a live job carries and asks across generations.
#[derive(Default)]
pub(super) struct LiveState {
    /// Rank 0's: asked whether newcomers wait.
    pub membership: Option<Box<dyn Membership>>,
    /// Its share of the epoch's numbers before this generation.
    pub carried: Option<EpochShare>,
    /// The bytes the generation's starting state (the heal) carried here.
    pub start_bytes: u64,
}

/// What rank 0 of a live job asks of the job's membership between steps.
pub trait Membership {
    /// Whether newcomers wait to join.
    fn newcomers_waiting(&mut self) -> anyhow::Result<bool>;
}

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// Asks `membership` between steps whether newcomers wait, and votes to
    /// let them in when they do (rank 0 of a live job).
    pub fn watch_membership(&mut self, membership: Box<dyn Membership>) {
        self.state.live.membership = Some(membership);
    }

    /// Whether this rank votes to let newcomers in after the step.
    pub(super) fn newcomers_vote(&mut self) -> anyhow::Result<bool> {
        match &mut self.state.live.membership {
            Some(membership) => membership.newcomers_waiting(),
            None => Ok(false),
        }
    }

    /// Goes on with `share`, this rank's numbers of the epoch in the
    /// generation before (a member of a live job).
    pub fn carry(&mut self, share: EpochShare) {
        self.state.live.carried = Some(share);
    }

    /// This rank's share of the current epoch's running numbers.
    pub fn epoch_share(&self) -> anyhow::Result<EpochShare> {
        let [loss_sum, correct] = self.state.meter.read(self.engine.backend())?;
        Ok(EpochShare {
            epoch: self.state.committed.epoch,
            loss_sum: loss_sum as f32,
            correct: correct as f32,
            images: self.state.meter.images,
        })
    }

    /// The bytes rank 0's broadcast of the starting state carried to each
    /// rank: in a live job's later generations, what healing took.
    pub fn start_bytes(&self) -> u64 {
        self.state.live.start_bytes
    }

    /// Where the last step committed on this rank left the run.
    pub fn committed(&self) -> Position {
        self.state.committed
    }

    /// This replica's state at its last committed step, from its own
    /// memory alone (no collective: its peers may be gone): what a
    /// checkpoint there would hold, with this rank's running numbers of the
    /// epoch as the only ones (the others' are lost with the generation).
    pub fn kept_state(&mut self) -> anyhow::Result<TrainingState> {
        let rank = self.topology.rank;
        if self.engine.schedule().part().is_some() {
            bail!("rank {rank}: a pipeline stage holds a part of the model, not a state to keep");
        }
        let position = self.state.committed;
        let world = self.topology.world;
        let (mut loss, mut correct) = (vec![0.0; world], vec![0.0; world]);
        let seconds = match position.step {
            0 => 0.0,
            _ => {
                let [l, c] = self.state.meter.read(self.engine.backend())?;
                [loss[rank], correct[rank]] = [l as f32, c as f32];
                self.state.meter.train_seconds()
            }
        };
        let whole = (self.engine.host_state())
            .with_context(|| format!("rank {rank}: keeping the state at {position}"))?;
        // A live job sums exactly (`--reproducible`), which refuses every
        // hook with a state of its own.
        Ok(self.state_at(position, whole, (loss, correct, seconds), None, None))
    }
}
