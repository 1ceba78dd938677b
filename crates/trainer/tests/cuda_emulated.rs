//! The training loop on the CUDA backend, run without a GPU on `cuda-emu`
//! (crates/cuda-emu), the CPU stand-in for the CUDA driver and NCCL:
//! batches gathered on the device, dropout, the fused loss, the finiteness
//! guard, Adam, evaluation, gradients staged through page-locked buffers for
//! the TCP ring, and gradients all-reduced by NCCL on a side stream while
//! backward goes on, with the watchdog that ends a stalled collective.
//!
//! `training_on_the_cuda_emulator` builds the emulator and re-runs this
//! binary with it loaded (`cuda_emu::rerun_on_emulator`); there the
//! `emulated_*` tests do the work (in the first run they return at once).

mod common;

use std::time::Duration;

use comm::nccl::NcclCommunicator;
use comm::{CommConfig, CommError, ReduceOp, TcpCommunicator};
use common::free_port;
use core_tensor::ops::AdamConfig;
use core_tensor::ops::Conv2dPoolKernel;
use core_tensor::{Backend, Cpu, Cuda, Fp32Tile, GemmStaging, MatmulPrecision, Ops, Products};
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::ddp::{AverageOver, NcclHook, plan_buckets};
use trainer::model::DropoutRates;
use trainer::models::cnn::CnnMnist;
use trainer::phases::Phase;
use trainer::train::{EpochReport, JobLinks, Setup, TrainConfig, Trainer};

const EMULATED: [&str; 7] = [
    "emulated_gpu_training_follows_the_cpu",
    "emulated_bf16_training_follows_float32",
    "emulated_fused_and_unfused_gpu_training_give_the_same_bits",
    "emulated_cp_async_staging_trains_the_register_staging_bits",
    "emulated_gpu_ranks_sharing_one_gpu_stay_identical",
    "emulated_nccl_ranks_on_two_gpus_stay_identical",
    "emulated_nccl_collective_without_its_peer_times_out",
];
const STEPS: usize = 4;

#[test]
fn training_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(2, &EMULATED);
}

fn data() -> FashionMnist {
    common::small_data(2 * 16 * STEPS, 50)
}

fn config(batch_size: usize, dropout: DropoutRates) -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size,
        adam: AdamConfig::default(),
        seed: 5,
        max_steps: Some(STEPS),
        dropout,
        // Small buckets: several all-reduces per step.
        bucket_mb: 0.5,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    }
}

/// One epoch of `STEPS` steps: the parameters after each, and the test
/// accuracy at the end.
fn train<B: Ops>(
    backend: B,
    data: &FashionMnist,
    cfg: TrainConfig,
    comm: Option<CommThread>,
) -> (Vec<Vec<f32>>, f64) {
    run(Trainer::new(backend, data, cfg, comm).unwrap())
}

fn run<B: Ops>(mut trainer: Trainer<B, CnnMnist>) -> (Vec<Vec<f32>>, f64) {
    let (history, report) = common::params_after_each_step(&mut trainer);
    phases_fit_the_epoch(&report);
    let accuracy = trainer.evaluate().unwrap();
    assert_eq!(history.len(), STEPS);
    (history, accuracy)
}

/// Every rank's phase times (device time: CUDA events on a GPU) are
/// positive where the phase does work, and add up to no more than the
/// epoch's wall time.
fn phases_fit_the_epoch(report: &EpochReport) {
    for (rank, stats) in report.ranks.iter().enumerate() {
        let phases = &stats.phases;
        for phase in [
            Phase::Data,
            Phase::Forward,
            Phase::Backward,
            Phase::Optimizer,
        ] {
            assert!(phases.get(phase) > 0.0, "rank {rank}: {phases:?}");
        }
        let total: f64 = phases.0.iter().sum();
        assert!(
            total <= report.train_seconds * 1.01 + 0.01,
            "rank {rank}: phases {total} s in an epoch of {} s",
            report.train_seconds
        );
    }
}

/// SHA-256 of the parameters' bytes (a checkpoint's model file's) after
/// `STEPS` steps of `config(16, REFERENCE)` on `data()` in float32, TF32 and
/// bf16, as the kernels wrote them before precision, tile and staging became
/// types (3ff88fe, cuda-emu, 2026-12-01), for every tile, staging and fusion.
const PARAMS_SHA256: [&str; 3] = [
    "4e3a54ae66f37ee4e4a951201b603fd8b2055ff4df9fe7c68178d0ec4055e8a5",
    "3c30261c8b90df1f4c804823a440459ab80c8b8568b3e02f369361e673f1cb9c",
    "af1e31efad41ab268747e12c67ab907f177d345798a84a8e72af96b63acd79e8",
];

