//! The engine that runs one collective on one rank: a sequence of segments
//! to write to the right neighbour and a sequence of segments to read from
//! the left one, progressed together on the calling thread with
//! non-blocking sockets and `poll(2)`.
//!
//! Both directions move at once (a ring step is full duplex) without a
//! second thread: on a small machine, handing segments between threads
//! costs scheduler wake-ups that are slower than the copies themselves.
//! Segments are pipelined: a segment received and reduced in one ring step
//! is queued for the next step right away, while later segments of the
//! current step are still arriving.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::ops::Range;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::tcp::element::Element;
use crate::tcp::header::{HEADER_BYTES, Header};
use crate::tcp::links::{Fault, RingLinks};

/// Pipeline granularity: big enough that syscalls per byte are few, small
/// enough that the next ring step starts early and a segment's reduction
/// runs in cache.
pub(crate) const SEGMENT_BYTES: usize = 256 << 10;

/// How long a rank keeps polling without sleeping when neither socket is
/// ready. Waking a sleeping process costs tens of microseconds on a VM, far
/// more than a small collective's transfer: spinning briefly cut a 2-rank
/// 4 KiB all-reduce from ~60 to ~9 µs and lifted 1 MiB from ~3.8 to ~5 GB/s
/// on a two-core VM. A longer wait (a slower peer) still ends up asleep.
pub(crate) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// What to do with a segment once it has arrived from the left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Add it into this rank's copy (reduce-scatter); `scale` applies the
    /// average's factor afterwards (done once, by the part's owner).
    Reduce { scale: bool },
    /// Overwrite this rank's copy with it (all-gather, broadcast).
    Store,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Recv {
    pub(crate) seg: usize,
    pub(crate) arrival: Arrival,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Send {
    pub(crate) seg: usize,
    /// How many receives must have completed before the segment holds
    /// what is to be sent.
    pub(crate) after: usize,
}

/// The schedule of one collective on one rank. All ranks derive their
/// plans from the same split of the buffer, so what one rank sends is, byte
/// for byte, what its right neighbour expects to receive.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Element ranges of the buffer, never empty.
    pub(crate) segments: Vec<Range<usize>>,
    /// Segments to send, in stream order.
    pub(crate) sends: Vec<Send>,
    /// Segments to receive, in stream order.
    pub(crate) recvs: Vec<Recv>,
}

impl Plan {
    /// Splits the `len` elements (of `elem_bytes` each) that start at
    /// `offset` into `parts` near-equal parts (the first `len % parts` one
    /// longer) and each part into segments; returns the segment indices of
    /// every part.
    pub(crate) fn split(
        &mut self,
        offset: usize,
        len: usize,
        parts: usize,
        elem_bytes: usize,
    ) -> Vec<Range<usize>> {
        let seg_elems = (SEGMENT_BYTES / elem_bytes).max(1);
        let (base, extra) = (len / parts, len % parts);
        let mut start = offset;
        (0..parts)
            .map(|p| {
                let end = start + base + usize::from(p < extra);
                let first = self.segments.len();
                let mut at = start;
                while at < end {
                    let next = (at + seg_elems).min(end);
                    self.segments.push(at..next);
                    at = next;
                }
                start = end;
                first..self.segments.len()
            })
            .collect()
    }

    /// Plans sending `seg` once everything received so far is in place.
    pub(crate) fn send_now(&mut self, seg: usize) {
        let after = self.recvs.len();
        self.sends.push(Send { seg, after });
    }

    pub(crate) fn receive(&mut self, seg: usize, arrival: Arrival) {
        self.recvs.push(Recv { seg, arrival });
    }
}

enum Outgoing {
    Header,
    Segment(usize),
}

