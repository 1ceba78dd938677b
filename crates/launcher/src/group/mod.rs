//! The launchers of a job of several machines, acting together through a
//! store of their own that node 0's launcher hosts at the rendezvous
//! endpoint: node 0 starts no worker before every node has joined, picks
//! the workers' store port for each attempt, the first launcher to see a
//! worker fail says so there, and every launcher stops its workers on it
//! (and restarts them, in the same attempt number, while restarts are
//! left). A launcher that leaves the store without saying its workers ended
//! (killed, its machine lost), or falls silent past `--heartbeat-timeout`
//! (stopped, or cut off by the network: see [`super::heartbeat`]), ends the
//! job on every node, its ranks cannot come back; but for an elastic job,
//! whose other machines restart without it while `--nnodes MIN` remain
//! ([`members`]).

use std::time::{Duration, Instant};

use std::net::{TcpListener, ToSocketAddrs};

use comm::{Auth, CommConfig, CommError, Store, StoreServer};

use crate::error::{Doing, LaunchError};
use crate::heartbeat::{self, Beater, Pulse, SharedStore};

mod flight;
mod members;
mod rendezvous;
mod watch;

pub use members::{LostMachine, Membership, Place};

use rendezvous::misfit;

/// How often a launcher looks for a failure on another node.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// How often node 0 looks for the other nodes while they join, and a
/// launcher for news while it waits for some.
const POLL: Duration = Duration::from_millis(50);

/// This launcher's seat in the group.
pub(super) struct NodeGroup {
    /// Its seat at the store: its node rank in a fixed job; in an elastic
    /// one its own across attempts, which number their machines afresh.
    pub node_rank: usize,
    /// The job's machines, those of the running attempt among them.
    members: Membership,
    /// Where node 0's store listens.
    master: Master,
    store: SharedStore,
    /// The other nodes' heartbeat (node 0 beats to no one).
    beater: Option<Beater>,
    /// Node 0's view of the other nodes' heartbeats.
    pulse: Pulse,
    /// Node 0 hosts the group's store; dropping it ends the group.
    server: Option<StoreServer>,
    last_look: Instant,
    /// A request's wait, and (twice) node 0's grace before a restart.
    timeout: Duration,
    /// How long the nodes may take to meet (`--rdzv-timeout`).
    rdzv_timeout: Duration,
    /// The store stopped answering (node 0's launcher is gone): this node
    /// goes on by itself, its workers noticing lost peers on their own.
    lost: bool,
    /// How long this launcher once went unanswered past the limit: it was
    /// stopped itself (or starved), and a node that left meanwhile most
    /// likely ended the job on its silence.
    away: Option<Duration>,
}

