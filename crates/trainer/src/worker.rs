//! One rank from start to finish: data, device, communicator, epochs.

use std::time::Duration;

use anyhow::Context;
use anyhow::bail;
use comm::{
    AUTH_TOKEN_VAR, AuthToken, CommConfig, Communicator, LaunchEnv, LaunchSource,
    LocalCommunicator, TcpCommunicator,
};
use core_tensor::{Cuda, Ops};

mod dataset;
mod device;
mod drive;
pub mod threads;
mod train;

use dataset::Dataset;
use device::{Device, choose_device, choose_transport, connect_nccl};
use drive::drive;
use threads::THREADS;
use train::{Links, train_on};

use crate::announce::started_by;
use crate::cli::Cli;
use crate::ddp::transport::Transport;
use crate::ddp::{CommHook, CommThread, NcclHook};
use crate::monitor::Monitor;
use crate::pipeline::{HostLink, NcclLink, PipelinePlace, StageLink};
use crate::stop::{StopKind, StopRequest, install_worker_handlers};
use crate::train::RunOutcome;
use launcher::contract::{RunEnd, hostname};

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
    // The device comes before the rendezvous: a rank without its GPU, or
    // without room for the model, fails here, alone and at once, instead
    // of after its peers' timeout.
    let device = choose_device(cli, &info)?;
    data.check_room(cli, &info, &device)?;
    let tcp = match launch {
        Some(env) if env.world_size > 1 => Some(connect(cli, env)?),
        _ => None,
    };
    let shared = Shared {
        cli,
        data: &data,
        started_by: started_by(launch),
    };
    run_rank(
        &shared,
        &info,
        device,
        tcp.map(|t| JobComm::Tcp(Box::new(t))),
        stop,
    )
}

/// What every rank of a process reads and never changes.
struct Shared<'a> {
    cli: &'a Cli,
    data: &'a Dataset,
    /// Who started the ranks, for the start-up line.
    started_by: &'static str,
}

/// How a rank reaches the others: sockets (a process per rank), or memory
/// (ranks as threads of one process).
enum JobComm {
    Tcp(Box<TcpCommunicator>),
    Local(LocalCommunicator),
}

impl JobComm {
    fn as_dyn(&mut self) -> &mut dyn Communicator {
        match self {
            JobComm::Tcp(c) => c.as_mut(),
            JobComm::Local(c) => c,
        }
    }

    fn boxed(self) -> Box<dyn Communicator> {
        match self {
            JobComm::Tcp(c) => c,
            JobComm::Local(c) => Box::new(c),
        }
    }
}

