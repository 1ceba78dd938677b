//! Joining the job's TCP ring: how long a rank waits for its peers, and
//! the job's secret.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use comm::{
    AUTH_TOKEN_VAR, AuthToken, CommConfig, Communicator, LaunchEnv, LaunchSource, StoreHost,
    TcpCommunicator,
};
use launcher::contract::hostname;
use launcher::flags::seconds;

/// The flags of joining the job.
#[derive(Clone, Debug, Args)]
pub struct JoinFlags {
    /// Seconds a rank waits for its peers (rendezvous, each collective)
    /// before failing.
    #[arg(long, default_value_t = 30.0, value_name = "SECS", value_parser = seconds)]
    pub timeout: f64,

    /// Read the job's auth token (64 hex digits) from this file, which must
    /// be private to its owner (chmod 600); else TRAINER_AUTH_TOKEN. The
    /// built-in launcher and `cargo xtask slurm-submit` make one per job.
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,
}

impl JoinFlags {
    /// `--timeout`.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout)
    }
}

/// Joins the job's TCP ring as the rank `env` names.
pub(super) fn connect(flags: &JoinFlags, env: &LaunchEnv) -> anyhow::Result<TcpCommunicator> {
    let auth = AuthToken::resolve(flags.auth_token_file.as_deref())
        .with_context(|| format!("rank {}: reading the job's auth token", env.rank))?;
    let config = CommConfig::from_launch_env(env)
        .with_timeout(flags.timeout())
        .with_auth(auth);
    let at_agent = matches!(config.store, StoreHost::Agent { .. });
    if config.auth.is_none() && env.rank == 0 {
        let reach = if at_agent {
            "torchrun's store or the ranks' ports".to_string()
        } else {
            format!("port {}", env.master_port)
        };
        tell!(
            "warning: no auth token ({AUTH_TOKEN_VAR} or --auth-token-file): the rendezvous is \
             unauthenticated, and any process that reaches {reach} can join this job"
        );
    }
    let comm = TcpCommunicator::connect(&config).with_context(|| {
        format!(
            "rank {} joining the job at {}",
            env.rank,
            config.master_endpoint()
        )
    })?;
    let via = match env.source {
        LaunchSource::Torchrun if at_agent => "torchrun, at its agent's store",
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
