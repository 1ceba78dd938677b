//! Splits a data set's indices across data-parallel workers.
//!
//! [`DistributedSampler`] reproduces the semantics of PyTorch's
//! `torch.utils.data.DistributedSampler` so that a run on R workers sees the
//! same per-rank shard sizes, padding and `drop_last` behaviour a PyTorch user
//! expects. Every rank computes the full epoch permutation on its own from
//! `seed + epoch`; no indices are ever exchanged between ranks, so agreement
//! rests entirely on the permutation being deterministic (see
//! [`epoch_permutation`]).

mod batch_positions;
mod config;
mod distributed;
mod permutation;

pub use batch_positions::BatchPositions;
pub use config::{SamplerConfig, SamplerError};
pub use distributed::DistributedSampler;
pub use permutation::epoch_permutation;
