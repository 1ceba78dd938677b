//! Wire format of the rendezvous store.
//!
//! Every message is one frame: a little-endian `u32` payload length, then the
//! payload. Payloads start with a tag byte; integers are little-endian `u64`,
//! byte strings are a `u32` length plus the bytes. Frames are bounded so a
//! stray client (a port scanner, a curl) cannot make the store allocate
//! without limit.
//!
//! The protocol grows by new tags only: a tag's layout never changes, so an
//! older client is served as before. A store that predates a tag closes
//! the connection of a client that sends it (an unknown message); `Look`
//! is sent only by node 0's launcher to the store it hosts itself, which
//! is always as new as its client.

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::error::Rejection;

/// Most keys one [`Request::Look`] may name: the launcher looks at three
/// at a time, and the bound keeps a hostile count from costing anything.
pub(crate) const MAX_LOOK_KEYS: usize = 64;

/// Largest payload either side accepts. Values are addresses and ids of a few
/// hundred bytes; 16 MiB leaves room without inviting abuse.
pub(crate) const MAX_FRAME: usize = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// First message of every connection: who is asking.
    Hello {
        rank: usize,
        world_size: usize,
    },
    /// A first message instead of `Hello`, from a client that takes the
    /// lowest rank not yet registered, above 0 (the host's): answered with
    /// the rank as a `Value` of 8 little-endian bytes.
    Join {
        world_size: usize,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    /// Answered with the value, or `NotFound` once `wait` has passed.
    Get {
        key: String,
        wait: Duration,
    },
    /// Ends the rendezvous for everyone with this reason (unless an
    /// earlier one is already recorded).
    Poison(Rejection),
    /// The values of up to [`MAX_LOOK_KEYS`] keys as they stand at one
    /// instant, without waiting: answered with `Values`, in order.
    Look {
        keys: Vec<String>,
    },
    /// A member of a job whose membership may change asks to be one of
    /// the next generation (`crate::Generation`): `step`, the optimizer
    /// steps its state holds (`None`: a newcomer without one); `suspect`,
    /// the member (by slot) it timed out waiting for. Answered with
    /// `Generation`, `Evicted`, `JobOver`, `Lost`, or `NotFound` once
    /// `wait` has passed.
    Enlist {
        step: Option<u64>,
        suspect: Option<usize>,
        wait: Duration,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    Ok,
    Value(Vec<u8>),
    NotFound,
    Rejected(Rejection),
    /// A `Look`'s answer: each key's value, `None` where it is not set.
    Values(Vec<Option<Vec<u8>>>),
    /// An `Enlist`'s answer: generation `number` is formed, of these
    /// members (slot and step, in rank order).
    Generation {
        number: u64,
        members: Vec<(usize, Option<u64>)>,
    },
    /// The asker was left out of generation `generation` (it did not
    /// enlist in time: hung or stopped): it is no member any more.
    Evicted {
        generation: u64,
    },
    /// The job's members finished: there is nothing left to join.
    JobOver,
    /// No member holding the job's state is left to form a generation.
    Lost,
}

const HELLO: u8 = 1;
const SET: u8 = 2;
const GET: u8 = 3;
const POISON: u8 = 4;
const JOIN: u8 = 5;
const LOOK: u8 = 6;
const ENLIST: u8 = 7;

const OK: u8 = 0;
const VALUE: u8 = 1;
const NOT_FOUND: u8 = 2;
const REJECTED: u8 = 3;
const VALUES: u8 = 4;
const GENERATION: u8 = 5;
const EVICTED: u8 = 6;
const JOB_OVER: u8 = 7;
const LOST: u8 = 8;

const UNSET: u8 = 0;
const SET_VALUE: u8 = 1;

const WORLD_SIZE_MISMATCH: u8 = 0;
const DUPLICATE_RANK: u8 = 1;
const RANK_OUT_OF_RANGE: u8 = 2;
const RANKS_MISSING: u8 = 3;

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Writes one frame and flushes it.
pub(crate) fn write_frame(mut w: impl Write, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(invalid(format!(
            "frame of {} bytes exceeds the {MAX_FRAME}-byte limit",
            payload.len()
        )));
    }
    let len =
        u32::try_from(payload.len()).map_err(|_| invalid("frame length does not fit in u32"))?;
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(payload);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame's payload.
///
/// The length is checked against [`MAX_FRAME`] before anything is allocated,
/// and the buffer grows with the bytes that actually arrive: a length prefix
/// alone reserves nothing, so a peer that announces 16 MiB and stalls costs
/// what it sent.
pub(crate) fn read_frame(mut r: impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0_u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(invalid(format!(
            "frame of {len} bytes exceeds the {MAX_FRAME}-byte limit (not a comm store client?)"
        )));
    }
    let mut payload = Vec::new();
    r.take(len as u64).read_to_end(&mut payload)?;
    if payload.len() < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame ends after {} of {len} bytes", payload.len()),
        ));
    }
    Ok(payload)
}

