//! Client of the rendezvous store: how ranks find each other and share small
//! values (data-channel addresses now, the NCCL unique id later). The store
//! is rank 0's (this crate's protocol) or a launcher's c10d TCPStore
//! (`c10d.rs`), behind the same methods.

mod c10d;

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::auth::{Role, handshake};
use crate::config::{CommConfig, StoreHost};
use crate::error::CommError;
use crate::store_protocol::{MAX_LOOK_KEYS, Request, Response, read_frame, write_frame};

/// Pause between attempts to reach a store that is not up yet (rank 0 may
/// start after the others).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How long the master's name may fail to resolve, never having resolved,
/// before joining gives up: a name that DNS learns late (a node just
/// started) has this long; a mistyped `MASTER_ADDR` is not worth the join
/// timeout's wait (10 minutes by default) in silence.
const UNRESOLVED_LIMIT: Duration = Duration::from_secs(30);

/// A connection to the job's store, registered under this rank.
#[derive(Debug)]
pub struct Store {
    stream: TcpStream,
    /// `Some(prefix)`: the store is a launcher's c10d TCPStore, and this
    /// job's keys live under `prefix` there; `None`: rank 0's.
    agent: Option<String>,
    master: String,
    /// How long [`Store::get`] waits: the join timeout.
    timeout: Duration,
    /// How long a request waits for its answer beyond the store's own wait.
    reply_timeout: Duration,
    /// Why an exchange failed: an answer may still be on its way, so no
    /// later request may use the connection (it would read that answer).
    fault: Option<Fault>,
}

/// How an exchange with the store failed.
#[derive(Clone, Debug)]
enum Fault {
    /// No answer for this long past the store's own wait.
    Silent(Duration),
    /// The connection closed or carried garbage: this, said.
    Broken(String),
}

impl Store {
    /// Connects to the store at `config.master_addr:master_port`, retrying
    /// until `config.rdzv_timeout` passes (rank 0 may not be listening yet),
    /// proves that it holds the job's token (and checks that the store does),
    /// and registers `config.rank` with `config.world_size`. The store refuses a
    /// world size that differs from rank 0's and a rank that is already
    /// registered. A launcher's c10d store instead checks that it speaks
    /// that protocol, and the ranks check each other through it.
    pub fn connect(config: &CommConfig) -> Result<Store, CommError> {
        let mut store = Store::reach(config)?;
        if store.agent.is_some() {
            store.register_at_agent(config.rank, config.world_size)?;
            return Ok(store);
        }
        let hello = Request::Hello {
            rank: config.rank,
            world_size: config.world_size,
        };
        match store.request(&hello, Duration::ZERO)? {
            Response::Ok => Ok(store),
            other => Err(store.unexpected(&other)),
        }
    }

    /// Like [`Store::connect`], but takes the lowest rank not yet
    /// registered above 0 (rank 0 hosts the store) instead of
    /// `config.rank`, for members numbered by arrival; that rank with the
    /// connection.
    pub fn join(config: &CommConfig) -> Result<(Store, usize), CommError> {
        let mut store = Store::reach(config)?;
        store.own_store_only("numbering members by arrival")?;
        let join = Request::Join {
            world_size: config.world_size,
        };
        match store.request(&join, Duration::ZERO)? {
            Response::Value(rank) if rank.len() == 8 => {
                let rank = u64::from_le_bytes(rank.try_into().unwrap_or_default());
                Ok((store, rank as usize))
            }
            other => Err(store.unexpected(&other)),
        }
    }

