//! Construction parameters of a [`crate::DistributedSampler`] and the errors
//! that reject bad ones.

use thiserror::Error;

/// How one rank should draw its shard; mirrors the keyword arguments of
/// PyTorch's `DistributedSampler` so configurations translate one-to-one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerConfig {
    /// Number of data-parallel workers (PyTorch's `world_size`).
    pub num_replicas: usize,
    /// This worker's index in `0..num_replicas`.
    pub rank: usize,
    /// Permute the data set every epoch (otherwise take it in order).
    pub shuffle: bool,
    /// Base seed; the permutation of epoch `e` is seeded with `seed + e`.
    pub seed: u64,
    /// Cut the tail so every rank gets `floor(len / num_replicas)` samples,
    /// instead of padding up to `ceil(len / num_replicas)` by repetition.
    pub drop_last: bool,
}

impl SamplerConfig {
    /// A single-process configuration (one replica, rank 0) with shuffling on
    /// and padding instead of dropping, i.e. PyTorch's defaults.
    pub fn single(seed: u64) -> Self {
        Self {
            num_replicas: 1,
            rank: 0,
            shuffle: true,
            seed,
            drop_last: false,
        }
    }
}

/// Rejected sampler arguments. These come straight from the command line, so
/// they are reported instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SamplerError {
    /// A world of zero workers cannot hold any shard.
    #[error("num_replicas must be at least 1")]
    ZeroReplicas,
    /// Ranks are numbered `0..num_replicas`.
    #[error(
        "rank {rank} is out of range for {num_replicas} replicas (valid ranks: 0..{num_replicas})"
    )]
    RankOutOfRange {
        /// The rejected rank.
        rank: usize,
        /// The configured number of replicas.
        num_replicas: usize,
    },
    /// A batch must hold at least one sample.
    #[error("batch size must be at least 1")]
    ZeroBatchSize,
}
