//! Gradient accumulation (`--accumulate-steps K`, PyTorch's `no_sync()`)
//! changes how a step's batch is summed, not what it learns: with dropout
//! off, 4 micro-batches of 16 follow one batch of 64 within 1e-4 after 30
//! steps (the bound of every reordering of a batch's sum:
//! docs/scaling.md), on one rank and on two, whose gradients travel once
//! per optimizer step and who stay bitwise identical.

mod common;

use std::sync::atomic::Ordering;

use common::pipeline::{Counting, local_job, on_ranks, relative};
use core_tensor::Cpu;
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, cnn_layout};
use trainer::train::{Silent, TrainConfig, Trainer};

const STEPS: usize = 30;

fn data() -> FashionMnist {
    common::small_data(2 * 64 * STEPS, 100)
}

/// Batches of `batch`, `k` to an optimizer step.
fn config(batch: usize, k: usize) -> TrainConfig {
    TrainConfig {
        seed: 11,
        max_steps: Some(STEPS),
        dropout: DropoutRates::OFF,
        bucket_mb: 0.05,
        accumulate_steps: k,
        ..TrainConfig::new(1, batch)
    }
}

/// The final parameters, and the f32 elements all-reduced.
fn train(
    data: &FashionMnist,
    cfg: TrainConfig,
    comm: Option<Box<dyn comm::Communicator>>,
) -> (Vec<f32>, usize) {
    let (comm, count) = match comm {
        Some(c) => {
            let (c, count) = Counting::wrap(c);
            (Some(CommThread::spawn(c).unwrap()), Some(count))
        }
        None => (None, None),
    };
    let mut trainer = Trainer::new(Cpu::new(1).unwrap(), data, cfg, comm).unwrap();
    let report = trainer
        .train_epoch(1, &mut Silent, &mut |_| Ok(()))
        .unwrap();
    assert_eq!(
        (report.steps, report.global_step),
        (STEPS, STEPS as u64),
        "optimizer steps"
    );
    let sent = count.map_or(0, |c| c.load(Ordering::Relaxed));
    (trainer.params().unwrap(), sent)
}

#[test]
fn four_micro_batches_of_16_follow_one_batch_of_64() {
    let data = data();
    let (whole, _) = train(&data, config(64, 1), None);
    let (micro, _) = train(&data, config(16, 4), None);
    let diff = relative(&micro, &whole);
    println!("K = 4 x 16 vs 64: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
    let init = CnnMnist::new(DropoutRates::OFF).init_params(11);
    assert!(
        relative(&whole, &init) > 1e-3,
        "training must move the parameters"
    );
    assert!(diff > 0.0, "another summation order: not the same bits");
}

#[test]
fn two_ranks_accumulating_average_once_per_optimizer_step() {
    let data = data();
    let whole = on_ranks(local_job(2), |comm| train(&data, config(64, 1), Some(comm)));
    let micro = on_ranks(local_job(2), |comm| train(&data, config(16, 4), Some(comm)));
    // The metrics and votes travel as f64; every f32 all-reduced is a
    // gradient, each once per optimizer step (not per micro-batch).
    let params = cnn_layout().len();
    for (rank, (p, sent)) in micro.iter().enumerate() {
        assert_eq!(*sent, STEPS * params, "rank {rank}");
        assert!(
            p.iter()
                .zip(&micro[0].0)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {rank} differs from rank 0"
        );
    }
    let diff = relative(&micro[0].0, &whole[0].0);
    println!("2 ranks, K = 4 x 16 vs 64: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
}

/// A short epoch's last optimizer step takes the micro-batches left, each
/// weighted by its samples: 3 micro-batches of 16, 16 and 8 in a step of
/// K = 4 give the mean over their 40 samples, as one batch of 40 does.
#[test]
fn an_epochs_last_step_takes_the_micro_batches_left() {
    let data = common::small_data(104, 50);
    // 104 samples: 64 + 40, or micro-batches 16 x 6 + 8, in steps of 4 + 3.
    let run = |batch, k| {
        let cfg = TrainConfig {
            max_steps: None,
            ..config(batch, k)
        };
        let mut trainer = Trainer::new(Cpu::new(1).unwrap(), &data, cfg, None).unwrap();
        let report = trainer
            .train_epoch(1, &mut Silent, &mut |_| Ok(()))
            .unwrap();
        (trainer.params().unwrap(), report.steps, report.images)
    };
    let (whole, steps, images) = run(64, 1);
    let (micro, micro_steps, micro_images) = run(16, 4);
    assert_eq!((steps, images), (2, 104));
    assert_eq!((micro_steps, micro_images), (2, 104));
    let diff = relative(&micro, &whole);
    assert!(diff <= 1e-5, "relative difference {diff:e} after 2 steps");
}
