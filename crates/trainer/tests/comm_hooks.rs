//! `--comm-hook`: what travels changes, not what is learned. Two ranks
//! train the CNN on the real FashionMNIST with each hook and reach the
//! test accuracy of float32 all-reduces (the 5-epoch figures are in
//! docs/scaling.md; the synthetic sets are learnt perfectly by any hook),
//! sending the bytes the hook promises: bf16 and fp16 half of float32's,
//! PowerSGD far fewer once it starts; the ranks stay bitwise identical
//! whatever travels. Without the data set (`apt-get install
//! dataset-fashion-mnist`) it is skipped, saying so; REQUIRE_FASHION_MNIST=1
//! makes that a failure.

mod common;

use common::pipeline::{local_job, on_ranks};
use core_tensor::Cpu;
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::ddp::{CommHookChoice, HalfFormat};
use trainer::models::cnn::cnn_layout;
use trainer::train::{EpochReport, Silent, TrainConfig, Trainer};

const STEPS: usize = 80;
/// PowerSGD's plain steps first (PyTorch's advice: about 10% of training).
const START: u64 = 10;

/// The real data set, or `None` (skipped) where it is not installed.
fn data() -> Option<FashionMnist> {
    let found = fashion_mnist::locate(None).and_then(|dir| FashionMnist::load(&dir));
    match found {
        Ok(data) => Some(data),
        Err(e) if std::env::var_os("REQUIRE_FASHION_MNIST").is_some() => {
            panic!("REQUIRE_FASHION_MNIST is set, but: {e}")
        }
        Err(e) => {
            eprintln!("skipped: the hooks' accuracy test needs the real FashionMNIST ({e})");
            None
        }
    }
}

/// Two ranks' epoch with `hook`: rank 0's report and parameters, checked
/// identical on both ranks.
fn train(data: &FashionMnist, hook: CommHookChoice) -> (EpochReport, Vec<f32>) {
    let cfg = TrainConfig {
        seed: 4,
        max_steps: Some(STEPS),
        comm_hook: hook,
        ..TrainConfig::new(1, 64)
    };
    let ranks = on_ranks(local_job(2), |comm| {
        let comm = CommThread::spawn(comm).unwrap();
        let mut t = Trainer::new(Cpu::new(1).unwrap(), data, cfg.clone(), Some(comm)).unwrap();
        let report = t.train_epoch(1, &mut Silent, &mut |_| Ok(())).unwrap();
        (report, t.params().unwrap())
    });
    let same = ranks[1]
        .1
        .iter()
        .zip(&ranks[0].1)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "{hook}: rank 1 holds another model than rank 0");
    ranks.into_iter().next().unwrap()
}

#[test]
fn every_hook_learns_what_float32_learns_in_fewer_bytes() {
    let Some(data) = data() else { return };
    let (none, _) = train(&data, CommHookChoice::None);
    let full = none.ranks[0].grad_bytes_per_step;
    // Two ranks: each sends half the buffer twice, i.e. all of it.
    assert_eq!(full, (cnn_layout().len() * 4) as f64);
    println!(
        "none: test accuracy {:.4}, loss {:.4}, {full} bytes a step",
        none.test_accuracy, none.loss
    );
    assert!(
        none.test_accuracy > 0.6,
        "{STEPS} steps learn: {}",
        none.test_accuracy
    );
    let hooks = [
        CommHookChoice::Half(HalfFormat::Bf16),
        CommHookChoice::Half(HalfFormat::Fp16),
        CommHookChoice::PowerSgd {
            rank: 1,
            start: START,
        },
        CommHookChoice::PowerSgd {
            rank: 4,
            start: START,
        },
    ];
    let runs: Vec<_> = hooks
        .iter()
        .map(|&hook| (hook, train(&data, hook).0))
        .collect();
    for (hook, r) in &runs {
        let bytes = r.ranks[0].grad_bytes_per_step;
        println!(
            "{hook}: test accuracy {:.4}, loss {:.4}, {bytes} bytes a step",
            r.test_accuracy, r.loss
        );
    }
    for (hook, r) in runs {
        let bytes = r.ranks[0].grad_bytes_per_step;
        // A sixth of an epoch, where 2 epochs ask 0.5 points. The test
        // accuracy of one moment this early wobbles by a point from step to
        // step; the epoch's mean training loss is steadier. PowerSGD learns
        // more slowly at first, rank 1 most (measured: 2.8 points and 10 %
        // more mean loss than float32 here, at seed 4); the longer runs of
        // docs/scaling.md show how far it catches up.
        let (points, loss) = match hook {
            CommHookChoice::Half(_) => (0.02, 0.005),
            _ => (0.05, 0.15),
        };
        let gap = none.test_accuracy - r.test_accuracy;
        assert!(
            gap <= points,
            "{hook}: test accuracy {} vs {}",
            r.test_accuracy,
            none.test_accuracy
        );
        assert!(
            r.loss <= none.loss * (1.0 + loss),
            "{hook}: loss {} vs {}",
            r.loss,
            none.loss
        );
        match hook {
            CommHookChoice::Half(_) => assert_eq!(bytes, full / 2.0, "{hook}"),
            _ => {
                let plain = START as f64 / STEPS as f64;
                assert!(bytes < full * (plain + 0.1), "{hook}: {bytes} bytes a step");
            }
        }
    }
}
