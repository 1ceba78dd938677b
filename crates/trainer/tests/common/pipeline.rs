//! Pipeline fixtures: a rank of pipelines wired as the worker wires it,
//! ranks as threads over the in-process or TCP transport, and the
//! comparisons the pipeline tests make.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{free_port, small_data};
use comm::{CommConfig, CommError, Communicator, LocalCommunicator, ReduceOp, TcpCommunicator};
use core_tensor::Cpu;
use core_tensor::ops::AdamConfig;
use fashion_mnist::FashionMnist;
use trainer::comm_thread::CommThread;
use trainer::ddp::AverageOver;
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, StageSpec, cnn_layout};
use trainer::phases::Phase;
use trainer::pipeline::HostLink;
use trainer::topology::Topology;
use trainer::train::{JobLinks, Setup, Silent, TrainConfig, Trainer};

pub const STEPS: usize = 30;

pub fn data() -> FashionMnist {
    small_data(2 * 32 * STEPS, 100)
}

pub fn config() -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size: 32,
        adam: AdamConfig::default(),
        seed: 11,
        max_steps: Some(STEPS),
        dropout: DropoutRates::OFF,
        bucket_mb: 0.05,
        sparse_grads: trainer::ddp::SparseGrads::Auto,
        sparse_adam: false,
        ..TrainConfig::new(1, 1)
    }
}

/// A communicator that counts the f32 elements it all-reduces.
pub struct Counting {
    inner: Box<dyn Communicator>,
    f32s: Arc<AtomicUsize>,
}

impl Counting {
    /// `inner`, and the count of the f32 elements it all-reduces.
    pub fn wrap(inner: Box<dyn Communicator>) -> (Box<dyn Communicator>, Arc<AtomicUsize>) {
        let f32s = Arc::new(AtomicUsize::new(0));
        let counting = Counting {
            inner,
            f32s: Arc::clone(&f32s),
        };
        (Box::new(counting), f32s)
    }
}

impl Communicator for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.f32s.fetch_add(buf.len(), Ordering::Relaxed);
        self.inner.all_reduce(buf, op)
    }
    fn all_reduce_half(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        format: comm::HalfFormat,
    ) -> Result<(), CommError> {
        self.f32s.fetch_add(buf.len(), Ordering::Relaxed);
        self.inner.all_reduce_half(buf, op, format)
    }
    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        self.inner.all_reduce_f64(buf, op)
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        self.inner.broadcast(buf, root)
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        self.inner.barrier()
    }
    fn send_recv(
        &mut self,
        send: Option<(&[f32], usize)>,
        recv: Option<(&mut [f32], usize)>,
    ) -> Result<(), CommError> {
        self.inner.send_recv(send, recv)
    }
    fn subgroup(&mut self, members: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        self.inner.subgroup(members)
    }
}

/// What one rank ended with.
pub struct Trained {
    pub params: Vec<f32>,
    /// The parameters it trained.
    pub part: usize,
    /// f32 elements all-reduced over the whole job's communicator, and
    /// over a pipeline stage's data-parallel group.
    pub job_f32s: usize,
    pub group_f32s: usize,
}

/// A counter of f32 elements all-reduced.
pub type Count = Arc<AtomicUsize>;

/// A pipeline layout: stages, micro-batches a batch, and the cut (each
/// stage's segments; `None`: at the measured times).
#[derive(Clone)]
pub struct Layout {
    pub stages: usize,
    pub micro_batches: usize,
    pub cut: Option<Vec<Range<usize>>>,
}

/// The layout the tests default to: the convolutions, then the fully
/// connected layers, in 4 micro-batches.
pub fn two_stages() -> Layout {
    Layout {
        stages: 2,
        micro_batches: 4,
        cut: Some(vec![0..2, 2..4]),
    }
}