/// `params` (after the last step) hold the bytes recorded for `precision`.
fn has_recorded_bytes(precision: MatmulPrecision, params: &[f32], what: &str) {
    let want = PARAMS_SHA256[precision as usize]; // MatmulPrecision's order
    assert_eq!(common::sha256_hex(params), want, "{precision:?}, {what}");
}

/// Two ranks of batch 16 (dropout off): bitwise identical after every step,
/// and within 1e-5 of one CPU rank of batch 32 on the same samples.
fn ranks_follow_one_cpu_rank(data: &FashionMnist, ranks: &[Vec<Vec<f32>>]) {
    for (step, (a, b)) in ranks[0].iter().zip(&ranks[1]).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "ranks differ after step {}",
            step + 1
        );
    }
    let (single, _) = train(
        Cpu::new(1).unwrap(),
        data,
        config(32, DropoutRates::OFF),
        None,
    );
    let relative = relative_difference(&ranks[0][STEPS - 1], &single[STEPS - 1]);
    assert!(
        relative <= 1e-5,
        "2 ranks of 16 and 1 CPU rank of 32 differ by {relative:e}"
    );
}

/// ‖a − b‖₂ / ‖b‖₂.
fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)))
        / norm(&mut b.iter().map(|&y| f64::from(y)))
}

/// With dropout on: the same masks on both devices (one counter-based RNG),
/// so the GPU follows the CPU up to the order of its sums.
#[test]
fn emulated_gpu_training_follows_the_cpu() {
    let Some(gpu) = common::emulated_gpu(0) else {
        return;
    };
    let data = data();
    let cfg = config(16, DropoutRates::REFERENCE);
    let (on_gpu, gpu_accuracy) = train(gpu, &data, cfg.clone(), None);
    let (on_cpu, cpu_accuracy) = train(Cpu::new(1).unwrap(), &data, cfg, None);
    for (step, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
        let relative = relative_difference(g, c);
        assert!(
            relative <= 1e-5,
            "step {}: GPU and CPU parameters differ by {relative:e}",
            step + 1
        );
    }
    assert_ne!(
        on_gpu[0],
        on_gpu[STEPS - 1],
        "training must move the parameters"
    );
    assert_eq!(gpu_accuracy, cpu_accuracy, "test accuracy");
}

/// Mixed precision (`--bf16`): the products' inputs rounded to bf16, their
/// sums, the weights, the gradients and Adam in float32. The loss follows
/// float32's (the CPU's) within 1 %; the parameters stay near float32's yet
/// differ from them by far more than float32 on the GPU does (1e-5): the
/// products did round. Adam's first steps move each weight by about the
/// learning rate whatever its gradient's size, so a gradient near zero
/// whose sign the rounding flips puts that weight 2·lr away: 1.4 % after
/// one step and 3.5 % after four (2026-11-27). And they stay float32:
/// nearly every parameter lies between two bf16 values, as a checkpoint
/// saves them.
#[test]
fn emulated_bf16_training_follows_float32() {
    if !cuda_emu::in_emulator() {
        return;
    }
    let gpu = Cuda::with_precision(0, MatmulPrecision::Bf16).unwrap();
    let data = data();
    let cfg = config(16, DropoutRates::REFERENCE);
    let (bf16, bf16_loss) = epoch(gpu.clone(), &data, cfg.clone());
    has_recorded_bytes(MatmulPrecision::Bf16, &bf16[STEPS - 1], "fused");
    let (unfused, _) = epoch(gpu.with_fusion(false), &data, cfg.clone());
    has_recorded_bytes(MatmulPrecision::Bf16, &unfused[STEPS - 1], "unfused");
    let (fp32, fp32_loss) = epoch(Cpu::new(1).unwrap(), &data, cfg);
    let loss_gap = (bf16_loss - fp32_loss).abs() / fp32_loss;
    let gaps: Vec<f64> = bf16
        .iter()
        .zip(&fp32)
        .map(|(b, f)| relative_difference(b, f))
        .collect();
    println!(
        "bf16 against float32: mean loss {bf16_loss} and {fp32_loss}, parameters apart by {gaps:?} after each step"
    );
    assert!(
        loss_gap <= 1e-2,
        "mean loss {bf16_loss} in bf16, {fp32_loss} in float32"
    );
    for (step, &relative) in gaps.iter().enumerate() {
        assert!(
            (1e-4..=0.1).contains(&relative),
            "step {}: bf16 and float32 parameters differ by {relative:e}",
            step + 1
        );
    }
    let last = &bf16[STEPS - 1];
    let between = last.iter().filter(|x| x.to_bits() & 0xffff != 0).count();
    assert!(
        between * 10 >= last.len() * 9,
        "only {between} of {} parameters lie between bf16 values",
        last.len()
    );
}

