//! torchrun's launcher flags, with its underscore spellings as aliases, so
//! that a torchrun command line works with `torchrun ... train.py` replaced
//! by `trainer ...`.

use clap::Args;

/// torchrun's rendezvous port when `--rdzv-endpoint` names none.
pub const DEFAULT_RDZV_PORT: u16 = 29400;

/// The bounds of `--heartbeat-timeout`, in seconds: below one second a
/// busy machine passes for a stopped one; past a day it detects nothing.
const HEARTBEAT_SECONDS: std::ops::RangeInclusive<f64> = 1.0..=86400.0;

/// torchrun's rendezvous backends that mean what this launcher does
/// (`--rdzv-backend`): node 0's launcher hosts a store at the endpoint, the
/// others join it. torchrun's `c10d` does just that; its `static` takes
/// fixed node ranks, which `--node-rank` gives here (else by arrival).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdzvBackend {
    C10d,
    Static,
}

/// `--rdzv-backend`'s value parser: torchrun's names this launcher can
/// stand in for, and why it refuses the others.
fn rdzv_backend(name: &str) -> Result<RdzvBackend, String> {
    match name {
        "c10d" => Ok(RdzvBackend::C10d),
        "static" => Ok(RdzvBackend::Static),
        "etcd" | "etcd-v2" => Err(format!(
            "torchrun's {name} rendezvous meets at an etcd server, and this launcher has no etcd client: its launchers meet at a store that node 0's launcher hosts, as torchrun's c10d does; give --rdzv-backend c10d with --rdzv-endpoint HOST:PORT of node 0, or launch with torchrun itself"
        )),
        _ => Err(format!(
            "no rendezvous backend is called {name:?}: this launcher takes torchrun's c10d and static, both meaning a store that node 0's launcher hosts at --rdzv-endpoint"
        )),
    }
}

/// `--nnodes`: how many machines a job runs on, a fixed number (`min ==
/// max`) or torchrun's elastic range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeCount {
    pub min: u32,
    pub max: u32,
}

impl NodeCount {
    pub const ONE: NodeCount = NodeCount { min: 1, max: 1 };

    /// Whether the machines may change from one attempt to the next.
    pub fn is_elastic(self) -> bool {
        self.min < self.max
    }
}

impl std::fmt::Display for NodeCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.is_elastic() {
            true => write!(f, "{}:{}", self.min, self.max),
            false => write!(f, "{}", self.max),
        }
    }
}

/// Parses `--nnodes`: `N` or `MIN:MAX`, each 1 to 1024, MIN no more than MAX.
fn node_count(s: &str) -> Result<NodeCount, String> {
    let number = |n: &str| match n.trim().parse::<u32>() {
        Ok(n @ 1..=1024) => Ok(n),
        _ => Err(format!("{n:?} is not a machine count from 1 to 1024")),
    };
    let (min, max) = match s.split_once(':') {
        Some((min, max)) => (number(min)?, number(max)?),
        None => (number(s)?, number(s)?),
    };
    if min > max {
        return Err(format!(
            "{s:?}: the least number of machines ({min}) is more than the most ({max}); elastic ranges are MIN:MAX"
        ));
    }
    Ok(NodeCount { min, max })
}

/// The launcher's flags: how many workers on this machine, how to treat
/// them, and where the machines meet.
#[derive(Clone, Debug, Args)]
pub struct LaunchFlags {
    /// Ranks to launch on this machine (world size = nnodes x this).
    #[arg(long, alias = "nproc_per_node", value_name = "M", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nproc_per_node: Option<u32>,

    /// Local launcher: restart the workers up to N times when one fails.
    ///
    /// It stops them all and restarts them from the newest checkpoint (needs
    /// --checkpoint-dir).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_restarts: u32,

