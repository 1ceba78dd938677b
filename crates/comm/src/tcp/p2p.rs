//! Point-to-point messages between ring neighbours: at most one outgoing
//! and one incoming message, progressed together on the calling thread
//! (like the collectives' engine), so two neighbours that send to each
//! other at the same time cannot deadlock on full socket buffers.
//!
//! A rank reaches its right neighbour over the link it writes collectives
//! to and its left neighbour over the link it reads them from (sockets are
//! full duplex); with two ranks both neighbours are the same rank and the
//! ring's own direction is used both ways. Every message starts with a
//! [`Header`] (kind `Send`, the sender, the length, and the message's
//! number between the two ranks), checked by the receiver.

use std::io::{ErrorKind, Read, Write};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::error::CommError;
use crate::tcp::header::{HEADER_BYTES, Header};
use crate::tcp::links::{Peer, RingLinks};
use crate::tcp::stream::Stream;

/// One message on its way out: the header, then `data`.
pub(crate) struct Outgoing<'a> {
    pub(crate) header: Header,
    pub(crate) data: &'a [u8],
    pub(crate) to: usize,
}

/// One message to receive into `data`, whose header must equal `expected`.
pub(crate) struct Incoming<'a> {
    pub(crate) expected: Header,
    pub(crate) data: &'a mut [u8],
    pub(crate) from: usize,
}

impl RingLinks {
    /// The link and peer that reach ring rank `peer`: writing (`send`) or
    /// reading. `None` if `peer` is not a neighbour.
    fn link_to(&self, peer: usize, send: bool) -> Option<(&Stream, &Peer)> {
        let right = (self.rank + 1) % self.world_size;
        let left = (self.rank + self.world_size - 1) % self.world_size;
        let (first, second) = if send {
            ((right, &self.to_right), (left, &self.from_left))
        } else {
            ((left, &self.from_left), (right, &self.to_right))
        };
        let peer_of = |stream: &Stream| {
            if std::ptr::eq(stream, &self.to_right) {
                &self.right
            } else {
                &self.left
            }
        };
        [first, second]
            .into_iter()
            .find(|&(r, _)| r == peer && peer != self.rank)
            .map(|(_, stream)| (stream, peer_of(stream)))
    }
}

/// Refuses a peer that is not a ring neighbour of this rank.
fn not_a_neighbour(links: &RingLinks, peer: usize) -> CommError {
    CommError::InvalidArgument {
        op: "send_recv",
        reason: format!(
            "rank {peer} of the group is not a neighbour of rank {} in a group of {}: \
             point-to-point messages go between adjacent ranks only (peer = rank ± 1)",
            links.rank, links.world_size
        ),
    }
}

/// Sends `out` and receives `inc` at once; see the module docs.
pub(crate) fn send_recv(
    links: &RingLinks,
    out: Option<Outgoing<'_>>,
    inc: Option<Incoming<'_>>,
) -> Result<(), CommError> {
    let out = match out {
        Some(o) => {
            let link = links
                .link_to(o.to, true)
                .ok_or_else(|| not_a_neighbour(links, o.to))?;
            let header = o.header.encode();
            Some((o, link, header))
        }
        None => None,
    };
    let mut inc = match inc {
        Some(i) => {
            let link = links
                .link_to(i.from, false)
                .ok_or_else(|| not_a_neighbour(links, i.from))?;
            Some((i, link))
        }
        None => None,
    };
    let (mut sent, mut got) = (0, 0);
    let mut header_in = [0_u8; HEADER_BYTES];
    loop {
        let mut want_write = None;
        if let Some((o, (stream, peer), header)) = &out {
            let total = HEADER_BYTES + o.data.len();
            while sent < total {
                let bytes = if sent < HEADER_BYTES {
                    &header[sent..]
                } else {
                    &o.data[sent - HEADER_BYTES..]
                };
                match (&**stream).write(bytes) {
                    Ok(0) => {
                        let e = ErrorKind::WriteZero.into();
                        return Err(links.peer_error(peer, "send", &e));
                    }
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        want_write = Some((*stream, *peer));
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(links.peer_error(peer, "send", &e)),
                }
            }
        }
        let mut want_read = None;
        if let Some((i, (stream, peer))) = &mut inc {
            let total = HEADER_BYTES + i.data.len();
            while got < total {
                let target = if got < HEADER_BYTES {
                    &mut header_in[got..]
                } else {
                    &mut i.data[got - HEADER_BYTES..]
                };
                match (&**stream).read(target) {
                    Ok(0) => {
                        let e = ErrorKind::UnexpectedEof.into();
                        return Err(links.peer_error(peer, "recv", &e));
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        want_read = Some((*stream, *peer));
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(links.peer_error(peer, "recv", &e)),
                }
                if got == HEADER_BYTES {
                    let theirs = Header::decode(&header_in);
                    if theirs != Some(i.expected) {
                        return Err(CommError::CollectiveMismatch {
                            peer: peer.rank,
                            ours: i.expected.describe(),
                            theirs: theirs.map_or_else(
                                || "something that is not a message header".to_string(),
                                |h| h.describe(),
                            ),
                        });
                    }
                }
            }
        }
        if want_write.is_none() && want_read.is_none() {
            return Ok(());
        }
        wait(links, want_write, want_read)?;
    }
}

/// Blocks until the awaited link can take bytes or has bytes, at most the
/// timeout, which is blamed on the peer awaited (the reader's first).
fn wait(
    links: &RingLinks,
    write: Option<(&Stream, &Peer)>,
    read: Option<(&Stream, &Peer)>,
) -> Result<(), CommError> {
    let Some((_, blame)) = read.or(write) else {
        return Ok(());
    };
    let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2);
    match (write, read) {
        (Some((w, _)), Some((r, _))) if std::ptr::eq(w, r) => {
            fds.push(PollFd::new(w, PollFlags::OUT | PollFlags::IN));
        }
        _ => {
            if let Some((w, _)) = write {
                fds.push(PollFd::new(w, PollFlags::OUT));
            }
            if let Some((r, _)) = read {
                fds.push(PollFd::new(r, PollFlags::IN));
            }
        }
    }
    let timeout = Timespec::try_from(links.timeout).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    loop {
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                return Err(CommError::PeerTimeout {
                    peer: blame.rank,
                    addr: blame.addr.clone(),
                    op: if read.is_some() { "recv" } else { "send" },
                    timeout: links.timeout,
                });
            }
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(links.peer_error(blame, "send_recv", &e.into())),
        }
    }
}
