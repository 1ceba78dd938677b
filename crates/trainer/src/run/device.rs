//! Which device a rank trains on, and how its gradients travel.

use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Args, ValueEnum};
use comm::nccl::{NcclCommunicator, require_nccl};
use comm::{Communicator, Store};
use core_tensor::{Backend, Cpu, Cuda, Fp32Tile, GemmStaging, MatmulPrecision, Products};

use crate::ddp::BackendChoice;
use crate::ddp::transport::{self, RankDevice, Transport};
use crate::topology::Topology;

/// Which device trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// A GPU when one is usable, the CPU otherwise (saying why).
    Auto,
    /// The CPU, with `--threads` threads.
    Cpu,
    /// The GPU of this rank's LOCAL_RANK; an error when there is none.
    Cuda,
}

/// The device's flags.
#[derive(Clone, Debug, Args)]
pub struct DeviceFlags {
    /// Which device trains.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto, value_name = "auto|cpu|cuda")]
    pub device: DeviceChoice,

    /// The precision of the GPU's conv and linear products [default: f32].
    ///
    /// f32 (float32 on the CUDA cores, the CPU's arithmetic), tf32 (TF32 on
    /// the tensor cores, compute capability 8.0+: faster, about 1e-3 relative
    /// from float32, as PyTorch's `allow_tf32`) or bf16 (mixed precision, as
    /// PyTorch's bf16 autocast: bf16 inputs and float32 sums on the tensor
    /// cores, compute capability 8.0+; weights, gradients, Adam and
    /// checkpoints stay float32; about 1e-2 relative from float32). GPU only:
    /// --device cpu refuses tf32 and bf16.
    #[arg(long, value_name = "f32|tf32|bf16", value_parser = MatmulPrecision::parse)]
    pub precision: Option<MatmulPrecision>,

    /// The same as --precision tf32.
    #[arg(long)]
    pub tf32: bool,

    /// The same as --precision bf16.
    #[arg(long)]
    pub bf16: bool,

    /// The tile of the GPU's float32 and TF32 products.
    ///
    /// square (64x64) or wide (64x256, for products of more than 32 rows and
    /// at least 1024 columns); the same results, a speed choice. Not with
    /// --precision bf16.
    #[arg(long, default_value = "square", value_name = "square|wide", value_parser = Fp32Tile::parse)]
    pub fp32_tile: Fp32Tile,

    /// How the GPU's float32 and TF32 products stage their tiles.
    ///
    /// In shared memory: registers (any GPU) or cp-async (copies that bypass
    /// the registers, compute capability 8.0+); the same results, a speed
    /// choice. Not with --precision bf16.
    #[arg(long, default_value = "registers", value_name = "registers|cp-async", value_parser = GemmStaging::parse)]
    pub gemm_staging: GemmStaging,

    /// Separate GPU kernels instead of the CNN's three fused ops.
    ///
    /// Run the CNN's conv1 and ReLU; conv2, max-pool, ReLU and dropout; fc1,
    /// ReLU and dropout, as separate GPU kernels instead of three fused ops:
    /// the same results, a speed comparison.
    #[arg(long)]
    pub no_fusion: bool,

    /// CPU threads per rank [default: cores on this machine / ranks on it].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
}

impl DeviceFlags {
    /// The products' precision the flags ask for, and the flag that asked
    /// for it as given (`--precision tf32`, `--tf32`; none for the default):
    /// `--precision` and its aliases `--tf32` and `--bf16` may repeat one
    /// precision, not name two.
    pub fn precision(&self) -> Result<(MatmulPrecision, Option<String>), String> {
        let given: Vec<(MatmulPrecision, String)> = [
            self.precision.map(|p| (p, format!("--precision {p}"))),
            self.tf32
                .then(|| (MatmulPrecision::Tf32, "--tf32".to_string())),
            self.bf16
                .then(|| (MatmulPrecision::Bf16, "--bf16".to_string())),
        ]
        .into_iter()
        .flatten()
        .collect();
        match given.as_slice() {
            [] => Ok((MatmulPrecision::Fp32, None)),
            [(precision, flag), rest @ ..] => match rest.iter().find(|(p, _)| p != precision) {
                Some((_, other)) => Err(format!(
                    "{flag} and {other} are two precisions of the same products: give one"
                )),
                None => Ok((*precision, Some(flag.clone()))),
            },
        }
    }