/// A rank of pipelines laid out as `layout` on `backend` over `comm` (its
/// job communicator), wired as the worker wires it, `setup` adding to a
/// fresh start; with the counts of what it all-reduces over the job and
/// over its stage's group.
pub fn stage_trainer(
    data: &FashionMnist,
    backend: Cpu,
    mut comm: Box<dyn Communicator>,
    layout: Layout,
    setup: impl FnOnce(Setup<Cpu>) -> Setup<Cpu>,
) -> (Trainer<Cpu, CnnMnist>, Count, Option<Count>) {
    let (rank, world) = (comm.rank(), comm.world_size());
    let topology = Topology::new((rank, world), (rank, world), layout.stages).unwrap();
    let pipeline = comm.subgroup(&topology.pipeline_members()).unwrap();
    let link = Box::new(HostLink::new(pipeline));
    let (averaging, group_f32s) = match topology.replicas() {
        1 => (None, None),
        _ => {
            let group = comm.subgroup(&topology.stage_group()).unwrap();
            let (group, count) = Counting::wrap(group);
            let over = AverageOver::Group(CommThread::spawn(group).unwrap());
            (Some(over), Some(count))
        }
    };
    let (comm, job_f32s) = Counting::wrap(comm);
    let comm = CommThread::spawn(comm).unwrap();
    let setup = setup(Setup {
        topology,
        ..Setup::linked(JobLinks::Job { comm, averaging })
    });
    let stage = StageSpec {
        micro_batches: layout.micro_batches,
        link,
        cut: layout.cut,
    };
    let trainer = Trainer::pipeline_stage(backend, data, (config(), setup), stage).unwrap();
    (trainer, job_f32s, group_f32s)
}

/// The final parameters of one rank: a plain data-parallel rank (no
/// `layout`) or a pipeline stage, over `comm` (`None`: alone).
pub fn train(
    data: &FashionMnist,
    comm: Option<Box<dyn Communicator>>,
    layout: Option<Layout>,
) -> Trained {
    let Some(layout) = layout else {
        let comm = comm.map(|c| CommThread::spawn(c).unwrap());
        let mut trainer = Trainer::new(Cpu::new(1).unwrap(), data, config(), comm).unwrap();
        trainer
            .train_epoch(1, &mut Silent, &mut |_| Ok(()))
            .unwrap();
        return Trained {
            params: trainer.params().unwrap(),
            part: cnn_layout().len(),
            job_f32s: 0,
            group_f32s: 0,
        };
    };
    let comm = comm.expect("a pipeline has several ranks");
    let (mut trainer, job_f32s, group_f32s) =
        stage_trainer(data, Cpu::new(1).unwrap(), comm, layout, |s| s);
    let report = trainer
        .train_epoch(1, &mut Silent, &mut |_| Ok(()))
        .unwrap();
    // Every stage sends, receives, and waits for its neighbours.
    let phases = report.ranks[trainer.rank()].phases;
    assert!(phases.get(Phase::PipelineWait) > 0.0, "{phases:?}");
    // The rank holds its stage's part only; the whole comes from all.
    let stage = trainer.part().unwrap().range();
    let part = trainer.params().unwrap();
    let whole = trainer.whole_params().unwrap();
    assert!(part[..] == whole[stage.clone()], "rank {}", trainer.rank());
    Trained {
        params: whole,
        part: stage.len(),
        job_f32s: job_f32s.load(Ordering::Relaxed),
        group_f32s: group_f32s.map_or(0, |c| c.load(Ordering::Relaxed)),
    }
}

/// Each rank's result, `body(rank, comm)` on a thread per rank.
pub fn on_ranks<T: Send>(
    comms: Vec<Box<dyn Communicator>>,
    body: impl Fn(Box<dyn Communicator>) -> T + Sync,
) -> Vec<T> {
    let body = &body;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || body(c)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub fn local_job(world: usize) -> Vec<Box<dyn Communicator>> {
    LocalCommunicator::job(world, Duration::from_secs(30))
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Communicator>)
        .collect()
}

pub fn tcp_job(world: usize) -> Vec<Box<dyn Communicator>> {
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let cfg = CommConfig::new(rank, world, "127.0.0.1", port)
                        .with_timeout(Duration::from_secs(30));
                    Box::new(TcpCommunicator::connect(&cfg).unwrap()) as Box<dyn Communicator>
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// ‖a − b‖₂ / ‖b‖₂.
pub fn relative(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)))
        / norm(&mut b.iter().map(|&y| f64::from(y)))
}

pub fn all_identical(ranks: &[Trained]) {
    for (r, t) in ranks.iter().enumerate() {
        assert!(
            t.params
                .iter()
                .zip(&ranks[0].params)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {r} holds another model than rank 0"
        );
    }
}
