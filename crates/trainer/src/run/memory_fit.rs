//! Whether this machine, and a rank's GPU, can hold the model, checked
//! once the device is chosen and before anything model-sized is made (and
//! before the rendezvous, so that a rank fails alone and at once).

use anyhow::Context;

use super::JobFlags;
use super::device::{Device, ranks_on};
use crate::ddp::BackendChoice;
use crate::models::{Footprint, GpuRoom, Loaded};
use crate::topology::Topology;
use crate::train::host_room_bytes;

/// Refuses a model this machine's memory cannot hold, its ranks together
/// (on GPUs, which then hold their replicas, if `gpu`).
pub(super) fn check_host(
    data: &dyn Loaded,
    job: &JobFlags,
    rank: &Topology,
    gpu: bool,
) -> anyhow::Result<()> {
    // Ranks are numbered machine by machine: rank 0 is here when this
    // machine's first rank is.
    let rank_0_here = rank.rank == rank.local_rank;
    let footprint = Footprint {
        gpu,
        local_ranks: rank.local_world,
        // Counted unless NCCL is asked for: `auto` may use the host.
        host_exchange: rank.world > 1 && !(gpu && job.ddp.backend == BackendChoice::Nccl),
        saves: rank_0_here && job.checkpoints.checkpoint_dir.is_some(),
        loads: rank_0_here && job.checkpoints.resume.is_some(),
    };
    data.check_host(&footprint, host_room_bytes())
}

/// Refuses a model `device`'s memory cannot hold (nothing to check on the
/// CPU: [`check_host`] counts it).
pub(super) fn check_device(
    data: &dyn Loaded,
    rank: &Topology,
    device: &Device,
) -> anyhow::Result<()> {
    let Device::Cuda { gpu, gpus } = device else {
        return Ok(());
    };
    let name = format!("cuda:{} ({})", gpu.ordinal(), gpu.name());
    let (free, total) = gpu
        .memory()
        .with_context(|| format!("rank {}: asking {name} for its free memory", rank.rank))?;
    data.check_gpu(&GpuRoom {
        ranks: ranks_on(gpu, *gpus, rank),
        name,
        free,
        total,
    })
}
