//! The state every rank holds bitwise identical: parameters, Adam's moments
//! and step count, and the finiteness guard in front of Adam.

use core_tensor::Ops;
use core_tensor::ops::GUARD_CLEAR;

use crate::checkpoint::origin::Start;

pub(super) struct Replica<B: Ops> {
    pub params: B::Storage<f32>,
    pub grads: B::Storage<f32>,
    pub adam_m: B::Storage<f32>,
    pub adam_v: B::Storage<f32>,
    /// Adam updates done so far.
    pub step: u64,
    /// The finiteness guard in front of Adam (`ops::finite`).
    pub guard: B::Storage<u32>,
}

impl<B: Ops> Replica<B> {
    pub fn upload(backend: &B, start: &Start) -> anyhow::Result<Self> {
        Ok(Self {
            params: backend.upload(&start.params)?,
            grads: backend.zeros(start.params.len())?,
            adam_m: backend.upload(&start.exp_avg)?,
            adam_v: backend.upload(&start.exp_avg_sq)?,
            step: start.optimizer_step,
            guard: backend.upload(&GUARD_CLEAR)?,
        })
    }
}