    /// Local launcher: seconds the workers get to stop after a signal.
    ///
    /// After it passes them a signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1,
    /// SIGUSR2), to save and stop before it kills them.
    #[arg(long, default_value_t = 30.0, value_name = "SECS", value_parser = seconds)]
    pub grace: f64,

    #[command(flatten)]
    pub rdzv: RdzvFlags,
}

/// Where and how the launchers of a job of several machines meet.
#[derive(Clone, Debug, Args)]
pub struct RdzvFlags {
    /// Machines in the job, one launcher on each; MIN:MAX: an elastic job.
    ///
    /// [default: 1, or one per SLURM node under srun]. An elastic job (as
    /// torchrun's) starts with MIN to MAX machines, goes on without a lost
    /// one while MIN remain (restarting from the newest checkpoint,
    /// --max-restarts), and takes a machine that comes back at its next
    /// restart.
    #[arg(long, value_name = "N|MIN:MAX", value_parser = node_count)]
    pub nnodes: Option<NodeCount>,

    /// This machine's index, 0..N [default: by arrival].
    ///
    /// Omitted, it is assigned by arrival at the rendezvous, so the same
    /// command works on every machine.
    #[arg(long, alias = "node_rank", value_name = "K")]
    pub node_rank: Option<u32>,

    /// Host of node 0, where the rendezvous store listens.
    #[arg(long, alias = "master_addr", value_name = "HOST")]
    pub master_addr: Option<String>,

    /// Port of the rendezvous store on --master-addr [default: 29500].
    #[arg(long, alias = "master_port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,

    /// HOST[:PORT] of the rendezvous store (torchrun's spelling).
    ///
    /// torchrun's spelling of --master-addr/--master-port; port 29400 when
    /// omitted.
    #[arg(
        long,
        alias = "rdzv_endpoint",
        value_name = "HOST:PORT",
        conflicts_with = "master_addr"
    )]
    pub rdzv_endpoint: Option<String>,

    /// Name of the job at the rendezvous.
    ///
    /// Launchers with another id are refused there.
    #[arg(long, alias = "rdzv_id", value_name = "ID")]
    pub rdzv_id: Option<String>,

    /// torchrun's rendezvous backend: c10d or static.
    ///
    /// Mapped to this launcher's own: c10d and static both mean that node 0's
    /// launcher hosts the store at --rdzv-endpoint (or
    /// --master-addr/--master-port) and the others join it, numbered by
    /// --node-rank or by arrival; etcd and etcd-v2 are refused (no etcd
    /// client).
    #[arg(long, alias = "rdzv_backend", value_parser = rdzv_backend, value_name = "c10d|static")]
    pub rdzv_backend: Option<RdzvBackend>,

    /// One machine, rendezvous on a free local port (torchrun --standalone).
    #[arg(long, conflicts_with_all = ["master_addr", "master_port", "rdzv_endpoint"])]
    pub standalone: bool,

    /// Several machines: seconds a launcher may go silent (1 to 86400).
    ///
    /// Then the job ends on every node as one that is stopped (SIGSTOP, a
    /// debugger, a suspended VM) or cut off by the network: node 0 hears no
    /// heartbeat from it (each beats ten times per limit), or node 0's
    /// launcher answers no request. With more than two machines keep it below
    /// --timeout, so that it is named before the other machines' ranks time
    /// out waiting for its ranks.
    #[arg(long, value_name = "SECS", default_value_t = 15.0, value_parser = heartbeat_seconds)]
    pub heartbeat_timeout: f64,
}

/// The longest duration a flag takes (`--grace`, and the trainer's
/// `--timeout` and `--progress-seconds`): 30 days, beyond any job's
/// wall-clock limit, and far inside what `Duration` and `Instant`
/// arithmetic can hold.
const MAX_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// A flag's value that must be a positive finite number.
pub fn positive_finite(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a positive finite number, got {s}"))
    }
}

