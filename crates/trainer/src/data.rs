//! The data seam: a model's data set hands the trainer an epoch's batches
//! and fills the model's input buffers with each ([`Batches`]). Which
//! samples a rank reads, in which order, is an [`Order`] every index-based
//! data set shares; what the samples are, a [`DataFingerprint`] that
//! checkpoints record.

mod fingerprint;

use std::ops::Range;

use anyhow::Context;
use core_tensor::Ops;
use sampler::{DistributedSampler, SamplerConfig};

pub use fingerprint::{DataFingerprint, Hasher};

/// One split of a model's data set, as the trainer reads it: epoch by
/// epoch, batch by batch. `Buf` is the model's [`crate::model::Model::Buffers`].
pub trait Batches<B: Ops, Buf> {
    /// Samples in the split, over all ranks.
    fn sample_count(&self) -> usize;

    /// The identity of the split's samples, the same on every rank and in
    /// every run on the same data (computed once, when the data set is
    /// loaded): a checkpoint records the training split's, so that a run
    /// on other data cannot continue one of its epochs.
    fn fingerprint(&self) -> DataFingerprint;

    /// Starts `epoch` (from 1) of the samples `order` gives this rank:
    /// returns the size of each batch of at most `batch` samples, in order.
    fn start_epoch(
        &mut self,
        backend: &B,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>>;

    /// Fills `buffers` with batch `step` (from 0) of the epoch started last.
    fn fill(&mut self, backend: &B, step: usize, buffers: &mut Buf) -> anyhow::Result<()>;
}

/// Which samples a rank reads in an epoch.
#[derive(Clone, Copy, Debug)]
pub enum Order {
    /// Training: `DistributedSampler`'s shuffled shard, reshuffled every
    /// epoch from `seed`; in a resumed epoch, the rest of it.
    Shuffled {
        rank: usize,
        world_size: usize,
        seed: u64,
        resumed: Option<Resumed>,
    },
    /// Evaluation: every `world_size`-th sample from `rank`, in order.
    Strided { rank: usize, world_size: usize },
    /// `--reproducible` training: the epoch's one shuffled order (from
    /// `seed`, as one replica's sampler shuffles it), padded at its end
    /// with its first samples to whole global batches; step `s` trains its
    /// positions `s·global_batch ..`, cut into units of `unit`, and this
    /// replica units `share.0 .. share.1` of each step, in order, in
    /// batches of `batch` within the step (a multiple of `unit`: a unit a
    /// batch, or a pipeline's, all of the step's share).
    Units {
        seed: u64,
        global_batch: usize,
        unit: usize,
        share: (usize, usize),
    },
}

/// Where a resumed epoch goes on: after its first `steps` steps, which
/// took the first `visited` samples of the epoch's shuffled order on
/// `replicas` replicas (the checkpoint's layout, which may not be this
/// run's). On another number of replicas this run shares out the rest of
/// the order over its own, so across the change no sample of the epoch is
/// lost or read twice but for the padding that evens the shards out (see
/// `sampler::DistributedSampler::set_visited`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resumed {
    pub steps: usize,
    pub visited: usize,
    pub replicas: usize,
}

/// An epoch's sample indices and the positions of each batch in them.
#[derive(Debug, Default)]
pub struct EpochPlan {
    pub indices: Vec<usize>,
    pub batches: Vec<Range<usize>>,
}

impl EpochPlan {
    /// The size of each batch.
    pub fn sizes(&self) -> Vec<usize> {
        self.batches.iter().map(|b| b.len()).collect()
    }
}

impl Order {
    /// The samples of `epoch` (from 1) out of `len`, in batches of `batch`.
    pub fn plan(&self, len: usize, epoch: u64, batch: usize) -> anyhow::Result<EpochPlan> {
        match *self {
            Order::Shuffled {
                rank,
                world_size,
                seed,
                resumed,
            } => {
                let config = SamplerConfig {
                    num_replicas: world_size,
                    rank,
                    shuffle: true,
                    seed,
                    drop_last: false,
                };
                let mut sampler = DistributedSampler::new(len, config)?;
                sampler.set_epoch(epoch - 1);
                // On as many replicas the plan is the unbroken epoch's (the
                // trainer skips the steps done). On another number the rest
                // of the order is shared out anew, and the steps done stay
                // in the plan, empty: batch `s` is still the epoch's step
                // `s + 1`.
                let reshared = resumed.filter(|r| r.replicas != world_size);
                let done = reshared.map_or(0, |r| r.steps);
                sampler.set_visited(reshared.map_or(0, |r| r.visited));
                let batches = std::iter::repeat_n(0..0, done);
                Ok(EpochPlan {
                    indices: sampler.indices(),
                    batches: batches.chain(sampler.batch_positions(batch)?).collect(),
                })
            }
            Order::Units {
                seed,
                global_batch,
                unit,
                share: (first, end),
            } => {
                let config = SamplerConfig {
                    num_replicas: 1,
                    rank: 0,
                    shuffle: true,
                    seed,
                    drop_last: false,
                };
                let mut sampler = DistributedSampler::new(len, config)?;
                sampler.set_epoch(epoch - 1);
                let order = sampler.indices();
                let mut plan = EpochPlan::default();
                for step in 0..len.div_ceil(global_batch) {
                    let at = step * global_batch;
                    let start = plan.indices.len();
                    let positions = at + first * unit..at + end * unit;
                    plan.indices.extend(positions.map(|p| order[p % len]));
                    let end = plan.indices.len();
                    let cut = (start..end).step_by(batch.max(1));
                    plan.batches.extend(cut.map(|b| b..(b + batch).min(end)));
                }
                Ok(plan)
            }
            Order::Strided { rank, world_size } => {
                let indices: Vec<usize> = (rank..len).step_by(world_size).collect();
                let batches = (0..indices.len())
                    .step_by(batch)
                    .map(|start| start..(start + batch).min(indices.len()))
                    .collect();
                Ok(EpochPlan { indices, batches })
            }
        }
    }
}

/// Sample indices as the device wants them.
pub fn to_device_indices<B: Ops>(
    backend: &B,
    indices: &[usize],
) -> anyhow::Result<B::Storage<u32>> {
    let narrow: Vec<u32> = indices
        .iter()
        .map(|&i| u32::try_from(i))
        .collect::<Result<_, _>>()
        .context("sample index above 2³²")?;
    Ok(backend.upload(&narrow)?)
}
