//! Fixed expectations computed by hand from the source of PyTorch's
//! `torch.utils.data.DistributedSampler` (shuffle=False, so the order is the
//! identity and the values do not depend on the permutation generator).

use sampler::{DistributedSampler, SamplerConfig, SamplerError};

fn in_order(len: usize, num_replicas: usize, rank: usize, drop_last: bool) -> DistributedSampler {
    DistributedSampler::new(
        len,
        SamplerConfig {
            num_replicas,
            rank,
            shuffle: false,
            seed: 0,
            drop_last,
        },
    )
    .expect("valid config")
}

fn shards(len: usize, num_replicas: usize, drop_last: bool) -> Vec<Vec<usize>> {
    (0..num_replicas)
        .map(|rank| in_order(len, num_replicas, rank, drop_last).indices())
        .collect()
}

#[test]
fn pads_with_the_head_when_not_divisible() {
    // PyTorch: total_size 12, indices [0..10] + [0, 1].
    let sampler = in_order(10, 3, 0, false);
    assert_eq!(sampler.num_samples(), 4);
    assert_eq!(sampler.total_size(), 12);
    assert_eq!(
        shards(10, 3, false),
        vec![vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]
    );
}

#[test]
fn drop_last_cuts_the_tail() {
    // PyTorch: num_samples = ceil((10 - 3) / 3) = 3, indices[:9].
    let sampler = in_order(10, 3, 2, true);
    assert_eq!(sampler.num_samples(), 3);
    assert_eq!(sampler.total_size(), 9);
    assert_eq!(
        shards(10, 3, true),
        vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5, 8]]
    );
}

#[test]
fn pads_cyclically_when_padding_exceeds_the_data_set() {
    // PyTorch: padding_size 3 > len 2, so indices += ([0, 1] * 2)[:3].
    assert_eq!(
        shards(2, 5, false),
        vec![vec![0], vec![1], vec![0], vec![1], vec![0]]
    );
}

#[test]
fn drop_last_with_fewer_items_than_replicas_gives_nothing() {
    // PyTorch: num_samples = ceil((2 - 5) / 5) = 0.
    let sampler = in_order(2, 5, 4, true);
    assert_eq!(sampler.num_samples(), 0);
    assert!(sampler.indices().is_empty());
}

#[test]
fn divisible_length_needs_no_padding_either_way() {
    assert_eq!(shards(9, 3, false), shards(9, 3, true));
    assert_eq!(shards(9, 3, false)[1], vec![1, 4, 7]);
}

#[test]
fn empty_data_set_yields_no_indices() {
    let sampler = in_order(0, 4, 3, false);
    assert_eq!(sampler.total_size(), 0);
    assert!(sampler.indices().is_empty());
}

#[test]
fn batches_follow_the_shard_and_keep_the_remainder() {
    let sampler = in_order(10, 3, 1, false);
    let indices = sampler.indices();
    let batches: Vec<_> = sampler
        .batch_positions(3)
        .expect("non-zero")
        .map(|r| indices[r].to_vec())
        .collect();
    assert_eq!(batches, vec![vec![1, 4, 7], vec![0]]);
    assert_eq!(sampler.num_batches(3), Ok(2));
    assert_eq!(sampler.num_batches(0), Err(SamplerError::ZeroBatchSize));
}

#[test]
fn rejects_zero_replicas() {
    let config = SamplerConfig {
        num_replicas: 0,
        ..SamplerConfig::single(0)
    };
    assert_eq!(
        DistributedSampler::new(10, config),
        Err(SamplerError::ZeroReplicas)
    );
}

#[test]
fn rejects_rank_beyond_world() {
    let config = SamplerConfig {
        num_replicas: 3,
        rank: 3,
        ..SamplerConfig::single(0)
    };
    let err = DistributedSampler::new(10, config).unwrap_err();
    assert_eq!(
        err,
        SamplerError::RankOutOfRange {
            rank: 3,
            num_replicas: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "rank 3 is out of range for 3 replicas (valid ranks: 0..3)"
    );
}

#[test]
fn set_epoch_changes_the_shuffled_order() {
    let mut sampler = DistributedSampler::new(100, SamplerConfig::single(5)).expect("valid");
    let first = sampler.indices();
    sampler.set_epoch(1);
    assert_eq!(sampler.epoch(), 1);
    assert_ne!(sampler.indices(), first);
    sampler.set_epoch(0);
    assert_eq!(sampler.indices(), first);
}