    /// A connection to the store, not yet registered.
    fn reach(config: &CommConfig) -> Result<Store, CommError> {
        let master = config.master_endpoint();
        let deadline = Instant::now() + config.rdzv_timeout;
        let host = &config.master_addr;
        let stream = connect_with_retry(host, config.master_port, deadline, UNRESOLVED_LIMIT)
            .map_err(|unreached| match unreached {
                Unreached::Unresolved { error, after } => CommError::Store {
                    master: master.clone(),
                    detail: format!(
                        "the name {host} resolves to no address ({error}), tried for {} s: check MASTER_ADDR or --master-addr (this machine's DNS or /etc/hosts must know it)",
                        after.as_secs()
                    ),
                },
                Unreached::Timeout(detail) => CommError::RendezvousTimeout {
                    master: master.clone(),
                    timeout: config.rdzv_timeout,
                    missing: vec![0],
                    world_size: config.world_size,
                    detail: format!("could not reach {}: {detail}", config.store.owner()),
                },
            })?;
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(config.timeout)))
            .and_then(|()| stream.set_write_timeout(Some(config.timeout)))
            .map_err(|e| CommError::io("configuring the store connection", e))?;
        let agent = match &config.store {
            StoreHost::RankZero | StoreHost::Launcher => {
                handshake(&stream, config.auth.token(), Role::Initiator).map_err(|failure| {
                    CommError::Auth {
                        peer: format!("{} at {master}", config.store.owner()),
                        failure,
                    }
                })?;
                None
            }
            StoreHost::Agent { prefix } => {
                c10d::validate(&stream).map_err(|e| c10d::not_a_store(&master, &e))?;
                Some(prefix.clone())
            }
        };
        Ok(Store {
            stream,
            agent,
            master,
            timeout: config.rdzv_timeout,
            reply_timeout: config.timeout,
            fault: None,
        })
    }

    /// Bounds how long each request waits for the store's answer beyond
    /// the store's own wait (default: the config's timeout): a store whose
    /// host is stopped (SIGSTOP, a debugger, a suspended VM) or cut off by
    /// the network keeps the connection open and never answers, and a
    /// member that must notice that sooner than its rendezvous timeout says
    /// so here. A request that gets no answer in time fails with
    /// [`CommError::StoreSilent`], and so does every later one: the late
    /// answer could otherwise be taken for theirs.
    pub fn set_reply_timeout(&mut self, reply_timeout: Duration) {
        self.reply_timeout = reply_timeout;
    }

    /// Stores `value` under `key`, replacing any earlier value.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), CommError> {
        if let Some(key) = self.agent_key(key) {
            return self.exchange(Duration::ZERO, |s| c10d::set(s, &key, value));
        }
        let request = Request::Set {
            key: key.to_string(),
            value: value.to_vec(),
        };
        match self.request(&request, Duration::ZERO)? {
            Response::Ok => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The value of `key`, waiting up to the join timeout
    /// (`rdzv_timeout`) for some rank to set it.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>, CommError> {
        let timeout = self.timeout;
        self.wait_for(key, timeout)?
            .ok_or_else(|| CommError::StoreTimeout {
                master: self.master.clone(),
                key: key.to_string(),
                timeout,
            })
    }

    /// The value of `key`, or `None` if no rank set it within `wait`
    /// (`Duration::ZERO` only looks).
    pub fn wait_for(&mut self, key: &str, wait: Duration) -> Result<Option<Vec<u8>>, CommError> {
        if let Some(key) = self.agent_key(key) {
            return self.wait_at_agent(&key, wait);
        }
        let request = Request::Get {
            key: key.to_string(),
            wait,
        };
        match self.request(&request, wait)? {
            Response::Value(v) => Ok(Some(v)),
            Response::NotFound => Ok(None),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Whether the member registered as `rank` has left the store: its
    /// connection closed (it exited, was killed, or its machine went away)
    /// while the store ran. Looks without waiting.
    pub fn departed(&mut self, rank: usize) -> Result<bool, CommError> {
        self.own_store_only("telling who left")?;
        let key = crate::store_server::departed_key(rank);
        Ok(self.wait_for(&key, Duration::ZERO)?.is_some())
    }

    /// The values of `keys` (`None`: not set) as they stood at one instant,
    /// in one request and without waiting: a member that sets one key and
    /// then another is never seen with the second and not the first. At
    /// most [`Store::MAX_LOOK_KEYS`] keys, whose values together fit in a
    /// 16 MiB frame (a store asked for more closes the connection).
    pub fn look_all(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, CommError> {
        self.own_store_only("looking at several keys at one instant")?;
        if keys.len() > MAX_LOOK_KEYS {
            return Err(CommError::Store {
                master: self.master.clone(),
                detail: format!(
                    "a look at {} keys exceeds the store's limit of {MAX_LOOK_KEYS}: look in several requests",
                    keys.len()
                ),
            });
        }
        let request = Request::Look {
            keys: keys.to_vec(),
        };
        match self.request(&request, Duration::ZERO)? {
            Response::Values(values) if values.len() == keys.len() => Ok(values),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The values of `keys` (`None`: not set) now, without waiting: one
    /// [`Store::look_all`] on rank 0's store, one look a key on a
    /// launcher's c10d TCPStore, which has no look at several keys. Unlike
    /// `look_all`, not one instant: for keys each written once.
    pub fn look_each(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, CommError> {
        match self.agent {
            None => (keys.chunks(MAX_LOOK_KEYS).map(|chunk| self.look_all(chunk))).try_fold(
                Vec::with_capacity(keys.len()),
                |mut all, values| {
                    all.extend(values?);
                    Ok(all)
                },
            ),
            Some(_) => (keys.iter())
                .map(|key| self.wait_for(key, Duration::ZERO))
                .collect(),
        }
    }

    /// Enlists this member for the next generation of a job whose
    /// membership changes (see [`crate::LiveMember`]), holding `step`
    /// steps of state, suspecting the member in slot `suspect`; waits up
    /// to `wait` for the generation to form.
    pub(crate) fn enlist(
        &mut self,
        (step, suspect): (Option<u64>, Option<usize>),
        wait: Duration,
    ) -> Result<Response, CommError> {
        self.own_store_only("forming a generation of the job")?;
        let request = Request::Enlist {
            step,
            suspect,
            wait,
        };
        match self.request(&request, wait)? {
            response @ (Response::Generation { .. }
            | Response::Evicted { .. }
            | Response::JobOver
            | Response::Lost
            | Response::NotFound) => Ok(response),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Most keys one [`Store::look_all`] may name.
    pub const MAX_LOOK_KEYS: usize = MAX_LOOK_KEYS;

    /// The key under which the store marks that the member registered as
    /// `rank` left ([`Store::departed`]), for a [`Store::look_all`].
    pub fn departed_key(rank: usize) -> String {
        crate::store_server::departed_key(rank)
    }

    /// Ends the rendezvous for every rank with `reason`; ranks waiting in
    /// [`Store::get`] get it as their error right away.
    pub(crate) fn poison(&mut self, reason: crate::error::Rejection) -> Result<(), CommError> {
        if self.agent.is_some() {
            return self.poison_at_agent(&reason);
        }
        match self.request(&Request::Poison(reason), Duration::ZERO)? {
            Response::Ok => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The local address of the connection to the store: the interface
    /// through which this host reaches rank 0.
    pub fn local_addr(&self) -> Result<SocketAddr, CommError> {
        self.stream
            .local_addr()
            .map_err(|e| CommError::io("reading the store connection's local address", e))
    }

    /// Sends one request and reads its answer; the store may take up to
    /// `server_wait` to answer before the reply timeout starts counting.
    /// After a failed exchange the connection serves nothing more.
    fn request(&mut self, request: &Request, server_wait: Duration) -> Result<Response, CommError> {
        let response = self.exchange(server_wait, |stream| {
            write_frame(stream, &request.encode())?;
            Response::decode(&read_frame(stream)?)
        })?;
        match response {
            Response::Rejected(r) => Err(r.into()),
            other => Ok(other),
        }
    }

    /// Runs `talk` (one request and its answer, in either protocol) on the
    /// connection; the store may take up to `server_wait` to answer before
    /// the reply timeout starts counting. After a failed exchange the
    /// connection serves nothing more.
    fn exchange<T>(
        &mut self,
        server_wait: Duration,
        talk: impl FnOnce(&TcpStream) -> io::Result<T>,
    ) -> Result<T, CommError> {
        if let Some(fault) = &self.fault {
            return Err(self.fault_error(fault));
        }
        let read_timeout = server_wait.saturating_add(self.reply_timeout);
        let exchange = || -> io::Result<T> {
            self.stream.set_write_timeout(Some(self.reply_timeout))?;
            self.stream.set_read_timeout(Some(read_timeout))?;
            talk(&self.stream)
        };
        exchange().map_err(|e| {
            let fault = match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => Fault::Silent(self.reply_timeout),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
                    let host = match self.agent {
                        None => "rank 0",
                        Some(_) => "the launcher (torchrun's agent)",
                    };
                    Fault::Broken(format!(
                        "{host} closed the store connection (did {host} exit?): {e}"
                    ))
                }
                _ => Fault::Broken(e.to_string()),
            };
            let error = self.fault_error(&fault);
            self.fault = Some(fault);
            error
        })
    }

    /// Fails what only rank 0's store can do (`what`), at a launcher's.
    fn own_store_only(&self, what: &str) -> Result<(), CommError> {
        match self.agent {
            None => Ok(()),
            Some(_) => Err(CommError::Store {
                master: self.master.clone(),
                detail: format!(
                    "{what} needs rank 0's store, and this is a launcher's c10d TCPStore"
                ),
            }),
        }
    }

    fn fault_error(&self, fault: &Fault) -> CommError {
        let master = self.master.clone();
        match fault {
            Fault::Silent(silent) => CommError::StoreSilent {
                master,
                silent: *silent,
            },
            Fault::Broken(detail) => CommError::Store {
                master,
                detail: detail.clone(),
            },
        }
    }

    fn unexpected(&self, response: &Response) -> CommError {
        CommError::Store {
            master: self.master.clone(),
            detail: format!("unexpected answer {response:?}"),
        }
    }
}

/// Why [`connect_with_retry`] gave up.
#[derive(Debug, PartialEq, Eq)]
enum Unreached {
    /// `host` never resolved, for `after` (at least the unresolved limit).
    Unresolved { error: String, after: Duration },
    /// The deadline passed; the last failure, as text for the error message.
    Timeout(String),
}

/// Tries every address `host` resolves to until one accepts or `deadline`
/// passes; a `host` that has never resolved gives up after
/// `unresolved_limit`.
fn connect_with_retry(
    host: &str,
    port: u16,
    deadline: Instant,
    unresolved_limit: Duration,
) -> Result<TcpStream, Unreached> {
    let start = Instant::now();
    let mut resolved = false;
    let mut last_error = String::from("no attempt made");
    loop {
        match (host, port).to_socket_addrs() {
            Ok(addrs) => {
                resolved = true;
                for addr in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left) {
                        Ok(s) => return Ok(s),
                        Err(e) => last_error = format!("{addr}: {e}"),
                    }
                }
            }
            Err(e) if !resolved && start.elapsed() >= unresolved_limit => {
                return Err(Unreached::Unresolved {
                    error: e.to_string(),
                    after: start.elapsed(),
                });
            }
            Err(e) => last_error = format!("cannot resolve {host}: {e}"),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Unreached::Timeout(last_error));
        }
        std::thread::sleep(left.min(RETRY_PAUSE));
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;

    /// A store whose process is stopped after it welcomed one member: the
    /// connection stays open, requests are read by no one. The frames it
    /// did read go to `seen`.
    fn stopped_store(seen: mpsc::Sender<usize>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            handshake(&stream, None, Role::Acceptor).unwrap();
            read_frame(&stream).unwrap();
            write_frame(&stream, &Response::Ok.encode()).unwrap();
            // One request arrives; then the process "stops".
            let mut frames = 0;
            stream
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            while read_frame(&stream).is_ok() {
                frames += 1;
            }
            let _ = seen.send(frames);
        });
        port
    }

    #[test]
    fn a_name_that_never_resolves_fails_before_the_join_timeout() {
        // `.invalid` never resolves (RFC 2606); a minute's deadline that a
        // give-up on the name does not wait for.
        let deadline = Instant::now() + Duration::from_secs(60);
        let limit = Duration::from_millis(200);
        match connect_with_retry("no-such-master.invalid", 29500, deadline, limit) {
            Err(Unreached::Unresolved { after, .. }) => assert!(after >= limit),
            other => panic!("expected the name to be given up on, got {other:?}"),
        }
    }

    #[test]
    fn a_store_that_stops_answering_fails_requests_within_the_reply_timeout() {
        let (seen, frames) = mpsc::channel();
        let port = stopped_store(seen);
        // Timeouts far longer than the test may take.
        let config =
            CommConfig::new(1, 2, "127.0.0.1", port).with_timeout(Duration::from_secs(600));
        let mut store = Store::connect(&config).unwrap();
        store.set_reply_timeout(Duration::from_millis(200));
        let asked = Instant::now();
        let err = store.set("heartbeat/1", b"1").unwrap_err();
        assert!(asked.elapsed() < Duration::from_secs(20), "hung");
        assert!(
            matches!(err, CommError::StoreSilent { silent, .. } if silent == Duration::from_millis(200)),
            "{err}"
        );
        assert!(err.to_string().contains("stopped answering"), "{err}");
        // Later requests fail the same way without touching the connection,
        // whose late answer would otherwise be read as theirs.
        let again = store.wait_for("x", Duration::ZERO).unwrap_err();
        assert!(matches!(again, CommError::StoreSilent { .. }), "{again}");
        assert_eq!(frames.recv_timeout(Duration::from_secs(20)), Ok(1));
    }
}
