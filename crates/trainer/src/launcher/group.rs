//! The launchers of a job of several machines, acting together through a
//! store of their own that node 0's launcher hosts at the rendezvous
//! endpoint: node 0 picks the workers' store port for each attempt, the
//! first launcher to see a worker fail says so there, and every launcher
//! stops its workers on it (and restarts them, in the same attempt number,
//! while restarts are left).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use std::net::{TcpListener, ToSocketAddrs};

use comm::{AuthToken, CommConfig, CommError, Store, StoreServer};

/// How often a launcher looks for a failure on another node.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// This launcher's seat in the group.
pub(super) struct NodeGroup {
    pub node_rank: usize,
    nnodes: usize,
    master_addr: String,
    store: Store,
    /// Node 0 hosts the group's store; dropping it ends the group.
    server: Option<StoreServer>,
    last_look: Instant,
    timeout: Duration,
    /// The store stopped answering (node 0's launcher is gone): this node
    /// goes on by itself, its workers noticing lost peers on their own.
    lost: bool,
}

impl NodeGroup {
    /// Joins (node 0: hosts) the group at `master`, waiting up to `timeout`
    /// for node 0; launchers with another `--rdzv-id` are refused. Without
    /// a node rank: the launcher on the master's host that binds the port
    /// first is node 0, the others are numbered by arrival. With the job's
    /// `auth` token every launcher proves it holds it, as the ranks do.
    pub fn join(
        node_rank: Option<usize>,
        nnodes: usize,
        master: &(String, u16),
        rdzv_id: &str,
        timeout: Duration,
        auth: Option<AuthToken>,
    ) -> anyhow::Result<NodeGroup> {
        let (addr, port) = master;
        let hosting = node_rank.map_or_else(|| is_this_host(addr), |k| k == 0);
        let bind = || StoreServer::bind_with_auth(addr, *port, nnodes, timeout, auth.clone());
        let server = match hosting.then(bind) {
            Some(Ok(server)) => Some(server),
            // Another launcher of this host came first.
            Some(Err(CommError::PortInUse { .. })) if node_rank.is_none() => None,
            Some(Err(e)) => {
                return Err(e).with_context(|| {
                    format!("node 0 hosting the launchers' store on port {port}")
                });
            }
            None => None,
        };
        let config = CommConfig::new(0, nnodes, addr.clone(), *port)
            .with_timeout(timeout)
            .with_auth(auth);
        let joined = match (&server, node_rank) {
            (Some(_), _) => Store::connect(&config).map(|s| (s, 0)),
            (None, Some(k)) => Store::connect(&CommConfig { rank: k, ..config }).map(|s| (s, k)),
            (None, None) => Store::join(&config),
        };
        let (mut store, node_rank) = joined.with_context(|| {
            let who = node_rank.map_or("a launcher".to_string(), |k| format!("node {k}"));
            format!("{who} joining the launchers at {addr}:{port}")
        })?;
        if node_rank == 0 {
            store.set("rdzv_id", rdzv_id.as_bytes())?;
        } else {
            let theirs = store.get("rdzv_id")?;
            if theirs != rdzv_id.as_bytes() {
                bail!(
                    "node {node_rank}: --rdzv-id {rdzv_id:?} is not node 0's {:?}: another job holds {addr}:{port}",
                    String::from_utf8_lossy(&theirs)
                );
            }
        }
        tell!("launcher: node {node_rank} of {nnodes}, rendezvous at {addr}:{port}");
        Ok(NodeGroup {
            node_rank,
            nnodes,
            master_addr: addr.clone(),
            store,
            server,
            last_look: Instant::now(),
            timeout,
            lost: false,
        })
    }

