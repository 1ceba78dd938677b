//! What a rank's step calls to average its gradients with its replicas':
//! the dense gradients in buckets through a [`CommHook`] (launched as
//! backward writes them, through [`Averaging::hook`]), and a model's row
//! tables through the sparse exchange after them; nothing at all with one
//! replica.

use std::ops::Range;

use anyhow::Context;
use core_tensor::Ops;

use super::powersgd::{PowerSgd, PowerSgdState};
use super::{
    CommHook, CommHookChoice, HostHook, HostWire, IntegerReduce, Reducer, SparseExchange,
    SparseGrads, plan_buckets,
};
use crate::comm_thread::CommThread;
use crate::model::{GradsReady, Model, NoSync};

/// Who averages a rank's gradients with its replicas' (see
/// `crate::train::Setup`).
pub enum AverageOver<B: Ops> {
    /// The job's communicator, through host memory: every rank is a
    /// replica.
    Job,
    /// A pipeline stage's data-parallel group, through host memory.
    Group(CommThread),
    /// A hook on the device (NCCL).
    Device(Box<dyn CommHook<B>>),
}

/// A rank's averaging, planned once.
pub struct Averaging<B: Ops> {
    /// First, so it is dropped first: an NCCL hook makes the compute
    /// stream wait for its collectives before the gradients are freed.
    dense: Option<Reducer<B>>,
    /// The row tables, exchanged apart from the buckets.
    rows: Option<SparseExchange<B>>,
    /// The group whose thread serves the host hook, joined after it.
    group: Option<CommThread>,
    /// What backward tells when there is nothing to average.
    alone: NoSync,
}

/// What the averaging plan reads of the training configuration.
pub struct Plan {
    pub bucket_mb: f64,
    pub sparse_grads: SparseGrads,
    /// Whether every step must form the union of the replicas' rows of
    /// the row tables (`--sparse-adam` updates them).
    pub row_union: bool,
    /// `--comm-hook` (for the host's hook; a device hook was made with it).
    pub comm_hook: CommHookChoice,
    /// The run's seed (PowerSGD's first `Q`s).
    pub seed: u64,
}

impl<B: Ops> Averaging<B> {
    /// Nothing to average: one replica.
    pub fn alone() -> Self {
        Self {
            dense: None,
            rows: None,
            group: None,
            alone: NoSync,
        }
    }

    /// The averaging over `over` of the gradients of `model`'s parameters
    /// in `trained` (a rank's gradient buffer holds just those), `job`
    /// being the job's communicator.
    pub fn plan<M: Model<B>>(
        backend: &B,
        (model, trained): (&M, Range<usize>),
        plan: &Plan,
        over: Option<AverageOver<B>>,
        job: Option<&CommThread>,
    ) -> anyhow::Result<Self> {
        let trained_start = trained.start;
        let buckets = plan_buckets(model.layout(), trained, plan.bucket_mb);
        let host = match over {
            None => return Ok(Self::alone()),
            Some(AverageOver::Device(hook)) => {
                return Ok(Self {
                    dense: Some(Reducer::new(buckets, hook)),
                    ..Self::alone()
                });
            }
            Some(AverageOver::Job) => None,
            Some(AverageOver::Group(group)) => Some(group),
        };
        let comm = host
            .as_ref()
            .or(job)
            .context("averaging over the job's ring needs the job's communicator")?;
        let tables = model.row_tables().map(|t| t.tables()).unwrap_or_default();
        let rows = SparseExchange::plan(tables, plan.sparse_grads, comm, plan.row_union)?;
        let buckets = SparseExchange::dense_buckets(rows.as_ref(), buckets);
        let wire = match plan.comm_hook {
            CommHookChoice::None => HostWire::F32,
            CommHookChoice::Half(format) => HostWire::Half(format),
            CommHookChoice::PowerSgd { rank, start } => {
                let base = trained_start;
                let how = (rank, start, plan.seed);
                HostWire::PowerSgd(Box::new(PowerSgd::plan(
                    model.layout(),
                    base,
                    &buckets,
                    how,
                )))
            }
        };
        let hook = HostHook::new(backend, &buckets, comm.handle(), wire)?;
        Ok(Self {
            dense: Some(Reducer::new(buckets, Box::new(hook))),
            rows,
            group: host,
            alone: NoSync,
        })
    }

