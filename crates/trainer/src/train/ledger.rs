//! What the loop tells a sample ledger (`--sample-ledger`): after each
//! committed step, every sample the whole job trained in it, so that anyone
//! can check that an epoch trained each sample once, across restarts and
//! changes of layout.
//!
//! Rank 0 computes every replica's samples itself from the epoch's
//! [`Order`], as each replica computes its own (no index crosses the
//! network): the one global order's step with `--reproducible`, else each
//! replica's `DistributedSampler` shard, replica by replica.

use anyhow::{Context, bail};

use super::accumulate::steps_of;
use crate::data::Order;

/// One committed optimizer step, as the ledger records it.
#[derive(Clone, Copy, Debug)]
pub struct CommittedStep<'a> {
    /// Optimizer steps since training began, this one included.
    pub global_step: u64,
    /// The epoch (from 1) and the step in it (from 1).
    pub epoch: u64,
    pub step: u64,
    /// The job's samples of the step, as indices of the training split.
    pub samples: &'a [u32],
}

/// Where committed steps go (rank 0's ledger file; see
/// `crate::report::sample_ledger`).
pub trait SampleRecord {
    fn committed(&mut self, step: &CommittedStep<'_>) -> anyhow::Result<()>;

    /// The global step of the last step recorded (0: none).
    fn last_step(&self) -> u64;
}

/// The job's samples in each optimizer step of `epoch` of a split of
/// `len` samples, as `order` (this rank's) shares it out over the
/// replicas: `batch` samples a micro-batch, `k` micro-batches a step, at
/// most `max_steps` steps.
pub(super) fn job_steps(
    order: &Order,
    (len, epoch): (usize, u64),
    (batch, k): (usize, usize),
    max_steps: Option<usize>,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let (plans, k) = match *order {
        // One global order: the step's `global_batch` positions as one
        // batch, whatever share of them this replica trains.
        Order::Units {
            seed,
            global_batch,
            unit,
            ..
        } => {
            let whole = Order::Units {
                seed,
                global_batch,
                unit,
                share: (0, global_batch / unit),
            };
            (vec![whole.plan(len, epoch, global_batch)?], 1)
        }
        Order::Shuffled {
            world_size,
            seed,
            resumed,
            ..
        } => {
            let replica = |rank| Order::Shuffled {
                rank,
                world_size,
                seed,
                resumed,
            };
            let plans = (0..world_size).map(|r| replica(r).plan(len, epoch, batch));
            (plans.collect::<anyhow::Result<Vec<_>>>()?, k)
        }
        Order::Strided { .. } => bail!("the ledger records training steps, not the test split's"),
    };
    let steps = steps_of(plans[0].batches.len(), k, max_steps);
    steps
        .into_iter()
        .map(|group| {
            let mut samples = Vec::new();
            for plan in &plans {
                for b in group.clone() {
                    let Some(positions) = plan.batches.get(b) else {
                        continue;
                    };
                    for &i in &plan.indices[positions.clone()] {
                        samples.push(u32::try_from(i).context("sample index above 2³²")?);
                    }
                }
            }
            Ok(samples)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How often each of `len` samples occurs in `steps`.
    fn counts(steps: &[Vec<u32>], len: usize) -> Vec<usize> {
        let mut counts = vec![0; len];
        for &i in steps.iter().flatten() {
            counts[i as usize] += 1;
        }
        counts
    }

    #[test]
    fn a_reproducible_epoch_is_its_global_batches_padded_by_its_first_samples() {
        let order = Order::Units {
            seed: 3,
            global_batch: 4,
            unit: 2,
            // This replica's share does not change the job's steps.
            share: (1, 2),
        };
        let steps = job_steps(&order, (10, 1), (2, 1), None).unwrap();
        assert_eq!(steps.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 4]);
        let counts = counts(&steps, 10);
        assert!(counts.iter().all(|&c| (1..=2).contains(&c)), "{counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), 12);
        // The padding is the epoch's first two samples again.
        assert_eq!(steps[2][2..], steps[0][..2]);
        let capped = job_steps(&order, (10, 1), (2, 1), Some(2)).unwrap();
        assert_eq!(capped, steps[..2]);
    }

    #[test]
    fn a_data_parallel_step_holds_every_replicas_micro_batches() {
        let order = |rank| Order::Shuffled {
            rank,
            world_size: 2,
            seed: 5,
            resumed: None,
        };
        // 11 samples over 2 replicas: 6 each (one padded), in batches of 2,
        // 2 micro-batches a step.
        let steps = job_steps(&order(1), (11, 2), (2, 2), None).unwrap();
        assert_eq!(steps.iter().map(Vec::len).collect::<Vec<_>>(), [8, 4]);
        let counts = counts(&steps, 11);
        assert!(counts.iter().all(|&c| (1..=2).contains(&c)), "{counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), 12);
        // Replica 0's first micro-batch, then its second, then replica 1's.
        let plan = order(0).plan(11, 2, 2).unwrap();
        let first: Vec<u32> = plan.indices[..4].iter().map(|&i| i as u32).collect();
        assert_eq!(steps[0][..4], first);
    }
}
