//! The state every rank holds bitwise identical to the other ranks training
//! the same parameters: parameters, Adam's moments and step count, and the
//! finiteness guard in front of Adam.

use std::ops::Range;

use core_tensor::Ops;
use core_tensor::ops::GUARD_CLEAR;

use crate::checkpoint::origin::Start;

pub(super) struct Replica<B: Ops> {
    /// The parameters this rank trains: the whole model, or its part (a
    /// pipeline stage's), which is all its forward pass reads. Their
    /// gradients and Adam's moments, of the same length.
    pub params: B::Storage<f32>,
    pub grads: B::Storage<f32>,
    pub adam_m: B::Storage<f32>,
    pub adam_v: B::Storage<f32>,
    /// Adam updates done so far.
    pub step: u64,
    /// The finiteness guard in front of Adam (`ops::finite`).
    pub guard: B::Storage<u32>,
    /// Where the parameters lie in the whole model, when they are a part.
    pub part: Option<Range<usize>>,
}

impl<B: Ops> Replica<B> {
    /// The replica of `start` (a whole model, on the host), holding
    /// `trained` of it (`None`: all): only that range goes to the device.
    pub fn upload(
        backend: &B,
        start: &Start,
        trained: Option<Range<usize>>,
    ) -> anyhow::Result<Self> {
        let range = trained.clone().unwrap_or(0..start.params.len());
        Ok(Self {
            params: backend.upload(&start.params[range.clone()])?,
            grads: backend.zeros(range.len())?,
            adam_m: backend.upload(&start.exp_avg[range.clone()])?,
            adam_v: backend.upload(&start.exp_avg_sq[range])?,
            step: start.optimizer_step,
            guard: backend.upload(&GUARD_CLEAR)?,
            part: trained,
        })
    }

    /// The step number the finiteness guard records for the next update
    /// (`step`, once incremented for it; saturating at `u32::MAX`).
    pub fn guard_step(&self) -> u32 {
        u32::try_from(self.step).unwrap_or(u32::MAX)
    }

    /// Where element 0 of the parameters (gradients, moments) lies in the
    /// model.
    pub fn offset(&self) -> usize {
        self.part.as_ref().map_or(0, |r| r.start)
    }
}
