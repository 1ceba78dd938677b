//! How a rank reaches the others, made once from its [`Topology`]: the
//! job's communicator (metrics, stop votes, the starting point,
//! checkpoints), the averaging of its gradients (through the host over the
//! job's ring or its stage's group, or NCCL on the GPUs), and for a
//! pipeline stage its link to the neighbouring stages (the pipeline's
//! sub-group, or NCCL between GPUs), as `init_process_group` and a
//! `DeviceMesh` do.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context;
use comm::flight::FlightLog;
use comm::nccl::NcclCommunicator;
use comm::{Communicator, LiveMember, LocalCommunicator, TcpCommunicator};
use core_tensor::{Cpu, Cuda, Ops};

use super::device::{Device, choose_transport, connect_nccl};
use super::job::JobFlags;
use crate::comm_thread::CommThread;
use crate::ddp::transport::Transport;
use crate::ddp::{AverageOver, CommHook, CommHookChoice, NcclHook};
use crate::pipeline::{HostLink, NcclLink, StageLink};
use crate::rank::Links;
use crate::topology::Topology;
use crate::train::JobLinks;

/// How a rank reaches the others before its wiring: sockets (a process per
/// rank), or memory (ranks as threads of one process).
pub(super) enum JobComm {
    Tcp(Box<TcpCommunicator>),
    /// A live job's generation (`--recovery live`): its ring, which has no
    /// store of its own, and the member whose store carries the unique
    /// ids of the generation's NCCL communicators.
    Generation {
        ring: Box<TcpCommunicator>,
        member: Arc<Mutex<LiveMember>>,
        number: u64,
    },
    Local(LocalCommunicator),
}

impl JobComm {
    fn as_dyn(&mut self) -> &mut dyn Communicator {
        match self {
            JobComm::Tcp(c) | JobComm::Generation { ring: c, .. } => c.as_mut(),
            JobComm::Local(c) => c,
        }
    }

    fn boxed(self) -> Box<dyn Communicator> {
        match self {
            JobComm::Tcp(c) | JobComm::Generation { ring: c, .. } => c,
            JobComm::Local(c) => Box::new(c),
        }
    }
}

/// A rank's communicators, before they meet its device.
pub(super) struct Wiring {
    /// Whether other ranks train the same parameters.
    replicas: bool,
    /// The job's communicator on its thread; `None` for one rank.
    comm: Option<CommThread>,
    /// A pipeline stage's data-parallel group, averaging through the host.
    group: Option<CommThread>,
    /// A pipeline's sub-group of the job, for a link through the host.
    pipeline: Option<Box<dyn Communicator>>,
    /// NCCL communicators: the gradients' (the job's, or a stage's
    /// replicas'), and a pipeline's.
    nccl_grads: Option<NcclCommunicator>,
    nccl_pipeline: Option<NcclCommunicator>,
    /// How gradients travel; `None` for one rank.
    pub transport: Option<Transport>,
    /// What they become on the wire (`--comm-hook`).
    comm_hook: CommHookChoice,
}

/// Wires rank `rank` on `device` from its job communicator `comm` (`None`
/// for one rank); `flight` gets the flight recorder of every communicator
/// that gradients, metrics and votes travel through.
pub(super) fn wire(
    job: &JobFlags,
    rank: &Topology,
    device: &Device,
    mut comm: Option<JobComm>,
    flight: &FlightLog,
) -> anyhow::Result<Wiring> {
    let backend = job.ddp.backend;
    let transport = choose_transport(
        backend,
        rank.rank,
        device,
        comm.as_mut().map(JobComm::as_dyn),
    )?;
    let nccl = transport == Some(Transport::Nccl);
    let r = rank.rank;
    let comm_hook = job.ddp.comm_hook;
    if nccl && matches!(comm_hook, CommHookChoice::PowerSgd { .. }) {
        anyhow::bail!(
            "rank {r}: --comm-hook {comm_hook} runs on the host's ring, but gradients travel over NCCL here (every rank has a GPU of its own): add --backend tcp, or use --comm-hook bf16 or fp16 with NCCL"
        );
    }
    // A pipeline's sub-group and its stage's data-parallel group (through
    // the host; NCCL has its own below).
    let (pipeline, group) =
        match &mut comm {
            Some(comm) if rank.stages > 1 => {
                let members = rank.pipeline_members();
                let pipeline = (comm.as_dyn().subgroup(&members))
                    .with_context(|| format!("rank {r}: forming pipeline {}", rank.replica()))?;
                let group =
                    match (rank.replicas(), nccl) {
                        (1, _) | (_, true) => None,
                        _ => Some(comm.as_dyn().subgroup(&rank.stage_group()).with_context(
                            || format!("rank {r}: forming stage {}'s group", rank.stage()),
                        )?),
                    };
                (Some(pipeline), group)
            }
            _ => (None, None),
        };
    let (nccl_grads, nccl_pipeline) = match (device, nccl, &mut comm) {
        (Device::Cuda { .. }, true, Some(JobComm::Local(_))) => anyhow::bail!(
            "rank {r}: --spawn threads averages gradients in this process's memory, not over NCCL: add --backend tcp, or use --spawn processes for NCCL"
        ),
        (Device::Cuda { gpu, .. }, true, comm) => {
            // A generation's communicators are its own: their ids are keyed
            // by its number in the store that outlives every generation.
            let (member, generation) = match comm {
                Some(JobComm::Generation { member, number, .. }) => {
                    exit_if_asked((r, *number));
                    (Some(Arc::clone(member)), format!("generation-{number}/"))
                }
                _ => (None, String::new()),
            };
            let mut member = member.as_deref().map(lock);
            let mut store = match (comm, member.as_deref_mut()) {
                (_, Some(member)) => Some(member.store()),
                (Some(JobComm::Tcp(tcp)), None) => tcp.store(),
                _ => None,
            };
            let timeout = job.join.timeout();
            let mut connect = |name: &str, place| {
                let name = format!("{generation}{name}");
                connect_nccl(timeout, gpu, store.as_deref_mut(), &name, place)
            };
            // Gradients are averaged over the whole job, or over a
            // pipeline stage's replicas (none with one replica: `--backend
            // nccl` at world 1 has nothing to average).
            let grads = match rank.stages {
                _ if rank.replicas() == 1 => None,
                1 => Some(connect("gradients", (r, rank.world))?),
                _ => Some(connect(
                    &format!("gradients-stage-{}", rank.stage()),
                    (rank.replica(), rank.replicas()),
                )?),
            };
            // Each pipeline's own communicator carries its activations.
            let stages = match rank.stages {
                1 => None,
                s => Some(connect(
                    &format!("pipeline-{}", rank.replica()),
                    (rank.stage(), s),
                )?),
            };
            (grads, stages)
        }
        _ => (None, None),
    };
    for nccl in nccl_grads.iter().chain(&nccl_pipeline) {
        flight.add(nccl.recorder().clone());
        nccl.dump_before_exit(flight.clone());
    }
    let comm = comm.map(|c| CommThread::spawn(c.boxed())).transpose()?;
    let stage_group = format!("stage-{}", rank.stage());
    let group = (group.map(|g| CommThread::spawn_named(g, &stage_group))).transpose()?;
    for thread in comm.iter().chain(&group) {
        flight.add(thread.recorder().clone());
    }
    Ok(Wiring {
        replicas: rank.replicas() > 1,
        comm,
        group,
        pipeline,
        nccl_grads,
        nccl_pipeline,
        transport,
        comm_hook,
    })
}

