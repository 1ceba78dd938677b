//! Gradient accumulation and the 16-bit communication hooks on the CUDA
//! backend, run without a GPU on `cuda-emu` (see `cuda_emulated.rs`): the
//! accumulation kernel sums 4 micro-batches of 16 to follow one batch of
//! 64 within 1e-4 after 6 steps (the CPU's `accumulation.rs` checks 30; a
//! step of 64 takes the emulator about 13 s, and 6 steps already tell a
//! lost or doubled micro-batch from rounding; the two trainings run on the
//! emulator's two GPUs); NCCL reduces bfloat16
//! copies of the gradients (half the bytes), and the ranks stay bitwise
//! identical.
//!
//! `hooks_on_the_cuda_emulator` builds the emulator and re-runs this binary
//! with it loaded; there the `emulated_*` tests do the work.

mod common;

use std::time::Duration;

use comm::nccl::NcclCommunicator;
use comm::{CommConfig, HalfFormat, TcpCommunicator};
use common::free_port;
use common::pipeline::relative;
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::ddp::{AverageOver, NcclHook};
use trainer::model::DropoutRates;
use trainer::models::cnn::cnn_layout;
use trainer::train::{JobLinks, Setup, Silent, TrainConfig, Trainer};

const EMULATED: [&str; 2] = [
    "emulated_gpu_accumulation_follows_one_batch",
    "emulated_nccl_averages_bf16_copies",
];

#[test]
fn hooks_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(2, &EMULATED);
}

fn config(batch: usize, k: usize, steps: usize) -> TrainConfig {
    TrainConfig {
        seed: 11,
        max_steps: Some(steps),
        dropout: DropoutRates::OFF,
        bucket_mb: 0.05,
        accumulate_steps: k,
        ..TrainConfig::new(1, batch)
    }
}

#[test]
fn emulated_gpu_accumulation_follows_one_batch() {
    const STEPS: usize = 6;
    let (Some(gpu0), Some(gpu1)) = (common::emulated_gpu(0), common::emulated_gpu(1)) else {
        return;
    };
    let data = common::small_data(64 * STEPS, 50);
    let train = |gpu, cfg| {
        let mut t = Trainer::new(gpu, &data, cfg, None).unwrap();
        t.train_epoch(1, &mut Silent, &mut |_| Ok(())).unwrap();
        t.params().unwrap()
    };
    let (whole, micro) = std::thread::scope(|s| {
        let whole = s.spawn(|| train(gpu0, config(64, 1, STEPS)));
        let micro = train(gpu1, config(16, 4, STEPS));
        (whole.join().unwrap(), micro)
    });
    let diff = relative(&micro, &whole);
    println!("emulated GPU, K = 4 x 16 vs 64: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
}

/// Rank `rank` of 2 training on its own emulated GPU with NCCL, carrying
/// `half`: its parameters and the bytes it sent per step.
fn nccl_rank(
    rank: usize,
    port: u16,
    data: &FashionMnist,
    half: Option<HalfFormat>,
) -> (Vec<f32>, f64) {
    const STEPS: usize = 4;
    let gpu = common::emulated_gpu(rank).unwrap();
    let timeout = Duration::from_secs(60);
    let cfg = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(timeout);
    let mut tcp = TcpCommunicator::connect(&cfg).unwrap();
    let stream = gpu.side_stream().unwrap();
    let nccl = NcclCommunicator::connect(stream, rank, 2, tcp.store(), timeout).unwrap();
    let setup = Setup::linked(JobLinks::Job {
        comm: CommThread::spawn(Box::new(tcp)).unwrap(),
        averaging: Some(AverageOver::Device(Box::new(
            NcclHook::new(nccl, &gpu, half).unwrap(),
        ))),
    });
    let mut t = Trainer::start(gpu, data, config(16, 1, STEPS), setup).unwrap();
    let report = t.train_epoch(1, &mut Silent, &mut |_| Ok(())).unwrap();
    (t.params().unwrap(), report.ranks[rank].grad_bytes_per_step)
}

#[test]
fn emulated_nccl_averages_bf16_copies() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let data = common::small_data(2 * 16 * 4, 50);
    let run = |half| {
        let port = free_port();
        common::on_two_ranks(|rank| nccl_rank(rank, port, &data, half))
    };
    let (float32, bf16) = (run(None), run(Some(HalfFormat::Bf16)));
    let params = cnn_layout().len() as f64;
    // Two ranks: each sends all of what the all-reduce carries.
    assert_eq!(float32[0].1, params * 4.0);
    assert_eq!(bf16[0].1, params * 2.0, "half the bytes");
    let same = bf16[1]
        .0
        .iter()
        .zip(&bf16[0].0)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "the ranks differ");
    let diff = relative(&bf16[0].0, &float32[0].0);
    println!("emulated NCCL, bf16 vs float32 gradients: relative difference {diff:e}");
    assert!(diff > 0.0 && diff <= 1e-2, "relative difference {diff:e}");
}
