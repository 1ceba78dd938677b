//! Properties that must hold for every data-set size, world size and seed.

use proptest::prelude::*;
use sampler::{DistributedSampler, SamplerConfig};
use std::collections::HashSet;

fn all_shards(
    len: usize,
    num_replicas: usize,
    seed: u64,
    epoch: u64,
    drop_last: bool,
) -> Vec<Vec<usize>> {
    (0..num_replicas)
        .map(|rank| {
            let mut sampler = DistributedSampler::new(
                len,
                SamplerConfig {
                    num_replicas,
                    rank,
                    shuffle: true,
                    seed,
                    drop_last,
                },
            )
            .expect("rank < num_replicas");
            sampler.set_epoch(epoch);
            sampler.indices()
        })
        .collect()
}

proptest! {
    #[test]
    fn shards_are_equal_sized(len in 0usize..500, replicas in 1usize..9, seed: u64, drop_last: bool) {
        let shards = all_shards(len, replicas, seed, 0, drop_last);
        let expected = if drop_last { len / replicas } else { len.div_ceil(replicas) };
        for shard in &shards {
            prop_assert_eq!(shard.len(), expected);
        }
    }

    #[test]
    fn shards_cover_the_data_set(len in 1usize..500, replicas in 1usize..9, seed: u64, epoch in 0u64..100) {
        let seen: HashSet<usize> = all_shards(len, replicas, seed, epoch, false).into_iter().flatten().collect();
        prop_assert_eq!(seen, (0..len).collect::<HashSet<_>>());
    }

    #[test]
    fn shards_are_disjoint_without_padding(per_rank in 0usize..60, replicas in 1usize..9, seed: u64) {
        let len = per_rank * replicas;
        let flat: Vec<usize> = all_shards(len, replicas, seed, 0, false).into_iter().flatten().collect();
        let distinct: HashSet<usize> = flat.iter().copied().collect();
        prop_assert_eq!(distinct.len(), flat.len());
        prop_assert_eq!(flat.len(), len);
    }

    #[test]
    fn drop_last_visits_distinct_items(len in 0usize..500, replicas in 1usize..9, seed: u64) {
        let flat: Vec<usize> = all_shards(len, replicas, seed, 3, true).into_iter().flatten().collect();
        let distinct: HashSet<usize> = flat.iter().copied().collect();
        prop_assert_eq!(flat.len(), len / replicas * replicas);
        prop_assert_eq!(distinct.len(), flat.len());
        prop_assert!(flat.iter().all(|&index| index < len));
    }

    #[test]
    fn same_seed_and_epoch_give_the_same_shards(len in 0usize..500, replicas in 1usize..9, seed: u64, epoch: u64) {
        prop_assert_eq!(
            all_shards(len, replicas, seed, epoch, false),
            all_shards(len, replicas, seed, epoch, false)
        );
    }

    #[test]
    fn consecutive_epochs_differ(len in 20usize..500, replicas in 1usize..9, seed in 0u64..u64::MAX, epoch in 0u64..1000) {
        // With at least 20 items a repeated order has probability 1/20!.
        prop_assert_ne!(
            all_shards(len, replicas, seed, epoch, false),
            all_shards(len, replicas, seed, epoch + 1, false)
        );
    }
}

/// Every rank's shard of `epoch` from `visited` positions on.
fn shards_after(len: usize, replicas: usize, seed: u64, visited: usize) -> Vec<Vec<usize>> {
    (0..replicas)
        .map(|rank| {
            let config = SamplerConfig {
                num_replicas: replicas,
                rank,
                shuffle: true,
                seed,
                drop_last: false,
            };
            let mut sampler = DistributedSampler::new(len, config).expect("rank < num_replicas");
            sampler.set_epoch(3);
            sampler.set_visited(visited);
            sampler.indices()
        })
        .collect()
}

proptest! {
    /// A resumed epoch on the same world reads the rest of each shard.
    #[test]
    fn continuing_on_the_same_world_reads_the_rest_of_each_shard(
        len in 1usize..400, replicas in 1usize..6, batch in 1usize..9, seed: u64, steps in 0usize..40,
    ) {
        let steps = steps.min(len / (batch * replicas));
        let whole = shards_after(len, replicas, seed, 0);
        let rest = shards_after(len, replicas, seed, steps * batch * replicas);
        for (whole, rest) in whole.iter().zip(&rest) {
            prop_assert_eq!(&whole[steps * batch..], &rest[..]);
        }
    }

    /// Across a change of world size (an elastic restart), the samples
    /// the old world took before the change and the new world takes after
    /// it are the epoch's samples, each once, plus the new world's padding
    /// (fewer than its size, repeats from the head of the epoch's order).
    #[test]
    fn a_world_change_loses_no_sample_and_repeats_only_the_padding(
        len in 1usize..400, before in 1usize..6, after in 1usize..6, batch in 1usize..9,
        seed: u64, steps in 0usize..40,
    ) {
        let steps = steps.min(len / (batch * before));
        let visited = steps * batch * before;
        let mut seen: Vec<usize> = shards_after(len, before, seed, 0)
            .iter()
            .flat_map(|shard| shard[..steps * batch].to_vec())
            .collect();
        seen.extend(shards_after(len, after, seed, visited).concat());
        let padding = seen.len() - len;
        prop_assert!(padding < after, "{padding} repeats");
        let distinct: HashSet<usize> = seen.iter().copied().collect();
        prop_assert_eq!(distinct.len(), len);
        prop_assert!(distinct.iter().all(|&i| i < len));
    }
}
