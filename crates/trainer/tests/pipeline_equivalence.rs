//! Pipeline parallelism changes where layers run, not what is learned:
//! with dropout off and one micro-batch a batch, any number of stages cut
//! anywhere gives a data-parallel rank's bits; with several micro-batches
//! (which sum gradients in another order) 2 stages follow 1 rank, and 2
//! stages x 2 replicas follow 2 data-parallel ranks, within 1e-4 after 30
//! steps, whatever the cut. Every rank holds its stage's part only, and
//! the parts the ranks of a layout hold make the same whole model, bit for
//! bit. A stage's gradients travel within its data-parallel group only,
//! and only the stage's own.

mod common;

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use comm::{CommConfig, CommError, Communicator, LocalCommunicator, ReduceOp, TcpCommunicator};
use common::free_port;
use core_tensor::ops::AdamConfig;
use core_tensor::{Backend, Cpu};
use fashion_mnist::FashionMnist;
use trainer::checkpoint::origin::Origin;
use trainer::checkpoint::{CheckpointDir, Checkpoints, Position};
use trainer::comm_thread::CommThread;
use trainer::ddp::AverageOver;
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, StageSpec, cnn_layout};
use trainer::phases::Phase;
use trainer::pipeline::HostLink;
use trainer::stop::{StopKind, StopRequest};
use trainer::topology::Topology;
use trainer::train::{EpochReport, RunOutcome, Setup, Silent, TrainConfig, Trainer};

const STEPS: usize = 30;

fn data() -> FashionMnist {
    common::small_data(2 * 32 * STEPS, 100)
}

fn config() -> TrainConfig {
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
    }
}

/// A communicator that counts the f32 elements it all-reduces.
struct Counting {
    inner: Box<dyn Communicator>,
    f32s: Arc<AtomicUsize>,
}