/// A duration flag in seconds: positive, finite, at most 30 days.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v = positive_finite(s)?;
    if v > MAX_SECONDS {
        Err(format!(
            "{s} seconds is more than 30 days ({MAX_SECONDS}), the longest wait this takes"
        ))
    } else {
        Ok(v)
    }
}

/// A `--heartbeat-timeout` within [`HEARTBEAT_SECONDS`].
fn heartbeat_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if HEARTBEAT_SECONDS.contains(&v) => Ok(v),
        _ => Err(format!(
            "{s:?} is not 1 to 86400 seconds: a shorter limit takes a busy machine for a stopped one, a longer one detects nothing"
        )),
    }
}

/// The flags above that take a value, in both spellings: the launcher's
/// alone, never passed on to its workers.
pub const LAUNCHER_ONLY: [&str; 17] = [
    "--max-restarts",
    "--nnodes",
    "--node-rank",
    "--node_rank",
    "--nproc-per-node",
    "--nproc_per_node",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--rdzv-backend",
    "--rdzv_backend",
    "--heartbeat-timeout",
];

/// The one switch among them.
pub const STANDALONE: &str = "--standalone";

impl RdzvFlags {
    /// How long a launcher may go silent: `--heartbeat-timeout`.
    pub fn heartbeat(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.heartbeat_timeout)
    }
}

impl LaunchFlags {
    /// Whether any flag asks for a launcher.
    pub fn any(&self) -> bool {
        let r = &self.rdzv;
        r.nnodes.is_some() || self.nproc_per_node.is_some() || r.standalone || self.max_restarts > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_thirty_days_are_refused_before_they_overflow() {
        assert_eq!(seconds("2592000"), Ok(MAX_SECONDS));
        assert_eq!(seconds("0.5"), Ok(0.5));
        for bad in ["2592001", "1e19", "1e300"] {
            let err = seconds(bad).unwrap_err();
            assert!(err.contains("30 days"), "{bad}: {err}");
        }
        for bad in ["0", "-1", "inf", "NaN", "soon"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn torchruns_c10d_and_static_rendezvous_are_ours_and_etcd_is_refused_with_the_reason() {
        assert_eq!(rdzv_backend("c10d"), Ok(RdzvBackend::C10d));
        assert_eq!(rdzv_backend("static"), Ok(RdzvBackend::Static));
        for etcd in ["etcd", "etcd-v2"] {
            let err = rdzv_backend(etcd).unwrap_err();
            assert!(
                err.contains("no etcd client") && err.contains("--rdzv-backend c10d"),
                "{err}"
            );
        }
        let err = rdzv_backend("C10D").unwrap_err();
        assert!(
            err.contains("no rendezvous backend is called \"C10D\""),
            "{err}"
        );
    }

    #[test]
    fn nnodes_is_a_count_or_an_elastic_range_of_counts() {
        let count = |min, max| Ok(NodeCount { min, max });
        assert_eq!(node_count("2"), count(2, 2));
        assert_eq!(node_count("1:4"), count(1, 4));
        assert_eq!(node_count("3:3"), count(3, 3));
        assert!(!node_count("3:3").unwrap().is_elastic());
        assert_eq!(node_count("1:4").unwrap().to_string(), "1:4");
        let err = node_count("4:2").unwrap_err();
        assert!(err.contains("is more than the most"), "{err}");
        for bad in ["0", "0:2", "1:", ":2", "1:2:3", "1025", "two"] {
            assert!(node_count(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn heartbeat_timeouts_of_zero_or_past_a_day_are_refused() {
        assert_eq!(heartbeat_seconds("2"), Ok(2.0));
        assert_eq!(heartbeat_seconds("86400"), Ok(86400.0));
        for bad in ["0", "0.5", "-3", "86401", "1e30", "inf", "NaN", "soon"] {
            let err = heartbeat_seconds(bad).unwrap_err();
            assert!(err.contains("1 to 86400 seconds"), "{bad}: {err}");
        }
    }
}
