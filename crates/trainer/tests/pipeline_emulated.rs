//! Pipeline parallelism on GPUs, run without a GPU on `cuda-emu`: NCCL
//! point-to-point (`ncclSend`/`ncclRecv` in one group) between two
//! emulated GPUs, on a communicator of its own made through the job's
//! store (a sub-group's), and a two-stage pipeline training on two
//! emulated GPUs, its activations and their gradients going GPU to GPU
//! over NCCL send/recv (one replica per stage: no gradient to average),
//! and 2 stages x 2 replicas on four emulated GPUs, each stage's gradients
//! averaged by NCCL within its data-parallel group.
//!
//! `pipeline_on_the_cuda_emulator` builds the emulator and re-runs this
//! binary with it loaded; there the `emulated_*` tests do the work.

mod common;

use std::time::Duration;

use comm::nccl::NcclCommunicator;
use comm::{CommConfig, LocalCommunicator, TcpCommunicator};
use common::free_port;
use core_tensor::ops::AdamConfig;
use core_tensor::{Backend, Cpu, Cuda};
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::ddp::{AverageOver, CommHook, NcclHook};
use trainer::model::DropoutRates;
use trainer::models::cnn::StageSpec;
use trainer::pipeline::NcclLink;
use trainer::topology::Topology;
use trainer::train::{JobLinks, Setup, Silent, TrainConfig, Trainer};

/// A device buffer of the CUDA backend.
type Buf = <Cuda as Backend>::Storage<f32>;

const EMULATED: [&str; 3] = [
    "emulated_nccl_send_recv_between_two_gpus",
    "emulated_two_stages_on_two_gpus_follow_one_cpu_rank",
    "emulated_two_stages_by_two_replicas_on_four_gpus_follow_two_cpu_ranks",
];

#[test]
fn pipeline_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(4, &EMULATED);
}

fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (rank * 1_000_003 + i) as f32).collect()
}

/// Both directions at once (longer than the emulator's staging slot), then
/// one direction only, then a peer that is this rank itself (refused).
#[test]
fn emulated_nccl_send_recv_between_two_gpus() {
    const LEN: usize = 600_001;
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let port = free_port();
    let got = common::on_two_ranks(|rank| {
        let gpu = common::emulated_gpu(rank).unwrap();
        let timeout = Duration::from_secs(60);
        let cfg = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(timeout);
        let mut tcp = TcpCommunicator::connect(&cfg).unwrap();
        let stream = gpu.side_stream().unwrap();
        let nccl =
            NcclCommunicator::connect_named(stream, rank, 2, tcp.store(), timeout, "pipeline-0")
                .unwrap();
        let peer = 1 - rank;
        let mine = gpu.upload(&values(rank, LEN)).unwrap();
        let mut theirs = gpu.upload(&vec![0.0_f32; LEN]).unwrap();
        let mut one_way = gpu.upload(&[0.0_f32; 7]).unwrap();
        nccl.stream().join(gpu.stream()).unwrap();
        // SAFETY: the buffers outlive `nccl.wait()`, which returns once the
        // exchanges completed, and no other stream touches them meanwhile.
        unsafe {
            nccl.send_recv(Some((&mine, peer)), Some((&mut theirs, peer)), "exchange")
                .unwrap();
            if rank == 0 {
                nccl.send_recv(None::<(&Buf, usize)>, Some((&mut one_way, peer)), "one way")
                    .unwrap();
            } else {
                let seven = gpu.upload(&values(rank, 7)).unwrap();
                nccl.send_recv(Some((&seven, peer)), None::<(&mut Buf, usize)>, "one way")
                    .unwrap();
                nccl.wait().unwrap();
            }
        }
        nccl.wait().unwrap();
        // SAFETY: refused before anything is queued.
        let refused =
            unsafe { nccl.send_recv(Some((&mine, rank)), None::<(&mut Buf, usize)>, "self") };
        assert!(
            refused
                .unwrap_err()
                .to_string()
                .contains("not another rank")
        );
        (
            gpu.download(&theirs).unwrap(),
            gpu.download(&one_way).unwrap(),
        )
    });
    for (rank, (theirs, one_way)) in got.into_iter().enumerate() {
        assert!(
            theirs == values(1 - rank, LEN),
            "rank {rank} got a wrong message"
        );
        if rank == 0 {
            assert_eq!(one_way, values(1, 7));
        }
    }
}

fn config() -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size: 16,
        adam: AdamConfig::default(),
        seed: 5,
        max_steps: Some(3),
        dropout: DropoutRates::OFF,
        bucket_mb: 0.5,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    }
}