/// One rank on `device`, from the choice of gradient transport to its
/// last epoch; `comm` is `None` for a single rank.
fn run_rank(
    shared: &Shared<'_>,
    info: &RankInfo,
    device: Device,
    mut comm: Option<JobComm>,
    stop: StopRequest,
) -> anyhow::Result<RunEnd> {
    let cli = shared.cli;
    let transport = choose_transport(cli, info, &device, comm.as_mut().map(JobComm::as_dyn))?;
    let pipeline = match (cli.pipeline_stages as usize, &mut comm) {
        (1, _) => None,
        (stages, Some(comm)) => {
            let place = PipelinePlace::of(info.rank, info.world_size, stages)
                .with_context(|| format!("rank {}", info.rank))?;
            let group = comm.as_dyn().subgroup(&place.members()).with_context(|| {
                format!("rank {}: forming pipeline {}", info.rank, place.replica)
            })?;
            // The stage's data-parallel group averages its gradients
            // (through the host; NCCL has its own below).
            let replicas = match (place.replicas, transport) {
                (1, _) | (_, Some(Transport::Nccl)) => None,
                _ => Some(
                    comm.as_dyn()
                        .subgroup(&place.replica_group())
                        .with_context(|| {
                            format!("rank {}: forming stage {}'s group", info.rank, place.stage)
                        })?,
                ),
            };
            Some((place, group, replicas))
        }
        (stages, None) => bail!(
            "--pipeline-stages {stages} needs at least {stages} ranks (--world-size, a multiple of the stages)"
        ),
    };
    let (nccl, pipeline_nccl) = match (&device, transport, &mut comm) {
        (Device::Cuda { .. }, Some(Transport::Nccl), Some(JobComm::Local(_))) => bail!(
            "rank {}: --spawn threads averages gradients in this process's memory, not over NCCL: add --backend tcp, or use --spawn processes for NCCL",
            info.rank
        ),
        (Device::Cuda { gpu, .. }, Some(Transport::Nccl), comm) => {
            let mut store = match comm {
                Some(JobComm::Tcp(tcp)) => tcp.store(),
                _ => None,
            };
            // Gradients are averaged over the whole job, or over a pipeline
            // stage's replicas (none with one replica).
            let grads = match &pipeline {
                None => {
                    let whole = (info.rank, info.world_size);
                    Some(connect_nccl(
                        cli,
                        gpu,
                        store.as_deref_mut(),
                        "gradients",
                        whole,
                    )?)
                }
                Some((place, ..)) if place.replicas > 1 => Some(connect_nccl(
                    cli,
                    gpu,
                    store.as_deref_mut(),
                    &format!("gradients-stage-{}", place.stage),
                    (place.replica, place.replicas),
                )?),
                Some(_) => None,
            };
            // Each pipeline's own communicator carries its activations.
            let stages = match &pipeline {
                Some((place, ..)) => Some(connect_nccl(
                    cli,
                    gpu,
                    store,
                    &format!("pipeline-{}", place.replica),
                    (place.stage, place.stages),
                )?),
                None => None,
            };
            (grads, stages)
        }
        _ => (None, None),
    };
    let comm = comm.map(|c| CommThread::spawn(c.boxed())).transpose()?;
    let (pipeline, group) = match pipeline {
        Some((place, link, replicas)) => {
            let group = replicas.map(CommThread::spawn).transpose()?;
            (Some((place, link)), group)
        }
        None => (None, None),
    };
    let job = Job {
        cli,
        info,
        data: shared.data,
        gradients: match transport {
            None => "",
            Some(Transport::Tcp) => match shared.started_by {
                THREADS => ", gradients through memory",
                _ => ", gradients over the TCP ring",
            },
            Some(Transport::Nccl) => ", gradients over NCCL",
        },
        started_by: shared.started_by,
    };
    let gpu_uuid = match &device {
        Device::Cpu(_) => None,
        Device::Cuda { gpu, .. } => gpu.uuid().ok(),
    };
    let (monitor, unwatched) = Monitor::start(gpu_uuid)
        .with_context(|| format!("rank {}: starting the monitor thread", info.rank))?;
    if let (Some(why), 0) = (unwatched, info.rank) {
        tell!("note: GPU monitoring off (utilisation, memory, power, temperature are null): {why}");
    }
    let outcome = match device {
        Device::Cpu(cpu) => {
            let pipeline = pipeline.map(|(place, group)| (place, host_link(group)));
            let links = Links {
                comm,
                group,
                device_hook: None,
                stop,
                monitor,
                share: None,
            };
            train_on(cpu, &job, links, pipeline)
        }
        Device::Cuda { gpu, .. } => {
            let hook = match nccl {
                Some(nccl) => Some(Box::new(NcclHook::new(nccl, &gpu)?) as Box<dyn CommHook<Cuda>>),
                None => None,
            };
            let pipeline = pipeline.map(|(place, group)| match pipeline_nccl {
                Some(nccl) => (place, Box::new(NcclLink::new(nccl, &gpu)) as Box<_>),
                None => (place, host_link(group)),
            });
            let links = Links {
                comm,
                group,
                device_hook: hook,
                stop,
                monitor,
                share: None,
            };
            train_on(gpu, &job, links, pipeline)
        }
    }?;
    Ok(match outcome {
        RunOutcome::Completed => RunEnd::Finished,
        RunOutcome::Preempted { .. } => StopKind::Preempt.run_end(),
        RunOutcome::Interrupted { .. } => StopKind::Interrupt.run_end(),
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

/// A pipeline stage's link through host memory over its `group`.
fn host_link<B: Ops>(group: Box<dyn Communicator>) -> Box<dyn StageLink<B>> {
    Box::new(HostLink::new(group))
}

/// Joins the job's TCP ring.
fn connect(cli: &Cli, env: &LaunchEnv) -> anyhow::Result<TcpCommunicator> {
    let auth = AuthToken::resolve(cli.auth_token_file.as_deref())
        .with_context(|| format!("rank {}: reading the job's auth token", env.rank))?;
    if auth.is_none() && env.rank == 0 {
        tell!(
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
    tell!(
        "rank {}/{} joined (host {}, master {}, via {via})",
        comm.rank(),
        comm.world_size(),
        hostname(),
        config.master_endpoint()
    );
    Ok(comm)
}
