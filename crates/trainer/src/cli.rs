//! Command-line flags.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use core_tensor::Fp32Tile;

use crate::checkpoint::resume::ResumeFrom;

mod rules;
mod shared;
mod values;

use launcher::LaunchFlags;
use launcher::flags::seconds;
use values::positive_finite;

const AFTER_HELP: &str = "\
HOW RANKS START (first match wins):
  1. torchrun-style environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
     MASTER_ADDR and MASTER_PORT are set -> this process is that rank.
  2. mpirun: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (or PMI_RANK,
     PMI_SIZE, PMIX_RANK) -> that rank; master MASTER_ADDR or, all ranks on
     one node, 127.0.0.1; port MASTER_PORT or 20000 + a hash of the job id.
  3. SLURM (under srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and
     SLURM_JOB_NODELIST are set -> rank, world size and local rank come from
     them; the master is the first host of the node list; the port is
     MASTER_PORT, or 20000 + SLURM_JOB_ID % 10000. With --nproc-per-node M
     and one task per node, each task is its node's launcher instead.
  4. None: --world-size N > 1 (or --nproc-per-node, --nnodes, --standalone,
     --max-restarts) makes
     this process a launcher that starts N workers on this machine on a free
     port, prefixes their output with the rank, and stops them all if one
     fails (or, with --max-restarts M, restarts them all from the newest
     checkpoint, up to M times). Several machines: one launcher on each,
     --nnodes N --nproc-per-node M --master-addr H (--node-rank K, or by
     arrival); torchrun's spellings (--nproc_per_node, ...) work too.

CHECKPOINTS: with --checkpoint-dir DIR, rank 0 writes DIR/ckpt-eEEEE-sSSSSSS/
(epoch E with S of its steps done) after every epoch and every
--checkpoint-every N optimizer steps: model.safetensors (PyTorch state_dict
names; torch's model.load_state_dict(safetensors.torch.load_file(..)) loads it)
and state.safetensors (Adam moments, position, settings, checksums).
--resume auto continues from the newest valid one, exactly where it stopped.

SIGNALS: SIGTERM or SIGUSR1 to a rank or to the launcher saves a checkpoint at
a step all ranks agree on and exits with code 75 (EX_TEMPFAIL; requeue and
continue with --resume auto). SIGINT and SIGHUP stop promptly, saving nothing;
a second signal stops at once. The launcher passes signals on to its workers,
kills them after --grace seconds, and exits with 75 if they all saved, else
with 128 + the signal; its workers die with it even when it is SIGKILLed.

GPU KERNELS: nvcc's PTX from the build when it loads, else NVRTC compiles them
for the GPU (libnvrtc.so: CUDA toolkit or the nvidia-cuda-nvrtc-cu12 wheel) and
keeps them in ~/.cache/core-tensor/kernels for the next start
(CORE_TENSOR_KERNEL_CACHE=DIR elsewhere, =off for no cache).

CURVES: trainer plot run.jsonl -o curves.png draws a --metrics file's loss,
accuracy and img/s per epoch (labels in DejaVu Sans: fonts-dejavu-core).

DATA: --data-dir, else data/fashion-mnist/, else /usr/share/datasets/fashion-mnist/
(Debian/Ubuntu: apt-get install dataset-fashion-mnist; elsewhere: cargo xtask fetch-data).
--model toy generates --samples samples from --seed; --model recsys streams --ratings
(a MovieLens ratings.csv: cargo xtask fetch-data movielens, or without a network
trainer synth-ratings ratings.csv --rows N for a generated one).";

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

/// How gradients travel between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// NCCL when every rank trains on a GPU of its own (and can load
    /// libnccl), the TCP transport otherwise (saying why).
    Auto,
    /// NCCL on the GPUs; an error when a rank has no GPU of its own.
    Nccl,
    /// The TCP/Unix-socket ring, for CPU and GPU ranks alike (GPU ranks
    /// stage gradients through host memory; several ranks may share a GPU).
    Tcp,
}

/// How a model's row-sparse gradients (recsys' embedding and per-row
/// biases) travel between ranks over the host transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SparseGrads {
    /// The touched rows when they are fewer bytes than the dense
    /// all-reduce, else the dense all-reduce; decided every step.
    Auto,
    /// Always the touched rows (indices + rows).
    Always,
    /// Always the dense all-reduce.
    Never,
}

/// How the built-in launcher runs the ranks of one machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Spawn {
    /// One worker process per rank, linked by Unix sockets (or TCP).
    Processes,
    /// One thread per rank in this process, sharing the loaded data set and
    /// meeting in memory: no ports, no child processes (PyTorch's
    /// DataParallel in spirit, with DDP's numbers: bitwise those of
    /// processes).
    Threads,
}

/// Which model trains, on which data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelChoice {
    /// The FashionMNIST CNN (Adam; --data-dir).
    Cnn,
    /// PyTorch's DDP-tutorial ToyModel (Linear 10->10, ReLU, Linear 10->5,
    /// MSE, SGD) on --samples synthetic samples generated from --seed.
    Toy,
    /// A MovieLens recommender (user and movie embeddings, an MLP, MSE,
    /// Adam; test RMSE on a held-out 10%) on --ratings, streamed in shards.
    Recsys,
}

/// Data-parallel training of the FashionMNIST CNN (or of another model:
/// --model).
#[derive(Clone, Debug, Parser)]
#[command(name = "trainer", version, about, after_help = AFTER_HELP, allow_negative_numbers = true)]
pub struct Cli {
    /// Ranks to launch on this machine (ignored when the environment already
    /// names this process's rank, which must then agree) [default: 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub world_size: Option<u32>,

