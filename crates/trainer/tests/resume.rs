//! A resumed run is the uninterrupted run: stopped mid-epoch or between
//! epochs, on one rank or two, and resumed from its newest checkpoint, it
//! ends with bitwise the same parameters and Adam state, and reports the
//! same epoch numbers (CPU, same seed and world size, dropout on); with
//! gradient accumulation too, and with PowerSGD, whose state (error
//! feedback, `Q`s) the checkpoints carry.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use comm::{CommConfig, TcpCommunicator};
use core_tensor::Cpu;
use core_tensor::ops::AdamConfig;
use fashion_mnist::FashionMnist;
use trainer::checkpoint::origin::Origin;
use trainer::checkpoint::{CheckpointDir, Checkpoints, Position, TrainingState, load};
use trainer::comm_thread::CommThread;
use trainer::model::DropoutRates;
use trainer::models::cnn::cnn_layout;
use trainer::stop::{StopKind, StopRequest};
use trainer::train::{EpochReport, RunOutcome, Setup, Silent, TrainConfig, Trainer};

const EPOCHS: usize = 2;
const STEPS: usize = 5;
const BATCH: usize = 16;
/// Checkpoints after optimizer steps 3 (epoch 1, step 3), 6 and 9, and
/// after each epoch.
const EVERY: u64 = 3;
const KEEP: usize = 10;
const END: Position = Position {
    epoch: EPOCHS as u64 + 1,
    step: 0,
};

fn data() -> FashionMnist {
    // Enough for two ranks of 2 micro-batches a step.
    common::small_data(4 * BATCH * STEPS + 37, 50)
}

/// What a variant changes in the configuration.
type Tweak = fn(TrainConfig) -> TrainConfig;

fn plain(cfg: TrainConfig) -> TrainConfig {
    cfg
}

fn config(epochs: usize, tweak: Tweak) -> TrainConfig {
    tweak(TrainConfig {
        epochs,
        batch_size: BATCH,
        adam: AdamConfig::default(),
        seed: 9,
        max_steps: Some(STEPS),
        dropout: DropoutRates::REFERENCE,
        bucket_mb: 0.05,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    })
}

/// What one run does.
#[derive(Clone, Copy)]
enum Plan {
    /// All epochs.
    Whole,
    /// Only the first epoch (stopped between epochs).
    FirstEpoch,
    /// Stops (as a kill would) after this many steps of epoch 1.
    StopAfter(usize),
    /// Continues from the newest checkpoint, which must be at this position.
    Resume(Position),
    /// This rank is asked to stop (as SIGTERM would) before its first step:
    /// every rank stops after step 1, and rank 0 saves a checkpoint there.
    Preempt(usize),
}

/// Runs `world` ranks (as threads) of one run; returns rank 0's epoch reports.
fn run(
    world: usize,
    data: &FashionMnist,
    dir: &Path,
    (plan, tweak): (Plan, Tweak),
) -> Vec<EpochReport> {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let comm = (world > 1).then(|| {
                        let cfg = CommConfig::new(rank, world, "127.0.0.1", port)
                            .with_timeout(Duration::from_secs(20));
                        CommThread::spawn(Box::new(TcpCommunicator::connect(&cfg).unwrap()))
                            .unwrap()
                    });
                    run_rank(rank, comm, data, dir, (plan, tweak))
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).next().unwrap()
    })
}

fn run_rank(
    rank: usize,
    comm: Option<CommThread>,
    data: &FashionMnist,
    dir: &Path,
    (plan, tweak): (Plan, Tweak),
) -> Vec<EpochReport> {
    let checkpoints = CheckpointDir::new(dir, KEEP);
    let origin = match plan {
        Plan::Resume(expected) if rank == 0 => {
            let layout = cnn_layout().clone();
            let (_, state) = checkpoints
                .newest_valid(&layout)
                .unwrap()
                .found
                .expect("a checkpoint to resume from");
            assert_eq!(
                state.position, expected,
                "resumed from the wrong checkpoint"
            );
            Origin::Resume(Box::new(state))
        }
        _ => Origin::Fresh,
    };
    let epochs = if matches!(plan, Plan::FirstEpoch) {
        1
    } else {
        EPOCHS
    };
    let stop = StopRequest::new();
    if matches!(plan, Plan::Preempt(r) if r == rank) {
        stop.request(StopKind::Preempt);
    }
    let setup = Setup {
        origin,
        stop,
        checkpoints: Some(Checkpoints {
            dir: checkpoints,
            every: Some(EVERY),
            record: None,
        }),
        ..Setup::fresh(comm)
    };
    let mut trainer =
        Trainer::start(Cpu::new(1).unwrap(), data, config(epochs, tweak), setup).unwrap();
    let mut reports = Vec::new();
    if let Plan::StopAfter(steps) = plan {
        let mut done = 0;
        let stopped = trainer.train_epoch(1, &mut Silent, &mut |_| {
            done += 1;
            if done == steps {
                Err(anyhow::anyhow!("interrupted"))
            } else {
                Ok(())
            }
        });
        assert!(stopped.is_err_and(|e| e.to_string() == "interrupted"));
    } else {
        let outcome = trainer
            .run(&mut Silent, &mut |r| {
                reports.push(r.clone());
                Ok(())
            })
            .unwrap();
        if let Plan::Preempt(_) = plan {
            let at = Position { epoch: 1, step: 1 };
            let saved = (rank == 0).then(|| dir.join(at.dir_name()));
            assert_eq!(outcome, RunOutcome::Preempted { at, saved });
        } else {
            assert_eq!(outcome, RunOutcome::Completed);
        }
    }
    reports
}