/// One epoch on `backend`: the parameters after each step, and the mean
/// loss.
fn epoch<B: Ops>(backend: B, data: &FashionMnist, cfg: TrainConfig) -> (Vec<Vec<f32>>, f64) {
    let mut trainer = Trainer::<B, CnnMnist>::new(backend, data, cfg, None).unwrap();
    let (history, report) = common::params_after_each_step(&mut trainer);
    assert_eq!(history.len(), STEPS);
    (history, report.loss)
}

/// The fused ops (the GPU's default: conv1 + ReLU; conv2, its max-pool,
/// ReLU and dropout; fc1 + ReLU + dropout, its output stored by the split-K
/// reduction) and their unfused kernels (`--no-fusion`): the same parameter
/// bits after every step, and the same test accuracy.
#[test]
fn emulated_fused_and_unfused_gpu_training_give_the_same_bits() {
    let Some(gpu) = common::emulated_gpu(0) else {
        return;
    };
    assert!(gpu.fuses(), "a GPU fuses by default");
    let data = data();
    let cfg = config(16, DropoutRates::REFERENCE);
    let (fused, fused_accuracy) = train(gpu.clone(), &data, cfg.clone(), None);
    let (unfused, unfused_accuracy) = train(gpu.with_fusion(false), &data, cfg, None);
    has_recorded_bytes(MatmulPrecision::Fp32, &fused[STEPS - 1], "fused");
    for (step, (f, u)) in fused.iter().zip(&unfused).enumerate() {
        assert!(
            f.iter().zip(u).all(|(a, b)| a.to_bits() == b.to_bits()),
            "step {}: fused and unfused parameters differ",
            step + 1
        );
    }
    assert_eq!(fused_accuracy, unfused_accuracy, "test accuracy");
}

/// The tiles staged by cp.async (`--gemm-staging cp-async`), here wide
/// (`--fp32-tile wide`) and unfused (`--no-fusion`), and through registers,
/// square and fused, in float32 and TF32: the same parameter bits after
/// every step, the recorded ones after the last, and the same test accuracy.
#[test]
fn emulated_cp_async_staging_trains_the_register_staging_bits() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let data = data();
    let cfg = config(16, DropoutRates::REFERENCE);
    for precision in [MatmulPrecision::Fp32, MatmulPrecision::Tf32] {
        let products = |tile, staging| Products::new(precision, tile, staging).unwrap();
        let gpu = |products| Cuda::with_products(0, products).unwrap();
        let registers = gpu(products(Fp32Tile::Square, GemmStaging::Registers));
        let copied = gpu(products(Fp32Tile::Wide, GemmStaging::CpAsync)).with_fusion(false);
        let [registers, copied] =
            [registers, copied].map(|gpu| train(gpu, &data, cfg.clone(), None));
        has_recorded_bytes(precision, &registers.0[STEPS - 1], "registers");
        has_recorded_bytes(precision, &copied.0[STEPS - 1], "cp.async, wide, unfused");
        for (step, (r, c)) in registers.0.iter().zip(&copied.0).enumerate() {
            assert!(
                r.iter().zip(c).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{precision:?} step {}: the two stagings' parameters differ",
                step + 1
            );
        }
        assert_eq!(registers.1, copied.1, "{precision:?} test accuracy");
    }
}

/// Two ranks on one GPU over the TCP ring (NCCL refuses that), gradients
/// staged through page-locked host buffers: the ranks stay bitwise
/// identical, and with dropout off they follow one CPU rank of twice the
/// batch.
#[test]
fn emulated_gpu_ranks_sharing_one_gpu_stay_identical() {
    let Some(gpu) = common::emulated_gpu(0) else {
        return;
    };
    let data = data();
    let port = free_port();
    let ranks: Vec<Vec<Vec<f32>>> = common::on_two_ranks(|rank| {
        let gpu = gpu.clone();
        let cfg = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(Duration::from_secs(60));
        let comm = TcpCommunicator::connect(&cfg).unwrap();
        let comm = CommThread::spawn(Box::new(comm)).unwrap();
        train(gpu, &data, config(16, DropoutRates::OFF), Some(comm)).0
    });
    ranks_follow_one_cpu_rank(&data, &ranks);
}

/// Rank `rank` of 2 on the TCP ring at `port` (for the starting point and
/// the metrics) and on NCCL on its own emulated GPU, the unique id passing
/// through the ring's store, as the worker sets it up.
fn nccl_rank(
    rank: usize,
    port: u16,
    gpu: &Cuda,
    timeout: Duration,
) -> (TcpCommunicator, NcclCommunicator) {
    let cfg = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(timeout);
    let mut tcp = TcpCommunicator::connect(&cfg).unwrap();
    let stream = gpu.side_stream().unwrap();
    let nccl = NcclCommunicator::connect(stream, rank, 2, tcp.store(), timeout).unwrap();
    (tcp, nccl)
}

