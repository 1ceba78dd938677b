//! Data parallelism changes where gradients are computed, not what is
//! learned: with dropout off, 2 ranks × batch 32 follow 1 rank × batch 64 on
//! the same samples, and the two ranks stay bitwise identical every step.

use std::time::Duration;

mod common;

use comm::{CommConfig, TcpCommunicator};
use common::free_port;
use core_tensor::Cpu;
use core_tensor::ops::AdamConfig;
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::model::DropoutRates;
use trainer::train::{TrainConfig, Trainer};

const STEPS: usize = 20;

fn data() -> FashionMnist {
    common::small_data(4 * 64 * STEPS, 100)
}

fn config(batch_size: usize) -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size,
        adam: AdamConfig::default(),
        seed: 3,
        max_steps: Some(STEPS),
        dropout: DropoutRates::OFF,
        // Small buckets, so that several all-reduces overlap backward.
        bucket_mb: 0.05,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    }
}

/// Trains one epoch of `STEPS` steps and returns the parameters after each.
fn run(data: &FashionMnist, cfg: TrainConfig, comm: Option<CommThread>) -> Vec<Vec<f32>> {
    let mut trainer = Trainer::new(Cpu::new(1).unwrap(), data, cfg, comm).unwrap();
    common::params_after_each_step(&mut trainer).0
}

#[test]
fn two_ranks_of_32_match_one_rank_of_64_and_stay_identical() {
    let data = data();
    let single = run(&data, config(64), None);
    let port = free_port();
    let ranks: Vec<Vec<Vec<f32>>> = common::on_two_ranks(|rank| {
        let cfg = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(Duration::from_secs(20));
        let comm = TcpCommunicator::connect(&cfg).unwrap();
        run(
            &data,
            config(32),
            Some(CommThread::spawn(Box::new(comm)).unwrap()),
        )
    });
    assert_eq!(single.len(), STEPS);
    assert!(ranks.iter().all(|r| r.len() == STEPS));
    for (step, (a, b)) in ranks[0].iter().zip(&ranks[1]).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "ranks differ after step {}",
            step + 1
        );
    }
    // Relative difference of the whole parameter vector, ‖Δ‖₂ / ‖p‖₂: the
    // sums over 64 samples and over 2×32 differ only in rounding, which
    // Adam's normalisation lets grow a little over the steps.
    let (ddp, reference) = (&ranks[0][STEPS - 1], &single[STEPS - 1]);
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let diff = norm(&mut ddp.iter().zip(reference).map(|(a, b)| f64::from(a - b)));
    let relative = diff / norm(&mut reference.iter().map(|&b| f64::from(b)));
    assert!(
        relative <= 1e-5,
        "relative difference {relative:e} after {STEPS} steps"
    );
    assert_ne!(&single[0], reference, "training must move the parameters");
}
