//! Client of the rendezvous store: how ranks find each other and share small
//! values (data-channel addresses now, the NCCL unique id later).

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::auth::{Role, handshake};
use crate::config::CommConfig;
use crate::error::CommError;
use crate::store_protocol::{Request, Response, read_frame, write_frame};

/// Pause between attempts to reach a store that is not up yet (rank 0 may
/// start after the others).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A connection to the store of rank 0, registered under this rank.
#[derive(Debug)]
pub struct Store {
    stream: TcpStream,
    master: String,
    timeout: Duration,
}

impl Store {
    /// Connects to the store at `config.master_addr:master_port`, retrying
    /// until `config.timeout` passes (rank 0 may not be listening yet),
    /// proves that it holds the job's token (and checks that the store does),
    /// and registers `config.rank` with `config.world_size`. The store refuses a
    /// world size that differs from rank 0's and a rank that is already
    /// registered.
    pub fn connect(config: &CommConfig) -> Result<Store, CommError> {
        let mut store = Store::reach(config)?;
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
        let deadline = Instant::now() + config.timeout;
        let stream = connect_with_retry(&config.master_addr, config.master_port, deadline)
            .map_err(|detail| CommError::RendezvousTimeout {
                master: master.clone(),
                timeout: config.timeout,
                missing: vec![0],
                world_size: config.world_size,
                detail: format!("could not reach rank 0's store: {detail}"),
            })?;
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(config.timeout)))
            .and_then(|()| stream.set_write_timeout(Some(config.timeout)))
            .map_err(|e| CommError::io("configuring the store connection", e))?;
        handshake(&stream, config.auth.as_ref(), Role::Initiator).map_err(|failure| {
            CommError::Auth {
                peer: format!("rank 0's store at {master}"),
                failure,
            }
        })?;
        Ok(Store {
            stream,
            master,
            timeout: config.timeout,
        })
    }

    /// Stores `value` under `key`, replacing any earlier value.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), CommError> {
        let request = Request::Set {
            key: key.to_string(),
            value: value.to_vec(),
        };
        match self.request(&request, Duration::ZERO)? {
            Response::Ok => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The value of `key`, waiting up to the configured timeout for some
    /// rank to set it.
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
        let key = crate::store_server::departed_key(rank);
        Ok(self.wait_for(&key, Duration::ZERO)?.is_some())
    }

    /// Ends the rendezvous for every rank with `reason`; ranks waiting in
    /// [`Store::get`] get it as their error right away.
    pub(crate) fn poison(&mut self, reason: crate::error::Rejection) -> Result<(), CommError> {
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
    /// `server_wait` to answer before the network timeout starts counting.
    fn request(&mut self, request: &Request, server_wait: Duration) -> Result<Response, CommError> {
        let read_timeout = server_wait.saturating_add(self.timeout);
        let exchange = || -> io::Result<Response> {
            self.stream.set_write_timeout(Some(self.timeout))?;
            self.stream.set_read_timeout(Some(read_timeout))?;
            write_frame(&self.stream, &request.encode())?;
            Response::decode(&read_frame(&self.stream)?)
        };
        let response = exchange().map_err(|e| {
            let detail = match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                    format!("no answer within {read_timeout:?} (is rank 0 alive?)")
                }
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
                    format!("rank 0 closed the store connection (did rank 0 exit?): {e}")
                }
                _ => e.to_string(),
            };
            CommError::Store {
                master: self.master.clone(),
                detail,
            }
        })?;
        match response {
            Response::Rejected(r) => Err(r.into()),
            other => Ok(other),
        }
    }

    fn unexpected(&self, response: &Response) -> CommError {
        CommError::Store {
            master: self.master.clone(),
            detail: format!("unexpected answer {response:?}"),
        }
    }
}

/// Tries every address `host` resolves to until one accepts or `deadline`
/// passes; returns the last failure as text for the error message.
fn connect_with_retry(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, String> {
    let mut last_error = String::from("no attempt made");
    loop {
        match (host, port).to_socket_addrs() {
            Ok(addrs) => {
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
            Err(e) => last_error = format!("cannot resolve {host}: {e}"),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last_error);
        }
        std::thread::sleep(left.min(RETRY_PAUSE));
    }
}
