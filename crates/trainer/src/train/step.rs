//! One optimizer step, top to bottom.

use anyhow::Context;
use core_tensor::Ops;

use super::Trainer;
use super::guard::GUARD_READ_EVERY;
use crate::model::{Mode, Model, NoSync, Optimizer};
use crate::phases::Phase;

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// One optimizer step on batch `step` (of `n` samples) of the epoch the
    /// training data started last. `stop_vote`
    /// travels with the gradients where that costs nothing (see
    /// [`crate::ddp::CommHook::carry_vote`]).
    pub(super) fn train_step(
        &mut self,
        step: usize,
        n: usize,
        dropout_seed: u64,
        stop_vote: bool,
    ) -> anyhow::Result<()> {
        let (b, model, replica, timer) = (
            &self.backend,
            &self.model,
            &mut self.replica,
            &mut self.timer,
        );
        let mut buffers = match self.buffers.remove(&n) {
            Some(buffers) => buffers,
            None => super::room::new_buffers(model, b, n, true)?,
        };

        // 1. The batch, filled in by the model's data set.
        timer.enter(Phase::Data)?;
        self.train.fill(b, step, &mut buffers)?;

        // 2. Forward, the running metrics, and the loss gradient.
        timer.enter(Phase::Forward)?;
        model.forward(
            b,
            &mut buffers,
            &replica.params,
            Mode::Train { dropout_seed },
        )?;
        if let Some(split) = model.forward_split(b)? {
            timer.split_forward(&split);
        }
        model.metric_sum(b, &buffers, &mut self.meter.correct)?;
        model.loss(b, &mut buffers, &mut self.meter.loss_sum)?;

        // 3. Backward; each bucket of gradients starts its all-reduce as
        //    soon as backward has written it, then the step waits for all.
        timer.enter(Phase::Backward)?;
        let (params, grads) = (&replica.params, &mut replica.grads);
        let union = match &mut self.reducer {
            None => {
                model.backward(b, &mut buffers, params, grads, dropout_seed, &mut NoSync)?;
                None
            }
            Some(reducer) => {
                reducer.carry_vote(stop_vote);
                model.backward(b, &mut buffers, params, grads, dropout_seed, reducer)?;
                timer.enter(Phase::AllReduceWait)?;
                reducer.finish(b, grads, model.sparse_rows(&buffers))?
            }
        };
        // The rows the lazy update moves: every rank's (the union), or with
        // no other rank this one's.
        let lazy_rows = match (&self.lazy_adam, union) {
            (None, _) => None,
            (Some(_), Some(union)) => Some(union),
            (Some(_), None) => Some(
                model
                    .sparse_rows(&buffers)
                    .context("--sparse-adam: the model names no rows of its table")?
                    .to_vec(),
            ),
        };
        self.buffers.insert(n, buffers);

        // 4. The optimizer, behind the guard that skips it on a non-finite
        //    loss or gradient (on the device: the host looks only now and
        //    then). The lazy update guards what it reads itself: the loss,
        //    the dense gradients and its rows, not the whole tables.
        timer.enter(Phase::Optimizer)?;
        replica.step += 1;
        let loss = &self.meter.loss_sum;
        match (model.optimizer(), &mut self.lazy_adam, lazy_rows) {
            (Optimizer::Adam, Some(lazy), Some(rows)) => {
                let on_device = self.reducer.as_ref().and_then(|r| r.row_union_on_device());
                lazy.step(b, &self.cfg.adam, &rows, on_device, loss, replica)?
            }
            (optimizer, ..) => {
                let step = replica.guard_step();
                b.guard_finite(step, loss, &replica.grads, &mut replica.guard)?;
                match optimizer {
                    Optimizer::Adam => b.adam_step(
                        &self.cfg.adam.scalars(replica.step),
                        &mut replica.params,
                        &replica.grads,
                        &mut replica.adam_m,
                        &mut replica.adam_v,
                        &replica.guard,
                    )?,
                    Optimizer::Sgd => b.sgd_step(
                        self.cfg.adam.lr as f32,
                        &mut replica.params,
                        &replica.grads,
                        &replica.guard,
                    )?,
                }
            }
        }
        timer.end_step()?;
        if B::IN_HOST_MEMORY || replica.step % GUARD_READ_EVERY == 0 {
            self.check_guard()?;
            // The guard read waited for the device: the step marks are
            // ready to read without another synchronisation.
            self.timer.harvest()?;
        }
        Ok(())
    }
}
