//! One epoch: this rank's shard in steps, stop requests and the votes on
//! them, periodic checkpoints, then the epoch's numbers over all ranks and
//! the test set.

use std::time::Instant;

use anyhow::{Context, bail};
use core_tensor::{Ops, rng};

use super::accumulate::{Micro, steps_of};
use super::ledger::{self, CommittedStep};
use super::memory::EpochBatches;
use super::votes::Vote;
use super::{EpochReport, Progress, Regroup, RunOutcome, Running, Trainer};
use crate::checkpoint::Position;
use crate::data::Resumed;
use crate::model::{DropoutSeed, Model};
use crate::monitor::{RankStats, Straggler};
use crate::stop::StopKind;

/// How an epoch ended.
pub(super) enum EpochEnd {
    Trained(EpochReport),
    Stopped(RunOutcome),
}

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    pub(super) fn epoch(
        &mut self,
        epoch: usize,
        progress: &mut dyn Progress,
        after_step: &mut dyn FnMut(&Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<EpochEnd> {
        let rank = self.topology.rank;
        let first_epoch = self.state.first_epoch;
        let resumed = match self.state.resume_at.take() {
            Some(point) if epoch == first_epoch => Some(point),
            Some(_) => bail!(
                "rank {rank}: asked to train epoch {epoch}, but this run resumes in epoch {first_epoch}"
            ),
            None => None,
        };
        let first = resumed.as_ref().map_or(0, |p| p.step);
        let replicas = self.topology.replicas();
        // The micro-batches of a step: its --accumulate-steps, or with
        // --reproducible this replica's units of it.
        let (k, batch) = match self.engine.exact() {
            Some(exact) => exact.batches(),
            None => (self.cfg.accumulate_steps, self.cfg.batch_size),
        };
        // Every optimizer step before a mid-epoch checkpoint holds K
        // micro-batches (only an epoch's last may hold fewer).
        let order = self.order(resumed.as_ref().map(|p| Resumed {
            steps: first * k,
            visited: p.visited.0 as usize,
            replicas: p.visited.1 as usize,
        }));
        let batches = self.engine.start_epoch(&order, epoch as u64, batch)?;
        // The epoch's batches are micro-batches, K to an optimizer step;
        // `--max-steps` counts optimizer steps.
        let groups = steps_of(batches.len(), k, self.cfg.max_steps);
        let steps = groups.len();
        // Rank 0's ledger: the whole job's samples of each step.
        let job_steps = match self.state.ledger {
            Some(_) => {
                let len = self.engine.schedule().fingerprint().samples as usize;
                let plan = (len, epoch as u64);
                let steps = ledger::job_steps(&order, plan, (batch, k), self.cfg.max_steps)?;
                self.record_steps_before(epoch, (first, &steps))?;
                Some(steps)
            }
            None => None,
        };
        let shape = EpochBatches {
            batch,
            samples: batches.iter().sum(),
            max_steps: self.cfg.max_steps.map(|m| m * k),
            local_ranks: self.topology.local_world,
            test_shards: self.test_shards(),
        };
        if first > steps {
            bail!(
                "rank {rank}: the checkpoint is at step {first} of epoch {epoch}, but this run's epochs have {steps} steps (another --max-steps?)"
            );
        }
        // The micro-batches this run trains.
        let todo = match (groups.get(first), groups.last()) {
            (Some(from), Some(to)) => from.start..to.end,
            _ => 0..0,
        };
        (self.engine.prepare((&batches[todo], &shape)))
            .with_context(|| format!("rank {rank}: preparing epoch {epoch}'s batches"))?;
        let counts = self.topology.counts_samples();
        let images_before = match resumed.as_ref().map(|p| p.visited) {
            // Begun on another number of replicas: all its images on rank
            // 0, as the epoch's numbers add up every rank's.
            Some((visited, by)) if by != replicas as u64 => match rank {
                0 => visited,
                _ => 0,
            },
            _ if counts => match first.checked_sub(1) {
                Some(last) => batches[..groups[last].end].iter().map(|&n| n as u64).sum(),
                None => 0,
            },
            _ => 0,
        };
        (self.state.meter).start(self.engine.backend(), resumed.as_ref(), images_before)?;
        // A live job's member goes on with its own share of the epoch's
        // numbers (the lost ranks' shares are lost with them).
        let carried = self.state.live.carried.take();
        if let Some(share) = carried.filter(|s| s.epoch == epoch as u64) {
            self.state.meter.carry(self.engine.backend(), &share)?;
        }
        // The epoch's monitoring leaves out setup and the last checkpoint.
        self.state.monitor.take();
        progress.start_epoch(epoch, steps, first);
        self.state.stop.training_begins();
        for (s, group) in groups.into_iter().enumerate().skip(first) {
            let at = Position {
                epoch: epoch as u64,
                step: s as u64 + 1,
            };
            let request = self.state.stop.requested();
            if request == Some(StopKind::Interrupt) {
                progress.finish_epoch();
                return Ok(EpochEnd::Stopped(RunOutcome::Interrupted { at }));
            }
            let first_index = group.start;
            let micro: Vec<Micro> = group
                .map(|index| Micro {
                    index,
                    samples: batches[index],
                    dropout_seed: self.dropout_seed(epoch, (s, index - first_index), index),
                })
                .collect();
            let samples: usize = micro.iter().map(|m| m.samples).sum();
            if counts {
                self.state.meter.images += samples as u64;
            }
            self.state.meter.visited += (samples * replicas) as u64;
            let in_step = || format!("rank {rank}: epoch {epoch}, step {}", s + 1);
            let vote = match request {
                Some(StopKind::Preempt) => Vote::Stop,
                _ if self.newcomers_vote().with_context(in_step)? => Vote::Regroup,
                _ => Vote::GoOn,
            };
            (self.state.votes)
                .cast(self.engine.global_step() + 1, vote)
                .with_context(in_step)?;
            self.engine
                .train_step(&micro, &mut self.state.meter, &mut self.state.timer)
                .with_context(in_step)?;
            self.state.committed = at;
            if let (Some(ledger), Some(job)) = (&mut self.state.ledger, &job_steps) {
                let step = CommittedStep {
                    global_step: self.engine.global_step(),
                    epoch: at.epoch,
                    step: at.step,
                    samples: &job[s],
                };
                ledger.committed(&step).with_context(in_step)?;
            }
            progress.step();
            self.report_running(progress)?;
            match self.state.votes.count(vote).with_context(in_step)? {
                Vote::GoOn => {}
                Vote::Stop => {
                    progress.finish_epoch();
                    // No rank returns before rank 0's checkpoint is on disk
                    // (under srun, one task's exit may kill the others).
                    let saved = self.save_checkpoint(at)?;
                    return Ok(EpochEnd::Stopped(RunOutcome::Preempted { at, saved }));
                }
                Vote::Regroup => {
                    progress.finish_epoch();
                    let why = Regroup::Newcomers;
                    return Ok(EpochEnd::Stopped(RunOutcome::Regroup { at, why }));
                }
            }
            // The epoch's last step is followed by the end-of-epoch checkpoint.
            if s + 1 < steps && self.checkpoint_due() {
                let began = Instant::now();
                self.save_checkpoint(at)?;
                self.state.meter.pause_since(began);
            }
            after_step(self)?;
        }
        self.engine
            .check_guard()
            .with_context(|| format!("rank {rank}: end of epoch {epoch}"))?;
        let meter = &self.state.meter;
        let [loss_sum, correct] = meter.read(self.engine.backend())?;
        let local = vec![loss_sum, correct, meter.images as f64];
        let [loss_sum, correct, images] = self.engine.sum_over_ranks(local)?[..] else {
            unreachable!("three values in, three out")
        };
        // After the ranks met: the epoch ends for all when the last ends.
        let train_seconds = self.state.meter.train_seconds();
        progress.finish_epoch();
        let eval_began = Instant::now();
        let test_accuracy = self.evaluate()?;
        let trained = (steps - first).max(1) as f64;
        let ranks = self
            .gather_rank_stats(eval_began.elapsed().as_secs_f64(), trained)
            .with_context(|| format!("rank {rank}: gathering epoch {epoch}'s monitoring"))?;
        Ok(EpochEnd::Trained(EpochReport {
            epoch,
            epochs: self.cfg.epochs,
            loss: loss_sum / images,
            metric: self.engine.model().metric(),
            accuracy: self.engine.model().metric().value(correct, images),
            test_accuracy,
            train_seconds,
            steps,
            images: images as u64,
            global_step: self.engine.global_step(),
            // A pipeline's stages do different work: compare each rank
            // with the same stage of the other replicas.
            straggler: Straggler::find(&ranks, self.topology.stages),
            ranks,
        }))
    }

    /// Tells the ledger the committed steps before `first` of `epoch` (of
    /// the epoch's `steps`) that it lacks: a generation of a live job whose
    /// rank 0 was lost may start after a step that rank 0 committed but
    /// did not live to record.
    fn record_steps_before(
        &mut self,
        epoch: usize,
        (first, steps): (usize, &[Vec<u32>]),
    ) -> anyhow::Result<()> {
        // Only a live job's rank 0 (one that watches the membership) may
        // start after steps no one recorded.
        let (Some(ledger), Some(_)) = (self.state.ledger.as_mut(), &self.state.live.membership)
        else {
            return Ok(());
        };
        let before = self.engine.global_step() - first as u64;
        for (s, samples) in steps.iter().enumerate().take(first) {
            let global_step = before + s as u64 + 1;
            if global_step > ledger.last_step() {
                ledger.committed(&CommittedStep {
                    global_step,
                    epoch: epoch as u64,
                    step: s as u64 + 1,
                    samples,
                })?;
            }
        }
        Ok(())
    }

    /// The dropout masks of micro-batch `index` of the epoch, the `j`-th of
    /// step `s`: drawn per rank and micro-batch, or with `--reproducible`
    /// per step of the global order, at the batch's rows in it, so that a
    /// sample's masks do not depend on which rank trains it.
    fn dropout_seed(&self, epoch: usize, (s, j): (usize, usize), index: usize) -> DropoutSeed {
        let (seed, epoch) = (self.cfg.seed, epoch as u64);
        match self.engine.exact() {
            Some(exact) => DropoutSeed {
                // Unlike the other modes', no rank enters the seed; the
                // leading word keeps its streams apart from theirs.
                seed: rng::derive_seed(seed, &[u64::MAX, epoch, s as u64]),
                first_row: exact.first_row(j),
            },
            None => {
                let rank = self.topology.rank as u64;
                DropoutSeed::new(rng::derive_seed(seed, &[rank, epoch, index as u64]))
            }
        }
    }

    /// Hands `progress` this rank's running loss and accuracy at the steps
    /// it asks for (host-memory backends only: see [`Progress::running_every`]).
    fn report_running(&self, progress: &mut dyn Progress) -> anyhow::Result<()> {
        let due = progress.running_every().is_some_and(|every| {
            B::IN_HOST_MEMORY && self.engine.global_step().is_multiple_of(every)
        }) && self.topology.counts_samples();
        if due {
            let meter = &self.state.meter;
            let [loss_sum, correct] = meter.read(self.engine.backend())?;
            let images = meter.images as f64;
            progress.running(&Running {
                global_step: self.engine.global_step(),
                loss: loss_sum / images,
                accuracy: self.engine.model().metric().value(correct, images),
                images: meter.images * self.topology.replicas() as u64,
                train_seconds: meter.train_seconds(),
            });
        }
        Ok(())
    }

    /// Every rank's monitoring and phase times for the epoch, in rank order
    /// (one all-reduce; see [`RankStats::table_row`]).
    /// `steps` were trained this epoch.
    fn gather_rank_stats(
        &mut self,
        eval_seconds: f64,
        steps: f64,
    ) -> anyhow::Result<Vec<RankStats>> {
        let mine = RankStats {
            usage: self.state.monitor.take(),
            phases: self.state.timer.take()?,
            eval_seconds,
            grad_bytes_per_step: self.engine.take_sent_bytes() as f64 / steps,
        };
        let row = mine.table_row(self.topology.rank, self.topology.world);
        let table = self.engine.sum_over_ranks(row)?;
        Ok(RankStats::from_table(&table))
    }
}
