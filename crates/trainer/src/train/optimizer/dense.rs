//! Adam and SGD over the whole buffer, behind a guard that reads the loss
//! and every gradient.

use core_tensor::Ops;
use core_tensor::ops::AdamConfig;

use super::{Optimizer, StepRows};
use crate::train::replica::Replica;

/// PyTorch's `torch.optim.Adam`.
pub struct Adam(pub AdamConfig);

/// `torch.optim.SGD` without momentum, at this learning rate.
pub struct Sgd(pub f32);

impl<B: Ops> Optimizer<B> for Adam {
    fn step(
        &mut self,
        b: &B,
        r: &mut Replica<B>,
        loss: &B::Storage<f32>,
        _: StepRows<'_, B>,
    ) -> anyhow::Result<()> {
        b.guard_finite(r.guard_step(), loss, &r.grads, &mut r.guard)?;
        let scalars = self.0.scalars(r.step);
        Ok(b.adam_step(
            &scalars,
            &mut r.params,
            &r.grads,
            &mut r.adam_m,
            &mut r.adam_v,
            &r.guard,
        )?)
    }
}

impl<B: Ops> Optimizer<B> for Sgd {
    fn step(
        &mut self,
        b: &B,
        r: &mut Replica<B>,
        loss: &B::Storage<f32>,
        _: StepRows<'_, B>,
    ) -> anyhow::Result<()> {
        b.guard_finite(r.guard_step(), loss, &r.grads, &mut r.guard)?;
        Ok(b.sgd_step(self.0, &mut r.params, &r.grads, &r.guard)?)
    }
}