/// Runs `plan` over `buf`: sends `header` then the planned segments,
/// receives and checks the left neighbour's header, then the planned
/// segments. `scratch` holds one incoming segment to be reduced; `scale` is
/// the factor for [`Arrival::Reduce`] with `scale: true`.
pub(crate) fn exchange<T: Element>(
    links: &RingLinks,
    buf: &mut [T],
    scratch: &mut [T],
    header: &Header,
    plan: &Plan,
    scale: Option<T>,
) -> Result<(), Fault> {
    let header_out = header.encode();
    let mut header_in = [0_u8; HEADER_BYTES];
    let mut header_received = false;

    // Sends whose data is ready, in stream order; `sent` bytes of the front
    // one are already written.
    let mut ready: VecDeque<Outgoing> = VecDeque::from([Outgoing::Header]);
    let mut sent = 0;
    let mut next_send = 0; // first plan.sends entry not yet in `ready`
    // How often each segment waits in `ready`: an arrival must not
    // overwrite a segment before it has left.
    let mut queued = vec![0_u32; plan.segments.len()];
    let mut next_recv = 0; // first plan.recvs entry not yet complete
    let mut received = 0; // bytes of the current arrival already read

    loop {
        while let Some(send) = plan.sends.get(next_send).filter(|s| s.after <= next_recv) {
            ready.push_back(Outgoing::Segment(send.seg));
            queued[send.seg] += 1;
            next_send += 1;
        }

        // Write until the socket is full, nothing is ready, or the link's
        // rate cap holds the rest back for `paced`.
        let mut paced = None;
        while let Some(front) = ready.front() {
            let bytes: &[u8] = match *front {
                Outgoing::Header => &header_out,
                Outgoing::Segment(s) => bytemuck::cast_slice(&buf[plan.segments[s].clone()]),
            };
            let mut rest = &bytes[sent..];
            if let Some(pace) = &links.pace {
                match pace.allowance(rest.len()) {
                    Ok(n) => rest = &rest[..n],
                    Err(wait) => {
                        paced = Some(wait);
                        break;
                    }
                }
            }
            match (&links.to_right).write(rest) {
                Ok(0) => return Err(Fault::ToRight(ErrorKind::WriteZero.into())),
                Ok(n) => {
                    if let Some(pace) = &links.pace {
                        pace.spend(n);
                    }
                    sent += n;
                    if sent == bytes.len() {
                        if let Outgoing::Segment(s) = *front {
                            queued[s] -= 1;
                        }
                        ready.pop_front();
                        sent = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Fault::ToRight(e)),
            }
        }

        // Read until the socket is empty, everything arrived, a completed
        // arrival makes a send ready, or the next arrival would overwrite a
        // segment that is still queued.
        let mut read_blocked = false;
        loop {
            let (target, recv): (&mut [u8], Option<Recv>) = if !header_received {
                (&mut header_in, None)
            } else if let Some(&recv) = plan.recvs.get(next_recv) {
                let range = plan.segments[recv.seg].clone();
                match recv.arrival {
                    Arrival::Reduce { .. } => (
                        bytemuck::cast_slice_mut(&mut scratch[..range.len()]),
                        Some(recv),
                    ),
                    Arrival::Store if queued[recv.seg] > 0 => break,
                    Arrival::Store => (bytemuck::cast_slice_mut(&mut buf[range]), Some(recv)),
                }
            } else {
                break;
            };
            let total = target.len();
            match (&links.from_left).read(&mut target[received..]) {
                Ok(0) => return Err(Fault::FromLeft(ErrorKind::UnexpectedEof.into())),
                Ok(n) => received += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    read_blocked = true;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fault::FromLeft(e)),
            }
            if received < total {
                continue;
            }
            received = 0;
            let Some(recv) = recv else {
                match Header::decode(&header_in) {
                    Some(theirs) if theirs == *header => {}
                    theirs => {
                        return Err(Fault::Mismatch {
                            ours: *header,
                            theirs,
                        });
                    }
                }
                header_received = true;
                continue;
            };
            if let Arrival::Reduce { scale: do_scale } = recv.arrival {
                let range = plan.segments[recv.seg].clone();
                let mine = &mut buf[range.clone()];
                for (m, t) in mine.iter_mut().zip(&scratch[..range.len()]) {
                    *m = *m + *t;
                }
                if let (true, Some(factor)) = (do_scale, scale) {
                    for m in mine.iter_mut() {
                        *m = *m * factor;
                    }
                }
            }
            next_recv += 1;
            if plan
                .sends
                .get(next_send)
                .is_some_and(|s| s.after <= next_recv)
            {
                break;
            }
        }

        let receiving = !header_received || next_recv < plan.recvs.len();
        let sending = !ready.is_empty() || next_send < plan.sends.len();
        if !sending && !receiving {
            return Ok(());
        }
        if plan
            .sends
            .get(next_send)
            .is_some_and(|s| s.after <= next_recv)
        {
            continue;
        }
        if let Some(pause) = paced {
            // The cap, not the socket, holds the writes back: wait for it,
            // or for bytes from the left.
            wait_for(links, receiving && read_blocked, pause)?;
            continue;
        }
        // Neither direction can move now: the write loop stopped on a full
        // socket (or had nothing to send), and the read loop on an empty
        // socket, the end, or a segment that must leave before it is
        // overwritten (then `ready` holds it and the write side is awaited).
        wait(links, !ready.is_empty(), receiving && read_blocked)?;
    }
}

