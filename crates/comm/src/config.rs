//! What a rank needs to know to join a job.

use std::time::Duration;

use crate::auth::AuthToken;
use crate::error::{CommError, Rejection};
use crate::launch_env::LaunchEnv;

/// The timeout the trainer uses by default for every blocking network step.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How two neighbouring ranks on the same machine connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SameHostTransport {
    /// A Unix domain socket (Linux): no TCP/IP processing per byte, which
    /// made 2-rank all-reduces of 1-64 MiB on a two-core VM some 10-25%
    /// faster than TCP over loopback. Used only where it works (same kernel
    /// and network namespace); otherwise TCP.
    #[default]
    UnixSocket,
    /// Always TCP, even on one machine (for comparisons and tests).
    Tcp,
}

/// Who hosts the job's rendezvous store at `MASTER_ADDR:MASTER_PORT`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreHost {
    /// Rank 0 hosts this crate's store, which every connection proves the
    /// job's token to (when the job has one).
    #[default]
    RankZero,
    /// A launcher hosts a c10d TCPStore there (torchrun's agent, with
    /// `TORCHELASTIC_USE_AGENT_STORE=True`): every rank is its client, keeps
    /// its keys under `prefix`, and the store itself is unauthenticated.
    Agent { prefix: String },
}

/// Identity of this rank and where the job's rendezvous store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    pub rank: usize,
    pub world_size: usize,
    /// Host name or address of rank 0, as every rank can resolve it.
    pub master_addr: String,
    /// Port of the rendezvous store.
    pub master_port: u16,
    /// Who hosts that store: rank 0, or the launcher.
    pub store: StoreHost,
    /// Upper bound for every blocking step: connecting, the whole
    /// rendezvous, and each read or write of a collective. A dead peer is
    /// usually reported much sooner, as soon as the OS sees the connection
    /// close.
    pub timeout: Duration,
    pub same_host: SameHostTransport,
    /// The job secret every store and ring connection must prove it holds;
    /// `None` runs the job unauthenticated (both ends must agree on that).
    pub auth: Option<AuthToken>,
}

impl CommConfig {
    /// A configuration with [`DEFAULT_TIMEOUT`].
    pub fn new(
        rank: usize,
        world_size: usize,
        master_addr: impl Into<String>,
        master_port: u16,
    ) -> Self {
        CommConfig {
            rank,
            world_size,
            master_addr: master_addr.into(),
            master_port,
            store: StoreHost::RankZero,
            timeout: DEFAULT_TIMEOUT,
            same_host: SameHostTransport::default(),
            auth: None,
        }
    }

    /// The configuration a launcher (torchrun or SLURM) described, at the
    /// store of torchrun's agent where it hosts one.
    pub fn from_launch_env(env: &LaunchEnv) -> Self {
        let store = match &env.agent {
            Some(agent) if agent.hosts_store => StoreHost::Agent {
                prefix: agent.key_prefix(),
            },
            _ => StoreHost::RankZero,
        };
        CommConfig::new(
            env.rank,
            env.world_size,
            env.master_addr.clone(),
            env.master_port,
        )
        .with_store(store)
    }

    /// Replaces who hosts the store.
    #[must_use]
    pub fn with_store(mut self, store: StoreHost) -> Self {
        self.store = store;
        self
    }

    /// Replaces the timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Replaces the transport between ranks on the same machine.
    #[must_use]
    pub fn with_same_host(mut self, same_host: SameHostTransport) -> Self {
        self.same_host = same_host;
        self
    }

    /// Sets the job secret (`None`: unauthenticated).
    #[must_use]
    pub fn with_auth(mut self, auth: Option<AuthToken>) -> Self {
        self.auth = auth;
        self
    }

    /// `host:port` of the store, for messages.
    pub fn master_endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }

    /// Rejects configurations that cannot describe a job, before any socket
    /// is opened.
    pub fn validate(&self) -> Result<(), CommError> {
        if self.world_size == 0 {
            return Err(CommError::InvalidConfig(
                "WORLD_SIZE=0: a job needs at least one rank".to_string(),
            ));
        }
        if self.rank >= self.world_size {
            return Err(Rejection::RankOutOfRange {
                rank: self.rank,
                world_size: self.world_size,
            }
            .into());
        }
        if self.world_size > 1 && self.master_addr.is_empty() {
            return Err(CommError::InvalidConfig("MASTER_ADDR is empty".to_string()));
        }
        if self.timeout.is_zero() {
            return Err(CommError::InvalidConfig(
                "the timeout must be longer than zero".to_string(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_size_zero_is_rejected() {
        let err = CommConfig::new(0, 0, "127.0.0.1", 1)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("WORLD_SIZE=0"), "{err}");
    }

    #[test]
    fn rank_at_or_above_world_size_is_rejected() {
        let err = CommConfig::new(2, 2, "127.0.0.1", 1)
            .validate()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("RANK=2 is out of range for WORLD_SIZE=2"),
            "{err}"
        );
    }

    #[test]
    fn zero_timeout_is_rejected() {
        let err = CommConfig::new(0, 2, "h", 1)
            .with_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("timeout"), "{err}");
    }

    #[test]
    fn last_rank_is_valid() {
        assert!(CommConfig::new(3, 4, "h", 1).validate().is_ok());
    }
}
