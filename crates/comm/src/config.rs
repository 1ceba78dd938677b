//! What a rank needs to know to join a job.

use std::net::IpAddr;
use std::time::Duration;

use crate::error::{CommError, Rejection};
use crate::job_auth::Auth;
use crate::launch_env::LaunchEnv;

/// The timeout the trainer uses by default for each collective and every
/// other blocking network step of a running job.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long joining a job may take by default: torchrun's rendezvous join
/// timeout. A node that boots slowly, a container pull or a cold kernel
/// cache delays a rank's arrival by minutes, not its collectives.
pub const DEFAULT_RDZV_TIMEOUT: Duration = Duration::from_secs(600);

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
    /// The trainer's own launcher (node 0's) hosts this crate's store there,
    /// as rank 0 would, the job's token included: the store outlives every
    /// rank (`TRAINER_STORE_HOST=launcher`).
    Launcher,
    /// A launcher hosts a c10d TCPStore there (torchrun's agent, with
    /// `TORCHELASTIC_USE_AGENT_STORE=True`): every rank is its client, keeps
    /// its keys under `prefix`, and the store itself is unauthenticated.
    Agent { prefix: String },
}

impl StoreHost {
    /// Whose store it is, for messages.
    pub fn owner(&self) -> &'static str {
        match self {
            StoreHost::RankZero => "rank 0's store",
            StoreHost::Launcher => "the launcher's store",
            StoreHost::Agent { .. } => "torchrun's store",
        }
    }
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
    /// Upper bound for each collective and every other blocking step of
    /// a running job (each read or write on the ring, each store request).
    /// A dead peer is usually reported much sooner, as soon as the OS sees
    /// the connection close.
    pub timeout: Duration,
    /// Upper bound for joining: reaching the store, every rank's arrival,
    /// forming the ring (and a sub-group's), a value awaited in the store.
    pub rdzv_timeout: Duration,
    pub same_host: SameHostTransport,
    /// The job secret every store and ring connection must prove it holds,
    /// or why none: unauthenticated (both ends must agree on that), which
    /// [`CommConfig::validate`] allows only on loopback or as the user's
    /// choice ([`Auth::Open`]).
    pub auth: Auth,
    /// Bytes per second each rank may write to its ring neighbour (a token
    /// bucket: a slow link simulated, for measurements); `None`: as fast
    /// as the connection goes.
    pub link_rate: Option<u64>,
}

impl CommConfig {
    /// A configuration with [`DEFAULT_TIMEOUT`] and [`DEFAULT_RDZV_TIMEOUT`],
    /// unauthenticated.
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
            rdzv_timeout: DEFAULT_RDZV_TIMEOUT,
            same_host: SameHostTransport::default(),
            auth: Auth::Missing,
            link_rate: None,
        }
    }

    /// The configuration a launcher (torchrun or SLURM) described, at the
    /// store of torchrun's agent where it hosts one.
    pub fn from_launch_env(env: &LaunchEnv) -> Self {
        let store = match &env.agent {
            Some(agent) if agent.hosts_store => StoreHost::Agent {
                prefix: agent.key_prefix(),
            },
            _ if env.launcher_store => StoreHost::Launcher,
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

    /// Replaces the collectives' timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Replaces the join timeout.
    #[must_use]
    pub fn with_rdzv_timeout(mut self, rdzv_timeout: Duration) -> Self {
        self.rdzv_timeout = rdzv_timeout;
        self
    }

    /// Replaces the transport between ranks on the same machine.
    #[must_use]
    pub fn with_same_host(mut self, same_host: SameHostTransport) -> Self {
        self.same_host = same_host;
        self
    }

    /// Sets the job secret, or why it has none.
    #[must_use]
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Caps what each rank sends to its ring neighbour at `bytes_per_second`
    /// (`None`: uncapped).
    #[must_use]
    pub fn with_link_rate(mut self, bytes_per_second: Option<u64>) -> Self {
        self.link_rate = bytes_per_second;
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
        if self.timeout.is_zero() || self.rdzv_timeout.is_zero() {
            return Err(CommError::InvalidConfig(
                "the timeouts must be longer than zero".to_string(),
            ));
        }
        let exposed = self.world_size > 1 && !is_loopback_host(&self.master_addr);
        if exposed && self.auth == Auth::Missing {
            return Err(CommError::TokenRequired {
                master: self.master_endpoint(),
            });
        }
        Ok(())
    }
}

/// Whether `host` names this machine's loopback interface and nothing
/// else: a loopback address (`127.0.0.1`, `::1`) or `localhost`. Only the
/// literal name counts: a host name that resolves to `127.0.1.1` on its own
/// machine (as Debian sets it up) may be another address elsewhere.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_matches(['[', ']']);
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical().is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AuthToken;

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
        let err = CommConfig::new(0, 2, "h", 1)
            .with_rdzv_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("timeout"), "{err}");
    }

    #[test]
    fn loopback_is_told_by_the_literal_address_or_localhost_only() {
        for host in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "[::1]",
            "::ffff:127.0.0.1",
            "LocalHost",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "0.0.0.0",
            "10.1.2.3",
            "::",
            "node01",
            "localhost.example.org",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_job_reachable_from_other_machines_needs_a_token_or_no_auth() {
        let exposed = CommConfig::new(1, 2, "node01", 29500);
        let err = exposed.validate().unwrap_err();
        let text = err.to_string();
        for named in [
            "node01:29500",
            "trainer token",
            "TRAINER_AUTH_TOKEN",
            "--no-auth",
        ] {
            assert!(text.contains(named), "{named}: {text}");
        }
        let token = AuthToken::generate().unwrap();
        assert!(
            exposed
                .clone()
                .with_auth(Auth::Token(token))
                .validate()
                .is_ok()
        );
        assert!(exposed.clone().with_auth(Auth::Open).validate().is_ok());
        // One machine's loopback, or a world of one, needs none.
        assert!(CommConfig::new(1, 2, "127.0.0.1", 1).validate().is_ok());
        assert!(CommConfig::new(0, 1, "node01", 1).validate().is_ok());
    }

    #[test]
    fn last_rank_is_valid() {
        assert!(CommConfig::new(3, 4, "127.0.0.1", 1).validate().is_ok());
    }
}
