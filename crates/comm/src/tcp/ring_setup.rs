//! Forming the ring: every rank publishes the addresses of its data
//! listeners in the store, collects everyone's, connects to its right
//! neighbour and accepts its left one.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};
#[cfg(target_os = "linux")]
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use crate::auth::{AuthFailure, AuthToken, HANDSHAKE_TIMEOUT, Role, handshake};
use crate::config::SameHostTransport;
use crate::deadline::Deadline;
use crate::error::CommError;
use crate::rendezvous::{Rendezvous, endpoint};
use crate::tcp::exchange::SPIN_BEFORE_SLEEP;
use crate::tcp::group::Group;
use crate::tcp::links::{Peer, RingLinks};
use crate::tcp::pace::Pace;
use crate::tcp::peer_address::{PeerAddress, machine_id};
use crate::tcp::stream::Stream;
#[cfg(target_os = "linux")]
use crate::tcp::unix_socket;

/// First bytes on every data connection after the authentication
/// handshake, so that a connection meant for another rank is dropped.
const HANDSHAKE_MAGIC: [u8; 4] = *b"CMRG";
const HANDSHAKE_BYTES: usize = 20;

/// How often an idle accept loop checks its listeners and deadline.
const ACCEPT_POLL: Duration = Duration::from_millis(2);
const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// The listeners of this rank: always TCP, plus a Unix socket on Linux.
struct Listeners {
    tcp: TcpListener,
    #[cfg(target_os = "linux")]
    unix: Option<UnixListener>,
}

