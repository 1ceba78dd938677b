//! How a stage cuts a batch into micro-batches, seeds their dropout masks
//! and sums their gradients: `--micro-batches M` as even as they come, or
//! with `--reproducible` one micro-batch a unit of the global batch.

use std::fmt;

use anyhow::anyhow;
use core_tensor::{Ops, rng};
use launcher::contract::Misconfigured;

use super::one_f_one_b::MicroSum;
use crate::model::{DropoutSeed, GradsReady};

/// Micro-batches per batch when `--micro-batches` is not given.
pub const MICRO_BATCHES: usize = 4;

/// How a stage cuts a batch into micro-batches and sums their gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Split {
    /// As many micro-batches as `Count` says, as even as they come, their
    /// gradients added in float into the batch mean.
    Even(Count),
    /// `--reproducible`: micro-batches of a unit of `unit` samples, each
    /// one's gradients handed on alone.
    Units { unit: usize },
}

/// How many micro-batches an even split makes, and who said so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Count {
    /// `--micro-batches M`.
    Given(usize),
    /// Not given: [`MICRO_BATCHES`].
    Default,
}

impl Count {
    fn get(self) -> usize {
        match self {
            Count::Given(count) => count,
            Count::Default => MICRO_BATCHES,
        }
    }
}

impl Split {
    /// `--micro-batches`, if given.
    pub fn given(micro_batches: Option<usize>) -> Self {
        Split::Even(micro_batches.map_or(Count::Default, Count::Given))
    }

    /// A micro-batch a unit of `unit` samples, of which this replica
    /// trains `units` a step; a given `--micro-batches` must say as many.
    pub fn into_units(self, unit: usize, units: usize) -> anyhow::Result<Self> {
        match self {
            Split::Even(Count::Given(count)) if count != units => {
                Err(anyhow!(Misconfigured(format!(
                    "--micro-batches {count} with --reproducible: a pipeline's micro-batches are its units of --unit {unit}, and this replica trains {units} of them each step: leave out --micro-batches"
                ))))
            }
            _ => Ok(Split::Units { unit }),
        }
    }

    /// The sizes of the micro-batches of a batch of `n`.
    pub fn sizes(self, n: usize) -> Vec<usize> {
        match self {
            Split::Even(count) => micro_sizes(count.get(), n),
            Split::Units { unit } => micro_sizes((n / unit).max(1), n),
        }
    }

    /// The smallest batch with every micro-batch, of batches of at most
    /// `largest` samples (buffers are measured on it).
    pub fn smallest_batch(self, largest: usize) -> usize {
        match self {
            // A batch of fewer samples than micro-batches runs fewer of them.
            Split::Even(count) => count.get().min(largest).max(1),
            Split::Units { unit } => unit,
        }
    }

    /// The dropout seeds of the micro-batches of `sizes` of a batch of
    /// `seed`, and what becomes of their gradients (`hook`: told each
    /// unit's).
    pub fn micro_batches<'a, B: Ops>(
        self,
        seed: DropoutSeed,
        sizes: &[usize],
        hook: &'a mut dyn GradsReady<B>,
    ) -> (Vec<DropoutSeed>, MicroSum<'a, B>) {
        match self {
            // Drawn per micro-batch; each weighted by its samples.
            Split::Even(_) => {
                let batch: usize = sizes.iter().sum();
                let scale = 1.0 / batch as f32;
                let seeds = (0..sizes.len())
                    .map(|i| DropoutSeed::new(rng::derive_seed(seed.seed, &[i as u64])))
                    .collect();
                let weights = sizes.iter().map(|&n| scale * n as f32).collect();
                (seeds, MicroSum::Weighted(weights))
            }
            // Keyed by each unit's first row in the global batch, as the
            // whole model's rows are.
            Split::Units { .. } => {
                let starts = sizes.iter().scan(0u64, |row, &n| {
                    let first = *row;
                    *row += n as u64;
                    Some(first)
                });
                let seeds = (starts.map(|first| DropoutSeed {
                    seed: seed.seed,
                    first_row: seed.first_row + first,
                }))
                .collect();
                (seeds, MicroSum::Units(hook))
            }
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Split::Even(count) => write!(f, "{} micro-batches per batch", count.get()),
            Split::Units { unit } => write!(f, "a micro-batch per unit of {unit} samples"),
        }
    }
}

/// The sizes of `micro_batches` micro-batches of a batch of `n`: as even
/// as they come.
fn micro_sizes(micro_batches: usize, n: usize) -> Vec<usize> {
    let m = micro_batches.min(n).max(1);
    let (base, extra) = (n / m, n % m);
    (0..m).map(|i| base + usize::from(i < extra)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_micro_batches_and_a_given_count_must_match() {
        let units = Split::given(None).into_units(16, 4).unwrap();
        assert_eq!(units.sizes(64), [16; 4]);
        let seeds = |split: Split| {
            let seed = DropoutSeed {
                seed: 9,
                first_row: 32,
            };
            let (seeds, _) =
                split.micro_batches::<core_tensor::Cpu>(seed, &[16; 4], &mut crate::model::NoSync);
            seeds
                .iter()
                .map(|s| (s.seed, s.first_row))
                .collect::<Vec<_>>()
        };
        assert_eq!(seeds(units), [(9, 32), (9, 48), (9, 64), (9, 80)]);
        assert!(Split::given(Some(4)).into_units(16, 4).is_ok());
        let err = Split::given(Some(2)).into_units(16, 4).unwrap_err();
        assert!(
            err.to_string()
                .contains("--micro-batches 2 with --reproducible"),
            "{err}"
        );
        assert_eq!(Split::given(None).sizes(10), [3, 3, 2, 2]);
    }
}