    /// The products the flags ask for: their precision, with the tile and
    /// the staging it allows (`Products::new`'s refusals).
    pub fn products(&self) -> anyhow::Result<Products> {
        let (precision, _) = self.precision().map_err(anyhow::Error::msg)?;
        Ok(Products::new(precision, self.fp32_tile, self.gemm_staging)?)
    }
}

/// The device a rank trains on.
#[derive(Clone)]
pub(super) enum Device {
    Cpu(Cpu),
    /// The GPU, and how many this machine has (ranks wrap around them).
    Cuda {
        gpu: Cuda,
        gpus: usize,
    },
}

impl Device {
    pub(super) fn is_gpu(&self) -> bool {
        matches!(self, Device::Cuda { .. })
    }
}

/// Whether the ranks of `cli` will train on GPUs, for a check made before
/// each settles its device: `--device auto` takes one where the driver
/// counts any (a GPU that then fails to open sends its rank to the CPU).
pub(super) fn expects_gpu(flags: &DeviceFlags) -> bool {
    match flags.device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Cuda => true,
        DeviceChoice::Auto => core_tensor::cuda_available().is_ok_and(|gpus| gpus > 0),
    }
}

/// The device `--device` asks for: `cuda` insists on the GPU of this rank's
/// local rank (wrapping around when ranks outnumber GPUs), `auto` takes it
/// when one is usable and otherwise says why it trains on the CPU.
pub(super) fn choose_device(flags: &DeviceFlags, rank: &Topology) -> anyhow::Result<Device> {
    let products = flags.products()?;
    let gpu = || -> anyhow::Result<Device> {
        let gpus = core_tensor::cuda_available()?;
        let gpu = Cuda::with_products(gpu_of(rank.local_rank, gpus), products)?
            .with_fusion(!flags.no_fusion);
        Ok(Device::Cuda { gpu, gpus })
    };
    // The flag to name: the precision's (as given) or --gemm-staging
    // cp-async when the GPU is too old for it (drop the flag), --device
    // cuda for everything else (no driver, no GPU).
    let tensor_core_flag = match flags.precision() {
        Ok((precision, Some(flag))) if precision != MatmulPrecision::Fp32 => flag,
        _ => "--gemm-staging".to_string(),
    };
    let blame = |why: anyhow::Error| {
        let flag = if is_gpu_too_old(&why) {
            tensor_core_flag.as_str()
        } else {
            "--device cuda"
        };
        why.context(format!("rank {}: {flag}", rank.rank))
    };
    match flags.device {
        DeviceChoice::Cpu => Ok(Device::Cpu(cpu_backend(flags, rank)?)),
        DeviceChoice::Cuda => gpu().map_err(blame),
        DeviceChoice::Auto => match gpu() {
            Ok(gpu) => Ok(gpu),
            // A GPU too old for TF32, bf16 or cp.async is an error, not
            // a quiet CPU run.
            Err(why) if is_gpu_too_old(&why) => Err(blame(why)),
            Err(why) => {
                // Once per machine: its ranks share the reason.
                if rank.local_rank == 0 {
                    let tf32 = if products.precision() != MatmulPrecision::Fp32
                        || products.staging() == GemmStaging::CpAsync
                    {
                        format!("; {tensor_core_flag} has no effect there")
                    } else {
                        String::new()
                    };
                    tell!(
                        "note: no usable GPU ({why:#}); training on the CPU (every rank on {}){tf32}",
                        launcher::contract::hostname()
                    );
                }
                Ok(Device::Cpu(cpu_backend(flags, rank)?))
            }
        },
    }
}

