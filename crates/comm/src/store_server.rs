//! The rendezvous key-value store that rank 0 hosts.
//!
//! One thread accepts connections and one thread serves each connected rank
//! (a job has few ranks, and a rank keeps its connection for its whole life).
//! Besides `set`/`get`, the store checks that every rank agrees with rank 0
//! on the world size and that no rank registers twice. The first such
//! problem poisons the store: every later request, including `get`s already
//! waiting, is answered with that rejection, so all ranks fail at once with
//! the message that explains the misconfiguration. Once every rank has
//! registered, a newcomer is a stranger (another job on this port, a
//! launcher started twice): it alone is refused, and the job goes on.
//! In a job whose membership changes ([`Seats::Freed`]) a member that left
//! frees its rank for a newcomer (a replacement the launcher started), and
//! the job forms its generations here (`generations.rs`).

mod generations;

use std::collections::HashMap;
use std::io::{self, ErrorKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{AuthToken, HANDSHAKE_TIMEOUT, Role, handshake};
use crate::config::is_loopback_host;
use crate::deadline::Deadline;
use crate::error::{CommError, Rejection};
use crate::store_protocol::{MAX_FRAME, Request, Response, read_frame, write_frame};
use generations::{Generations, Verdict};
pub(crate) use generations::{OVER_KEY, WAITING_KEY};

/// A running store. Dropping it stops the accept thread, disconnects all
/// clients and joins their threads.
#[derive(Debug)]
pub struct StoreServer {
    port: u16,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

/// What becomes of a member's rank when its connection closes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Seats {
    /// It stays taken: a newcomer with that rank is a stranger (a job whose
    /// every member must stay, and a launchers' store, whose seats number
    /// machines for good).
    #[default]
    Kept,
    /// It is free for a newcomer: the replacement of a lost member of a
    /// job whose membership changes (`--recovery live`).
    Freed,
}

#[derive(Debug)]
struct Shared {
    world_size: usize,
    seats: Seats,
    /// Bound on every write, on a client's hello, and on each frame once it
    /// has begun (see [`read_request`]).
    io_timeout: Duration,
    auth: Option<AuthToken>,
    stop: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    values: HashMap<String, Vec<u8>>,
    /// Ranks whose member is connected now.
    registered: Vec<bool>,
    /// Whether every rank has registered once: from then on a newcomer
    /// that cannot register is refused alone.
    complete: bool,
    generations: Generations,
    rejection: Option<Rejection>,
    /// Clones of the sockets of the clients still connected, by connection
    /// number, to shut them down on drop. A handler removes its own when its
    /// client leaves, so the socket closes then (a dropped stranger sees
    /// the connection end, and its descriptor is not held until the job
    /// ends). Dropping a poisoned store waits (briefly) for the clients to
    /// leave, so that every rank hears why the job failed rather than just
    /// that rank 0 went away.
    connections: HashMap<u64, TcpStream>,
    handlers: Vec<JoinHandle<()>>,
}

impl Shared {
    /// The state stays consistent even if a handler thread panicked while
    /// holding the lock (every update is a single insert), so poisoning is
    /// ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reject(&self, state: &mut State, rejection: Rejection) -> Response {
        let first = state.rejection.get_or_insert(rejection).clone();
        self.changed.notify_all();
        Response::Rejected(first)
    }

    /// Refuses a newcomer that cannot register: while the rendezvous is
    /// under way, for everyone ([`Shared::reject`]); once every rank has
    /// registered, for the newcomer alone, so that a stranger does not end
    /// a job that runs.
    fn refuse(&self, state: &mut State, rejection: Rejection) -> Response {
        if state.complete {
            return Response::Rejected(rejection);
        }
        self.reject(state, rejection)
    }

    fn hello(&self, rank: usize, world_size: usize) -> Response {
        let mut state = self.lock();
        if let Some(r) = &state.rejection {
            return Response::Rejected(r.clone());
        }
        if world_size != self.world_size {
            let rejection = Rejection::WorldSizeMismatch {
                rank,
                rank_world_size: world_size,
                master_world_size: self.world_size,
            };
            return self.refuse(&mut state, rejection);
        }
        if rank >= self.world_size {
            let rejection = Rejection::RankOutOfRange {
                rank,
                world_size: self.world_size,
            };
            return self.refuse(&mut state, rejection);
        }
        if state.registered[rank] {
            return self.refuse(&mut state, Rejection::DuplicateRank { rank });
        }
        state.registered[rank] = true;
        state.complete |= state.registered.iter().all(|&r| r);
        Response::Ok
    }

    /// Registers the lowest free rank above 0 (rank 0 is the host's).
    fn join(&self, world_size: usize) -> Response {
        let mut state = self.lock();
        if let Some(r) = &state.rejection {
            return Response::Rejected(r.clone());
        }
        let free = (1..self.world_size).find(|&rank| !state.registered[rank]);
        if world_size != self.world_size {
            let rejection = Rejection::WorldSizeMismatch {
                rank: free.unwrap_or(self.world_size),
                rank_world_size: world_size,
                master_world_size: self.world_size,
            };
            return self.refuse(&mut state, rejection);
        }
        match free {
            Some(rank) => {
                state.registered[rank] = true;
                state.complete |= state.registered.iter().all(|&r| r);
                Response::Value((rank as u64).to_le_bytes().to_vec())
            }
            None => {
                let rejection = Rejection::RankOutOfRange {
                    rank: self.world_size,
                    world_size: self.world_size,
                };
                self.refuse(&mut state, rejection)
            }
        }
    }

    fn set(&self, key: String, value: Vec<u8>) -> Response {
        let mut state = self.lock();
        if let Some(r) = &state.rejection {
            return Response::Rejected(r.clone());
        }
        state.values.insert(key, value);
        self.changed.notify_all();
        Response::Ok
    }

    fn poison(&self, rejection: Rejection) -> Response {
        let mut state = self.lock();
        self.reject(&mut state, rejection);
        Response::Ok
    }

    fn client_left(&self, connection: u64) {
        self.lock().connections.remove(&connection);
        self.changed.notify_all();
    }

    /// The member registered as `rank` left: others may need to know (a
    /// launcher killed with its machine's ranks), and with [`Seats::Freed`]
    /// its rank is free.
    fn member_left(&self, rank: usize) {
        let mut state = self.lock();
        state.values.insert(departed_key(rank), Vec::new());
        if self.seats == Seats::Freed {
            state.registered[rank] = false;
            state.generations.left(rank);
            state.publish_waiting();
        }
        self.changed.notify_all();
    }

    /// `slot` enlists for the next generation and waits up to `wait` for
    /// it to form (see `generations.rs`).
    fn enlist(
        &self,
        slot: usize,
        (step, suspect): (Option<u64>, Option<usize>),
        wait: Duration,
    ) -> Response {
        let deadline = Instant::now().checked_add(wait);
        let mut state = self.lock();
        let number = match state.generations.enlist(slot, step, suspect) {
            Ok(number) => number,
            Err(verdict) => return verdict.into(),
        };
        state.publish_waiting();
        self.changed.notify_all();
        loop {
            if let Some(r) = &state.rejection {
                return Response::Rejected(r.clone());
            }
            if state.values.contains_key(OVER_KEY) {
                state.generations.withdraw(slot);
                return Response::JobOver;
            }
            if let Some(verdict) = state.generations.verdict(number, slot) {
                return verdict.into();
            }
            let connected = state.connected_slots();
            let limits = (self.world_size, self.io_timeout);
            match state.generations.try_form(&connected, limits) {
                Some(Verdict::Lost) => return Response::Lost,
                Some(_) => {
                    state.publish_waiting();
                    self.changed.notify_all();
                    continue;
                }
                None => {}
            }
            let left = deadline.map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() || self.stop.load(Ordering::SeqCst) {
                state.generations.withdraw(slot);
                state.publish_waiting();
                return Response::NotFound;
            }
            // The grace and the timeout pass without news: look again.
            state = self
                .changed
                .wait_timeout(state, left.min(FORMING_POLL))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn get(&self, key: &str, wait: Duration) -> Response {
        let deadline = Instant::now().checked_add(wait);
        let mut state = self.lock();
        loop {
            if let Some(r) = &state.rejection {
                return Response::Rejected(r.clone());
            }
            if let Some(v) = state.values.get(key) {
                return Response::Value(v.clone());
            }
            if self.stop.load(Ordering::SeqCst) {
                return Response::NotFound;
            }
            // `None` means a wait too long to represent: wait in slices.
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Response::NotFound;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The values of `keys` as they stand now, read under one lock: a
    /// member that sets one key and then another is never seen with the
    /// second and not the first. `None` when the answer could not travel
    /// (over [`MAX_FRAME`]), measured before anything is copied, so that a
    /// look naming one large value many times costs nothing.
    fn look(&self, keys: &[String]) -> Option<Response> {
        let state = self.lock();
        if let Some(r) = &state.rejection {
            return Some(Response::Rejected(r.clone()));
        }
        let found: Vec<Option<&Vec<u8>>> = keys.iter().map(|k| state.values.get(k)).collect();
        // The tag and count, then a mark and a length before each value.
        let size = found
            .iter()
            .flatten()
            .fold(9 + keys.len(), |size, v| size.saturating_add(4 + v.len()));
        (size <= MAX_FRAME)
            .then(|| Response::Values(found.into_iter().map(|v| v.cloned()).collect()))
    }
}

impl StoreServer {
    /// Starts a store for a job of `world_size` ranks on `port` of every
    /// interface (IPv6 as well when `master_addr` is an IPv6 literal), or
    /// of loopback alone when `master_addr` names it (`127.0.0.1`, `::1`,
    /// `localhost`: a job of one machine, which no other can reach).
    /// The store is unauthenticated: its clients must hold no token.
    pub fn bind(
        master_addr: &str,
        port: u16,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        StoreServer::bind_with_auth(master_addr, port, world_size, timeout, None)
    }

    /// [`StoreServer::bind`] for a job with secret `auth`: a client that
    /// cannot prove it holds the same token (or holds one where `auth` is
    /// `None`) is disconnected at the handshake, and the store goes on
    /// serving the others.
    pub fn bind_with_auth(
        master_addr: &str,
        port: u16,
        world_size: usize,
        timeout: Duration,
        auth: Option<AuthToken>,
    ) -> Result<Self, CommError> {
        let job = (world_size, timeout, auth);
        StoreServer::bind_for_job(master_addr, port, job, Seats::Kept)
    }

    /// [`StoreServer::bind_with_auth`] for a job of `world_size` ranks,
    /// collectives bounded by `timeout`, whose ranks' `seats` are freed
    /// when they leave, or not.
    pub fn bind_for_job(
        master_addr: &str,
        port: u16,
        (world_size, timeout, auth): (usize, Duration, Option<AuthToken>),
        seats: Seats,
    ) -> Result<Self, CommError> {
        let host = master_addr.trim_matches(['[', ']']);
        let interfaces = if is_loopback_host(host) {
            host
        } else if host.parse::<Ipv6Addr>().is_ok() {
            "::"
        } else {
            "0.0.0.0"
        };
        let listener = TcpListener::bind((interfaces, port))
            .map_err(|e| CommError::store_bind(master_addr, port, e))?;
        let port = listener
            .local_addr()
            .map_err(|e| CommError::io("reading the store's port", e))?
            .port();
        let shared = Arc::new(Shared {
            world_size,
            seats,
            io_timeout: timeout,
            auth,
            stop: AtomicBool::new(false),
            state: Mutex::new(State {
                registered: vec![false; world_size],
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = std::thread::Builder::new()
            .name("comm-store-accept".into())
            .spawn(move || accept_loop(&listener, &accept_shared))
            .map_err(|e| CommError::io("starting the store thread", e))?;
        Ok(StoreServer {
            port,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The port the store listens on (useful when bound to port 0).
    pub fn port(&self) -> u16 {
        self.port
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut next_connection = 0_u64;
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        // A failed accept (e.g. out of file descriptors) loses that one
        // client, which then times out with a clear error; the store itself
        // keeps serving the others.
        let Ok(stream) = conn else { continue };
        let Ok(control) = stream.try_clone() else {
            continue;
        };
        let connection = next_connection;
        next_connection += 1;
        {
            let mut state = shared.lock();
            state.connections.insert(connection, control);
            // Threads of clients that left have nothing left to join for.
            state.handlers.retain(|handler| !handler.is_finished());
        }
        let handler_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("comm-store-client".into())
            .spawn(move || {
                serve(stream, &handler_shared);
                handler_shared.client_left(connection);
            });
        match spawned {
            Ok(handle) => shared.lock().handlers.push(handle),
            Err(_) => shared.client_left(connection),
        }
    }
}

/// How often a member waiting for its generation looks at the clock.
const FORMING_POLL: Duration = Duration::from_millis(50);

impl From<Verdict> for Response {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Formed { number, members } => Response::Generation { number, members },
            Verdict::Evicted { generation } => Response::Evicted { generation },
            Verdict::Lost => Response::Lost,
        }
    }
}

/// Serves one client until it disconnects, misbehaves or the store stops.
fn serve(stream: TcpStream, shared: &Shared) {
    if stream.set_nodelay(true).is_err()
        || stream.set_write_timeout(Some(shared.io_timeout)).is_err()
    {
        return;
    }
    let within = Deadline::after(&stream, HANDSHAKE_TIMEOUT);
    if let Err(failure) = handshake(within, shared.auth.as_ref(), Role::Acceptor) {
        // The store's only voice: rank 0's log shows who knocked. The
        // refused client gets its own error from its side of the handshake.
        if !shared.stop.load(Ordering::SeqCst) {
            let from = stream
                .peer_addr()
                .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string());
            eprintln!("comm: the rendezvous store refused a connection from {from}: {failure}");
        }
        // Hang up now: the impostor must not keep a half-open connection.
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let mut member = None;
    serve_member(&stream, shared, &mut member);
    // The others may need to know that a member left (a launcher killed with
    // its machine's ranks); the store stopping is no member's departure.
    if let Some(rank) = member
        && !shared.stop.load(Ordering::SeqCst)
    {
        shared.member_left(rank);
    }
}

/// Serves a handshaken client's requests until it disconnects or
/// misbehaves; `member` becomes the rank it registered as.
fn serve_member(stream: &TcpStream, shared: &Shared, member: &mut Option<usize>) {
    let mut said_hello = false;
    while let Ok(payload) = read_request(stream, said_hello, shared.io_timeout) {
        let Ok(request) = Request::decode(&payload) else {
            return;
        };
        let response = match request {
            Request::Hello { rank, world_size } if !said_hello => {
                said_hello = true;
                let response = shared.hello(rank, world_size);
                if response == Response::Ok {
                    *member = Some(rank);
                }
                response
            }
            Request::Join { world_size } if !said_hello => {
                said_hello = true;
                let response = shared.join(world_size);
                if let Response::Value(rank) = &response {
                    *member = rank
                        .as_slice()
                        .try_into()
                        .ok()
                        .map(|r| u64::from_le_bytes(r) as usize);
                }
                response
            }
            // A second hello, or anything before the first, is not a comm client.
            Request::Hello { .. } | Request::Join { .. } => return,
            _ if !said_hello => return,
            Request::Set { key, value } => shared.set(key, value),
            Request::Poison(rejection) => shared.poison(rejection),
            Request::Get { key, wait } => shared.get(&key, wait),
            Request::Look { keys } => match shared.look(&keys) {
                Some(values) => values,
                None => return,
            },
            Request::Enlist {
                step,
                suspect,
                wait,
            } => match *member {
                Some(slot) => shared.enlist(slot, (step, suspect), wait),
                None => return,
            },
        };
        // A refused newcomer hears why, and is served no more.
        if write_frame(stream, &response.encode()).is_err() || member.is_none() {
            return;
        }
    }
}

/// The key the store sets when the member registered as `rank` leaves (its
/// connection closed): read through [`crate::Store::departed`].
pub(crate) fn departed_key(rank: usize) -> String {
    format!("comm/departed/{rank}")
}

/// Reads the next request frame. A registered rank may stay quiet between
/// requests for as long as it trains, but a frame it has begun must be
/// complete within `timeout`; a connection that has not said hello gets
/// `timeout` for its first frame from the start. So a peer that never speaks,
/// or stalls half-way through a frame, loses its connection and nothing else.
fn read_request(stream: &TcpStream, said_hello: bool, timeout: Duration) -> io::Result<Vec<u8>> {
    if said_hello {
        stream.set_read_timeout(None)?;
        if stream.peek(&mut [0_u8])? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
    }
    read_frame(Deadline::after(stream, timeout))
}

/// How long dropping a poisoned store waits for clients to hear why.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        // Wake the blocking accept with a connection of our own; if that
        // fails the accept thread is left detached rather than hanging drop.
        let wake = |ip: IpAddr| {
            TcpStream::connect_timeout(&(ip, self.port).into(), Duration::from_secs(1))
        };
        let woke = wake(Ipv4Addr::LOCALHOST.into())
            .or_else(|_| wake(Ipv6Addr::LOCALHOST.into()))
            .is_ok();
        if woke && let Some(t) = self.accept_thread.take() {
            // A panic in the accept thread has nothing left to clean up.
            let _ = t.join();
        }
        let (connections, handlers) = {
            let deadline = Instant::now() + DRAIN_TIMEOUT;
            let mut state = self.shared.lock();
            while state.rejection.is_some() && !state.connections.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self
                    .shared
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            (
                std::mem::take(&mut state.connections),
                std::mem::take(&mut state.handlers),
            )
        };
        for c in connections.values() {
            // Already-closed sockets fail to shut down; nothing to do then.
            let _ = c.shutdown(Shutdown::Both);
        }
        for h in handlers {
            let _ = h.join();
        }
    }
}