    /// The model to train.
    #[arg(long, value_enum, default_value_t = ModelChoice::Cnn, value_name = "cnn|toy|recsys")]
    pub model: ModelChoice,

    /// Synthetic samples for --model toy [default: 8192].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=(1 << 32)))]
    pub samples: Option<u64>,

    /// MovieLens ratings.csv for --model recsys (`cargo xtask fetch-data
    /// movielens` downloads ml-latest-small).
    #[arg(long, value_name = "PATH")]
    pub ratings: Option<PathBuf>,

    /// Embedding size of --model recsys [default: 32].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub embedding_dim: Option<u32>,

    /// Passes over the training set.
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,

    /// Samples per step on each rank.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub batch_size: u32,

    /// Learning rate (Adam's; SGD's for --model toy).
    #[arg(long, default_value_t = 1e-3, value_name = "RATE", value_parser = positive_finite, allow_hyphen_values = true)]
    pub lr: f64,

    /// Seed for the initial weights, the shuffling and dropout.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,

    /// Directory holding the four FashionMNIST .gz files [default: see DATA below].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Stop each epoch after this many steps (for quick runs) [default: the whole epoch].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,

    /// Which device trains.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto, value_name = "auto|cpu|cuda")]
    pub device: DeviceChoice,

    /// Run conv and linear products on the GPU's tensor cores in TF32
    /// (compute capability 8.0+): faster, about 1e-3 relative from float32,
    /// as PyTorch's `allow_tf32`.
    #[arg(long)]
    pub tf32: bool,

    /// The GPU's float32 products' tile: square (64x64) or wide (64x128, for
    /// products of more than 32 rows); the same results, a speed choice.
    #[arg(long, default_value = "square", value_name = "square|wide", value_parser = Fp32Tile::parse)]
    pub fp32_tile: Fp32Tile,

    /// Gradient transport between ranks.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto, value_name = "auto|nccl|tcp")]
    pub backend: BackendChoice,

    /// CPU threads per rank [default: cores on this machine / ranks on it].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,

    /// Write one JSON line per epoch to this file (rank 0 only).
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,

    /// Write TensorBoard event files into this directory (rank 0 only).
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,

    /// Rank 0's running loss and accuracy every N steps, to the progress
    /// display and TensorBoard (CPU training; on a GPU, once per epoch).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_every: u64,

    /// Seconds between progress lines when stderr is not a terminal.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = seconds)]
    pub progress_seconds: f64,

    /// Gradient bucket size in MiB for the all-reduce: a bucket closes at the
    /// parameter that brings it to the cap (1 MiB for the first, as in
    /// PyTorch DDP), so one large parameter makes a larger bucket.
    #[arg(long, default_value_t = 25.0, value_name = "MIB", value_parser = positive_finite)]
    pub bucket_mb: f64,

    /// Row-sparse gradients (recsys' embedding and per-row biases): send
    /// only the rows a step touched, or the dense all-reduce, whichever
    /// moves fewer bytes (auto). NCCL ranks always use the dense all-reduce.
    #[arg(long, value_enum, default_value_t = SparseGrads::Auto, value_name = "auto|always|never")]
    pub sparse_grads: SparseGrads,

    /// Recsys: update only the embedding rows and per-row biases a step's
    /// batch looked up (all ranks' rows), as torch.optim.SparseAdam does,
    /// not the whole tables (dense Adam, the default, decays every row's
    /// moments every step).
    /// Needs the host's sparse exchange (--backend tcp, not
    /// --sparse-grads never) with more than one rank.
    #[arg(long)]
    pub sparse_adam: bool,

    /// Seconds a rank waits for its peers (rendezvous, each collective)
    /// before failing.
    #[arg(long, default_value_t = 30.0, value_name = "SECS", value_parser = seconds)]
    pub timeout: f64,

    /// Disable both dropout layers (for checking data-parallel equivalence).
    #[arg(long)]
    pub no_dropout: bool,

    /// Write checkpoints into this directory (rank 0), after every epoch.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,

    /// Also checkpoint every N optimizer steps (needs --checkpoint-dir).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: Option<u64>,

    /// Checkpoints to keep in --checkpoint-dir; older ones are deleted.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: u32,

    /// Continue from a checkpoint directory, or `auto`: the newest valid one
    /// in --checkpoint-dir (none there yet: start fresh).
    #[arg(long, value_name = "PATH|auto", value_parser = ResumeFrom::parse)]
    pub resume: Option<ResumeFrom>,

    /// Start from the weights in a safetensors file with PyTorch's
    /// state_dict names (fresh optimizer). With --resume auto: only when
    /// there is no checkpoint to resume from.
    #[arg(long, value_name = "FILE")]
    pub init_from: Option<PathBuf>,

    /// Read the job's auth token (64 hex digits) from this file, which must
    /// be private to its owner (chmod 600); else TRAINER_AUTH_TOKEN. The
    /// built-in launcher and `cargo xtask slurm-submit` make one per job.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,

    /// Pipeline parallelism: split the model into S stages, one per rank
    /// (S = 2 for this CNN: the convolution stack, the fully connected
    /// stack); the world is S x data-parallel replicas.
    #[arg(long, value_name = "S", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub pipeline_stages: u32,

    /// Micro-batches per batch in a pipeline (1F1B schedule).
    #[arg(long, value_name = "M", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub micro_batches: u32,

    /// Local launcher: run the ranks of this machine as worker processes
    /// or as threads of this one (one machine only; no --max-restarts).
    #[arg(long, value_enum, default_value_t = Spawn::Processes, value_name = "processes|threads")]
    pub spawn: Spawn,

    #[command(flatten)]
    pub launch: LaunchFlags,
}

#[cfg(test)]
mod tests;
