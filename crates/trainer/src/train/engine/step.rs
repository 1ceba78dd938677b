//! One optimizer step, top to bottom.

use core_tensor::Ops;

use super::StepEngine;
use super::guard::GUARD_READ_EVERY;
use crate::model::{GradsReady, Model};
use crate::phases::{Phase, StepTimer};
use crate::train::accumulate::Micro;
use crate::train::meter::EpochMeter;
use crate::train::optimizer::StepRows;
use crate::train::schedule::Pass;

impl<B: Ops, M: Model<B>> StepEngine<B, M> {
    /// One optimizer step over `micro`, its micro-batches of the epoch the
    /// training data started last (one, without `--accumulate-steps`),
    /// its loss and metric summed into the epoch's `meter`, its phases
    /// timed by `timer`.
    pub fn train_step(
        &mut self,
        micro: &[Micro],
        meter: &mut EpochMeter<B>,
        timer: &mut StepTimer<B>,
    ) -> anyhow::Result<()> {
        let (b, model, replica) = (&self.backend, &self.model, &mut self.replica);
        let step = replica.step;
        self.averaging.begin_step(step);

        // 1. The schedule fills each batch and runs the model's passes over
        //    it; each bucket of gradients starts its averaging as soon as
        //    backward has written it (after the last micro-batch, summed).
        let total: usize = micro.iter().map(|m| m.samples).sum();
        let len = B::len(&replica.grads);
        let schedule = &mut self.schedule;
        let mut run = |m: &Micro, grads: &mut B::Storage<f32>, hook: &mut dyn GradsReady<B>| {
            let pass = Pass {
                params: &replica.params,
                grads,
                dropout_seed: m.dropout_seed,
                loss_sum: &mut meter.loss_sum,
                metric_sum: &mut meter.correct,
                timer: &mut *timer,
                hook,
            };
            schedule.train(b, model, (m.index, m.samples), pass)
        };
        let grads = &mut replica.grads;
        match self.exact.as_mut() {
            // --reproducible: each unit alone, kept, then their exact sum
            //  over the replicas.
            Some(exact) => {
                for m in micro {
                    run(m, grads, &mut exact.stashing())?;
                }
                timer.enter(Phase::AllReduceWait)?;
                // NCCL's int64 all-reduce where the gradients' hook has
                // it, else the host's over the replicas.
                let over = self.averaging.integers(self.comm.as_mut());
                exact.finish(b, grads, over)?;
            }
            None => {
                for (at, m) in micro.iter().enumerate() {
                    match self.accumulator.as_mut() {
                        None => run(m, grads, self.averaging.hook())?,
                        Some(acc) => {
                            let weight = (m.samples as f64 / total as f64) as f32;
                            let place = (at, micro.len(), weight);
                            let mut adding =
                                acc.micro_batch(b, place, len, self.averaging.hook())?;
                            run(m, grads, &mut adding)?;
                            adding.finish(b, grads)?;
                        }
                    }
                }
                // 2. Wait for the averages (and the row tables' exchange,
                //    which names the rows every replica's batch moved).
                if self.averaging.is_active() {
                    timer.enter(Phase::AllReduceWait)?;
                }
            }
        }
        let n = micro.last().map_or(0, |m| m.samples);
        let own_rows = self.schedule.batch_rows(model, n);
        let union = match self.exact {
            Some(_) => None,
            None => self.averaging.finish(b, &mut replica.grads, own_rows)?,
        };

        // 3. The optimizer, behind the guard that skips it on a non-finite
        //    loss or gradient (on the device: the host looks only now and
        //    then).
        timer.enter(Phase::Optimizer)?;
        replica.step += 1;
        let rows = StepRows {
            ids: union.as_deref().or(own_rows),
            on_device: self.averaging.row_union_on_device(),
        };
        (self.optimizer).step(b, replica, &meter.loss_sum, rows)?;
        timer.end_step()?;
        if B::IN_HOST_MEMORY || replica.step % GUARD_READ_EVERY == 0 {
            self.check_guard()?;
            // The guard read waited for the device: the step marks are
            // ready to read without another synchronisation.
            timer.harvest()?;
        }
        Ok(())
    }
}
