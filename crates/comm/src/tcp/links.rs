//! The two connections of a rank in the ring and how their failures are
//! reported. Each connection carries data one way only: this rank writes to
//! its right neighbour and reads from its left one, so with two ranks both
//! directions of the pair run at once (full duplex).

use std::io::{self, ErrorKind};
use std::time::Duration;

use crate::error::CommError;
use crate::tcp::header::Header;
use crate::tcp::pace::Pace;
use crate::tcp::stream::Stream;

/// A neighbour: its rank and how it is reached, for messages.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub(crate) rank: usize,
    pub(crate) addr: String,
}

/// Both connections, non-blocking (the exchange engine polls them).
#[derive(Debug)]
pub(crate) struct RingLinks {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) to_right: Stream,
    pub(crate) right: Peer,
    pub(crate) from_left: Stream,
    pub(crate) left: Peer,
    /// Longest a collective waits without any progress.
    pub(crate) timeout: Duration,
    /// How long to poll without sleeping before blocking; zero when the
    /// machine has fewer cores than local ranks (spinning would steal the
    /// core a peer needs).
    pub(crate) spin: Duration,
    /// The link's rate cap on what this rank sends (`None`: none).
    pub(crate) pace: Option<Pace>,
}

/// What went wrong inside one collective, before it is attributed to a
/// peer and turned into a [`CommError`].
#[derive(Debug)]
pub(crate) enum Fault {
    FromLeft(io::Error),
    ToRight(io::Error),
    Mismatch {
        ours: Header,
        theirs: Option<Header>,
    },
}

impl RingLinks {
    /// Attributes `fault` to the neighbour involved.
    pub(crate) fn error(&self, fault: Fault, op: &'static str) -> CommError {
        match fault {
            Fault::FromLeft(e) => self.peer_error(&self.left, op, &e),
            Fault::ToRight(e) => self.peer_error(&self.right, op, &e),
            Fault::Mismatch { ours, theirs } => CommError::CollectiveMismatch {
                peer: self.left.rank,
                ours: ours.describe(),
                theirs: theirs.map_or_else(
                    || "something this rank cannot decode (out of step with an earlier collective?)".to_string(),
                    |h| h.describe(),
                ),
            },
        }
    }

    pub(crate) fn peer_error(&self, peer: &Peer, op: &'static str, e: &io::Error) -> CommError {
        let detail = match e.kind() {
            ErrorKind::TimedOut => {
                return CommError::PeerTimeout {
                    peer: peer.rank,
                    addr: peer.addr.clone(),
                    op,
                    timeout: self.timeout,
                };
            }
            ErrorKind::UnexpectedEof => "connection closed by peer".to_string(),
            ErrorKind::ConnectionReset => "connection reset".to_string(),
            ErrorKind::BrokenPipe => "connection closed by peer (broken pipe)".to_string(),
            ErrorKind::ConnectionAborted => "connection aborted".to_string(),
            _ => e.to_string(),
        };
        CommError::PeerLost {
            peer: peer.rank,
            addr: peer.addr.clone(),
            op,
            detail,
        }
    }
}
