//! One rank from start to finish, made from the flags: its place in the
//! job, its model's data, its device, its links to the others; then its
//! model's entry trains it (`crate::models`, `crate::rank`).

mod device;
mod flight_recorder;
pub mod help_heading;
mod job;
mod join;
mod live;
mod memory_fit;
pub mod threads;
pub mod token;
mod wiring;

use std::path::PathBuf;

use anyhow::Context;
use comm::LaunchEnv;
use comm::flight::FlightLog;
use core_tensor::Reductions;
use launcher::contract::{RunEnd, hostname};

pub use device::{DeviceChoice, DeviceFlags};
pub use flight_recorder::FlightFlags;
pub use job::JobFlags;
pub use join::{JoinFlags, Recovery};
pub use wiring::EXIT_BEFORE_NCCL_ENV;

use device::{Device, choose_device};
use wiring::{JobComm, wire};

use crate::ddp::transport::Transport;
use crate::models::Loaded;
use crate::monitor::Monitor;
use crate::rank::{Live, Rank, RankJob};
use crate::report::announce::started_by;
use crate::stop::{StopKind, StopRequest, dump_flight_log, install_worker_handlers};
use crate::topology::Topology;
use crate::train::RunOutcome;

/// Trains as one rank: `launch` is `None` for a single-process run. The
/// first SIGTERM/SIGUSR1 asks the loop to stop at an agreed step and save.
pub fn run(job: &JobFlags, launch: Option<&LaunchEnv>) -> anyhow::Result<RunEnd> {
    let stop = StopRequest::new();
    install_worker_handlers(&stop)?;
    let rank = Topology::launched(launch, job.pipeline.pipeline_stages as usize)?;
    // A job that may not start (no token, and other machines could reach
    // its rendezvous) fails before it loads anything.
    let joining = match launch {
        Some(env) if env.world_size > 1 => Some((join::config(&job.join, env)?, env)),
        _ => None,
    };
    let data = job.model.model.entry().load(&job.model)?;
    // The device comes before the rendezvous: a rank without its GPU, or
    // without room for the model, fails here, alone and at once, instead
    // of after its peers' timeout.
    let device = choose_device(&job.device, &rank)?;
    memory_fit::check_host(data.as_ref(), job, &rank, device.is_gpu())?;
    memory_fit::check_device(data.as_ref(), &rank, &device)?;
    let process = Process {
        job,
        data: data.as_ref(),
        started_by: started_by(launch),
        // The job's port tells jobs apart on a machine (a launcher of ours
        // names the directory itself).
        flight_dir: job.flight_dir(launch.map_or(std::process::id(), |e| e.master_port.into())),
    };
    if let (Recovery::Live, Some((config, env))) = (job.join.recovery, &joining) {
        return live::run(&process, (config, env), (rank, device), stop);
    }
    let tcp = joining
        .map(|(config, env)| join::connect(&config, env))
        .transpose()?;
    let comm = tcp.map(|t| JobComm::Tcp(Box::new(t)));
    Ok(run_end(&process.run_rank(rank, device, comm, stop, None)?))
}

/// The process's end after a rank's outcome.
pub(super) fn run_end(outcome: &RunOutcome) -> RunEnd {
    match outcome {
        RunOutcome::Completed | RunOutcome::Regroup { .. } => RunEnd::Finished,
        RunOutcome::Preempted { .. } => StopKind::Preempt.run_end(),
        RunOutcome::Interrupted { .. } => StopKind::Interrupt.run_end(),
    }
}

/// What every rank of a process reads and never changes.
struct Process<'a> {
    job: &'a JobFlags,
    data: &'a dyn Loaded,
    /// Who started the ranks, for the start-up line.
    started_by: &'static str,
    /// Where the ranks write their flight records.
    flight_dir: PathBuf,
}

impl Process<'_> {
    /// One rank on `device`, from its wiring to its last epoch; `comm` is
    /// `None` for a single rank. A rank that fails writes its flight
    /// record; so does one asked by SIGUSR2.
    fn run_rank(
        &self,
        rank: Topology,
        device: Device,
        comm: Option<JobComm>,
        stop: StopRequest,
        live: Option<Live>,
    ) -> anyhow::Result<RunOutcome> {
        let flight = FlightLog::new(rank.rank, rank.world, hostname(), &self.flight_dir);
        stop.dump_on_signal(flight.clone());
        let ran = self.train_rank(rank, device, (comm, live), stop, &flight);
        if let Err(e) = &ran {
            dump_flight_log(&flight, &format!("{e:#}"));
        }
        ran
    }

    fn train_rank(
        &self,
        rank: Topology,
        device: Device,
        (comm, live): (Option<JobComm>, Option<Live>),
        stop: StopRequest,
        flight: &FlightLog,
    ) -> anyhow::Result<RunOutcome> {
        let job = self.job;
        let wiring = wire(job, &rank, &device, comm, flight)?;
        let gradients = match wiring.transport {
            None => "",
            Some(Transport::Tcp) if self.started_by == threads::THREADS => {
                ", gradients through memory"
            }
            Some(Transport::Tcp) => ", gradients over the TCP ring",
            Some(Transport::Nccl) => ", gradients over NCCL",
        };
        let about = format!(
            "world size {} ({}){gradients}, {}",
            rank.world,
            self.started_by,
            self.data.describe(job.train.seed)
        );
        let (precision, _) = job.device.precision().map_err(anyhow::Error::msg)?;
        let rank_job = RankJob {
            checkpoints: &job.checkpoints,
            outputs: &job.outputs,
            micro_batches: job.pipeline.micro_batches.map(|m| m as usize),
            shared: job.shared_settings(precision),
            about,
            pytorch_class: job.model.model.entry().pytorch_class(),
        };
        let gpu_uuid = match &device {
            Device::Cpu(_) => None,
            Device::Cuda { gpu, .. } => gpu.uuid().ok(),
        };
        let (monitor, unwatched) = Monitor::start(gpu_uuid)
            .with_context(|| format!("rank {}: starting the monitor thread", rank.rank))?;
        if let (Some(why), true) = (unwatched, rank.leads()) {
            tell!(
                "note: GPU monitoring off (utilisation, memory, power, temperature are null): {why}"
            );
        }
        let cfg = job.train_config();
        match device {
            Device::Cpu(cpu) => self.data.on_cpu(Rank {
                // --reproducible: a unit's reductions are cut alike
                // whatever --threads says.
                backend: match cfg.exact {
                    Some(_) => cpu.with_reductions(Reductions::Fixed),
                    None => cpu,
                },
                topology: rank,
                cfg,
                links: wiring.on_cpu()?,
                stop,
                monitor,
                job: &rank_job,
                live,
            }),
            Device::Cuda { gpu, .. } => {
                let links = wiring.on_cuda(&gpu)?;
                self.data.on_cuda(Rank {
                    backend: gpu,
                    topology: rank,
                    cfg,
                    links,
                    stop,
                    monitor,
                    job: &rank_job,
                    live,
                })
            }
        }
    }
}