/// The GPU of local rank `local_rank` among `count`: ranks wrap around when
/// they outnumber the GPUs.
fn gpu_of(local_rank: usize, count: usize) -> usize {
    if count == 0 {
        local_rank
    } else {
        local_rank % count
    }
}

/// How many of this machine's ranks train on `gpu`, this one included,
/// the machine having `gpus` GPUs.
pub(super) fn ranks_on(gpu: &Cuda, gpus: usize, rank: &Topology) -> usize {
    let sharing = (0..rank.local_world).filter(|&r| gpu_of(r, gpus) == gpu.ordinal());
    sharing.count().max(1)
}

fn is_gpu_too_old(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<core_tensor::Error>(),
        Some(core_tensor::Error::GpuTooOld { .. })
    )
}

/// The gradient transport every rank agrees on (`--backend`), or `None`
/// for a single rank that needs none. Each rank states its device; the
/// statements travel over the job's communicator, so all ranks apply one
/// rule to the same facts.
pub(super) fn choose_transport(
    backend: BackendChoice,
    rank: usize,
    device: &Device,
    comm: Option<&mut dyn Communicator>,
) -> anyhow::Result<Option<Transport>> {
    if comm.is_none() && backend != BackendChoice::Nccl {
        return Ok(None);
    }
    // A GPU rank that may use NCCL checks the library itself, keeping the
    // search report for its own error.
    let (mine, missing_nccl) = match device {
        Device::Cpu(_) => (RankDevice::default(), None),
        Device::Cuda { gpu, .. } => {
            let uuid = gpu
                .uuid()
                .with_context(|| format!("rank {rank}: reading the GPU's UUID"))?;
            let missing = match backend {
                BackendChoice::Tcp => None,
                _ => require_nccl().err(),
            };
            let device = RankDevice {
                gpu: Some(uuid),
                nccl_loadable: missing.is_none() && backend != BackendChoice::Tcp,
            };
            (device, missing)
        }
    };
    let ranks = match comm {
        Some(comm) => transport::exchange(comm, &mine)
            .with_context(|| format!("rank {rank}: agreeing on the gradient transport"))?,
        None => vec![mine],
    };
    match transport::choose(backend, &ranks) {
        Ok(decision) => {
            if let (Some(note), 0) = (&decision.note, rank) {
                tell!("note: {note}");
            }
            Ok(Some(decision.transport))
        }
        Err(why) => Err(match missing_nccl {
            Some(report) => anyhow!(report).context(format!("rank {rank}: --backend nccl")),
            None => anyhow!("rank {rank}: {why}"),
        }),
    }
}

/// This rank's NCCL communicator `name` (the job's gradients, or one
/// pipeline's), on a side stream of its GPU, as rank `rank` of `world`;
/// the group's rank 0's unique id travels through the TCP ring's `store`.
pub(super) fn connect_nccl(
    timeout: Duration,
    gpu: &Cuda,
    store: Option<&mut Store>,
    name: &str,
    (rank, world): (usize, usize),
) -> anyhow::Result<NcclCommunicator> {
    let context = || {
        format!(
            "rank {rank}: creating the NCCL communicator {name:?} on {}",
            gpu.describe()
        )
    };
    let stream = gpu.side_stream().with_context(context)?;
    NcclCommunicator::connect_named(stream, rank, world, store, timeout, name).with_context(context)
}

/// The CPU backend, with `--threads` or a fair share of this machine's cores.
fn cpu_backend(flags: &DeviceFlags, rank: &Topology) -> anyhow::Result<Cpu> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local = rank.local_world;
    let threads = flags.threads.map_or((cores / local).max(1), |t| t as usize);
    let wanted = threads * local;
    if wanted > cores && rank.local_rank == 0 {
        tell!(
            "note: {local} rank(s) x --threads {threads} on this machine's {cores} CPU(s): the threads take turns, which is slower than {} thread(s) per rank",
            (cores / local).max(1)
        );
    }
    Ok(Cpu::new(threads)?)
}
