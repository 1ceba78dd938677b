//! Error types. Every failure a user, a launcher or the network can cause is
//! one of these values: the messages name the rank, address and variable
//! involved so that a multi-node job that fails says *which* rank to look at.

use std::time::Duration;

/// Why the rendezvous store (rank 0) refused a rank. The store also remembers
/// the first refusal and hands it to every rank that asks afterwards, so a
/// misconfigured job fails on all ranks with the same message instead of the
/// healthy ranks waiting out their timeout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A rank was started with a different `WORLD_SIZE` than rank 0.
    #[error(
        "WORLD_SIZE mismatch: rank {rank} was started with WORLD_SIZE={rank_world_size} but rank 0 \
         (the rendezvous host) has WORLD_SIZE={master_world_size}; every rank must use the same WORLD_SIZE"
    )]
    WorldSizeMismatch {
        rank: usize,
        rank_world_size: usize,
        master_world_size: usize,
    },
    /// Two processes registered with the same rank.
    #[error(
        "duplicate rank: two processes registered as rank {rank}; every process needs a distinct RANK"
    )]
    DuplicateRank { rank: usize },
    /// A rank number outside `0..world_size`.
    #[error("RANK={rank} is out of range for WORLD_SIZE={world_size} (ranks are 0..{world_size})")]
    RankOutOfRange { rank: usize, world_size: usize },
    /// A rank gave up waiting for these ranks; the rendezvous is over.
    #[error(
        "the rendezvous failed: rank(s) {} of {world_size} did not arrive in time",
        rank_list(.missing)
    )]
    RanksMissing {
        missing: Vec<usize>,
        world_size: usize,
    },
}

/// Errors of the `comm` crate.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The configuration cannot describe a job (e.g. `WORLD_SIZE=0`).
    #[error("invalid communicator configuration: {0}")]
    InvalidConfig(String),

    /// A collective was called with arguments that cannot work on this
    /// communicator (e.g. a broadcast root outside the world).
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    /// Rank 0 could not host the store because the port is taken.
    #[error(
        "MASTER_PORT {port} on {addr} is already in use (another job, or another process started as \
         rank 0?); pick another with MASTER_PORT=..."
    )]
    PortInUse { addr: String, port: u16 },

    /// The store or a rank refused this rank; see [`Rejection`].
    #[error(transparent)]
    Rejected(#[from] Rejection),

    /// Not all ranks arrived before the join timeout.
    #[error(
        "rendezvous at {master} timed out after {timeout:?} (the join timeout, --rdzv-timeout): rank(s) {} of {world_size} never arrived ({detail})",
        rank_list(.missing)
    )]
    RendezvousTimeout {
        master: String,
        timeout: Duration,
        missing: Vec<usize>,
        world_size: usize,
        detail: String,
    },

    /// A job whose membership changes lost every member that held its
    /// state: no generation can form to go on from.
    #[error(
        "the job at {master} lost every rank that held its state: nothing is left to heal a newcomer from (the launcher restarts the job from its newest checkpoint, if --max-restarts allows)"
    )]
    JobLost { master: String },

    /// A blocking store `get` did not see its key within the join timeout.
    #[error(
        "timed out after {timeout:?} (the join timeout, --rdzv-timeout) waiting for key {key:?} in the rendezvous store at {master}"
    )]
    StoreTimeout {
        master: String,
        key: String,
        timeout: Duration,
    },

    /// Other machines could reach the store, and the job has no token.
    #[error(
        "the rendezvous at {master} is open to other machines and this job has no auth token, so any process that reaches it could join the job; give every rank the same token: `trainer token FILE` writes one (then --auth-token-file FILE), `cargo xtask slurm-submit` makes one per job, or set TRAINER_AUTH_TOKEN to 64 hex digits; --no-auth runs without one (see docs/security.md)"
    )]
    TokenRequired { master: String },

    /// The job token could not be read or generated.
    #[error(transparent)]
    AuthToken(#[from] crate::auth::AuthTokenError),

    /// The opening handshake with `peer` failed: the other side does not
    /// hold this job's token (or holds one where this side has none), does
    /// not speak the job's protocol, or says nothing.
    #[error("the handshake with {peer} failed: {failure}")]
    Auth {
        peer: String,
        failure: crate::auth::AuthFailure,
    },

    /// The store connection failed or carried something that is not the
    /// store protocol.
    #[error("rendezvous store at {master}: {detail}")]
    Store { master: String, detail: String },

    /// The store took a request and gave no answer for `silent` past its
    /// own wait, its connection still open: its host is stopped (SIGSTOP,
    /// a debugger, a suspended VM) or cut off by the network.
    #[error(
        "rendezvous store at {master} stopped answering: nothing for {silent:?} (its process stopped, e.g. by SIGSTOP or a debugger, or its machine suspended or cut off by the network?)"
    )]
    StoreSilent { master: String, silent: Duration },

    /// A neighbour closed or reset its connection: it crashed, was killed, or
    /// gave up after its own error.
    #[error("lost connection to rank {peer} ({addr}) during {op}: {detail}")]
    PeerLost {
        peer: usize,
        addr: String,
        op: &'static str,
        detail: String,
    },

    /// A neighbour stayed silent (or did not drain its socket) for the whole
    /// timeout: it hangs, or it is not calling the same collective.
    #[error(
        "timed out after {timeout:?} (the collective timeout, --timeout) waiting for rank {peer} ({addr}) during {op}"
    )]
    PeerTimeout {
        peer: usize,
        addr: String,
        op: &'static str,
        timeout: Duration,
    },

    /// Neighbouring ranks called different collectives (or the same one with
    /// different lengths); the programs have diverged.
    #[error(
        "collective mismatch with rank {peer}: this rank called {ours} but rank {peer} called {theirs}"
    )]
    CollectiveMismatch {
        peer: usize,
        ours: String,
        theirs: String,
    },

    /// An earlier error left the ring in an unknown state; the communicator
    /// refuses further collectives rather than exchanging garbage.
    #[error("communicator unusable after an earlier failure: {0}")]
    Broken(String),

    /// `libnccl.so` could not be loaded; the search report says where NCCL
    /// was looked for, what was found and how to make it loadable.
    #[error("{0}")]
    NcclMissing(crate::nccl_library::NcclSearch),

    /// An NCCL call or collective failed; `code` and `detail` are NCCL's
    /// own words (`ncclGetErrorString`, `ncclGetLastError`).
    #[error("rank {rank}: NCCL {op} failed: {code}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    Nccl {
        rank: usize,
        op: String,
        code: String,
        detail: String,
    },

    /// An NCCL call or collective failed because a peer did
    /// (`ncclRemoteError`: its process exited, it aborted, or the network to
    /// it broke); the communicator was aborted. A live job's members form
    /// a new generation on it.
    #[error("rank {rank}: NCCL {op} failed: {code} (a peer failed or left the job{})", if detail.is_empty() { String::new() } else { format!("; {detail}") })]
    NcclPeerLost {
        rank: usize,
        op: String,
        code: String,
        detail: String,
    },

    /// An NCCL collective did not complete in time; the communicator was
    /// aborted.
    #[error(
        "rank {rank}: NCCL {op} did not complete within {timeout:?} (the collective timeout, \
         --timeout: a peer died, hangs, or called another collective); the communicator was aborted"
    )]
    NcclTimeout {
        rank: usize,
        op: String,
        timeout: Duration,
    },

    /// A CUDA call around the NCCL collectives (streams, events) failed.
    #[error("rank {rank}: CUDA error during NCCL {op}: {detail}")]
    Cuda {
        rank: usize,
        op: String,
        detail: String,
    },

    /// Local socket setup failed (e.g. no free port for the data listener).
    /// The message is `context` alone: the operating system's error is the
    /// [`source`](std::error::Error::source), which `anyhow`'s `{:#}` (how
    /// the trainer prints errors) appends after a colon.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl CommError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source,
        }
    }

    /// Rank 0 could not listen on `port` for the store (`master_addr` is
    /// what the ranks were told to connect to).
    pub(crate) fn store_bind(master_addr: &str, port: u16, source: std::io::Error) -> Self {
        match source.kind() {
            std::io::ErrorKind::AddrInUse => CommError::PortInUse {
                addr: master_addr.to_string(),
                port,
            },
            std::io::ErrorKind::PermissionDenied if (1..1024).contains(&port) => CommError::io(
                format!(
                    "rank 0 could not host the rendezvous store on port {port}, a privileged \
                     port (below 1024); pick a port from 1024 up with MASTER_PORT=..."
                ),
                source,
            ),
            _ => CommError::io(
                format!("rank 0 could not host the rendezvous store on port {port}"),
                source,
            ),
        }
    }
}

