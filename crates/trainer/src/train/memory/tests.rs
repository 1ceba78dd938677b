use core_tensor::{Cpu, Error};

use super::*;
use crate::model::{DropoutRates, Model};
use crate::models::cnn::CnnMnist;
use crate::models::toy::ToyModel;

fn epoch(batch: usize, samples: usize, max_steps: Option<usize>) -> EpochBatches {
    EpochBatches {
        batch,
        samples,
        max_steps,
        local_ranks: 1,
        test_shards: vec![5000, 4999],
    }
}

#[test]
fn an_epoch_holds_its_full_batch_and_its_last_one_when_reached() {
    // 60,000 samples in batches of 64: 937 full ones and one of 32.
    assert_eq!(epoch(64, 60_000, None).sizes_with(64), [64, 32]);
    assert_eq!(epoch(64, 60_000, Some(937)).sizes_with(64), [64]);
    assert_eq!(epoch(64, 60_000, Some(938)).sizes_with(64), [64, 32]);
    assert_eq!(epoch(60_000, 30_000, None).sizes_with(60_000), [30_000]);
    assert_eq!(epoch(100, 300, None).sizes_with(100), [100]);
    // Two shards of 5000 and 4999 in test batches of 256.
    assert_eq!(epoch(1, 1, None).test_sizes(), [135, 136, 256]);
}

/// What `make(n)` allocates on `cpu`.
fn allocated<T>(cpu: &Cpu, make: impl Fn(usize) -> core_tensor::Result<T>, n: usize) -> u64 {
    let before = cpu.allocated_bytes();
    let _made = make(n).unwrap();
    cpu.allocated_bytes() - before
}

#[test]
fn the_models_buffers_grow_by_the_same_bytes_every_sample() {
    let cpu = Cpu::new(1).unwrap();
    let cnn = CnnMnist::new(DropoutRates::REFERENCE);
    let toy = ToyModel::default();
    for train in [true, false] {
        let makers: [&dyn Fn(usize) -> u64; 2] = [
            &|n| allocated(&cpu, |n| Model::<Cpu>::buffers(&cnn, &cpu, n, train), n),
            &|n| allocated(&cpu, |n| Model::<Cpu>::buffers(&toy, &cpu, n, train), n),
        ];
        for bytes_at in makers {
            let per = bytes_at(2) - bytes_at(1);
            for n in [3, 64, 1000] {
                assert_eq!(bytes_at(n), bytes_at(1) + per * (n as u64 - 1), "{n}");
            }
        }
    }
    // And the measure says so: the CNN's activations, 534 KiB a sample.
    let make = |n| Model::<Cpu>::buffers(&cnn, &cpu, n, true);
    let cost = BatchCost::measure(&cpu, 1, make).unwrap();
    assert_eq!(cost.bytes(1000), allocated(&cpu, make, 1000));
    assert_eq!(cost.per_sample.div_ceil(1024), 534);
}

#[test]
fn the_largest_batch_leaves_room_for_the_epochs_last_one() {
    let cost = BatchCost {
        fixed: 1000,
        per_sample: 10,
    };
    let shape = epoch(100, 100, None);
    // 1700 bytes hold one batch of 70, but not the last one of 30 besides:
    // 50 twice (1000 + 500 once) is the largest that fits.
    assert_eq!(largest_fitting(&cost, &shape, 1700, 1), Some(50));
    assert_eq!(cost.bytes_of(&shape.sizes_with(51)), 3000);
    // Cut to one step, the last batch never comes.
    assert_eq!(
        largest_fitting(&cost, &epoch(100, 100, Some(1)), 1700, 1),
        Some(70)
    );
    assert_eq!(largest_fitting(&cost, &shape, 999, 1), None);
    // A pipeline's batch is at least its micro-batches.
    assert_eq!(largest_fitting(&cost, &shape, 1015, 4), None);
}

#[test]
fn an_allocation_refused_all_the_same_names_the_buffers_and_the_fix() {
    let cpu = Cpu::new(1).unwrap();
    let make = |n: usize| match n {
        1 | 2 => cpu.zeros::<f32>(n),
        _ => Err(Error::OutOfMemory {
            device: "the host".into(),
            bytes: n as u64 * 4,
        }),
    };
    let err = training_buffers(&cpu, (&[64], &epoch(64, 640, None)), (1, 0), make).unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "making the buffers of a training batch of 64: lower --batch-size: out of memory: the host could not give 0.00 GiB (256 bytes)"
    );
}

#[test]
fn the_host_says_what_a_rank_may_take() {
    let cpu = Cpu::new(1).unwrap();
    let alone = Room::now(&cpu, 1).unwrap().unwrap();
    let shared = Room::now(&cpu, 4).unwrap().unwrap();
    assert!(
        alone.bytes > 1 << 20 && shared.bytes <= alone.bytes,
        "{alone:?} {shared:?}"
    );
    assert_eq!(amount(85 << 20), "85 MiB");
    assert_eq!(amount(7 << 30), "7.0 GiB");
}