impl Counting {
    fn wrap(inner: Box<dyn Communicator>) -> (Box<dyn Communicator>, Arc<AtomicUsize>) {
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
struct Trained {
    params: Vec<f32>,
    /// The parameters it trained.
    part: usize,
    /// f32 elements all-reduced over the whole job's communicator, and
    /// over a pipeline stage's data-parallel group.
    job_f32s: usize,
    group_f32s: usize,
}

/// A counter of f32 elements all-reduced.
type Count = Arc<AtomicUsize>;

/// A pipeline layout: stages, micro-batches a batch, and the cut (each
/// stage's segments; `None`: at the measured times).
#[derive(Clone)]
struct Layout {
    stages: usize,
    micro_batches: usize,
    cut: Option<Vec<Range<usize>>>,
}

/// The layout the tests default to: the convolutions, then the fully
/// connected layers, in 4 micro-batches.
fn two_stages() -> Layout {
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
fn stage_trainer(
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
    let setup = setup(Setup {
        topology,
        averaging,
        ..Setup::fresh(Some(CommThread::spawn(comm).unwrap()))
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
fn train(
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
fn on_ranks<T: Send>(
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

fn local_job(world: usize) -> Vec<Box<dyn Communicator>> {
    LocalCommunicator::job(world, Duration::from_secs(30))
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Communicator>)
        .collect()
}

fn tcp_job(world: usize) -> Vec<Box<dyn Communicator>> {
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
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)))
        / norm(&mut b.iter().map(|&y| f64::from(y)))
}

fn all_identical(ranks: &[Trained]) {
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

#[test]
fn two_stages_follow_one_rank() {
    let data = data();
    let single = train(&data, None, None).params;
    let stages = on_ranks(tcp_job(2), |comm| {
        train(&data, Some(comm), Some(two_stages()))
    });
    all_identical(&stages);
    // One replica per stage: no gradient is averaged anywhere (the whole
    // model is assembled by broadcasts at the epoch's end).
    for (rank, t) in stages.iter().enumerate() {
        assert_eq!((t.job_f32s, t.group_f32s), (0, 0), "rank {rank}");
    }
    let diff = relative(&stages[0].params, &single);
    println!("2 stages vs 1 rank: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
    let init = CnnMnist::new(DropoutRates::OFF).init_params(config().seed);
    assert!(
        relative(&single, &init) > 1e-3,
        "training must move the parameters"
    );
}

/// With one micro-batch a batch a stage computes what the whole model
/// computes, in the same order, so every cut of every number of stages
/// gives the bits of one rank; and the cut never changes a bit, so the
/// cuts of 4 micro-batches (3 of them, and 3 micro-batches of uneven
/// sizes) agree with each other to the bit.
#[test]
fn one_micro_batch_is_data_parallelism_whatever_the_cut() {
    let data = data();
    let single = train(&data, None, None).params;
    let cuts: [&[Range<usize>]; 7] = [
        &[0..1, 1..4],
        &[0..2, 2..4],
        &[0..3, 3..4],
        &[0..1, 1..2, 2..4],
        &[0..1, 1..3, 3..4],
        &[0..2, 2..3, 3..4],
        &[0..1, 1..2, 2..3, 3..4],
    ];
    for cut in cuts {
        let layout = Layout {
            stages: cut.len(),
            micro_batches: 1,
            cut: Some(cut.to_vec()),
        };
        let ranks = on_ranks(local_job(cut.len()), |comm| {
            train(&data, Some(comm), Some(layout.clone()))
        });
        all_identical(&ranks);
        assert!(ranks[0].params == single, "cut {cut:?}");
    }
    for micro_batches in [4, 3] {
        let at = |cut: &[Range<usize>]| {
            let layout = Layout {
                stages: 2,
                micro_batches,
                cut: Some(cut.to_vec()),
            };
            on_ranks(local_job(2), |comm| {
                train(&data, Some(comm), Some(layout.clone()))
            })
        };
        let first = at(cuts[0]);
        for cut in &cuts[1..3] {
            let other = at(cut);
            assert!(
                other[0].params == first[0].params,
                "M {micro_batches}, cut {cut:?}"
            );
        }
        let diff = relative(&first[0].params, &single);
        assert!(
            diff <= 1e-4,
            "M {micro_batches}: relative difference {diff:e}"
        );
    }
}

/// Ranks as threads (the in-process transport) this time: stages 0 and 1
/// of replica 0 are ranks 0 and 1, of replica 1 ranks 2 and 3.
#[test]
fn two_stages_by_two_replicas_follow_two_data_parallel_ranks() {
    let data = data();
    let ddp = on_ranks(local_job(2), |comm| train(&data, Some(comm), None));
    let grid = on_ranks(local_job(4), |comm| {
        train(&data, Some(comm), Some(two_stages()))
    });
    all_identical(&grid);
    // Each stage's gradients, and only those, travel within its group;
    // none over the whole job.
    for (rank, t) in grid.iter().enumerate() {
        assert_eq!(t.job_f32s, 0, "rank {rank} averaged over the whole job");
        assert_eq!(t.group_f32s, STEPS * t.part, "rank {rank}");
    }
    let diff = relative(&grid[0].params, &ddp[0].params);
    println!("2 x 2 vs 2 data-parallel ranks: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
}

#[test]
fn layouts_that_do_not_fit_are_errors() {
    let err = Topology::new((0, 3), (0, 3), 2).unwrap_err().to_string();
    assert!(err.contains("not a multiple"), "{err}");
    let err = Topology::new((0, 1), (0, 1), 2).unwrap_err().to_string();
    assert!(err.contains("needs at least 2 ranks"), "{err}");
    let t = Topology::new((5, 6), (1, 2), 2).unwrap();
    assert_eq!(
        (t.stage(), t.replica(), t.pipeline_members()),
        (1, 2, vec![4, 5])
    );
    // The CNN has four segments: five stages cannot cut it, nor can a cut
    // that skips a segment.
    let data = data();
    for (layout, needle) in [
        (
            Layout {
                stages: 5,
                micro_batches: 1,
                cut: None,
            },
            "at most 4 stages",
        ),
        (
            Layout {
                stages: 2,
                micro_batches: 1,
                cut: Some(vec![0..1, 2..4]),
            },
            "contiguous non-empty runs",
        ),
    ] {
        let errors = on_ranks(local_job(layout.stages), |mut comm| {
            let (rank, world) = (comm.rank(), comm.world_size());
            let topology = Topology::new((rank, world), (rank, world), layout.stages).unwrap();
            let link = Box::new(HostLink::new(
                comm.subgroup(&topology.pipeline_members()).unwrap(),
            ));
            let setup = Setup {
                topology,
                averaging: None,
                ..Setup::fresh(Some(CommThread::spawn(comm).unwrap()))
            };
            let stage = StageSpec {
                micro_batches: layout.micro_batches,
                link,
                cut: layout.cut.clone(),
            };
            let made =
                Trainer::pipeline_stage(Cpu::new(1).unwrap(), &data, (config(), setup), stage);
            format!("{:#}", made.err().expect("refused"))
        });
        for err in errors {
            assert!(err.contains(needle), "{err}");
        }
    }
}

/// A preemption asked of one stage's rank alone reaches every rank (its
/// vote cannot ride the stage group's all-reduce): all stop after the same
/// step, and rank 0 saves the whole model there, each stage's parameters
/// and moments from that stage's rank.
#[test]
fn a_preemption_of_one_stage_stops_every_rank_with_a_whole_checkpoint() {
    let data = data();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ends = on_ranks(local_job(4), |comm| {
        let rank = comm.rank();
        let stop = StopRequest::new();
        if rank == 3 {
            stop.request(StopKind::Preempt);
        }
        let checkpoints = Some(Checkpoints {
            dir: CheckpointDir::new(dir, 2),
            every: None,
        });
        let layout = two_stages();
        let (mut trainer, ..) =
            stage_trainer(&data, Cpu::new(1).unwrap(), comm, layout, |s| Setup {
                stop,
                checkpoints,
                ..s
            });
        let end = trainer.run(&mut Silent, &mut |_| Ok(())).unwrap();
        (
            end,
            trainer.params().unwrap(),
            trainer.part().unwrap().range(),
        )
    });
    let at = Position { epoch: 1, step: 1 };
    for (rank, (end, ..)) in ends.iter().enumerate() {
        let saved = (rank == 0).then(|| dir.join(at.dir_name()));
        assert_eq!(end, &RunOutcome::Preempted { at, saved }, "rank {rank}");
    }
    let state = trainer::checkpoint::load(&dir.join(at.dir_name()), cnn_layout()).unwrap();
    assert_eq!(state.optimizer_step, 1);
    // Stage s's part as rank s (its first replica) trained it.
    for (stage, (_, trained, range)) in ends.iter().take(2).enumerate() {
        assert!(state.params[range.clone()] == trained[..], "stage {stage}");
        assert!(
            state.exp_avg[range.clone()].iter().any(|&m| m != 0.0),
            "stage {stage}"
        );
    }
}

/// A stage's device holds its part of the model only: its parameters,
/// gradients and two Adam moments take 16 bytes per parameter of the
/// stage's, where a data-parallel rank's take 16 per parameter of the
/// model (everything else a trainer allocates at its start is alike).
#[test]
fn a_stage_allocates_its_part_of_the_model_only() {
    let data = data();
    let bytes = |cpu: &Cpu| cpu.allocated_host_bytes().unwrap();
    let cpu = Cpu::new(1).unwrap();
    let whole = Trainer::new(cpu.clone(), &data, config(), None).unwrap();
    let (whole_bytes, _) = (bytes(&cpu), whole);
    let stages = on_ranks(local_job(2), |comm| {
        let cpu = Cpu::new(1).unwrap();
        let (stage, ..) = stage_trainer(&data, cpu.clone(), comm, two_stages(), |s| s);
        (bytes(&cpu), stage.part().unwrap().range().len())
    });
    for (stage, (held, part)) in stages.into_iter().enumerate() {
        let missing = cnn_layout().len() - part;
        assert_eq!(whole_bytes - held, 16 * missing as u64, "stage {stage}");
    }
}

/// A pipeline evaluates through its stages, and finds what the whole model
/// finds: the test accuracy of a 2-stage run is, bit for bit, that of 2
/// data-parallel ranks evaluating the checkpoint it saved (more than one
/// test batch per rank; test labels changed for an accuracy off 0 and 1,
/// which any change of a logit's argmax moves).
#[test]
fn a_pipelines_test_accuracy_is_the_whole_models() {
    let mut data = common::small_data(2 * 32 * STEPS, 1100);
    for (i, label) in data.test.labels.iter_mut().enumerate() {
        *label = (*label + (i * i % 3) as u8) % 10;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let piped = on_ranks(local_job(2), |comm| {
        let checkpoints = Some(Checkpoints {
            dir: CheckpointDir::new(dir, 2),
            every: None,
        });
        let layout = two_stages();
        let (mut trainer, ..) = stage_trainer(&data, Cpu::new(1).unwrap(), comm, layout, |s| {
            Setup { checkpoints, ..s }
        });
        let mut accuracy = f64::NAN;
        let mut keep = |r: &EpochReport| {
            accuracy = r.test_accuracy;
            Ok(())
        };
        trainer.run(&mut Silent, &mut keep).unwrap();
        accuracy
    });
    let at = Position { epoch: 2, step: 0 };
    let state = trainer::checkpoint::load(&dir.join(at.dir_name()), cnn_layout()).unwrap();
    let whole = on_ranks(local_job(2), |comm| {
        let setup = Setup {
            origin: Origin::Resume(Box::new(state.clone())),
            ..Setup::fresh(Some(CommThread::spawn(comm).unwrap()))
        };
        let mut trainer = Trainer::start(Cpu::new(1).unwrap(), &data, config(), setup).unwrap();
        trainer.evaluate().unwrap()
    });
    assert!(piped[0] > 0.1 && piped[0] < 0.9, "{piped:?}");
    for (rank, accuracy) in piped.iter().chain(&whole).enumerate() {
        assert_eq!(
            accuracy.to_bits(),
            whole[0].to_bits(),
            "rank {rank}: {piped:?} {whole:?}"
        );
    }
}
