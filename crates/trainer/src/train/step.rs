//! One optimizer step, top to bottom.

use core_tensor::Ops;

use super::Trainer;
use super::guard::GUARD_READ_EVERY;
use super::optimizer::StepRows;
use super::schedule::Pass;
use crate::model::Model;
use crate::phases::Phase;

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// One optimizer step on batch `step` (of `n` samples) of the epoch the
    /// training data started last.
    pub(super) fn train_step(
        &mut self,
        (step, n): (usize, usize),
        dropout_seed: u64,
    ) -> anyhow::Result<()> {
        let (b, model, replica) = (&self.backend, &self.model, &mut self.replica);
        let (meter, timer) = (&mut self.state.meter, &mut self.state.timer);

        // 1. The schedule fills the batch and runs the model's passes over
        //    it; each bucket of gradients starts its averaging as soon as
        //    backward has written it.
        let pass = Pass {
            params: &replica.params,
            grads: &mut replica.grads,
            dropout_seed,
            loss_sum: &mut meter.loss_sum,
            metric_sum: &mut meter.correct,
            timer,
            hook: self.averaging.hook(),
        };
        self.schedule.train(b, model, (step, n), pass)?;

        // 2. Wait for the averages (and the row tables' exchange, which
        //    names the rows every replica's batch moved).
        if self.averaging.is_active() {
            timer.enter(Phase::AllReduceWait)?;
        }
        let own_rows = self.schedule.batch_rows(model, n);
        let union = self.averaging.finish(b, &mut replica.grads, own_rows)?;

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
            self.state.timer.harvest()?;
        }
        Ok(())
    }
}
