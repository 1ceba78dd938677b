//! One rank from start to finish: data, device, communicator, epochs.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use comm::{
    AUTH_TOKEN_VAR, AuthToken, CommConfig, Communicator, LaunchEnv, LaunchSource, TcpCommunicator,
};
use core_tensor::ops::AdamConfig;
use core_tensor::{Cuda, Ops};

mod dataset;
mod device;

use dataset::Dataset;
use device::{Device, choose_device, choose_transport, connect_nccl};

use crate::announce::{report_outcome, started_by};
use crate::checkpoint::origin::Origin;
use crate::checkpoint::resume::{self, Request};
use crate::checkpoint::{CheckpointDir, Checkpoints, Settings};
use crate::cli::Cli;
use crate::data::Batches;
use crate::ddp::transport::Transport;
use crate::ddp::{CommHook, CommThread, NcclHook};
use crate::metrics::{MetricsFile, epoch_line};
use crate::model::cnn::DeviceSplit;
use crate::model::recsys::{RatingsShard, RecsysModel};
use crate::model::toy::{ToyData, ToyModel};
use crate::model::{CnnMnist, DropoutRates, Model};
use crate::monitor::{Monitor, Straggler};
use crate::progress::Console;
use crate::stop::{RunEnd, StopRequest, install_worker_handlers};
use crate::tensorboard::EventWriter;
use crate::train::{Progress, RunOutcome, Setup, Silent, TrainConfig, Trainer};

/// This process's place in the job.
#[derive(Clone, Debug)]
pub struct RankInfo {
    pub rank: usize,
    /// Rank among the processes on this machine: picks the GPU.
    pub local_rank: usize,
    pub world_size: usize,
    /// Ranks sharing this machine (they share its cores).
    pub local_world_size: usize,
}

/// Trains as one rank: `launch` is `None` for a single-process run. The
/// first SIGTERM/SIGUSR1 asks the loop to stop at an agreed step and save.
pub fn run(cli: &Cli, launch: Option<&LaunchEnv>) -> anyhow::Result<RunEnd> {
    let stop = StopRequest::new();
    install_worker_handlers(&stop)?;
    let info = launch.map_or(
        RankInfo {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            local_world_size: 1,
        },
        |env| RankInfo {
            rank: env.rank,
            local_rank: env.local_rank,
            world_size: env.world_size,
            local_world_size: env.local_world_size.max(1),
        },
    );
    let data = Dataset::load(cli)?;
    // The device comes before the rendezvous: a rank without its GPU fails
    // here, alone and at once, instead of after its peers' timeout.
    let device = choose_device(cli, &info)?;
    let mut tcp = match launch {
        Some(env) if env.world_size > 1 => Some(connect(cli, env)?),
        _ => None,
    };
    let transport = choose_transport(cli, &info, &device, tcp.as_mut())?;
    let nccl = match (&device, transport) {
        (Device::Cuda(gpu), Some(Transport::Nccl)) => {
            Some(connect_nccl(cli, &info, gpu, tcp.as_mut())?)
        }
        _ => None,
    };
    let comm = tcp.map(|t| CommThread::spawn(Box::new(t))).transpose()?;
    let job = Job {
        cli,
        info: &info,
        data: &data,
        gradients: match transport {
            None => "",
            Some(Transport::Tcp) => ", gradients over the TCP ring",
            Some(Transport::Nccl) => ", gradients over NCCL",
        },
        started_by: started_by(launch),
    };
    let gpu_uuid = match &device {
        Device::Cpu(_) => None,
        Device::Cuda(gpu) => gpu.uuid().ok(),
    };
    let (monitor, unwatched) = Monitor::start(gpu_uuid)
        .with_context(|| format!("rank {}: starting the monitor thread", info.rank))?;
    if let (Some(why), 0) = (unwatched, info.rank) {
        eprintln!(
            "note: GPU monitoring off (utilisation, memory, power, temperature are null): {why}"
        );
    }
    let outcome = match device {
        Device::Cpu(cpu) => train_on(cpu, &job, comm, None, stop, monitor),
        Device::Cuda(gpu) => {
            let hook = match nccl {
                Some(nccl) => Some(Box::new(NcclHook::new(nccl, &gpu)?) as Box<dyn CommHook<Cuda>>),
                None => None,
            };
            train_on(gpu, &job, comm, hook, stop, monitor)
        }
    }?;
    Ok(match outcome {
        RunOutcome::Completed => RunEnd::Finished,
        RunOutcome::Preempted { .. } => RunEnd::Preempted,
        // SIGINT or SIGHUP; a shell's Ctrl-C code either way.
        RunOutcome::Interrupted { .. } => RunEnd::Signalled(signal_hook::consts::SIGINT),
    })
}

