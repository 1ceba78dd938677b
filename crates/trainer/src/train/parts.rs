//! Who averages a rank's gradients, and for a model split between ranks
//! ([`Model::partition`]: pipeline stages) how the whole model is made
//! again on a host where it is needed (checkpoints), from the parts the
//! ranks hold on their devices.

use anyhow::{Context, bail};
use core_tensor::Ops;

use super::replica::Replica;
use super::{TrainConfig, Trainer};
use crate::comm_thread::CommThread;
use crate::ddp::{CommHook, HostHook, Reducer, SparseExchange, plan_buckets};
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
            let sparse =
                SparseExchange::plan(model.row_tables(), cfg.sparse_grads, comm, cfg.sparse_adam)?;
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
    /// The whole parameters and Adam moments on rank 0's host, for a
    /// checkpoint (gathered from the parts' ranks for a partitioned model:
    /// every rank calls it); `None` on the other ranks.
    pub(super) fn whole_state(&mut self) -> anyhow::Result<Option<[Vec<f32>; 3]>> {
        let params = self.assemble(|r| &r.params, false)?;
        let m = self.assemble(|r| &r.adam_m, false)?;
        let v = self.assemble(|r| &r.adam_v, false)?;
        Ok(params.zip(m).zip(v).map(|((p, m), v)| [p, m, v]))
    }

    /// The whole model's parameters on the host of every rank. For a model
    /// split between ranks, every rank calls it: each part comes from the
    /// first replica's rank training it.
    pub fn whole_params(&mut self) -> anyhow::Result<Vec<f32>> {
        self.assemble(|r| &r.params, true)?
            .context("every rank receives the whole model")
    }

    /// The whole of a vector the replica keeps (`pick`: its parameters or
    /// a moment), on the host of rank 0 (and of every rank if
    /// `everywhere`), `None` elsewhere. For a model split between ranks,
    /// part `p` is broadcast from rank `p`, its first replica: the other
    /// ranks hold one part at a time, and keep none of the others'.
    fn assemble(
        &mut self,
        pick: fn(&Replica<B>) -> &B::Storage<f32>,
        everywhere: bool,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let keep = everywhere || self.rank == 0;
        let Some(partition) = self.model.partition() else {
            return Ok(match keep {
                true => Some(self.backend.download(pick(&self.replica))?),
                false => None,
            });
        };
        let len = partition.parts.last().map_or(0, |r| r.end);
        let mut whole = keep.then(|| vec![0.0; len]);
        for (p, range) in partition.parts.iter().enumerate() {
            let mut part = if p == self.rank {
                self.backend.download(pick(&self.replica))?
            } else {
                vec![0.0; range.len()]
            };
            let Some(comm) = self.comm.as_mut() else {
                bail!("a model split between ranks needs the job's communicator");
            };
            comm.broadcast(&mut part, p)
                .context("assembling the whole model")?;
            if let Some(whole) = whole.as_mut() {
                whole[range.clone()].copy_from_slice(&part);
            }
        }
        Ok(whole)
    }
}

#[cfg(test)]
mod tests {
    use core_tensor::Cpu;
    use core_tensor::ops::AdamConfig;

    use super::*;
    use crate::comm_thread::two_ranks::on_two_ranks;
    use crate::ddp::SparseGrads;
    use crate::model::DropoutRates;
    use crate::models::recsys::{RatingsIndex, RecsysModel, synth};

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
        let tables: usize = (Model::<Cpu>::row_tables(&model).iter())
            .map(|(range, _)| range.len())
            .sum();
        let biases = layout.range("bias.weight").unwrap().len();
        assert_eq!(tables, biases * 4, "rows of 3 and their biases");
        for (mode, dense) in [
            (SparseGrads::Auto, layout.len() - tables),
            (SparseGrads::Never, layout.len()),
        ] {
            let cfg = TrainConfig {
                epochs: 1,
                batch_size: 8,
                adam: AdamConfig::default(),
                seed: 1,
                max_steps: None,
                dropout: DropoutRates::OFF,
                bucket_mb: 25.0,
                sparse_grads: mode,
                sparse_adam: false,
            };
            let got = on_two_ranks(|_, comm| {
                let cpu = Cpu::new(1).unwrap();
                let reducer = plan_reducer(&cpu, &model, &cfg, None, Some(&comm), None).unwrap();
                reducer.unwrap().dense_elements()
            });
            assert_eq!(got, [dense, dense], "--sparse-grads {mode:?}");
        }
    }
}
