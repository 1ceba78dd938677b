//! The step engine: one rank's replica and everything that steps it — the
//! schedule that runs the model over a batch, the averaging of the
//! gradients over the replicas, the optimizer, `--accumulate-steps`' sum and
//! `--reproducible`'s exact one — and the collectives over the job's ranks
//! (sums, the whole model from a pipeline's parts, PowerSGD's state).
//!
//! It knows nothing of epochs, stop votes, checkpoint files or ledgers:
//! that is the epoch policy's ([`super::Trainer`]), which tells it what to
//! train and when to gather. Its parts are private: the policy reads them
//! through the accessors below and asks the engine to act (start an epoch,
//! evaluate, meet the other ranks), so that only the engine steps the
//! replica. Its methods live by concept: `step.rs` (one optimizer step),
//! `guard.rs` (the finiteness guard), `assemble.rs` (the whole model on
//! rank 0's host).

use anyhow::Context;
use core_tensor::Ops;

mod assemble;
mod guard;
mod step;

pub(super) use guard::GUARD_READ_EVERY;

use super::accumulate::Accumulator;
use super::exact::ExactSum;
use super::memory::EpochBatches;
use super::optimizer::Optimizer;
use super::replica::Replica;
use super::schedule::Schedule;
use crate::checkpoint::HookState;
use crate::comm_thread::CommThread;
use crate::data::Order;
use crate::ddp::Averaging;
use crate::model::Model;

pub(super) struct StepEngine<B: Ops, M: Model<B>> {
    /// First, so it is dropped first: an NCCL hook makes the compute
    /// stream wait for its collectives before the gradients are freed.
    averaging: Averaging<B>,
    /// The job's communicator; `None` for one rank.
    comm: Option<CommThread>,
    backend: B,
    model: M,
    replica: Replica<B>,
    optimizer: Box<dyn Optimizer<B>>,
    schedule: Box<dyn Schedule<B, M>>,
    /// The sum of a step's micro-batches (`--accumulate-steps` above 1).
    accumulator: Option<Accumulator<B>>,
    /// `--reproducible`: the step's units and their exact sum.
    exact: Option<ExactSum>,
}

impl<B: Ops, M: Model<B>> StepEngine<B, M> {
    /// The engine of a replica that `schedule` runs `model` over, on
    /// `backend`, with the averaging over the job's ranks (`comm`) and the
    /// sum of a step's micro-batches (`accumulator`) or units (`exact`).
    pub fn new(
        (backend, model, schedule): (B, M, Box<dyn Schedule<B, M>>),
        (replica, optimizer): (Replica<B>, Box<dyn Optimizer<B>>),
        (averaging, comm): (Averaging<B>, Option<CommThread>),
        (accumulator, exact): (Option<Accumulator<B>>, Option<ExactSum>),
    ) -> Self {
        Self {
            averaging,
            comm,
            backend,
            model,
            replica,
            optimizer,
            schedule,
            accumulator,
            exact,
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    /// Optimizer steps taken (those of the run resumed included).
    pub fn global_step(&self) -> u64 {
        self.replica.step
    }

    /// The schedule, to ask it about the data and the part trained; the
    /// engine alone runs it.
    pub fn schedule(&self) -> &dyn Schedule<B, M> {
        &*self.schedule
    }

    /// `--reproducible`'s plan of units and its exact sum (`None`: the
    /// default summation).
    pub fn exact(&self) -> Option<&ExactSum> {
        self.exact.as_ref()
    }

    /// Whether this is the job's only rank (no communicator).
    pub fn alone(&self) -> bool {
        self.comm.is_none()
    }

    /// [`Schedule::start_epoch`] with this engine's backend.
    pub fn start_epoch(
        &mut self,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>> {
        self.schedule
            .start_epoch(&self.backend, order, epoch, batch)
    }

    /// [`Schedule::prepare`] with this engine's backend and model.
    pub fn prepare(&mut self, batches: (&[usize], &EpochBatches)) -> anyhow::Result<()> {
        (self.schedule).prepare(&self.backend, &self.model, batches)
    }

    /// The model's metric over the test samples `orders` give this rank,
    /// at the current parameters, into `sum`.
    pub fn evaluate(&mut self, orders: &[Order], sum: &mut B::Storage<f32>) -> anyhow::Result<()> {
        let at = (&self.replica.params, orders);
        (self.schedule).evaluate(&self.backend, &self.model, at, sum)
    }

    /// The gradient bytes this rank sent since it was asked last.
    pub fn take_sent_bytes(&mut self) -> u64 {
        let exact = self.exact.as_mut().map_or(0, |e| e.take_sent_bytes());
        self.averaging.take_sent_bytes() + exact
    }

    /// Whether every rank says `done` (every rank calls it).
    pub fn all_say(&mut self, done: bool) -> anyhow::Result<bool> {
        match &mut self.comm {
            Some(comm) => {
                let all = comm.sum_f64(vec![f64::from(u8::from(done))])?;
                Ok(all[0] == comm.world_size() as f64)
            }
            None => Ok(done),
        }
    }

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