/// What every rank trains on, whatever its device.
struct Job<'a> {
    cli: &'a Cli,
    info: &'a RankInfo,
    data: &'a Dataset,
    /// How gradients travel, for the start-up line.
    gradients: &'static str,
    /// Who started the ranks, for the start-up line.
    started_by: &'static str,
}

/// A rank's links to the others and to the outside.
struct Links<B: Ops> {
    comm: Option<CommThread>,
    device_hook: Option<Box<dyn CommHook<B>>>,
    stop: StopRequest,
    monitor: Monitor,
}

/// A model's training and (if it has one) test split.
type Splits<B, M> = (
    Box<dyn Batches<B, <M as Model<B>>::Buffers>>,
    Option<Box<dyn Batches<B, <M as Model<B>>::Buffers>>>,
);

fn train_on<B: Ops>(
    backend: B,
    job: &Job<'_>,
    comm: Option<CommThread>,
    device_hook: Option<Box<dyn CommHook<B>>>,
    stop: StopRequest,
    monitor: Monitor,
) -> anyhow::Result<RunOutcome> {
    let cli = job.cli;
    let cfg = TrainConfig {
        epochs: cli.epochs as usize,
        batch_size: cli.batch_size as usize,
        adam: AdamConfig {
            lr: cli.lr,
            ..AdamConfig::default()
        },
        seed: cli.seed,
        max_steps: cli.max_steps.map(|s| s as usize),
        dropout: if cli.no_dropout {
            DropoutRates::OFF
        } else {
            DropoutRates::REFERENCE
        },
        bucket_mb: cli.bucket_mb,
    };
    let links = Links {
        comm,
        device_hook,
        stop,
        monitor,
    };
    let rank = job.info.rank;
    match job.data {
        Dataset::Fashion { data, .. } => {
            let upload = || -> anyhow::Result<Splits<B, CnnMnist>> {
                let train = DeviceSplit::upload(&backend, &data.train, "training")?;
                let test = DeviceSplit::upload(&backend, &data.test, "test")?;
                Ok((Box::new(train), Some(Box::new(test))))
            };
            let splits = upload().with_context(|| format!("rank {rank}: setting up"))?;
            let model = CnnMnist::new(cfg.dropout);
            train_model(backend, model, splits, cfg, job, links)
        }
        Dataset::Toy { samples } => {
            let data = ToyData::generate(cfg.seed, *samples);
            let splits: Splits<B, ToyModel> = (Box::new(data), None);
            train_model(backend, ToyModel::default(), splits, cfg, job, links)
        }
        Dataset::Recsys { index, dim } => {
            let model = RecsysModel::new(index, *dim)?;
            let train = RatingsShard::new(index.clone(), false);
            let test: Box<dyn Batches<B, _>> = Box::new(RatingsShard::new(index.clone(), true));
            let splits: Splits<B, RecsysModel> = (Box::new(train), Some(test));
            train_model(backend, model, splits, cfg, job, links)
        }
    }
}

