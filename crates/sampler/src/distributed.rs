//! The sampler itself: which indices one rank visits in one epoch.

use crate::batch_positions::BatchPositions;
use crate::config::{SamplerConfig, SamplerError};
use crate::permutation::epoch_permutation;

/// One rank's view of a data set of `len` items, following PyTorch's
/// `DistributedSampler`:
///
/// 1. order `0..len`, shuffled by [`epoch_permutation`] when `shuffle` is on;
/// 2. without `drop_last`, pad to `ceil(len / R) * R` by repeating the head of
///    that order cyclically (so every rank takes the same number of steps and
///    collective operations never wait on a rank that has run out); with
///    `drop_last`, truncate to `floor(len / R) * R`;
/// 3. rank `r` takes positions `r, r + R, r + 2R, ...` of the result.
///
/// An epoch can also continue after its first `visited` positions of the
/// (shuffled) order were taken by a world of any size
/// ([`Self::set_visited`]): the rest is padded and shared out the same
/// way, from position `visited` on. Where `visited` is a multiple of `R`
/// the rank gets exactly the tail of the shard it would have had, so a
/// resumed epoch on the same world reads what an unbroken one reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    config: SamplerConfig,
    epoch: u64,
    visited: usize,
}

impl DistributedSampler {
    /// Validates `config` for a data set of `len` items; starts at epoch 0.
    pub fn new(len: usize, config: SamplerConfig) -> Result<Self, SamplerError> {
        if config.num_replicas == 0 {
            return Err(SamplerError::ZeroReplicas);
        }
        if config.rank >= config.num_replicas {
            return Err(SamplerError::RankOutOfRange {
                rank: config.rank,
                num_replicas: config.num_replicas,
            });
        }
        Ok(Self {
            len,
            config,
            epoch: 0,
            visited: 0,
        })
    }

    /// Selects the epoch whose permutation [`Self::indices`] returns. As in
    /// PyTorch, forgetting to call this makes every epoch use the same order.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Continues the current epoch after the first `visited` positions of
    /// its order, which ranks of this or another world size have taken:
    /// the epoch's samples from there on (none when `visited` reaches the
    /// data set's length), padded as at the start.
    pub fn set_visited(&mut self, visited: usize) {
        self.visited = visited;
    }

    /// The epoch last passed to [`Self::set_epoch`] (0 initially).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The configuration this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Size of the underlying data set.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// Number of indices this rank visits per epoch: `ceil(len / R)`, or
    /// `floor(len / R)` with `drop_last` (of the positions not yet visited,
    /// after [`Self::set_visited`]). Identical on every rank.
    pub fn num_samples(&self) -> usize {
        let replicas = self.config.num_replicas;
        let left = self.len.saturating_sub(self.visited);
        if self.config.drop_last {
            left / replicas
        } else {
            left.div_ceil(replicas)
        }
    }

    /// Number of indices visited by all ranks together per epoch (after
    /// the visited ones).
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.config.num_replicas
    }

    /// The indices this rank visits in the current epoch, in visiting order.
    pub fn indices(&self) -> Vec<usize> {
        let order = if self.config.shuffle {
            epoch_permutation(self.len, self.config.seed, self.epoch)
        } else {
            (0..self.len).collect()
        };
        // Position `p` of the padded (or truncated) list is `order[p % len]`:
        // the cyclic repetition PyTorch uses when padding exceeds `len`.
        // `total_size() > 0` implies `len > 0`, so the modulo is defined.
        let first = self.visited + self.config.rank;
        (first..self.visited + self.total_size())
            .step_by(self.config.num_replicas)
            .map(|position| order[position % self.len])
            .collect()
    }

    /// Where each batch of `batch_size` lies in [`Self::indices`]. The last
    /// batch is kept even when it is shorter, so no sample of the shard is
    /// skipped; because every rank has the same `num_samples()`, every rank
    /// gets the same number of batches of the same sizes.
    pub fn batch_positions(&self, batch_size: usize) -> Result<BatchPositions, SamplerError> {
        BatchPositions::new(self.num_samples(), batch_size)
    }

    /// Number of batches [`Self::batch_positions`] yields: `ceil(num_samples / batch_size)`.
    pub fn num_batches(&self, batch_size: usize) -> Result<usize, SamplerError> {
        if batch_size == 0 {
            return Err(SamplerError::ZeroBatchSize);
        }
        Ok(self.num_samples().div_ceil(batch_size))
    }
}
