//! `--reproducible` on the CUDA backend, run without a GPU on `cuda-emu`
//! (see `cuda_emulated.rs`): units trained one at a time on the device,
//! dropout keyed by the sample's row in the global batch, and the units'
//! gradients summed exactly, over NCCL as `ncclInt64` (a maximum per block,
//! then the sum). One emulated GPU and two over NCCL end on the same bytes.
//!
//! The binary too (`--device cuda --reproducible`, the toy model: seconds
//! on the emulator): world 1 and world 2 over NCCL write the same
//! `model.safetensors`.
//!
//! `reproducible_on_the_cuda_emulator` builds the emulator and re-runs this
//! binary with it loaded; there `emulated_*` does the work.

mod common;

use std::path::Path;
use std::time::Duration;

use comm::flight::{Kind, State};
use comm::nccl::NcclCommunicator;
use comm::{CommConfig, IntReduce, TcpCommunicator};
use common::free_port;
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::ddp::{AverageOver, NcclHook, ring_bytes};
use trainer::model::DropoutRates;
use trainer::models::cnn::cnn_layout;
use trainer::train::{
    EXACT_BLOCK, EpochReport, ExactRequest, JobLinks, Setup, TrainConfig, Trainer,
};

const EMULATED: [&str; 3] = [
    "emulated_nccl_reduces_int64_exactly",
    "emulated_one_gpu_and_two_over_nccl_end_on_the_same_bytes",
    "emulated_the_binary_writes_one_model_on_one_gpu_and_two",
];

/// Steps of each run; a step is `GLOBAL` samples in units of `UNIT`: three
/// units, so that the two GPUs' shares differ (two units and one).
const STEPS: usize = 3;
const GLOBAL: usize = 24;
const UNIT: usize = 8;

#[test]
fn reproducible_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(2, &EMULATED);
}

fn config() -> TrainConfig {
    TrainConfig {
        seed: 3,
        max_steps: Some(STEPS),
        dropout: DropoutRates::REFERENCE,
        exact: Some(ExactRequest {
            global_batch: Some(GLOBAL),
            unit: UNIT,
        }),
        ..TrainConfig::new(1, UNIT)
    }
}

/// The parameters after the last step, and the epoch's report.
fn train(
    mut trainer: Trainer<core_tensor::Cuda, trainer::models::cnn::CnnMnist>,
) -> (Vec<f32>, EpochReport) {
    let (mut history, report) = common::params_after_each_step(&mut trainer);
    assert_eq!(history.len(), STEPS);
    assert_ne!(
        history[0],
        history[STEPS - 1],
        "training moves the parameters"
    );
    (history.pop().unwrap(), report)
}

/// Rank `rank` of 2 training over NCCL ([`nccl_rank`]; the TCP ring
/// carries the starting point and the metrics): its parameters after the
/// last step, its report, and its NCCL collectives.
fn on_nccl(
    rank: usize,
    port: u16,
    data: &FashionMnist,
) -> (Vec<f32>, EpochReport, Vec<(Kind, usize, State)>) {
    let (tcp, nccl, gpu) = nccl_rank(rank, port);
    let flight = nccl.recorder().clone();
    let setup = Setup::linked(JobLinks::Job {
        comm: CommThread::spawn(Box::new(tcp)).unwrap(),
        averaging: Some(AverageOver::Device(Box::new(
            NcclHook::new(nccl, &gpu, None).unwrap(),
        ))),
    });
    let (params, report) = train(Trainer::start(gpu, data, config(), setup).unwrap());
    let seen = (flight.snapshot().entries.iter())
        .map(|e| (e.kind, e.bytes, e.state))
        .collect();
    (params, report, seen)
}

/// Rank `rank`'s NCCL communicator on emulated GPU `rank`, the unique id
/// passing through the TCP ring's store at `port`.
fn nccl_rank(rank: usize, port: u16) -> (TcpCommunicator, NcclCommunicator, core_tensor::Cuda) {
    let timeout = Duration::from_secs(60);
    let gpu = common::emulated_gpu(rank).unwrap();
    let config = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(timeout);
    let mut tcp = TcpCommunicator::connect(&config).unwrap();
    let stream = gpu.side_stream().unwrap();
    let nccl = NcclCommunicator::connect(stream, rank, 2, tcp.store(), timeout).unwrap();
    (tcp, nccl, gpu)
}