fn train_model<B: Ops, M: Model<B>>(
    backend: B,
    model: M,
    (train, test): Splits<B, M>,
    cfg: TrainConfig,
    job: &Job<'_>,
    links: Links<B>,
) -> anyhow::Result<RunOutcome> {
    let Job {
        cli,
        info,
        gradients,
        ..
    } = *job;
    let rank = info.rank;
    let device = backend.describe();
    let lead = rank == 0;
    let checkpoint_dir = cli
        .checkpoint_dir
        .as_ref()
        .map(|dir| CheckpointDir::new(dir, cli.keep as usize));
    // Rank 0 alone reads checkpoints (other hosts may not see them) and
    // sends what it found to the others.
    let origin = if lead {
        let settings = cfg.settings(info.world_size, model.kind());
        choose_origin(cli, checkpoint_dir.as_ref(), &settings, model.layout())?
    } else {
        Origin::Fresh
    };
    let resumed = matches!(origin, Origin::Resume(_));
    let setup = Setup {
        comm: links.comm,
        origin,
        device_hook: links.device_hook,
        checkpoints: checkpoint_dir.map(|dir| Checkpoints {
            dir,
            every: cli.checkpoint_every,
        }),
        stop: links.stop,
    };
    let data = job.data.describe(cfg.seed);
    let mut trainer = Trainer::with_model(backend, model, train, test, cfg, setup)
        .with_context(|| format!("rank {rank}: setting up"))?;
    trainer.watch(links.monitor);
    if lead {
        eprintln!(
            "training on {device}, world size {} ({}){gradients}, {data}",
            info.world_size, job.started_by,
        );
        if trainer.first_epoch() > cli.epochs as usize {
            eprintln!(
                "note: the checkpoint is past epoch {}: nothing left to train (raise --epochs to go on)",
                cli.epochs
            );
        }
    }
    let mut metrics = match (&cli.metrics, lead) {
        // A resumed run adds to the rows of the epochs before it.
        (Some(path), true) if resumed => {
            Some(MetricsFile::append_to(path, info.world_size, device)?)
        }
        (Some(path), true) => Some(MetricsFile::create(path, info.world_size, device)?),
        _ => None,
    };
    let board = match (&cli.tensorboard, lead) {
        (Some(dir), true) => Some(Rc::new(RefCell::new(
            EventWriter::create(dir, &hostname()).context("rank 0: --tensorboard")?,
        ))),
        _ => None,
    };
    let mut progress: Box<dyn Progress> = if lead {
        let line_every = Duration::from_secs_f64(cli.progress_seconds);
        Box::new(Console::new(cli.log_every, line_every, board.clone()))
    } else {
        Box::new(Silent)
    };
    let outcome = trainer.run(progress.as_mut(), &mut |report| {
        if lead {
            println!("{}", epoch_line(report));
            if let Some(s) = Straggler::find(&report.ranks) {
                eprintln!(
                    "note: rank {} is {:.0}% behind the median rank (its steps' time, waiting for gradients excluded)",
                    s.rank,
                    100.0 * (s.ratio - 1.0)
                );
            }
            if let Some(m) = &mut metrics {
                m.append(report)?;
            }
            if let Some(board) = &board {
                board.borrow_mut().epoch(report)?;
            }
        }
        Ok(())
    })?;
    report_outcome(&outcome, info, cli, trainer.last_checkpoint());
    Ok(outcome)
}

/// Rank 0's decision of where training starts (see [`resume::choose`]),
/// after clearing what interrupted saves left in the checkpoint directory.
fn choose_origin(
    cli: &Cli,
    dir: Option<&CheckpointDir>,
    settings: &Settings,
    layout: &core_tensor::FlatLayout,
) -> anyhow::Result<Origin> {
    let choose = || -> anyhow::Result<Origin> {
        if let Some(dir) = dir {
            for leftover in dir.prepare()? {
                eprintln!(
                    "note: removed {}, left over from an interrupted save",
                    leftover.display()
                );
            }
        }
        let request = Request {
            resume: cli.resume.as_ref(),
            init_from: cli.init_from.as_deref(),
            dir,
        };
        resume::choose(&request, settings, layout)
    };
    choose().context("rank 0")
}

/// Joins the job's TCP ring.
fn connect(cli: &Cli, env: &LaunchEnv) -> anyhow::Result<TcpCommunicator> {
    let auth = AuthToken::resolve(cli.auth_token_file.as_deref())
        .with_context(|| format!("rank {}: reading the job's auth token", env.rank))?;
    if auth.is_none() && env.rank == 0 {
        eprintln!(
            "warning: no auth token ({AUTH_TOKEN_VAR} or --auth-token-file): the rendezvous is \
             unauthenticated, and any process that reaches port {} can join this job",
            env.master_port
        );
    }
    let config = CommConfig::from_launch_env(env)
        .with_timeout(Duration::from_secs_f64(cli.timeout))
        .with_auth(auth);
    let comm = TcpCommunicator::connect(&config).with_context(|| {
        format!(
            "rank {} joining the job at {}",
            env.rank,
            config.master_endpoint()
        )
    })?;
    let via = match env.source {
        LaunchSource::Torchrun => "torchrun-style environment",
        LaunchSource::Mpi => "mpirun",
        LaunchSource::Slurm => "slurm",
    };
    eprintln!(
        "rank {}/{} joined (host {}, master {}, via {via})",
        comm.rank(),
        comm.world_size(),
        hostname(),
        config.master_endpoint()
    );
    Ok(comm)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