/// Blocks until the right socket can take bytes (`want_write`) or the left
/// one has bytes (`want_read`), at most the timeout; a timeout is blamed on
/// the neighbour that is awaited.
fn wait(links: &RingLinks, want_write: bool, want_read: bool) -> Result<(), Fault> {
    // Only the awaited sockets: a hung-up socket that is not awaited would
    // make poll return at once, again and again.
    let write = || PollFd::new(&links.to_right, PollFlags::OUT);
    let read = || PollFd::new(&links.from_left, PollFlags::IN);
    let mut both;
    let mut one;
    let fds: &mut [PollFd<'_>] = match (want_write, want_read) {
        (true, true) => {
            both = [write(), read()];
            &mut both
        }
        (true, false) => {
            one = [write()];
            &mut one
        }
        (false, _) => {
            one = [read()];
            &mut one
        }
    };
    let timeout = Timespec::try_from(links.timeout).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    if !links.spin.is_zero() {
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let start = Instant::now();
        while start.elapsed() < links.spin {
            // An error here shows up again in the blocking poll below.
            if poll(fds, Some(&now)).is_ok_and(|ready| ready > 0) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }
    loop {
        match poll(fds, Some(&timeout)) {
            Ok(0) => {
                let timed_out = io::Error::from(ErrorKind::TimedOut);
                return Err(if want_read {
                    Fault::FromLeft(timed_out)
                } else {
                    Fault::ToRight(timed_out)
                });
            }
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Fault::FromLeft(e.into())),
        }
    }
}

/// Waits `pause` (the link's rate cap), or less if bytes arrive from the
/// left and `want_read`.
fn wait_for(links: &RingLinks, want_read: bool, pause: Duration) -> Result<(), Fault> {
    if !want_read {
        std::thread::sleep(pause);
        return Ok(());
    }
    let fds = &mut [PollFd::new(&links.from_left, PollFlags::IN)];
    let timeout = Timespec::try_from(pause).unwrap_or(Timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    });
    match poll(fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(Fault::FromLeft(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_the_range_with_nonempty_segments_in_order() {
        for len in [0, 1, 2, 3, 7, 100, 1001, 3 * SEGMENT_BYTES / 4 + 5] {
            for parts in 1..6 {
                let mut plan = Plan::default();
                let offset = 10;
                let parts_of = plan.split(offset, len, parts, 4);
                assert_eq!(parts_of.len(), parts);
                let mut at = offset;
                for seg in &plan.segments {
                    assert_eq!(seg.start, at);
                    assert!(seg.end > seg.start, "empty segment");
                    assert!(seg.len() * 4 <= SEGMENT_BYTES);
                    at = seg.end;
                }
                assert_eq!(at, offset + len);
                let part_lens: Vec<usize> = parts_of
                    .iter()
                    .map(|p| plan.segments[p.clone()].iter().map(|s| s.len()).sum())
                    .collect();
                let (min, max) = (
                    part_lens.iter().min().unwrap(),
                    part_lens.iter().max().unwrap(),
                );
                assert!(max - min <= 1, "{part_lens:?}");
            }
        }
    }
}