/// Rank `rank` of `world` (2 stages x `world / 2` replicas) on emulated
/// GPU `rank`, connected as the worker connects them: each stage's
/// gradients over NCCL within its data-parallel group (none with one
/// replica), each pipeline's activations over its own NCCL communicator.
/// Its parameters after one epoch of `data`.
fn train_gpu_stage(rank: usize, world: usize, port: u16, data: &FashionMnist) -> Vec<f32> {
    let gpu = common::emulated_gpu(rank).unwrap();
    let timeout = Duration::from_secs(120);
    let cfg = CommConfig::new(rank, world, "127.0.0.1", port).with_timeout(timeout);
    let mut tcp = TcpCommunicator::connect(&cfg).unwrap();
    let topology = Topology::new((rank, world), (rank, world), 2).unwrap();
    let (stage, replica) = (topology.stage(), topology.replica());
    let mut nccl = |rank, name: String| {
        let stream = gpu.side_stream().unwrap();
        NcclCommunicator::connect_named(stream, rank, 2, tcp.store(), timeout, &name).unwrap()
    };
    let grads =
        (topology.replicas() > 1).then(|| nccl(replica, format!("gradients-stage-{stage}")));
    let pipe = nccl(stage, format!("pipeline-{replica}"));
    let link = Box::new(NcclLink::new(pipe, &gpu));
    let hook = |g| Box::new(NcclHook::new(g, &gpu, None).unwrap()) as Box<dyn CommHook<Cuda>>;
    let setup = Setup {
        topology,
        ..Setup::linked(JobLinks::Job {
            comm: CommThread::spawn(Box::new(tcp)).unwrap(),
            averaging: grads.map(|g| AverageOver::Device(hook(g))),
        })
    };
    // The convolutions, then the fully connected layers: pinned, where
    // measuring the emulator's times would only slow the test down.
    let stage = StageSpec {
        micro_batches: 2,
        link,
        cut: Some(vec![0..2, 2..4]),
    };
    let mut trainer = Trainer::pipeline_stage(gpu, data, (config(), setup), stage).unwrap();
    trainer
        .train_epoch(1, &mut Silent, &mut |_| Ok(()))
        .unwrap();
    trainer.whole_params().unwrap()
}

/// ‖a − b‖₂ / ‖b‖₂.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)))
        / norm(&mut b.iter().map(|&y| f64::from(y)))
}

/// Stage `rank` on emulated GPU `rank`; the CPU rank it must follow.
#[test]
fn emulated_two_stages_on_two_gpus_follow_one_cpu_rank() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let data = common::small_data(16 * 3, 20);
    let port = free_port();
    let stages = common::on_two_ranks(|rank| train_gpu_stage(rank, 2, port, &data));
    let mut single = Trainer::new(Cpu::new(1).unwrap(), &data, config(), None).unwrap();
    single.train_epoch(1, &mut Silent, &mut |_| Ok(())).unwrap();
    let single = single.params().unwrap();
    assert!(stages[0] == stages[1], "the stages hold different models");
    let diff = relative(&stages[0], &single);
    assert!(
        diff <= 1e-4,
        "2 GPU stages and 1 CPU rank differ by {diff:e}"
    );
}

/// 2 stages x 2 replicas on four emulated GPUs; the 2 CPU data-parallel
/// ranks they must follow.
#[test]
fn emulated_two_stages_by_two_replicas_on_four_gpus_follow_two_cpu_ranks() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let data = common::small_data(2 * 16 * 3, 20);
    let port = free_port();
    let data = &data;
    let grid: Vec<Vec<f32>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..4)
            .map(|r| s.spawn(move || train_gpu_stage(r, 4, port, data)))
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let ddp: Vec<Vec<f32>> = std::thread::scope(|s| {
        let ranks: Vec<_> = LocalCommunicator::job(2, Duration::from_secs(120))
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let comm = CommThread::spawn(Box::new(comm)).unwrap();
                    let mut trainer =
                        Trainer::new(Cpu::new(1).unwrap(), data, config(), Some(comm)).unwrap();
                    trainer
                        .train_epoch(1, &mut Silent, &mut |_| Ok(()))
                        .unwrap();
                    trainer.params().unwrap()
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (r, params) in grid.iter().enumerate() {
        assert!(
            params == &grid[0],
            "rank {r} holds another model than rank 0"
        );
    }
    let diff = relative(&grid[0], &ddp[0]);
    assert!(
        diff <= 1e-4,
        "2 x 2 GPU stages and 2 CPU ranks differ by {diff:e}"
    );
}
