//! Joining the job's TCP ring: how long a rank waits to join and for its
//! peers' collectives, and the job's secret.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use comm::{
    AUTH_TOKEN_VAR, Auth, AuthChoice, CommConfig, Communicator, LaunchEnv, LaunchSource, StoreHost,
    TcpCommunicator,
};
use launcher::contract::hostname;
use launcher::flags::{positive_finite, seconds};

use super::help_heading;

/// The flags of joining the job.
#[derive(Clone, Debug, Args)]
pub struct JoinFlags {
    /// Seconds a rank waits for its peers in each collective (and NCCL's).
    ///
    /// Then it fails, naming the collective.
    #[arg(long, help_heading = help_heading::COMMUNICATION, default_value_t = 30.0, value_name = "SECS", value_parser = seconds)]
    pub timeout: f64,

    /// Seconds joining the job may take (torchrun's join timeout).
    ///
    /// Every rank's (and, with several machines, every launcher's) arrival at
    /// the rendezvous. Slow boots, container pulls and cold caches delay a
    /// rank's arrival, not its collectives.
    #[arg(long, default_value_t = 600.0, value_name = "SECS", value_parser = seconds)]
    pub rdzv_timeout: f64,

    /// Read the job's auth token from this file.
    ///
    /// 64 hex digits, in a file that must be private to its owner (chmod 600;
    /// `trainer token FILE` writes one); else TRAINER_AUTH_TOKEN. The
    /// built-in launcher on one machine and `cargo xtask slurm-submit` make
    /// one per job.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,

    /// Run without an auth token (TRAINER_AUTH_TOKEN is ignored).
    ///
    /// Even where other machines can reach the rendezvous: any process that
    /// reaches its ports can join the job (see docs/security.md).
    #[arg(long, conflicts_with = "auth_token_file")]
    pub no_auth: bool,

    /// Cap what each rank sends on the host's ring, in megabits per second.
    ///
    /// To its neighbour on the TCP / Unix-socket ring (a token bucket in the
    /// sender): a slow network simulated on one machine, to measure what
    /// --comm-hook and --accumulate-steps save. Not for --spawn threads,
    /// whose ranks share memory.
    #[arg(long, help_heading = help_heading::COMMUNICATION, value_name = "MBPS", value_parser = positive_finite)]
    pub link_mbps: Option<f64>,

    /// What the job does when a rank is lost.
    ///
    /// `restart`: every rank stops, and the launcher restarts them all from
    /// the newest checkpoint (up to --max-restarts). `live`: the others go
    /// on at once without it, from the step they committed last, and the
    /// launcher starts a replacement that joins them (healed from their
    /// memory, counted against --max-restarts). Needs --reproducible and
    /// --global-batch, so that the result does not depend on how many
    /// ranks train it, and this binary's launcher, whose store outlives
    /// every rank.
    #[arg(long, value_enum, default_value_t = Recovery::Restart)]
    pub recovery: Recovery,

    /// With --recovery live: the fewest ranks the job trains on.
    ///
    /// A generation of fewer (ranks lost, their replacements not joined or
    /// none left) ends the job with an error, after its rank 0 saved the
    /// last committed step as a checkpoint (with --checkpoint-dir).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub min_world: u32,
}

/// What a job does when a rank is lost (`--recovery`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Recovery {
    /// Every rank stops; the launcher restarts all of them from the newest
    /// checkpoint (torchrun's way).
    #[default]
    Restart,
    /// The others go on without it, and a replacement joins them.
    Live,
}

impl JoinFlags {
    /// `--timeout`: each collective's.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout)
    }

    /// `--rdzv-timeout`: joining's.
    pub fn rdzv_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.rdzv_timeout)
    }

    /// Where the job's token comes from, as the two flags say.
    pub fn auth(&self) -> AuthChoice {
        AuthChoice::of_flags(self.auth_token_file.clone(), self.no_auth)
    }

    /// `--link-mbps` in bytes per second.
    pub fn link_rate(&self) -> Option<u64> {
        self.link_mbps.map(|mbps| (mbps * 1e6 / 8.0).ceil() as u64)
    }
}

/// How the rank `env` names joins the job, as `flags` say; refused (before
/// the rank loads anything) when other machines could reach the
/// rendezvous and the job has no token.
pub(super) fn config(flags: &JoinFlags, env: &LaunchEnv) -> anyhow::Result<CommConfig> {
    let auth = (flags.auth().resolve())
        .with_context(|| format!("rank {}: reading the job's auth token", env.rank))?;
    let config = CommConfig::from_launch_env(env)
        .with_timeout(flags.timeout())
        .with_rdzv_timeout(flags.rdzv_timeout())
        .with_auth(auth)
        .with_link_rate(flags.link_rate());
    config
        .validate()
        .with_context(|| format!("rank {}", env.rank))?;
    Ok(config)
}

/// Joins the job's TCP ring as the rank `env` names, with `config`; rank 0
/// of a job without a token says so, once.
pub(super) fn connect(config: &CommConfig, env: &LaunchEnv) -> anyhow::Result<TcpCommunicator> {
    let why = match config.auth {
        Auth::Token(_) => None,
        Auth::Open => Some("--no-auth".to_string()),
        Auth::Missing => Some(format!(
            "no auth token ({AUTH_TOKEN_VAR} or --auth-token-file)"
        )),
    };
    if let Some(why) = why
        && env.rank == 0
    {
        let reach = match config.store {
            StoreHost::Agent { .. } => "torchrun's store or the ranks' ports".to_string(),
            StoreHost::RankZero | StoreHost::Launcher => {
                format!("port {} of {}", env.master_port, env.master_addr)
            }
        };
        tell!(
            "warning: {why}: the rendezvous is unauthenticated, and any process that reaches \
             {reach} can join this job"
        );
    }
    let comm = TcpCommunicator::connect(config).with_context(|| {
        format!(
            "rank {} joining the job at {}",
            env.rank,
            config.master_endpoint()
        )
    })?;
    let via = match env.source {
        LaunchSource::Torchrun if matches!(config.store, StoreHost::Agent { .. }) => {
            "torchrun, at its agent's store"
        }
        LaunchSource::Torchrun => "torchrun-style environment",
        LaunchSource::Mpi => "mpirun",
        LaunchSource::Slurm => "slurm",
    };
    tell!(
        "rank {}/{} joined (host {}, master {}, via {via})",
        comm.rank(),
        comm.world_size(),
        hostname(),
        config.master_endpoint()
    );
    Ok(comm)
}
