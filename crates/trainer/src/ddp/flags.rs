//! The flags of gradient averaging: which transport, in which buckets, how
//! a model's row-sparse gradients travel, and what form the dense ones take
//! on the wire (`--comm-hook`).

use std::fmt;
use std::str::FromStr;

use clap::{Args, ValueEnum};
pub use comm::HalfFormat;
use launcher::flags::positive_finite;
use serde::{Deserialize, Serialize};

/// How gradients travel between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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

    /// Gradient bucket size in MiB for the all-reduce.
    ///
    /// A bucket closes at the parameter that brings it to the cap (1 MiB for
    /// the first, as in PyTorch DDP), so one large parameter makes a larger
    /// bucket.
    #[arg(long, default_value_t = 25.0, value_name = "MIB", value_parser = positive_finite)]
    pub bucket_mb: f64,

    /// Row-sparse gradients (recsys' embedding and per-row biases).
    ///
    /// Send only the rows a step touched, or the dense all-reduce, whichever
    /// moves fewer bytes (auto). NCCL ranks always use the dense all-reduce.
    #[arg(long, value_enum, default_value_t = SparseGrads::Auto, value_name = "auto|always|never")]
    pub sparse_grads: SparseGrads,

    /// What the gradients become on the wire (PyTorch DDP's comm hooks).
    ///
    /// As PyTorch DDP's register_comm_hook: none (float32, the default); bf16
    /// or fp16 (cast before the all-reduce and back after: half the bytes;
    /// NCCL adds in that type, the TCP ring adds each hop in float32); or
    /// powersgd:RANK[:START] (PyTorch's PowerSGD: each weight matrix sent as
    /// rank-RANK factors with error feedback and warm start, biases as
    /// float32; plain all-reduces for the first START optimizer steps,
    /// default 1000). powersgd needs --backend tcp.
    #[arg(long, default_value_t = CommHookChoice::None, value_name = "none|bf16|fp16|powersgd:RANK[:START]")]
    pub comm_hook: CommHookChoice,
}

/// `--comm-hook`: how the dense gradient buckets are averaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommHookChoice {
    /// float32 all-reduces (PyTorch's default `allreduce_hook`).
    None,
    /// `bf16_compress_hook` / `fp16_compress_hook`.
    Half(HalfFormat),
    /// `powerSGD_hook` with `matrix_approximation_rank = rank` and
    /// `start_powerSGD_iter = start`.
    PowerSgd { rank: usize, start: u64 },
}

/// PyTorch's `start_powerSGD_iter` default.
pub const POWERSGD_START: u64 = 1000;

impl fmt::Display for CommHookChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommHookChoice::None => f.write_str("none"),
            CommHookChoice::Half(HalfFormat::Bf16) => f.write_str("bf16"),
            CommHookChoice::Half(HalfFormat::Fp16) => f.write_str("fp16"),
            CommHookChoice::PowerSgd { rank, start } => write!(f, "powersgd:{rank}:{start}"),
        }
    }
}

impl FromStr for CommHookChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = "expected none, bf16, fp16 or powersgd:RANK[:START] (e.g. powersgd:4:100)";
        match s {
            "none" => return Ok(CommHookChoice::None),
            "bf16" => return Ok(CommHookChoice::Half(HalfFormat::Bf16)),
            "fp16" => return Ok(CommHookChoice::Half(HalfFormat::Fp16)),
            _ => {}
        }
        let Some(spec) = s.strip_prefix("powersgd:") else {
            return Err(format!("unknown hook `{s}`: {usage}"));
        };
        let (rank, start) = match spec.split_once(':') {
            Some((rank, start)) => (rank, Some(start)),
            None => (spec, None),
        };
        let rank = match rank.parse::<usize>() {
            Ok(r) if (1..=1024).contains(&r) => r,
            _ => {
                return Err(format!(
                    "powersgd's RANK `{rank}` is not a whole number from 1 to 1024: {usage}"
                ));
            }
        };
        let start = match start.map(str::parse::<u64>) {
            None => POWERSGD_START,
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                return Err(format!(
                    "powersgd's START `{}` is not a step count: {usage}",
                    start.unwrap_or_default()
                ));
            }
        };
        Ok(CommHookChoice::PowerSgd { rank, start })
    }
}
