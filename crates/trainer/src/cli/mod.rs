//! The command line: the program's own flags (how many ranks, how they
//! run) around the launcher's (`launcher::LaunchFlags`) and the rank's
//! (`run::JobFlags`, each group defined where it is read), and the rules
//! between groups (`rules.rs`).

use clap::{Parser, ValueEnum};
use launcher::LaunchFlags;

use crate::run::JobFlags;
use crate::run::help_heading;

mod rules;

/// What `-h` says below the flags: where the rest is.
const SHORT_AFTER_HELP: &str = "\
How ranks start, checkpoints, signals, timeouts, auth, GPU kernels, curves
and data: see --help.";

/// What `--help` says below the flags.
const AFTER_HELP: &str = "\
HOW RANKS START (first match wins):
  1. torchrun-style environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
     MASTER_ADDR and MASTER_PORT are set -> this process is that rank. Under
     torchrun itself (torchrun --no-python trainer ...) the ranks meet at its
     agent's store, and a worker it restarts continues from the newest
     checkpoint in --checkpoint-dir.
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
SIGUSR2 stops nothing: every rank writes its flight record (--flight-recorder)
and the launcher says which rank holds the others up, as it does after a
failure; trainer flight-report DIR says it from the records alone.

TIMEOUTS: --rdzv-timeout SECS (600) bounds joining the job (every rank's and
launcher's arrival), --timeout SECS (30) each collective; an error names the
one that ran out.

AUTH: every store and ring connection proves it holds the job's token
(TRAINER_AUTH_TOKEN, or --auth-token-file FILE). The launcher on one machine
makes one. A rendezvous other machines can reach (a master other than
127.0.0.1, ::1 or localhost) does not start without one: `trainer token FILE`
writes one, `cargo xtask slurm-submit` makes one per job; --no-auth runs
without (any process that reaches the ports can join; see docs/security.md).

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

/// Data-parallel training of the FashionMNIST CNN (or of another model:
/// --model).
#[derive(Clone, Debug, Parser)]
#[command(
    name = "trainer",
    version,
    about,
    after_help = SHORT_AFTER_HELP,
    after_long_help = AFTER_HELP,
    allow_negative_numbers = true
)]
pub struct Cli {
    /// Ranks to launch on this machine [default: 1].
    ///
    /// Ignored when the environment already names this process's rank,
    /// which must then agree.
    #[arg(long, help_heading = help_heading::LAUNCHING, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub world_size: Option<u32>,

    /// Local launcher: run the ranks as worker processes or as threads.
    ///
    /// Threads of this one process: one machine only, no --max-restarts.
    #[arg(long, help_heading = help_heading::LAUNCHING, value_enum, default_value_t = Spawn::Processes, value_name = "processes|threads")]
    pub spawn: Spawn,

    #[command(flatten)]
    pub job: JobFlags,

    #[command(flatten, next_help_heading = help_heading::LAUNCHING)]
    pub launch: LaunchFlags,
}

#[cfg(test)]
mod tests;
