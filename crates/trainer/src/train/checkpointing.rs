//! What a checkpoint gathers from the ranks, and when one is due.

use std::path::PathBuf;

use anyhow::Context;
use core_tensor::Ops;

use super::Trainer;
use crate::checkpoint::{Position, TrainingState};
use crate::model::Model;

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// Whether `--checkpoint-every` asks for a checkpoint after this step.
    pub(super) fn checkpoint_due(&self) -> bool {
        let every = self.checkpoints.as_ref().and_then(|c| c.every);
        every.is_some_and(|n| self.replica.step % n == 0)
    }

    /// Checkpoints at `position`, if checkpoints are on. Every rank calls it
    /// (mid-epoch, the ranks' running metrics are gathered); rank 0 writes
    /// and returns the checkpoint's directory.
    pub(super) fn save_checkpoint(
        &mut self,
        position: Position,
    ) -> anyhow::Result<Option<PathBuf>> {
        if self.checkpoints.is_none() {
            return Ok(None);
        }
        self.check_guard()
            .with_context(|| format!("rank {}: before checkpointing at {position}", self.rank))?;
        let (epoch_loss_sum, epoch_correct, train_seconds) = if position.step == 0 {
            (vec![0.0; self.world_size], vec![0.0; self.world_size], 0.0)
        } else {
            let (loss, correct) = self.gather_epoch_metrics()?;
            (loss, correct, self.meter.train_seconds())
        };
        let whole = self
            .whole_state()
            .with_context(|| format!("rank {}: checkpointing at {position}", self.rank))?;
        let (Some(checkpoints), Some([params, exp_avg, exp_avg_sq])) =
            (self.checkpoints.as_ref(), whole)
        else {
            return Ok(None);
        };
        let state = TrainingState {
            position,
            optimizer_step: self.replica.step,
            params,
            exp_avg,
            exp_avg_sq,
            epoch_loss_sum,
            epoch_correct,
            epoch_train_seconds: train_seconds,
            settings: self.cfg.settings(self.world_size, self.model.kind()),
        };
        let saved = checkpoints
            .dir
            .save(&state, self.model.layout())
            .with_context(|| format!("rank 0: checkpointing at {position}"))?;
        Ok(Some(saved))
    }

    /// Every rank's running loss sum and correct count, exactly: each rank
    /// fills its own slots, and f32 → f64 → f32 plus zeros loses nothing.
    fn gather_epoch_metrics(&mut self) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
        let n = self.world_size;
        let mut mine = vec![0.0; 2 * n];
        [mine[self.rank], mine[n + self.rank]] = self.meter.read(&self.backend)?;
        let all = self.sum_over_ranks(mine)?;
        Ok((
            all[..n].iter().map(|&x| x as f32).collect(),
            all[n..].iter().map(|&x| x as f32).collect(),
        ))
    }
}