struct Encoder(Vec<u8>);

impl Encoder {
    fn new(tag: u8) -> Self {
        Encoder(vec![tag])
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn usize(self, v: usize) -> Self {
        self.u64(v as u64)
    }
    fn maybe(self, v: Option<u64>) -> Self {
        match v {
            None => self.u8(UNSET),
            Some(v) => self.u8(SET_VALUE).u64(v),
        }
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        // Frames are capped at MAX_FRAME, far below u32::MAX; write_frame
        // rejects anything larger before it reaches the wire.
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
}

struct Decoder<'a> {
    rest: &'a [u8],
}

impl<'a> Decoder<'a> {
    fn new(payload: &'a [u8]) -> io::Result<(u8, Self)> {
        match payload.split_first() {
            Some((&tag, rest)) => Ok((tag, Decoder { rest })),
            None => Err(invalid("empty message")),
        }
    }
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(invalid("truncated message"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0_u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn usize(&mut self) -> io::Result<usize> {
        usize::try_from(self.u64()?).map_err(|_| invalid("integer does not fit in usize"))
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let mut b = [0_u8; 4];
        b.copy_from_slice(self.take(4)?);
        let len = u32::from_le_bytes(b) as usize;
        Ok(self.take(len)?.to_vec())
    }
    fn maybe(&mut self) -> io::Result<Option<u64>> {
        match self.u8()? {
            UNSET => Ok(None),
            SET_VALUE => self.u64().map(Some),
            other => Err(invalid(format!("unknown value mark {other}"))),
        }
    }
    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| invalid("key is not UTF-8"))
    }
    /// A count of entries that take at least `min_bytes` each, at most
    /// [`MAX_LOOK_KEYS`]: refused before anything is allocated for it.
    fn count(&mut self, min_bytes: usize) -> io::Result<usize> {
        let count = self.u64()?;
        if count > MAX_LOOK_KEYS as u64 {
            return Err(invalid(format!(
                "a look at {count} keys exceeds the {MAX_LOOK_KEYS}-key limit"
            )));
        }
        let count = count as usize;
        if count > self.rest.len() / min_bytes {
            return Err(invalid("truncated message"));
        }
        Ok(count)
    }
    fn finish<T>(self, value: T) -> io::Result<T> {
        if self.rest.is_empty() {
            Ok(value)
        } else {
            Err(invalid("trailing bytes after message"))
        }
    }
}

fn encode_rejection(e: Encoder, r: &Rejection) -> Encoder {
    match r {
        Rejection::WorldSizeMismatch {
            rank,
            rank_world_size,
            master_world_size,
        } => e
            .u64(u64::from(WORLD_SIZE_MISMATCH))
            .usize(*rank)
            .usize(*rank_world_size)
            .usize(*master_world_size),
        Rejection::DuplicateRank { rank } => e.u64(u64::from(DUPLICATE_RANK)).usize(*rank),
        Rejection::RankOutOfRange { rank, world_size } => e
            .u64(u64::from(RANK_OUT_OF_RANGE))
            .usize(*rank)
            .usize(*world_size),
        Rejection::RanksMissing {
            missing,
            world_size,
        } => missing.iter().fold(
            e.u64(u64::from(RANKS_MISSING))
                .usize(*world_size)
                .usize(missing.len()),
            |e, &m| e.usize(m),
        ),
    }
}

fn decode_rejection(d: &mut Decoder<'_>) -> io::Result<Rejection> {
    let kind = d.u64()?;
    Ok(match u8::try_from(kind) {
        Ok(WORLD_SIZE_MISMATCH) => Rejection::WorldSizeMismatch {
            rank: d.usize()?,
            rank_world_size: d.usize()?,
            master_world_size: d.usize()?,
        },
        Ok(DUPLICATE_RANK) => Rejection::DuplicateRank { rank: d.usize()? },
        Ok(RANK_OUT_OF_RANGE) => Rejection::RankOutOfRange {
            rank: d.usize()?,
            world_size: d.usize()?,
        },
        Ok(RANKS_MISSING) => {
            let world_size = d.usize()?;
            let count = d.usize()?;
            // Each entry takes 8 bytes: a count the payload cannot hold is
            // refused before allocating for it.
            if count > d.rest.len() / 8 {
                return Err(invalid("truncated message"));
            }
            let missing = (0..count).map(|_| d.usize()).collect::<io::Result<_>>()?;
            Rejection::RanksMissing {
                missing,
                world_size,
            }
        }
        _ => return Err(invalid(format!("unknown rejection kind {kind}"))),
    })
}

/// `wait` in whole milliseconds, rounded up: the store waits at least as
/// long as asked.
fn millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

impl Request {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello { rank, world_size } => {
                Encoder::new(HELLO).usize(*rank).usize(*world_size).0
            }
            Request::Join { world_size } => Encoder::new(JOIN).usize(*world_size).0,
            Request::Set { key, value } => Encoder::new(SET).bytes(key.as_bytes()).bytes(value).0,
            Request::Get { key, wait } => {
                Encoder::new(GET).bytes(key.as_bytes()).u64(millis(*wait)).0
            }
            Request::Poison(r) => encode_rejection(Encoder::new(POISON), r).0,
            Request::Look { keys } => {
                keys.iter()
                    .fold(Encoder::new(LOOK).usize(keys.len()), |e, k| {
                        e.bytes(k.as_bytes())
                    })
                    .0
            }
            Request::Enlist {
                step,
                suspect,
                wait,
            } => {
                Encoder::new(ENLIST)
                    .maybe(*step)
                    .maybe(suspect.map(|s| s as u64))
                    .u64(millis(*wait))
                    .0
            }
        }
    }

    pub(crate) fn decode(payload: &[u8]) -> io::Result<Self> {
        let (tag, mut d) = Decoder::new(payload)?;
        match tag {
            HELLO => {
                let rank = d.usize()?;
                let world_size = d.usize()?;
                d.finish(Request::Hello { rank, world_size })
            }
            JOIN => {
                let world_size = d.usize()?;
                d.finish(Request::Join { world_size })
            }
            SET => {
                let key = d.string()?;
                let value = d.bytes()?;
                d.finish(Request::Set { key, value })
            }
            GET => {
                let key = d.string()?;
                let wait = Duration::from_millis(d.u64()?);
                d.finish(Request::Get { key, wait })
            }
            POISON => {
                let rejection = decode_rejection(&mut d)?;
                d.finish(Request::Poison(rejection))
            }
            LOOK => {
                // Each key takes its 4-byte length at least.
                let count = d.count(4)?;
                let keys = (0..count).map(|_| d.string()).collect::<io::Result<_>>()?;
                d.finish(Request::Look { keys })
            }
            ENLIST => {
                let step = d.maybe()?;
                let suspect = d.maybe()?.map(|s| s as usize);
                let wait = Duration::from_millis(d.u64()?);
                d.finish(Request::Enlist {
                    step,
                    suspect,
                    wait,
                })
            }
            other => Err(invalid(format!("unknown request tag {other}"))),
        }
    }
}