impl Wiring {
    /// The links of a CPU rank: everything through the host.
    pub fn on_cpu(mut self) -> anyhow::Result<Links<Cpu>> {
        let averaging = self.host_averaging();
        let link = self.pipeline.take().map(host_link);
        self.links(averaging, link)
    }

    /// The links of a rank on `gpu`: NCCL where it was chosen.
    pub fn on_cuda(mut self, gpu: &Cuda) -> anyhow::Result<Links<Cuda>> {
        let averaging = match self.nccl_grads.take() {
            Some(nccl) => {
                let half = match self.comm_hook {
                    CommHookChoice::Half(format) => Some(format),
                    _ => None,
                };
                let hook = NcclHook::new(nccl, gpu, half)?;
                Some(AverageOver::Device(
                    Box::new(hook) as Box<dyn CommHook<Cuda>>
                ))
            }
            None => self.host_averaging(),
        };
        let link = match (self.nccl_pipeline.take(), self.pipeline.take()) {
            (Some(nccl), _) => Some(Box::new(NcclLink::new(nccl, gpu)) as Box<_>),
            (None, link) => link.map(host_link),
        };
        self.links(averaging, link)
    }

    /// The links' shape: a pipeline's link or gradients to average come
    /// only with a job's communicator.
    fn links<B: Ops>(
        self,
        averaging: Option<AverageOver<B>>,
        link: Option<Box<dyn StageLink<B>>>,
    ) -> anyhow::Result<Links<B>> {
        match (self.comm, link) {
            (None, None) if averaging.is_none() => Ok(Links::Whole(JobLinks::Alone)),
            (Some(comm), None) => Ok(Links::Whole(JobLinks::Job { comm, averaging })),
            (Some(comm), Some(link)) => Ok(Links::Stage {
                comm,
                link,
                averaging,
            }),
            (None, _) => {
                anyhow::bail!("a pipeline stage or a replica to average with, in a job of one rank")
            }
        }
    }

    /// Averaging through host memory: over the stage's group, or the
    /// job's communicator; none with one replica.
    fn host_averaging<B: Ops>(&mut self) -> Option<AverageOver<B>> {
        match (self.replicas, self.group.take()) {
            (false, _) => None,
            (true, Some(group)) => Some(AverageOver::Group(group)),
            (true, None) => Some(AverageOver::Job),
        }
    }
}

/// A pipeline stage's link through host memory over its `group`.
fn host_link<B: Ops>(group: Box<dyn Communicator>) -> Box<dyn StageLink<B>> {
    Box::new(HostLink::new(group))
}

/// Test-only: `RANK:GENERATION`, the rank of a live job's generation that
/// exits at once, as if killed, just before it builds the generation's
/// NCCL communicators: its peers lose it while theirs form.
pub const EXIT_BEFORE_NCCL_ENV: &str = "TRAINER_TEST_EXIT_BEFORE_NCCL";

/// Honours [`EXIT_BEFORE_NCCL_ENV`] for `rank` of generation `number`.
fn exit_if_asked((rank, number): (usize, u64)) {
    let asked = std::env::var(EXIT_BEFORE_NCCL_ENV).ok();
    if asked.is_some_and(|v| v == format!("{rank}:{number}")) {
        std::process::exit(137);
    }
}

/// The member, between generations, for rank 0's look, or for its
/// generation's NCCL unique ids: never held across a panic that matters
/// (a poisoned lock's member is as it was).
pub(super) fn lock(member: &Mutex<LiveMember>) -> MutexGuard<'_, LiveMember> {
    member.lock().unwrap_or_else(PoisonError::into_inner)
}