    /// Where `--reproducible`'s integer sums go: the device hook's own
    /// (NCCL's int64 all-reduce) where it has one, else the host
    /// communicator over this rank's replicas, its pipeline stage's group
    /// or `job`, the job's; `None` with one replica.
    pub fn integers<'a>(
        &'a mut self,
        job: Option<&'a mut CommThread>,
    ) -> Option<&'a mut dyn IntegerReduce> {
        // Asked twice: returning the first answer's borrow from inside the
        // `if` would keep `self` borrowed for the rest (today's borrow
        // checker), and the asking costs nothing.
        if self.device_integers().is_some() {
            return self.device_integers();
        }
        match (&self.dense, &mut self.group) {
            (None, _) => None,
            (Some(_), Some(group)) => Some(group),
            (Some(_), None) => job.map(|c| c as &mut dyn IntegerReduce),
        }
    }

    fn device_integers(&mut self) -> Option<&mut dyn IntegerReduce> {
        self.dense.as_mut()?.hook_mut().integers()
    }

    /// Whether there is anything to average (more than one replica).
    pub fn is_active(&self) -> bool {
        self.dense.is_some()
    }

    /// A step begins after `step` optimizer steps.
    pub fn begin_step(&mut self, step: u64) {
        if let Some(dense) = &mut self.dense {
            dense.hook_mut().begin_step(step);
        }
    }

    /// What backward tells as each bucket's gradients are final.
    pub fn hook(&mut self) -> &mut dyn GradsReady<B> {
        match &mut self.dense {
            Some(reducer) => reducer,
            None => &mut self.alone,
        }
    }

    /// Ends the step's averaging (every bucket was launched); `rows` are
    /// the rows of the row tables this rank's batch looked up. Returns
    /// the union of every replica's rows where the sparse exchange formed
    /// it.
    pub fn finish(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        rows: Option<&[u32]>,
    ) -> anyhow::Result<Option<Vec<u32>>> {
        if let Some(dense) = &mut self.dense {
            dense.finish(backend, grads)?;
        }
        match &mut self.rows {
            Some(sparse) => sparse.exchange(backend, grads, rows),
            None => Ok(None),
        }
    }

    /// Bytes this rank sent in gradient collectives since the last call.
    pub fn take_sent_bytes(&mut self) -> u64 {
        self.dense
            .as_mut()
            .map_or(0, |d| d.hook_mut().take_sent_bytes())
    }

    /// PowerSGD's state, between steps (`None`: none to keep).
    pub fn powersgd_state(&self) -> anyhow::Result<Option<PowerSgdState>> {
        self.dense
            .as_ref()
            .map_or(Ok(None), |d| d.hook().powersgd_state())
    }

    /// Continues PowerSGD from a checkpoint's state.
    pub fn restore_powersgd(&mut self, state: &PowerSgdState) -> anyhow::Result<()> {
        match &mut self.dense {
            Some(dense) => dense.hook_mut().restore_powersgd(state),
            None => Ok(()),
        }
    }

    /// Reports a collective that failed since the last look.
    pub fn check(&self) -> anyhow::Result<()> {
        match &self.dense {
            Some(reducer) => reducer.hook().check(),
            None => Ok(()),
        }
    }

    /// Whether every step returns the union of the replicas' rows (see
    /// [`SparseExchange::plan`]).
    pub fn forms_row_union(&self) -> bool {
        self.rows.as_ref().is_some_and(|s| s.forms_union())
    }

    /// After [`Averaging::finish`] returned the union of the replicas'
    /// rows: the same ids on the device, where the sparse exchange left
    /// them there.
    pub fn row_union_on_device(&self) -> Option<&B::Storage<u32>> {
        self.rows.as_ref()?.union_on_device()
    }

    /// The gradient elements the dense buckets carry each step: every
    /// parameter trained but the row tables a sparse exchange carries.
    pub fn dense_elements(&self) -> usize {
        self.dense.as_ref().map_or(0, Reducer::elements)
    }
}

#[cfg(test)]
mod tests {
    use core_tensor::Cpu;

    use super::*;
    use crate::comm_thread::CommThread;
    use crate::model::RowTables;
    use crate::models::recsys::{RatingsIndex, RecsysBuffers, RecsysModel, synth};

    /// recsys at two ranks over the host's ring: the dense all-reduce
    /// carries every gradient but the row tables (the embedding and the
    /// per-row biases), which the sparse exchange carries; with
    /// `--sparse-grads never`, every gradient.
    #[test]
    fn the_dense_buckets_carry_neither_row_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        synth::write_ratings(&path, 200, 5, 7, 1).unwrap();
        let model = RecsysModel::new(&RatingsIndex::build(&path).unwrap(), 3).unwrap();
        let layout = Model::<Cpu>::layout(&model);
        let tables: usize = (RowTables::<RecsysBuffers<Cpu>>::tables(&model).iter())
            .map(|(range, _)| range.len())
            .sum();
        let biases = layout.range("bias.weight").unwrap().len();
        assert_eq!(tables, biases * 4, "rows of 3 and their biases");
        for (mode, dense) in [
            (SparseGrads::Auto, layout.len() - tables),
            (SparseGrads::Never, layout.len()),
        ] {
            let plan = Plan {
                bucket_mb: 25.0,
                sparse_grads: mode,
                row_union: false,
                comm_hook: CommHookChoice::None,
                seed: 0,
            };
            let got = CommThread::on_two_ranks(|_, comm| {
                let cpu = Cpu::new(1).unwrap();
                let whole = (&model, 0..layout.len());
                let over = Some(AverageOver::Job);
                let averaging = Averaging::plan(&cpu, whole, &plan, over, Some(&comm)).unwrap();
                averaging.dense_elements()
            });
            assert_eq!(got, [dense, dense], "--sparse-grads {mode:?}");
        }
    }
}
