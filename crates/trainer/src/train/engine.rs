//! The step engine: one rank's replica and everything that steps it — the
//! schedule that runs the model over a batch, the averaging of the
//! gradients over the replicas, the optimizer, `--accumulate-steps`' sum and
//! `--reproducible`'s exact one — and the collectives over the job's ranks
//! (sums, the whole model from a pipeline's parts, PowerSGD's state).
//!
//! It knows nothing of epochs, stop votes, checkpoint files or ledgers:
//! that is the epoch policy's ([`super::Trainer`]), which tells it what to
//! train and when to gather. Its methods live by concept: `step.rs` (one
//! optimizer step), `guard.rs` (the finiteness guard), `assemble.rs` (the
//! whole model on rank 0's host).

use anyhow::Context;
use core_tensor::Ops;

use super::accumulate::Accumulator;
use super::exact::ExactSum;
use super::optimizer::Optimizer;
use super::replica::Replica;
use super::schedule::Schedule;
use crate::checkpoint::HookState;
use crate::comm_thread::CommThread;
use crate::ddp::Averaging;
use crate::model::Model;

pub(super) struct StepEngine<B: Ops, M: Model<B>> {
    /// First, so it is dropped first: an NCCL hook makes the compute
    /// stream wait for its collectives before the gradients are freed.
    pub averaging: Averaging<B>,
    /// The job's communicator; `None` for one rank.
    pub comm: Option<CommThread>,
    pub backend: B,
    pub model: M,
    pub replica: Replica<B>,
    pub optimizer: Box<dyn Optimizer<B>>,
    pub schedule: Box<dyn Schedule<B, M>>,
    /// The sum of a step's micro-batches (`--accumulate-steps` above 1).
    pub accumulator: Option<Accumulator<B>>,
    /// `--reproducible`: the step's units and their exact sum.
    pub exact: Option<ExactSum>,
}

impl<B: Ops, M: Model<B>> StepEngine<B, M> {
    /// `values` summed over the job's ranks (every rank calls it).
    pub fn sum_over_ranks(&mut self, values: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        match &mut self.comm {
            Some(comm) => comm.sum_f64(values).context("reducing epoch metrics"),
            None => Ok(values),
        }
    }

    /// PowerSGD's state with every rank's error feedback, on rank 0 (every
    /// rank calls it; all have a state or none do: they run alike).
    pub fn hook_state(&mut self) -> anyhow::Result<Option<HookState>> {
        let Some(mine) = self.averaging.powersgd_state()? else {
            return Ok(None);
        };
        let errors = match self.comm.as_mut() {
            Some(comm) => comm.all_gather(mine.error)?.concat(),
            None => mine.error,
        };
        Ok(Some(HookState { q: mine.q, errors }))
    }
}
