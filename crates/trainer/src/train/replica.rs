//! The state every rank holds bitwise identical to the other ranks training
//! the same parameters: parameters, Adam's moments and step count, and the
//! finiteness guard in front of Adam.

use std::ops::Range;

use core_tensor::Ops;
use core_tensor::ops::GUARD_CLEAR;

use crate::checkpoint::origin::Start;

pub(super) struct Replica<B: Ops> {
    /// The whole model: what forward and evaluation read.
    pub params: B::Storage<f32>,
    /// The gradients and Adam's moments of the parameters this rank trains
    /// (all of them, or its [`Part`]'s).
    pub grads: B::Storage<f32>,
    pub adam_m: B::Storage<f32>,
    pub adam_v: B::Storage<f32>,
    /// Adam updates done so far.
    pub step: u64,
    /// The finiteness guard in front of Adam (`ops::finite`).
    pub guard: B::Storage<u32>,
    /// The part of the model this rank trains, when not the whole (a
    /// pipeline stage).
    pub part: Option<Part<B>>,
}

/// The parameters a rank trains when it trains a part of the model.
pub(super) struct Part<B: Ops> {
    /// Where the part lies in the whole.
    pub range: Range<usize>,
    /// The part's parameters, which the optimizer steps; copied into the
    /// whole on the device after every step ([`Replica::publish`]).
    pub params: B::Storage<f32>,
}

impl<B: Ops> Replica<B> {
    /// The replica of `start` (a whole model), training `trained` of it
    /// (`None`: all).
    pub fn upload(
        backend: &B,
        start: &Start,
        trained: Option<Range<usize>>,
    ) -> anyhow::Result<Self> {
        let range = trained.clone().unwrap_or(0..start.params.len());
        let part = match trained {
            Some(range) => Some(Part {
                params: backend.upload(&start.params[range.clone()])?,
                range,
            }),
            None => None,
        };
        Ok(Self {
            params: backend.upload(&start.params)?,
            grads: backend.zeros(range.len())?,
            adam_m: backend.upload(&start.exp_avg[range.clone()])?,
            adam_v: backend.upload(&start.exp_avg_sq[range])?,
            step: start.optimizer_step,
            guard: backend.upload(&GUARD_CLEAR)?,
            part,
        })
    }

    /// Where element 0 of the gradients (and moments) lies in the model.
    pub fn offset(&self) -> usize {
        self.part.as_ref().map_or(0, |p| p.range.start)
    }

    /// After an optimizer step on a part: the part's new values into the
    /// whole model, which the next forward pass reads.
    pub fn publish(&mut self, backend: &B) -> anyhow::Result<()> {
        if let Some(part) = &self.part {
            backend.copy_into(&part.params, &mut self.params, part.range.start)?;
        }
        Ok(())
    }
}
