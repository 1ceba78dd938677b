//! Where checkpoints go, how often, how many stay, and where a run starts.

use std::path::PathBuf;

use clap::Args;

use super::resume::ResumeFrom;

/// The checkpoint flags.
#[derive(Clone, Debug, Args)]
pub struct CheckpointFlags {
    /// Write checkpoints into this directory (rank 0), after every epoch.
    ///
    /// The job holds it for its life (a lock on DIR/trainer.lock): a second
    /// job on it is refused at its start, naming the first.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,

    /// Also checkpoint every N optimizer steps (needs --checkpoint-dir).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: Option<u64>,

    /// Checkpoints to keep in --checkpoint-dir; older ones are deleted.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: u32,

    /// Continue from a checkpoint directory, or `auto`.
    ///
    /// `auto`: the newest valid one in --checkpoint-dir (none there yet:
    /// start fresh).
    #[arg(long, value_name = "PATH|auto", value_parser = ResumeFrom::parse)]
    pub resume: Option<ResumeFrom>,

    /// Start from the weights in a safetensors file (fresh optimizer).
    ///
    /// Its tensors have PyTorch's state_dict names. With --resume auto: only
    /// when there is no checkpoint to resume from.
    #[arg(long, value_name = "FILE")]
    pub init_from: Option<PathBuf>,
}