impl Listeners {
    /// Binds the listeners and describes them for the store.
    fn bind(rendezvous: &mut Rendezvous) -> Result<(Listeners, PeerAddress), CommError> {
        let rank = rendezvous.config().rank;
        let host = rendezvous.advertised_host()?;
        // A rank that reaches the store over loopback runs on rank 0's
        // machine, in a job of one machine: its peers come over loopback too.
        let interfaces = match rendezvous.store().local_addr()?.ip() {
            ip if ip.is_loopback() => ip,
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let tcp = TcpListener::bind((interfaces, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| CommError::io(format!("rank {rank}: binding the data listener"), e))?;
        let port = tcp
            .local_addr()
            .map_err(|e| CommError::io("reading the data listener's port", e))?
            .port();
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut address = PeerAddress {
            tcp: endpoint(&host, port),
            machine: machine_id(),
            unix: None,
        };
        #[cfg(target_os = "linux")]
        let unix = match (rendezvous.config().same_host, &address.machine) {
            (SameHostTransport::UnixSocket, Some(_)) => {
                unix_socket::bind(rank).map(|(listener, name)| {
                    address.unix = Some(name);
                    listener
                })
            }
            _ => None,
        };
        Ok((
            Listeners {
                tcp,
                #[cfg(target_os = "linux")]
                unix,
            },
            address,
        ))
    }

    /// One pending connection from any listener, if there is one.
    fn try_accept(&self) -> io::Result<Option<Stream>> {
        match self.tcp.accept() {
            Ok((s, _)) => return Ok(Some(Stream::Tcp(s))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        #[cfg(target_os = "linux")]
        if let Some(unix) = &self.unix {
            match unix.accept() {
                Ok((s, _)) => return Ok(Some(Stream::Unix(s))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

/// Builds this rank's links in the ring of `group`; `deadline` bounds the
/// whole setup. Links and errors name peers by their rank in the job.
pub(crate) fn connect_ring(
    rendezvous: &mut Rendezvous,
    group: &Group,
    deadline: Instant,
) -> Result<RingLinks, CommError> {
    let config = rendezvous.config().clone();
    let (rank, world) = (group.rank, group.world());
    let (listeners, mine) = Listeners::bind(rendezvous)?;
    rendezvous
        .store()
        .set(&group.address_key(rank), mine.encode().as_bytes())?;

    let addresses = group.gather_addresses(rendezvous, deadline)?;
    let (right, left) = ((rank + 1) % world, (rank + world - 1) % world);
    let missing = |peer: usize, detail: String| CommError::RendezvousTimeout {
        master: config.master_endpoint(),
        timeout: config.rdzv_timeout,
        missing: vec![group.global(peer)],
        world_size: config.world_size,
        detail,
    };

    // Both links at once: the handshake to the right neighbour needs its
    // answer, which it gives from its own accept loop, so a rank that
    // finished its connect before accepting would wait around the ring.
    let token = config.auth.token();
    let use_unix = config.same_host == SameHostTransport::UnixSocket;
    let (to_right, from_left) = std::thread::scope(|scope| {
        let right_link = scope.spawn(|| {
            open_to_right(
                &mine,
                &addresses[right],
                use_unix,
                token,
                hello(rank, world),
                deadline,
            )
        });
        let from_left = accept_from(&listeners, left, world, token, deadline);
        let to_right = right_link
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (to_right, from_left)
    });
    let to_right = to_right.map_err(|e| match e {
        RightLinkError::Auth(failure) => CommError::Auth {
            peer: format!("rank {} at {}", group.global(right), addresses[right].tcp),
            failure,
        },
        RightLinkError::Connect(e) => missing(
            right,
            format!(
                "could not connect to rank {} at {}: {e}",
                group.global(right),
                addresses[right].tcp
            ),
        ),
        RightLinkError::Dropped(e) => missing(
            right,
            format!(
                "rank {} at {} dropped the connection: {e}",
                group.global(right),
                addresses[right].tcp
            ),
        ),
    })?;
    let from_left = from_left.map_err(|e| {
        missing(
            left,
            format!(
                "rank {} ({}) did not open its data connection to rank {}: {e}",
                group.global(left),
                addresses[left].tcp,
                group.global(rank)
            ),
        )
    })?;

    to_right
        .non_blocking()
        .and_then(|()| from_left.non_blocking())
        .map_err(|e| CommError::io("configuring the ring connections", e))?;
    let peer = |rank: usize, stream: &Stream| Peer {
        rank: group.global(rank),
        addr: format!("{} via {}", addresses[rank].tcp, stream.kind()),
    };
    // Busy-waiting only pays while every rank on this machine has a core.
    let local_ranks = addresses.iter().filter(|a| mine.same_machine(a)).count();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let spin = if local_ranks > 0 && local_ranks <= cores {
        SPIN_BEFORE_SLEEP
    } else {
        Duration::ZERO
    };
    Ok(RingLinks {
        rank,
        world_size: world,
        spin,
        right: peer(right, &to_right),
        to_right,
        left: peer(left, &from_left),
        from_left,
        timeout: config.timeout,
        pace: config.link_rate.map(Pace::new),
    })
}

/// The ring hello that follows the authentication handshake: which rank
/// connects, in a world of which size.
fn hello(rank: usize, world: usize) -> Vec<u8> {
    let mut hello = Vec::with_capacity(HANDSHAKE_BYTES);
    hello.extend_from_slice(&HANDSHAKE_MAGIC);
    hello.extend_from_slice(&(rank as u64).to_le_bytes());
    hello.extend_from_slice(&(world as u64).to_le_bytes());
    hello
}

/// How opening the link to the right neighbour failed.
enum RightLinkError {
    Connect(io::Error),
    Auth(AuthFailure),
    Dropped(io::Error),
}

/// Connects to the right neighbour, authenticates, and says who this rank is.
fn open_to_right(
    mine: &PeerAddress,
    peer: &PeerAddress,
    use_unix: bool,
    token: Option<&AuthToken>,
    hello: Vec<u8>,
    deadline: Instant,
) -> Result<Stream, RightLinkError> {
    let stream = connect(mine, peer, use_unix, deadline).map_err(RightLinkError::Connect)?;
    // The neighbour answers from its accept loop, which it may reach late.
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.blocking(left).map_err(RightLinkError::Dropped)?;
    handshake(&stream, token, Role::Initiator).map_err(RightLinkError::Auth)?;
    (&stream)
        .write_all(&hello)
        .map_err(RightLinkError::Dropped)?;
    Ok(stream)
}

/// Connects to `peer`: over its Unix socket when it runs on this machine
/// (and that works), else over TCP, retrying refused attempts until
/// `deadline`.
fn connect(
    mine: &PeerAddress,
    peer: &PeerAddress,
    use_unix: bool,
    deadline: Instant,
) -> io::Result<Stream> {
    #[cfg(target_os = "linux")]
    if let (true, true, Some(name)) = (use_unix, mine.same_machine(peer), &peer.unix)
        && let Ok(s) = unix_socket::connect(name)
    {
        return Ok(Stream::Unix(s));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (mine, use_unix);
    loop {
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} resolves to no address", peer.tcp),
        );
        for target in peer.tcp.to_socket_addrs()? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
            }
            match TcpStream::connect_timeout(&target, left) {
                Ok(s) => return Ok(Stream::Tcp(s)),
                Err(e) => last = e,
            }
        }
        if Instant::now() + CONNECT_RETRY >= deadline {
            return Err(last);
        }
        std::thread::sleep(CONNECT_RETRY);
    }
}

/// Accepts connections until one proves it holds the job's token and
/// presents a valid hello from rank `expected`; anything else is dropped
/// after at most [`HANDSHAKE_TIMEOUT`] per read.
fn accept_from(
    listeners: &Listeners,
    expected: usize,
    world: usize,
    token: Option<&AuthToken>,
    deadline: Instant,
) -> io::Result<Stream> {
    loop {
        match listeners.try_accept()? {
            Some(stream) => {
                if let Ok(true) = check_handshake(&stream, expected, world, token, deadline) {
                    return Ok(stream);
                }
            }
            None => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no connection before the deadline",
                    ));
                }
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

fn check_handshake(
    stream: &Stream,
    expected: usize,
    world: usize,
    token: Option<&AuthToken>,
    deadline: Instant,
) -> io::Result<bool> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), HANDSHAKE_TIMEOUT);
    stream.blocking(left)?;
    // One deadline for the whole exchange: a stranger trickling bytes must
    // not hold up the accept loop the real neighbour is waiting on.
    let mut within = Deadline::after(stream, left);
    if handshake(&mut within, token, Role::Acceptor).is_err() {
        return Ok(false);
    }
    let mut hello = [0_u8; HANDSHAKE_BYTES];
    within.read_exact(&mut hello)?;
    let word = |at: usize| {
        let mut w = [0_u8; 8];
        w.copy_from_slice(&hello[at..at + 8]);
        u64::from_le_bytes(w)
    };
    Ok(hello[..4] == HANDSHAKE_MAGIC && word(4) == expected as u64 && word(12) == world as u64)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    /// A ring listener's side of a connection from `peer`, which runs the
    /// initiator's handshake with `peer_token` and then says hello as rank 1.
    fn accept_check(token: &AuthToken, peer_token: Option<AuthToken>) -> bool {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let peer = std::thread::spawn(move || {
            theirs.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).unwrap();
            if handshake(&theirs, peer_token.as_ref(), Role::Initiator).is_ok() {
                let _ = (&theirs).write_all(&hello(1, 2));
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let accepted = check_handshake(&Stream::Unix(ours), 1, 2, Some(token), deadline);
        peer.join().unwrap();
        accepted.unwrap_or(false)
    }

    #[test]
    fn a_ring_listener_accepts_the_job_token_only() {
        let token = AuthToken::generate().unwrap();
        assert!(accept_check(&token, Some(token.clone())));
        assert!(!accept_check(&token, Some(AuthToken::generate().unwrap())));
        assert!(!accept_check(&token, None));
    }

    #[test]
    fn a_silent_connection_to_a_ring_listener_is_dropped_within_a_second() {
        let (ours, _silent) = UnixStream::pair().unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(20);
        let token = AuthToken::generate().unwrap();
        let accepted = check_handshake(&Stream::Unix(ours), 1, 2, Some(&token), deadline);
        assert!(!accepted.unwrap_or(false));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
