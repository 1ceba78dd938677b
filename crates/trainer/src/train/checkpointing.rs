//! What a checkpoint gathers from the ranks, and when one is due.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use core_tensor::Ops;

use super::Trainer;
use crate::checkpoint::{HookState, Position, TrainingState};
use crate::model::Model;

/// The longest pause between the ranks' meetings while rank 0 writes a
/// checkpoint: far under any sensible --timeout, and a few all-reduces of
/// one value per second are nothing beside a save.
const HEARTBEAT: Duration = Duration::from_millis(100);

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// Whether `--checkpoint-every` asks for a checkpoint after this step.
    pub(super) fn checkpoint_due(&self) -> bool {
        let every = self.state.checkpoints.as_ref().and_then(|c| c.every);
        every.is_some_and(|n| self.engine.global_step().is_multiple_of(n))
    }

    /// Checkpoints at `position`, if checkpoints are on. Every rank calls it
    /// (mid-epoch, the ranks' running metrics are gathered); rank 0 writes
    /// and returns the checkpoint's directory, and no rank returns before
    /// the checkpoint is on disk.
    pub(super) fn save_checkpoint(
        &mut self,
        position: Position,
    ) -> anyhow::Result<Option<PathBuf>> {
        if self.state.checkpoints.is_none() {
            return Ok(None);
        }
        let (rank, world) = (self.topology.rank, self.topology.world);
        self.engine
            .check_guard()
            .with_context(|| format!("rank {rank}: before checkpointing at {position}"))?;
        let (epoch_loss_sum, epoch_correct, train_seconds) = if position.step == 0 {
            (vec![0.0; world], vec![0.0; world], 0.0)
        } else {
            let (loss, correct) = self.gather_epoch_metrics()?;
            (loss, correct, self.state.meter.train_seconds())
        };
        let whole = self
            .engine
            .whole_state(rank)
            .with_context(|| format!("rank {rank}: checkpointing at {position}"))?;
        // Recorded only where it does not follow from the position (see
        // `TrainingState::epoch_visited`).
        let visited = self.state.meter.visited;
        let per_step = self.cfg.batch_size * self.cfg.accumulate_steps * self.topology.replicas();
        let in_this_layout = position.step * per_step as u64;
        let epoch_visited = (position.step > 0 && visited != in_this_layout).then_some(visited);
        let hook = self.engine.hook_state().with_context(|| {
            format!("rank {rank}: checkpointing PowerSGD's state at {position}")
        })?;
        let metrics = (epoch_loss_sum, epoch_correct, train_seconds);
        let state = whole.map(|whole| self.state_at(position, whole, metrics, epoch_visited, hook));
        let Some(checkpoints) = self.state.checkpoints.as_ref() else {
            return Ok(None);
        };
        // Its own copy: the engine meets the other ranks while it writes.
        let layout = self.engine.model().layout().clone();
        let write = || {
            state
                .map(|state| checkpoints.dir.save(&state, &layout))
                .transpose()
                .with_context(|| format!("rank 0: checkpointing at {position}"))
        };
        if self.engine.alone() {
            return write();
        }
        let engine = &mut self.engine;
        // The ranks keep meeting while rank 0 writes, each meeting well
        // within --timeout, so that a slow file system (a save longer than
        // --timeout) never reads as a lost rank.
        std::thread::scope(|scope| {
            let writer = scope.spawn(write);
            let mut pause = Duration::from_millis(5);
            loop {
                let all_done = engine.all_say(writer.is_finished()).with_context(|| {
                    format!("rank {rank}: waiting for rank 0's checkpoint at {position}")
                })?;
                if all_done {
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(HEARTBEAT);
            }
            writer
                .join()
                .unwrap_or_else(|_| Err(anyhow!("rank 0: the checkpoint writer panicked")))
        })
    }

    /// The state a checkpoint at `position` holds: the `whole` parameters
    /// and Adam moments, every rank's running loss and correct sums and
    /// rank 0's seconds of the epoch, the samples visited where they do
    /// not follow from the position, and the hook's state.
    pub(super) fn state_at(
        &self,
        position: Position,
        [params, exp_avg, exp_avg_sq]: [Vec<f32>; 3],
        (epoch_loss_sum, epoch_correct, epoch_train_seconds): (Vec<f32>, Vec<f32>, f64),
        epoch_visited: Option<u64>,
        hook: Option<HookState>,
    ) -> TrainingState {
        let layout = (self.topology.world, self.topology.stages);
        TrainingState {
            position,
            optimizer_step: self.engine.global_step(),
            params,
            exp_avg,
            exp_avg_sq,
            epoch_loss_sum,
            epoch_correct,
            epoch_train_seconds,
            epoch_visited,
            settings: (self.cfg).settings(
                layout,
                self.engine.model().kind(),
                self.engine.schedule().fingerprint(),
                (self.state.checkpoints.as_ref()).and_then(|c| c.record.clone()),
            ),
            hook,
        }
    }

    /// Every rank's running loss sum and correct count, exactly: each rank
    /// fills its own slots, and f32 → f64 → f32 plus zeros loses nothing.
    fn gather_epoch_metrics(&mut self) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
        let (n, rank) = (self.topology.world, self.topology.rank);
        let mut mine = vec![0.0; 2 * n];
        [mine[rank], mine[n + rank]] = self.state.meter.read(self.engine.backend())?;
        let all = self.engine.sum_over_ranks(mine)?;
        Ok((
            all[..n].iter().map(|&x| x as f32).collect(),
            all[n..].iter().map(|&x| x as f32).collect(),
        ))
    }
}