impl NodeGroup {
    /// Joins (node 0: hosts) the group at `master`, the nodes meeting
    /// within `rdzv_timeout`; launchers with another `--rdzv-id` are
    /// refused. Without a node rank: the launcher on the master's host that
    /// binds the port first is node 0, the others are numbered by arrival.
    /// With the job's `auth` token every launcher proves it holds it, as
    /// the ranks do; without one, a store other machines can reach is
    /// refused unless the user chose so (`--no-auth`). A request to the store waits up to
    /// `timeout`; a node silent for `heartbeat` (node 0: no beat; the
    /// others: node 0's store gives no answer) ends the job (an elastic
    /// job's other machines go on without it).
    pub fn join(
        node_rank: Option<usize>,
        members: Membership,
        master: &(String, u16),
        rdzv_id: &str,
        (timeout, rdzv_timeout, heartbeat): (Duration, Duration, Duration),
        auth: Auth,
    ) -> Result<NodeGroup, LaunchError> {
        let (addr, port) = master;
        let nnodes = members.seats;
        let config = CommConfig::new(0, nnodes, addr.clone(), *port)
            .with_timeout(timeout)
            .with_rdzv_timeout(rdzv_timeout)
            .with_auth(auth.clone());
        config
            .validate()
            .doing(|| format!("launcher (--nnodes {})", members.max))?;
        let hosting = node_rank.map_or_else(|| is_this_host(addr), |k| k == 0);
        let token = auth.token().cloned();
        let bind = || StoreServer::bind_with_auth(addr, *port, nnodes, timeout, token.clone());
        let server = match hosting.then(bind) {
            Some(Ok(server)) => Some(server),
            // Another launcher of this host came first.
            Some(Err(CommError::PortInUse { .. })) if node_rank.is_none() => None,
            Some(Err(e)) => {
                return Err(e)
                    .doing(|| format!("node 0 hosting the launchers' store on port {port}"));
            }
            None => None,
        };
        let joined = match (&server, node_rank) {
            (Some(_), _) => Store::connect(&config).map(|s| (s, 0)),
            (None, Some(k)) => Store::connect(&CommConfig { rank: k, ..config }).map(|s| (s, k)),
            (None, None) => Store::join(&config),
        };
        let who = node_rank.map_or("a launcher".to_string(), |k| format!("node {k}"));
        let (mut store, node_rank) = match joined {
            Err(CommError::Rejected(r)) => {
                refuse!(
                    Rendezvous,
                    "{who}: {}",
                    misfit(&r, &format!("{addr}:{port}"), &members)
                )
            }
            joined => joined.doing(|| format!("{who} joining the launchers at {addr}:{port}"))?,
        };
        if server.is_none() {
            // Node 0 stopped or cut off keeps the connection open, silent.
            store.set_reply_timeout(heartbeat);
        }
        let mut group = NodeGroup {
            node_rank,
            master: Master {
                addr: addr.clone(),
                port: *port,
                host: format!("at {addr}"),
            },
            store: SharedStore::new(store),
            beater: None,
            pulse: Pulse::new(members.seats, heartbeat),
            server,
            last_look: Instant::now(),
            timeout,
            rdzv_timeout,
            lost: false,
            away: None,
            members,
        };
        if node_rank == 0 {
            let host = crate::contract::hostname();
            group.store.set("host/0", host.as_bytes())?;
            group.store.set("rdzv_id", rdzv_id.as_bytes())?;
            // An elastic job's machines meet at each attempt.
            if !group.members.is_elastic() {
                group
                    .wait_for_nodes(rdzv_id, *port)
                    .map_err(|e| group.explain(e))?;
            }
        } else {
            group
                .show_up(rdzv_id, *port)
                .map_err(|e| group.explain(e))?;
            let every = heartbeat::interval(heartbeat);
            group.beater = Some(Beater::start(group.store.clone(), node_rank, every)?);
        }
        match group.members.is_elastic() {
            true => tell!(
                "launcher: seat {node_rank} of an elastic job of {}:{} machines, rendezvous at {addr}:{port}",
                group.members.min,
                group.members.max
            ),
            false => tell!("launcher: node {node_rank} of {nnodes}, rendezvous at {addr}:{port}"),
        }
        let why = match auth {
            Auth::Token(_) => None,
            Auth::Open => Some("--no-auth"),
            Auth::Missing => Some("no auth token (TRAINER_AUTH_TOKEN or --auth-token-file)"),
        };
        if let Some(why) = why
            && node_rank == 0
        {
            tell!(
                "warning: {why}: the launchers' rendezvous is unauthenticated, and any process that reaches port {port} of {addr} can join this job"
            );
        }
        Ok(group)
    }

    /// Where node `k` runs, as it said when it joined.
    fn host(&mut self, k: usize) -> String {
        match self.store.look(&format!("host/{k}")) {
            Ok(Some(host)) => format!("host {}", String::from_utf8_lossy(&host)),
            _ => "host unknown".to_string(),
        }
    }

    /// Tells every node that `what` failed in `attempt`, unless news from
    /// another node came first (waiting up to `wait` for it: a failure, a
    /// signal or a departed launcher there, the likelier cause; on node 0,
    /// longer while a node's heartbeat is late): then that news.
    /// A failure that is `final` (no restart can mend it) is marked so for
    /// the others.
    pub fn report_failure(
        &mut self,
        attempt: u32,
        (what, is_final): (&str, bool),
        wait: Duration,
    ) -> Option<Elsewhere> {
        let until = Instant::now() + wait;
        loop {
            if let Some(news) = self.news_now(attempt) {
                return Some(news);
            }
            // Node 0 waits on while a node's heartbeat is late: the failure
            // here is then likely its ranks' silence, and the node, once
            // past --heartbeat-timeout, the cause (however short --timeout).
            let now = Instant::now();
            let waiting = now < until || (!wait.is_zero() && self.pulse.late(now));
            if self.lost || !waiting {
                break;
            }
            std::thread::sleep(POLL);
        }
        if !self.lost {
            let key = |what: &str| format!("attempt/{attempt}/{what}");
            let told = (!is_final || self.store.set(&key("final"), b"").is_ok())
                && self.store.set(&key("failed"), what.as_bytes()).is_ok();
            self.lost = !told;
        }
        None
    }