/// The numbers of an epoch that do not depend on timing (compared with
/// `==`, which for these finite floats means bit for bit).
fn numbers(r: &EpochReport) -> (usize, f64, f64, f64, usize, u64) {
    (
        r.epoch,
        r.loss,
        r.accuracy,
        r.test_accuracy,
        r.steps,
        r.images,
    )
}

fn final_state(dir: &Path) -> TrainingState {
    load(&dir.join(END.dir_name()), cnn_layout()).unwrap()
}

/// Interrupts a run with `stop`, resumes it, and compares with a run
/// that was never interrupted.
fn check(world: usize, stop: Plan, resume_at: Position) {
    check_variant(world, (stop, resume_at), plain);
}

/// [`check`] of the configuration `tweak` makes; returns the final state.
fn check_variant(world: usize, (stop, resume_at): (Plan, Position), tweak: Tweak) -> TrainingState {
    let data = data();
    let (whole, parts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let expected = run(world, &data, whole.path(), (Plan::Whole, tweak));
    let mut reports = run(world, &data, parts.path(), (stop, tweak));
    reports.extend(run(
        world,
        &data,
        parts.path(),
        (Plan::Resume(resume_at), tweak),
    ));

    assert_eq!(
        reports.iter().map(numbers).collect::<Vec<_>>(),
        expected.iter().map(numbers).collect::<Vec<_>>()
    );
    let (want, got) = (final_state(whole.path()), final_state(parts.path()));
    assert_eq!(got.optimizer_step, (EPOCHS * STEPS) as u64);
    for (name, a, b) in [
        ("parameters", &got.params, &want.params),
        ("exp_avg", &got.exp_avg, &want.exp_avg),
        ("exp_avg_sq", &got.exp_avg_sq, &want.exp_avg_sq),
    ] {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert!(
            differ == 0 && a.len() == b.len(),
            "{name}: {differ} of {} values differ from the uninterrupted run",
            b.len()
        );
    }
    assert_eq!(got, want, "the final checkpoints differ");
    got
}

#[test]
fn one_rank_resumed_mid_epoch_ends_bitwise_equal() {
    check(1, Plan::StopAfter(4), Position { epoch: 1, step: 3 });
}

#[test]
fn one_rank_resumed_between_epochs_ends_bitwise_equal() {
    check(1, Plan::FirstEpoch, Position { epoch: 2, step: 0 });
}

#[test]
fn two_ranks_resumed_mid_epoch_end_bitwise_equal() {
    check(2, Plan::StopAfter(4), Position { epoch: 1, step: 3 });
}

/// A preemption request on one rank stops both at the same step; the
/// checkpoint rank 0 writes there resumes to the uninterrupted result.
#[test]
fn one_rank_preempted_resumes_bitwise_equal() {
    check(1, Plan::Preempt(0), Position { epoch: 1, step: 1 });
}

#[test]
fn two_ranks_preempted_through_rank_1_resume_bitwise_equal() {
    check(2, Plan::Preempt(1), Position { epoch: 1, step: 1 });
}

#[test]
fn two_ranks_resumed_between_epochs_end_bitwise_equal() {
    check(2, Plan::FirstEpoch, Position { epoch: 2, step: 0 });
}

/// Two micro-batches a step: the checkpoint after optimizer step 3 comes
/// after micro-batch 6, and the resumed run goes on with micro-batch 7.
#[test]
fn two_ranks_accumulating_resumed_mid_epoch_end_bitwise_equal() {
    let accumulating: Tweak = |cfg| TrainConfig {
        accumulate_steps: 2,
        ..cfg
    };
    let got = check_variant(
        2,
        (Plan::StopAfter(4), Position { epoch: 1, step: 3 }),
        accumulating,
    );
    assert_eq!(got.settings.accumulate_steps, 2);
}

/// PowerSGD from optimizer step 3 on: the checkpoint after step 3 holds
/// its first state, every later one the state of that step, and the
/// resumed runs continue it bit for bit (mid-epoch, and between epochs).
#[test]
fn two_ranks_with_powersgd_resumed_end_bitwise_equal() {
    let powersgd: Tweak = |cfg| TrainConfig {
        comm_hook: trainer::ddp::CommHookChoice::PowerSgd { rank: 2, start: 2 },
        ..cfg
    };
    for (stop, at) in [
        (Plan::StopAfter(4), Position { epoch: 1, step: 3 }),
        (Plan::FirstEpoch, Position { epoch: 2, step: 0 }),
    ] {
        let got = check_variant(2, (stop, at), powersgd);
        let hook = got
            .hook
            .expect("the final checkpoint holds PowerSGD's state");
        assert_eq!(
            hook.errors.len(),
            2 * cnn_layout().len(),
            "both ranks' error feedback"
        );
        assert!(
            hook.errors.iter().any(|&e| e != 0.0),
            "the error feedback is kept"
        );
        // Every weight is worth compressing at rank 2 (conv1 as 32 x 9:
        // (32 + 9) x 2 x 2 < 288), no bias.
        let mut names: Vec<&str> = hook.q.iter().map(|(n, ..)| n.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight"]
        );
    }
}