    /// Where the workers of `attempt` meet: node 0 finds a free port on its
    /// host, the others wait for it.
    pub fn worker_master(&mut self, attempt: u32) -> anyhow::Result<(String, u16)> {
        let key = format!("attempt/{attempt}/port");
        let port = if self.server.is_some() {
            let port = super::free_port()?;
            self.store.set(&key, &port.to_be_bytes())?;
            port
        } else {
            // Node 0 may still be giving its workers their grace.
            let patience = self.timeout * 2 + Duration::from_secs(30);
            let bytes = self.store.wait_for(&key, patience)?.with_context(|| {
                format!(
                    "node {}: node 0 did not start attempt {attempt} within {patience:?}",
                    self.node_rank
                )
            })?;
            u16::from_be_bytes(
                bytes
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("a malformed port"))?,
            )
        };
        Ok((self.master_addr.clone(), port))
    }

    /// Tells every node that `what` failed in `attempt`, unless another
    /// node reported a failure first (waiting up to `wait` for one): then
    /// that report, the cause.
    pub fn report_failure(&mut self, attempt: u32, what: &str, wait: Duration) -> Option<String> {
        if self.lost {
            return None;
        }
        let key = format!("attempt/{attempt}/failed");
        match self.store.wait_for(&key, wait) {
            Ok(Some(cause)) => Some(String::from_utf8_lossy(&cause).into_owned()),
            Ok(None) => {
                self.lost = self.store.set(&key, what.as_bytes()).is_err();
                None
            }
            Err(_) => {
                self.lost = true;
                None
            }
        }
    }

    /// Tells every node that this one's launcher got `signal` in
    /// `attempt`, which they pass on to their own workers: the job stops as
    /// one, not as a failure the others would restart from.
    pub fn report_signal(&mut self, attempt: u32, signal: i32) {
        if !self.lost {
            let key = format!("attempt/{attempt}/signal");
            self.lost = self.store.set(&key, &signal.to_be_bytes()).is_err();
        }
    }

    /// A failure or a signal another node reported in `attempt`, looked for
    /// at most every [`LOOK_EVERY`].
    pub fn news_elsewhere(&mut self, attempt: u32) -> Option<Elsewhere> {
        if self.last_look.elapsed() < LOOK_EVERY {
            return None;
        }
        self.last_look = Instant::now();
        self.news_now(attempt)
    }

    /// [`NodeGroup::news_elsewhere`] without the wait between looks: when a
    /// worker here just failed, whether another node's signal is why.
    pub fn news_now(&mut self, attempt: u32) -> Option<Elsewhere> {
        if self.lost {
            return None;
        }
        let mut look = |what: &str| {
            let key = format!("attempt/{attempt}/{what}");
            self.store.wait_for(&key, Duration::ZERO)
        };
        let found = look("failed").and_then(|failed| Ok((failed, look("signal")?)));
        match found {
            Ok((Some(cause), _)) => Some(Elsewhere::Failed(
                String::from_utf8_lossy(&cause).into_owned(),
            )),
            Ok((None, Some(signal))) => {
                let signal = signal.try_into().ok().map(i32::from_be_bytes)?;
                Some(Elsewhere::Signalled(signal))
            }
            Ok((None, None)) => None,
            Err(e) => {
                tell!(
                    "launcher: node {}: lost the launchers' store ({e}); going on alone",
                    self.node_rank
                );
                self.lost = true;
                None
            }
        }
    }

    /// Says this node's workers ended in `attempt`; node 0 then waits (up to
    /// `wait`) for the others, so that its store outlives their last look.
    pub fn finish(&mut self, attempt: u32, wait: Duration) {
        if self.lost {
            return;
        }
        let _ = self
            .store
            .set(&format!("attempt/{attempt}/ended/{}", self.node_rank), b"");
        if self.server.is_some() {
            for node in 1..self.nnodes {
                let key = format!("attempt/{attempt}/ended/{node}");
                if !matches!(self.store.wait_for(&key, wait), Ok(Some(_))) {
                    tell!("launcher: node {node} did not say it ended within {wait:?}");
                }
            }
        }
    }
}

/// What another node's launcher reported.
#[derive(Debug, PartialEq)]
pub enum Elsewhere {
    /// One of its workers failed: this, the cause.
    Failed(String),
    /// It got this signal, which goes on to every node's workers.
    Signalled(i32),
}

/// Whether `host` names an address of this machine (one it can bind).
fn is_this_host(host: &str) -> bool {
    (host, 0)
        .to_socket_addrs()
        .is_ok_and(|mut addrs| addrs.any(|a| TcpListener::bind(a).is_ok()))
}
