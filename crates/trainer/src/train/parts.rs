//! Who averages a rank's gradients, and for a model split between ranks
//! ([`Model::partition`]: pipeline stages) how the whole model is made
//! again where it is needed (evaluation, checkpoints).

use anyhow::{Context, bail};
use core_tensor::Ops;

use super::{TrainConfig, Trainer};
use crate::ddp::{CommHook, CommThread, HostHook, Reducer, SparseExchange, plan_buckets};
use crate::model::Model;

/// The gradient averaging of a rank training `model`: through
/// `device_hook`, or the host hook over the ranks training the same
/// parameters (`group` for a partitioned model, which carries the part's
/// gradients only; `comm` otherwise); `None` when no other rank trains
/// them.
pub(super) fn plan_reducer<B: Ops, M: Model<B>>(
    backend: &B,
    model: &M,
    cfg: &TrainConfig,
    device_hook: Option<Box<dyn CommHook<B>>>,
    comm: Option<&CommThread>,
    group: Option<&CommThread>,
) -> anyhow::Result<Option<Reducer<B>>> {
    let layout = model.layout();
    let partition = model.partition();
    let (trained, averaging) = match &partition {
        None => (0..layout.len(), comm),
        Some(p) => {
            let given = device_hook.is_some() || group.is_some();
            if given != (p.replicas > 1) {
                bail!(
                    "a model part trained by {} rank(s) needs {} to average its gradients",
                    p.replicas,
                    if given {
                        "no communicator"
                    } else {
                        "the communicator of its data-parallel group"
                    }
                );
            }
            (p.mine(), group)
        }
    };
    let buckets = plan_buckets(layout, trained, cfg.bucket_mb);
    let reducer = match (device_hook, averaging) {
        (Some(hook), _) => Reducer::new(buckets, hook),
        (None, Some(comm)) => {
            let sparse = SparseExchange::plan(model.sparse_table(), cfg.sparse_grads, comm)?;
            let buckets = SparseExchange::dense_buckets(sparse.as_ref(), buckets);
            let hook = HostHook::new(backend, &buckets, comm.handle())?;
            Reducer::new(buckets, Box::new(hook)).with_sparse(sparse)
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(match partition {
        Some(_) => reducer.over_subgroup(),
        None => reducer,
    }))
}

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// Brings every rank's whole model up to date, for a partitioned model
    /// (each part from the first replica's rank training it); nothing to do
    /// otherwise. Every rank calls it.
    pub(super) fn assemble_params(&mut self) -> anyhow::Result<()> {
        let Some(part) = &self.replica.part else {
            return Ok(());
        };
        let mine = self.backend.download(&part.params)?;
        let whole = self.assemble(mine).context("assembling the whole model")?;
        self.backend
            .write_range(&whole, &mut self.replica.params, 0)?;
        Ok(())
    }

    /// The whole parameters and Adam moments on rank 0, for a checkpoint
    /// (gathered from the parts' ranks for a partitioned model: every rank
    /// calls it); `None` on the other ranks.
    pub(super) fn whole_state(&mut self) -> anyhow::Result<Option<[Vec<f32>; 3]>> {
        if self.replica.part.is_none() && self.rank != 0 {
            return Ok(None);
        }
        self.assemble_params()?;
        let b = &self.backend;
        let (m, v) = (
            b.download(&self.replica.adam_m)?,
            b.download(&self.replica.adam_v)?,
        );
        let (m, v) = (self.assemble(m)?, self.assemble(v)?);
        let params = self.backend.download(&self.replica.params)?;
        Ok((self.rank == 0).then_some([params, m, v]))
    }

    /// The whole of a vector kept per part (this rank's part is `mine`):
    /// part `p` broadcast from rank `p`, its first replica. `mine` itself
    /// for a model trained whole.
    fn assemble(&mut self, mine: Vec<f32>) -> anyhow::Result<Vec<f32>> {
        let Some(partition) = self.model.partition() else {
            return Ok(mine);
        };
        let Some(comm) = self.comm.as_mut() else {
            bail!("a model split between ranks needs the job's communicator");
        };
        let len = partition.parts.last().map_or(0, |r| r.end);
        let mut whole = vec![0.0; len];
        for (p, range) in partition.parts.iter().enumerate() {
            let mut part = if p == self.rank {
                mine.clone()
            } else {
                vec![0.0; range.len()]
            };
            comm.broadcast(&mut part, p)?;
            whole[range.clone()].copy_from_slice(&part);
        }
        Ok(whole)
    }
}
