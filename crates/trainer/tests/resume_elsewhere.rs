//! An epoch begun in one layout goes on in another (what an elastic
//! restart does): resumed mid-epoch on more or fewer ranks, the run
//! shares out the rest of the epoch's shuffled order over the new ranks, so
//! the epoch trains on each of its samples once but for the padding that
//! evens the last shards out, and counts them all; checkpoints after the
//! change record how far into the order the epoch got.

mod common;

use std::path::Path;

use common::pipeline::{local_job, on_ranks};
use core_tensor::Cpu;
use core_tensor::ops::AdamConfig;
use fashion_mnist::FashionMnist;
use trainer::checkpoint::origin::Origin;
use trainer::checkpoint::{CheckpointDir, Checkpoints, Position, load};
use trainer::comm_thread::CommThread;
use trainer::model::DropoutRates;
use trainer::models::cnn::cnn_layout;
use trainer::train::{EpochReport, Setup, Silent, TrainConfig, Trainer};

const BATCH: usize = 16;
/// Training samples: no world size used here divides it.
const SAMPLES: usize = 197;

/// Micro-batches of `BATCH`, `k` to an optimizer step.
fn config(k: usize) -> TrainConfig {
    TrainConfig {
        accumulate_steps: k,
        epochs: 1,
        batch_size: BATCH,
        adam: AdamConfig::default(),
        seed: 5,
        max_steps: None,
        dropout: DropoutRates::OFF,
        bucket_mb: 0.05,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    }
}

/// Runs epoch 1 on `world` ranks from the newest checkpoint in `dir` (if
/// any), checkpointing after every step; stops after `steps` steps of this
/// run (`None`: at the epoch's end, whose report it returns).
fn run(data: &FashionMnist, dir: &Path, world: usize, steps: Option<usize>) -> Option<EpochReport> {
    run_k(data, dir, (world, 1), steps)
}

/// [`run`] with `k` micro-batches to an optimizer step.
fn run_k(
    data: &FashionMnist,
    dir: &Path,
    (world, k): (usize, usize),
    steps: Option<usize>,
) -> Option<EpochReport> {
    let reports = on_ranks(local_job(world), |comm| {
        let checkpoints = CheckpointDir::new(dir, 100);
        let newest = match comm.rank() {
            0 => checkpoints.newest_valid(cnn_layout()).unwrap().found,
            _ => None,
        };
        let setup = Setup {
            origin: newest.map_or(Origin::Fresh, |(_, s)| Origin::Resume(Box::new(s))),
            checkpoints: Some(Checkpoints {
                dir: checkpoints,
                every: Some(1),
                record: None,
            }),
            ..Setup::fresh(Some(CommThread::spawn(comm).unwrap()))
        };
        let mut trainer = Trainer::start(Cpu::new(1).unwrap(), data, config(k), setup).unwrap();
        let mut done = 0;
        let ended = trainer.train_epoch(1, &mut Silent, &mut |_| {
            done += 1;
            match steps == Some(done) {
                true => Err(anyhow::anyhow!("stopped")),
                false => Ok(()),
            }
        });
        ended.ok()
    });
    reports.into_iter().next().unwrap()
}

#[test]
fn an_epoch_goes_on_over_another_number_of_ranks_without_losing_a_sample() {
    let data = common::small_data(SAMPLES, 40);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let at = |step| dir.join(Position { epoch: 1, step }.dir_name());

    // 2 ranks take 3 steps: 96 samples of the epoch's order.
    assert!(run(&data, dir, 2, Some(3)).is_none());
    let state = load(&at(3), cnn_layout()).unwrap();
    assert_eq!((state.visited(), state.epoch_visited), (96, None));

    // 3 ranks go on for a step: 48 more, which the step count alone no
    // longer says (4 steps of 3 ranks would be 192).
    assert!(run(&data, dir, 3, Some(1)).is_none());
    let state = load(&at(4), cnn_layout()).unwrap();
    assert_eq!(state.epoch_visited, Some(144));

    // 1 rank ends the epoch: the other 53 samples in 4 more steps.
    let report = run(&data, dir, 1, None).expect("the epoch ends");
    assert_eq!((report.steps, report.images), (8, SAMPLES as u64));
    assert!(report.loss.is_finite() && (0.0..=1.0).contains(&report.accuracy));
    assert_eq!(report.global_step, 8);
}

/// Resumed on as many ranks as it began on, an epoch reads what it would
/// have read unbroken, so a new layout's sharing out of the rest applies
/// only where the layout changed: 2 ranks stopped and resumed on 2 count
/// the padded epoch (99 + 99), as an unbroken run does.
#[test]
fn an_epoch_resumed_on_as_many_ranks_is_the_unbroken_one() {
    let data = common::small_data(SAMPLES, 40);
    let (whole, parts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let unbroken = run(&data, whole.path(), 2, None).unwrap();
    assert!(run(&data, parts.path(), 2, Some(2)).is_none());
    let resumed = run(&data, parts.path(), 2, None).unwrap();
    assert_eq!(unbroken.images, 198);
    assert_eq!(
        (resumed.steps, resumed.images, resumed.loss.to_bits()),
        (unbroken.steps, unbroken.images, unbroken.loss.to_bits())
    );
}

/// With 2 micro-batches to an optimizer step, a checkpoint's steps count
/// optimizer steps, each of 2 micro-batches, in the layout that took them;
/// the epoch still reads each sample once and counts them all.
#[test]
fn an_accumulating_epoch_goes_on_over_another_number_of_ranks() {
    let data = common::small_data(SAMPLES, 40);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let at = |step| dir.join(Position { epoch: 1, step }.dir_name());

    // 2 ranks take a step of 2 x 16 each: 64 samples of the order.
    assert!(run_k(&data, dir, (2, 2), Some(1)).is_none());
    let state = load(&at(1), cnn_layout()).unwrap();
    assert_eq!((state.visited(), state.epoch_visited), (64, None));

    // 3 ranks share out the other 133 (45 each, padded) and take a step
    // of 2 x 16 each: 96 more.
    assert!(run_k(&data, dir, (3, 2), Some(1)).is_none());
    let state = load(&at(2), cnn_layout()).unwrap();
    assert_eq!(state.epoch_visited, Some(160));

    // 1 rank ends the epoch: the other 37 in micro-batches of 16, 16, 5,
    // 2 optimizer steps.
    let report = run_k(&data, dir, (1, 2), None).expect("the epoch ends");
    assert_eq!((report.steps, report.images), (4, SAMPLES as u64));
    assert_eq!(report.global_step, 4);
}