/// `ncclInt64` sums wrap as two's complement and maxima order negatives,
/// over more elements than the emulator's staging slot holds at once.
#[test]
fn emulated_nccl_reduces_int64_exactly() {
    const LEN: usize = 300_001;
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let values = |rank: usize| -> Vec<i64> {
        let mut v: Vec<i64> = (0..LEN as i64).map(|i| [i, -3 * i - 1][rank]).collect();
        v[0] = [i64::MAX, 2][rank];
        v
    };
    let port = free_port();
    let got = common::on_two_ranks(|rank| {
        let (_tcp, nccl, _gpu) = nccl_rank(rank, port);
        let stream = nccl.stream().clone();
        [IntReduce::Sum, IntReduce::Max].map(|op| {
            let mut buf = stream.clone_htod(&values(rank)).unwrap();
            // SAFETY: `buf` is this test's own, on the communication
            // stream; `wait` returns once the collective is done.
            unsafe { nccl.all_reduce_in_place(&mut buf, op, "int64 all-reduce") }.unwrap();
            nccl.wait().unwrap();
            stream.clone_dtoh(&buf).unwrap()
        })
    });
    let (a, b) = (values(0), values(1));
    let sum: Vec<i64> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    let max: Vec<i64> = a.iter().zip(&b).map(|(x, y)| *x.max(y)).collect();
    assert_eq!(sum[0], i64::MIN + 1, "the sum wraps");
    for (rank, [s, m]) in got.iter().enumerate() {
        assert!(s == &sum, "rank {rank}: the sum");
        assert!(m == &max, "rank {rank}: the maximum");
    }
}

/// One GPU training every unit, and two GPUs over NCCL training two units
/// and one: the same parameter bits after the last step (the bytes of a
/// checkpoint's `model.safetensors`), each step's sum two `ncclInt64`
/// all-reduces (the blocks' maxima, then the sum), and the bytes per step
/// they count.
#[test]
fn emulated_one_gpu_and_two_over_nccl_end_on_the_same_bytes() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let data = common::small_data(GLOBAL * STEPS, 16);
    let (alone, _) =
        train(Trainer::new(common::emulated_gpu(0).unwrap(), &data, config(), None).unwrap());
    let port = free_port();
    let ranks = common::on_two_ranks(|rank| on_nccl(rank, port, &data));
    for (rank, (params, _, _)) in ranks.iter().enumerate() {
        assert!(
            params
                .iter()
                .zip(&alone)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {rank} of two GPUs ends on other bits than one GPU"
        );
    }
    let layout = cnn_layout();
    let blocks: usize = (layout.views().iter())
        .map(|v| v.range.len().div_ceil(EXACT_BLOCK))
        .sum();
    let len = layout.len();
    let (_, report, seen) = &ranks[0];
    assert_eq!(seen, &ranks[1].2, "both ranks' collectives");
    let mut want = vec![(Kind::Barrier, 4, State::Done)];
    for _ in 0..STEPS {
        want.push((Kind::AllReduce, 8 * blocks, State::Done));
        want.push((Kind::AllReduce, 8 * len, State::Done));
    }
    assert_eq!(
        seen, &want,
        "connect's barrier, then per step the maxima and the sum"
    );
    let per_step = report.ranks[0].grad_bytes_per_step;
    let exact = ring_bytes(blocks, 8, 2) + ring_bytes(len, 8, 2);
    assert_eq!(per_step, exact as f64, "bytes per step");
    println!(
        "bytes per step at two GPUs over NCCL: {per_step} with --reproducible ({blocks} block maxima and {len} sums, i64), {} for the float32 all-reduce",
        ring_bytes(len, 4, 2)
    );
}

/// The binary's `model.safetensors` after three steps of the toy model on
/// `world` emulated GPUs (`--backend nccl`: at world 1 nothing to average),
/// written into `dir`.
fn toy_model_bytes(dir: &Path, world: usize) -> Vec<u8> {
    let out = common::run(
        common::trainer()
            .args(["--model", "toy", "--samples", "512", "--epochs", "1"])
            .args(["--max-steps", "3", "--seed", "3", "--timeout", "60"])
            .args(["--device", "cuda", "--backend", "nccl"])
            .args(["--world-size", &world.to_string()])
            .args(["--reproducible", "--global-batch", "48", "--unit", "16"])
            .arg("--checkpoint-dir")
            .arg(dir),
    );
    let err = common::stderr(&out);
    assert!(out.status.success(), "world {world}: {err}");
    let ckpt = dir.join("ckpt-e0002-s000000").join("model.safetensors");
    std::fs::read(&ckpt).unwrap_or_else(|e| panic!("{}: {e}\n{err}", ckpt.display()))
}

#[test]
fn emulated_the_binary_writes_one_model_on_one_gpu_and_two() {
    if !cuda_emu::in_emulator() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let one = toy_model_bytes(&tmp.path().join("w1"), 1);
    let two = toy_model_bytes(&tmp.path().join("w2"), 2);
    assert!(
        one == two,
        "world 1 and world 2 over NCCL wrote other bytes"
    );
}