/// Ranks for a message: all of them up to [`LISTED_RANKS`], else the first
/// ones and a count (a rendezvous of 100,000 missing ranks printed them all).
fn rank_list(ranks: &[usize]) -> String {
    if ranks.len() <= LISTED_RANKS {
        return format!("{ranks:?}");
    }
    let first: Vec<String> = ranks[..LISTED_RANKS].iter().map(usize::to_string).collect();
    format!("[{}, … {} in all]", first.join(", "), ranks.len())
}

/// How many ranks a message lists before it counts the rest.
const LISTED_RANKS: usize = 16;

#[cfg(test)]
mod tests {
    use super::CommError;
    use std::io;

    /// `err` as the trainer prints it: its message and causes, `{:#}`.
    fn chain(err: impl std::error::Error + Send + Sync + 'static) -> String {
        format!("{:#}", anyhow::Error::new(err))
    }

    #[test]
    fn an_io_error_states_the_os_error_once() {
        let denied = || io::Error::from_raw_os_error(13);
        let err = CommError::store_bind("node0", 80, denied());
        let text = chain(err);
        assert_eq!(text.matches(&denied().to_string()).count(), 1, "{text}");
        assert!(
            text.starts_with("rank 0 could not host the rendezvous store on port 80, a privileged"),
            "{text}"
        );
        assert!(
            text.ends_with(&format!("MASTER_PORT=...: {}", denied())),
            "{text}"
        );
        let err = CommError::io("binding the data listener", denied());
        assert_eq!(
            chain(err),
            format!("binding the data listener: {}", denied())
        );
    }

    #[test]
    fn long_lists_of_missing_ranks_are_cut_short() {
        assert_eq!(super::rank_list(&[1, 3]), "[1, 3]");
        let many: Vec<usize> = (1..100_000).collect();
        let text = super::Rejection::RanksMissing {
            missing: many,
            world_size: 100_000,
        }
        .to_string();
        assert!(
            text.contains(
                "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, … 99999 in all]"
            ),
            "{text}"
        );
        assert!(text.len() < 200, "{text}");
    }

    #[test]
    fn a_taken_store_port_is_port_in_use() {
        let taken = io::Error::from(io::ErrorKind::AddrInUse);
        assert!(matches!(
            CommError::store_bind("node0", 29500, taken),
            CommError::PortInUse { port: 29500, .. }
        ));
    }
}