impl Response {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Response::Ok => Encoder::new(OK).0,
            Response::Value(v) => Encoder::new(VALUE).bytes(v).0,
            Response::NotFound => Encoder::new(NOT_FOUND).0,
            Response::Rejected(r) => encode_rejection(Encoder::new(REJECTED), r).0,
            Response::Values(values) => {
                values
                    .iter()
                    .fold(Encoder::new(VALUES).usize(values.len()), |e, v| match v {
                        None => e.u8(UNSET),
                        Some(v) => e.u8(SET_VALUE).bytes(v),
                    })
                    .0
            }
            Response::Generation { number, members } => {
                (members.iter())
                    .fold(
                        Encoder::new(GENERATION).u64(*number).usize(members.len()),
                        |e, &(slot, step)| e.usize(slot).maybe(step),
                    )
                    .0
            }
            Response::Evicted { generation } => Encoder::new(EVICTED).u64(*generation).0,
            Response::JobOver => Encoder::new(JOB_OVER).0,
            Response::Lost => Encoder::new(LOST).0,
        }
    }

    pub(crate) fn decode(payload: &[u8]) -> io::Result<Self> {
        let (tag, mut d) = Decoder::new(payload)?;
        match tag {
            OK => d.finish(Response::Ok),
            VALUE => {
                let v = d.bytes()?;
                d.finish(Response::Value(v))
            }
            NOT_FOUND => d.finish(Response::NotFound),
            REJECTED => {
                let rejection = decode_rejection(&mut d)?;
                d.finish(Response::Rejected(rejection))
            }
            VALUES => {
                // Each value takes its 1-byte mark at least.
                let count = d.count(1)?;
                let values = (0..count)
                    .map(|_| match d.u8()? {
                        UNSET => Ok(None),
                        SET_VALUE => d.bytes().map(Some),
                        other => Err(invalid(format!("unknown value mark {other}"))),
                    })
                    .collect::<io::Result<_>>()?;
                d.finish(Response::Values(values))
            }
            GENERATION => {
                let number = d.u64()?;
                // Each member takes its slot and a mark at least: a count
                // the payload cannot hold is refused before allocating.
                let count = d.usize()?;
                if count > d.rest.len() / 9 {
                    return Err(invalid("truncated message"));
                }
                let members = (0..count)
                    .map(|_| Ok((d.usize()?, d.maybe()?)))
                    .collect::<io::Result<_>>()?;
                d.finish(Response::Generation { number, members })
            }
            EVICTED => {
                let generation = d.u64()?;
                d.finish(Response::Evicted { generation })
            }
            JOB_OVER => d.finish(Response::JobOver),
            LOST => d.finish(Response::Lost),
            other => Err(invalid(format!("unknown response tag {other}"))),
        }
    }
}

#[cfg(test)]
mod tests;