/// Two ranks on two GPUs averaging gradients with NCCL (several buckets,
/// each all-reduced on the side stream as soon as backward has written
/// it): the ranks stay bitwise identical and follow one CPU rank of twice
/// the batch.
#[test]
fn emulated_nccl_ranks_on_two_gpus_stay_identical() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let data = data();
    let port = free_port();
    let ran = common::on_two_ranks(|rank| {
        let gpu = common::emulated_gpu(rank).unwrap();
        let (tcp, nccl) = nccl_rank(rank, port, &gpu, Duration::from_secs(60));
        let flight = nccl.recorder().clone();
        let cfg = TrainConfig {
            bucket_mb: 0.05,
            sparse_grads: trainer::ddp::SparseGrads::Auto,
            sparse_adam: false,
            ..config(16, DropoutRates::OFF)
        };
        let layout = trainer::models::cnn::cnn_layout();
        let buckets = plan_buckets(layout, 0..layout.len(), cfg.bucket_mb);
        assert!(buckets.len() > 2, "several buckets overlap backward");
        let setup = Setup::linked(JobLinks::Job {
            comm: CommThread::spawn(Box::new(tcp)).unwrap(),
            averaging: Some(AverageOver::Device(Box::new(
                NcclHook::new(nccl, &gpu, None).unwrap(),
            ))),
        });
        let params = run(Trainer::start(gpu, &data, cfg, setup).unwrap()).0;
        (params, flight.snapshot(), buckets.len())
    });
    // The flight records, from the CUDA events around each collective:
    // every one done, the same collectives on both ranks, each step's
    // buckets in launch order after connect's barrier.
    let seen = |r: usize| -> Vec<_> {
        (ran[r].1.entries.iter())
            .map(|e| (e.seq, e.kind, e.bucket, e.bytes, e.state))
            .collect()
    };
    assert_eq!(seen(0), seen(1));
    let buckets = ran[0].2;
    assert_eq!(seen(0).len(), 1 + STEPS * buckets);
    assert_eq!(seen(0)[0].1, comm::flight::Kind::Barrier);
    for (i, (seq, kind, bucket, _, state)) in seen(0).into_iter().enumerate().skip(1) {
        assert_eq!(
            (seq, kind, state),
            (
                i as u64 + 1,
                comm::flight::Kind::AllReduce,
                comm::flight::State::Done
            )
        );
        assert_eq!(bucket, Some((i - 1) % buckets));
    }
    let ranks: Vec<Vec<Vec<f32>>> = ran.into_iter().map(|r| r.0).collect();
    ranks_follow_one_cpu_rank(&data, &ranks);
}

/// A collective whose peer never comes: the watchdog aborts it at the
/// timeout, and the rank's next call names itself and the collective.
#[test]
fn emulated_nccl_collective_without_its_peer_times_out() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let port = free_port();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let gpu = common::emulated_gpu(1).unwrap();
            let _peer = nccl_rank(1, port, &gpu, TIMEOUT);
            // Connected, but never joins the collective.
            done_rx.recv().unwrap();
        });
        let gpu = common::emulated_gpu(0).unwrap();
        let (_tcp, nccl) = nccl_rank(0, port, &gpu, TIMEOUT);
        let mut buf = gpu.upload(&[1.0f32; 64]).unwrap();
        nccl.stream().join(gpu.stream()).unwrap();
        let started = std::time::Instant::now();
        // SAFETY: nothing else uses `buf`, and `nccl` is dropped before it
        // (below): that drop joins the watchdog, which has aborted the
        // collective by then, so nothing writes `buf` once it is freed.
        unsafe { nccl.all_reduce_in_place(&mut buf, ReduceOp::Sum, "lonely all-reduce") }.unwrap();
        let err = nccl.wait().unwrap_err();
        assert!(
            matches!(&err, CommError::NcclTimeout { rank: 0, op, .. } if op.contains("lonely all-reduce")),
            "{err}"
        );
        let took = started.elapsed();
        assert!(
            took >= TIMEOUT && took < TIMEOUT * 4,
            "failed after {took:?}"
        );
        // Its flight record: connect's barrier done, then the all-reduce
        // the stream reached (its start event completed) and never ended.
        let flight = nccl.recorder().snapshot();
        let seen: Vec<_> = (flight.entries.iter())
            .map(|e| (e.seq, e.kind, e.bytes, e.state))
            .collect();
        use comm::flight::{Kind, State};
        assert_eq!(
            seen,
            [
                (1, Kind::Barrier, 4, State::Done),
                (2, Kind::AllReduce, 256, State::Started)
            ]
        );
        done_tx.send(()).unwrap();
        drop(nccl);
    });
}