    /// Tells every node that this one's launcher got `signal` in
    /// `attempt`, which they pass on to their own workers: the job stops as
    /// one, not as a failure the others would restart from. A store that
    /// fails it (node 0 gone or silent) is told: the workers' stop may
    /// wait on node 0's ranks.
    pub fn report_signal(&mut self, attempt: u32, signal: i32) {
        if !self.lost {
            let key = format!("attempt/{attempt}/signal");
            if let Err(e) = self.store.set(&key, &signal.to_be_bytes()) {
                self.lost = true;
                tell!("launcher: {}", self.master_lost(&e));
            }
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
    /// worker here just failed, whether another node's signal is why. The
    /// store lost (node 0's launcher gone) is news too, once.
    pub fn news_now(&mut self, attempt: u32) -> Option<Elsewhere> {
        if self.lost {
            return None;
        }
        match self.look(attempt) {
            Ok(news) => news,
            Err(e) => {
                self.lost = true;
                Some(Elsewhere::Departed(self.master_lost(&e)))
            }
        }
    }

    /// Notes how long the store has not answered, once past the limit.
    fn note_away(&mut self) {
        let unanswered = self.store.unanswered();
        if unanswered >= self.pulse.limit() {
            self.away = self.away.max(Some(unanswered));
        }
    }

    /// What a node other than 0 says when node 0's store failed it with `e`.
    fn master_lost(&mut self, e: &CommError) -> String {
        self.note_away();
        match (e, self.away) {
            (CommError::Rejected(r), _) => {
                let at = format!("{}:{}", self.master.addr, self.master.port);
                format!("node {}: {}", self.node_rank, misfit(r, &at, &self.members))
            }
            (CommError::StoreSilent { silent, .. }, _) => {
                heartbeat::silent_master(self.node_rank, &self.master.host, *silent)
            }
            (_, Some(away)) => {
                let left = format!("node 0's launcher ({}) left", self.master.host);
                heartbeat::was_away(self.node_rank, away, self.pulse.limit(), &left)
            }
            _ => format!(
                "node {}: node 0's launcher is gone (killed, or its machine lost?), and the job cannot go on without its ranks: {e}",
                self.node_rank
            ),
        }
    }

    /// One look at the store for news of `attempt`: a failure, a signal, or
    /// (node 0 looks: its store sees them) a node whose launcher left, or
    /// fell silent, before it said its workers ended.
    fn look(&mut self, attempt: u32) -> Result<Option<Elsewhere>, CommError> {
        self.note_away();
        let key = |what: &str| format!("attempt/{attempt}/{what}");
        let node = self.node_rank;
        let keys = [
            key("failed"),
            key("final"),
            key("signal"),
            heartbeat::verdict_key(attempt, node),
            members::vacated_key(attempt, node),
            members::END_KEY.to_string(),
        ];
        // One request: `final` and the verdict are set before the failure.
        let mut values = self.store.look_all(&keys)?.into_iter();
        let mut next = || values.next().flatten();
        let (failed, is_final, signal, own) = (next(), next().is_some(), next(), next());
        let (vacated, over) = (next().is_some(), next().is_some());
        if vacated {
            return Ok(Some(Elsewhere::Departed(format!(
                "node {node}: node 0 gave this machine up (its launcher fell silent past --heartbeat-timeout {:.1} s) and the live job's ranks went on without it: its ranks stop; keep every launcher running (a larger --heartbeat-timeout allows longer pauses)",
                self.pulse.limit().as_secs_f64()
            ))));
        }
        if let Some(cause) = failed {
            let cause = heartbeat::verdict(node, &cause, own, self.pulse.limit());
            let restartable = !is_final;
            return Ok(Some(Elsewhere::Failed { cause, restartable }));
        }
        if let Some(signal) = signal {
            return Ok(signal
                .try_into()
                .ok()
                .map(|s| Elsewhere::Signalled(i32::from_be_bytes(s))));
        }
        if self.server.is_none() {
            // A live job's rank 0 finished while ranks here still run: they
            // joined too late to train, or are finishing too.
            let late = over && self.members.goes_on_without_machines();
            return Ok(late.then_some(Elsewhere::Over));
        }
        match self.vanished(attempt)? {
            Some(news) => Ok(Some(news)),
            None => self.fill_vacancy(attempt).map(|()| None),
        }
    }
}

/// Where node 0's store listens, and where node 0 runs as it said (`host
/// NAME`), for the other nodes' messages.
struct Master {
    addr: String,
    port: u16,
    host: String,
}

/// What another node's launcher reported.
#[derive(Debug, PartialEq)]
pub enum Elsewhere {
    /// One of its workers failed (or node 0 saw a node's launcher go):
    /// this, the cause, and whether a restart may mend it.
    Failed { cause: String, restartable: bool },
    /// It got this signal, which goes on to every node's workers.
    Signalled(i32),
    /// A node's launcher is gone (this, the story): no restart can bring
    /// its ranks back.
    Departed(String),
    /// A node's launcher is gone (this, the story), and a live job's ranks
    /// go on without its ranks: nothing stops here.
    WentOnWithout(String),
    /// A live job's training ended on node 0: ranks here still running
    /// joined too late to train (or are about to end too).
    Over,
}

/// Whether `host` names an address of this machine (one it can bind).
fn is_this_host(host: &str) -> bool {
    (host, 0)
        .to_socket_addrs()
        .is_ok_and(|mut addrs| addrs.any(|a| TcpListener::bind(a).is_ok()))
}
