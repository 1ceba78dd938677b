//! The flags of gradient averaging: which transport, in which buckets, and
//! how a model's row-sparse gradients travel.

use clap::{Args, ValueEnum};
use launcher::flags::positive_finite;

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

/// The averaging's flags.
#[derive(Clone, Debug, Args)]
pub struct DdpFlags {
    /// Gradient transport between ranks.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto, value_name = "auto|nccl|tcp")]
    pub backend: BackendChoice,

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
}
