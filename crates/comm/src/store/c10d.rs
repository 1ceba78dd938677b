//! The job's store when a launcher hosts it: a client of PyTorch's c10d
//! `TCPStore` (torch/csrc/distributed/c10d/TCPStore.cpp, and its libuv
//! server), as torchrun's workers meet at its agent's store
//! (`TORCHELASTIC_USE_AGENT_STORE=True`).
//!
//! The protocol is one connection of queries: a command byte, then its
//! arguments, integers in the machine's byte order (little-endian on every
//! platform PyTorch ships for), keys and values as a `u64` length and the
//! bytes. `SET` is not answered; the others are. A connection opens with
//! `VALIDATE` (a magic number) and a `PING` whose nonce the store echoes,
//! as PyTorch's own client does. PyTorch's client writes `/` before every
//! key, and so does this one: PyTorch sees the job's keys under the names
//! this crate gives them (with the store's key prefix).
//!
//! The store knows no job: the ranks register by checking each other
//! through it (`compare-set` of the world size, `add` to their rank's
//! counter), and a rank that gives up on the rendezvous leaves its reason
//! under a key that waiting ranks look at between slices of their wait.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::Store;
use crate::error::{CommError, Rejection};
use crate::store_protocol::{MAX_FRAME, Response};

// The query types this client sends (c10d's `QueryType`).
const VALIDATE: u8 = 0;
const SET: u8 = 1;
const COMPARE_SET: u8 = 2;
const GET: u8 = 3;
const ADD: u8 = 4;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const CANCEL_WAIT: u8 = 12;
const PING: u8 = 13;

/// What `VALIDATE` carries (c10d's `validationMagicNumber`).
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// `CHECK`'s answer when every key is set (else `NOT_READY`, 1).
const READY: u8 = 0;
/// `WAIT`'s answers: the keys are set, or the wait was cancelled.
const STOP_WAITING: u8 = 0;
const WAIT_CANCELED: u8 = 1;

/// The keys through which the ranks check each other.
const WORLD_SIZE_KEY: &str = "comm/world_size";
const POISON_KEY: &str = "comm/poison";

/// How long one wait at the store runs before the rank looks whether
/// another rank gave up on the rendezvous: the store wakes a waiter only
/// for the keys it waits on.
const POISON_LOOK: Duration = Duration::from_millis(200);

/// One query, built in memory and sent in one write.
struct Query(Vec<u8>);

impl Query {
    fn new(command: u8) -> Self {
        Query(vec![command])
    }

    fn word(mut self, n: u64) -> Self {
        self.0.extend_from_slice(&n.to_le_bytes());
        self
    }

    fn bytes(self, bytes: &[u8]) -> Self {
        let mut query = self.word(bytes.len() as u64);
        query.0.extend_from_slice(bytes);
        query
    }

    fn send(self, mut stream: &TcpStream) -> io::Result<()> {
        stream.write_all(&self.0)
    }
}

fn read_array<const N: usize>(mut stream: &TcpStream) -> io::Result<[u8; N]> {
    let mut bytes = [0; N];
    stream.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn read_byte(stream: &TcpStream) -> io::Result<u8> {
    Ok(read_array::<1>(stream)?[0])
}

/// A value the store sent: its length, then its bytes, at most
/// [`MAX_FRAME`] of them.
fn read_value(mut stream: &TcpStream) -> io::Result<Vec<u8>> {
    let len = u64::from_le_bytes(read_array(stream)?);
    if len > MAX_FRAME as u64 {
        return Err(garbled(format!("a value of {len} bytes")));
    }
    let mut value = vec![0; len as usize];
    stream.read_exact(&mut value)?;
    Ok(value)
}

fn garbled(what: String) -> io::Error {
    io::Error::new(
        ErrorKind::InvalidData,
        format!("the store answered {what}, which is not c10d's TCPStore protocol"),
    )
}

/// Opens the conversation as PyTorch's client does, and checks that a
/// TCPStore answers.
pub(super) fn validate(stream: &TcpStream) -> io::Result<()> {
    let nonce = std::process::id();
    let mut query = Query::new(VALIDATE);
    query.0.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
    query.0.push(PING);
    query.0.extend_from_slice(&nonce.to_le_bytes());
    query.send(stream)?;
    match u32::from_le_bytes(read_array(stream)?) {
        echo if echo == nonce => Ok(()),
        other => Err(garbled(format!("the ping {nonce:#x} with {other:#x}"))),
    }
}

/// The error of a connection on which no TCPStore answered.
pub(super) fn not_a_store(master: &str, e: &io::Error) -> CommError {
    CommError::Store {
        master: master.to_string(),
        detail: format!(
            "torchrun's agent should host a c10d TCPStore there (TORCHELASTIC_USE_AGENT_STORE=True), and none answered ({e}); unset TORCHELASTIC_USE_AGENT_STORE if rank 0 is to host the store"
        ),
    }
}

pub(super) fn set(stream: &TcpStream, key: &str, value: &[u8]) -> io::Result<()> {
    Query::new(SET)
        .bytes(key.as_bytes())
        .bytes(value)
        .send(stream)
}

/// Sets `key` to `desired` if it holds `expected` (empty: is not set);
/// the value it holds afterwards.
pub(super) fn compare_set(
    stream: &TcpStream,
    key: &str,
    expected: &[u8],
    desired: &[u8],
) -> io::Result<Vec<u8>> {
    Query::new(COMPARE_SET)
        .bytes(key.as_bytes())
        .bytes(expected)
        .bytes(desired)
        .send(stream)?;
    read_value(stream)
}

/// The value of `key`, which must be set: an older store closes the
/// connection of a `GET` of a missing key.
pub(super) fn get(stream: &TcpStream, key: &str) -> io::Result<Vec<u8>> {
    Query::new(GET).bytes(key.as_bytes()).send(stream)?;
    read_value(stream)
}

/// Adds `delta` to the number `key` holds (0 when not set); the sum.
pub(super) fn add(stream: &TcpStream, key: &str, delta: i64) -> io::Result<i64> {
    Query::new(ADD)
        .bytes(key.as_bytes())
        .word(delta as u64)
        .send(stream)?;
    Ok(i64::from_le_bytes(read_array(stream)?))
}

/// Whether `key` is set, without waiting.
pub(super) fn check(stream: &TcpStream, key: &str) -> io::Result<bool> {
    Query::new(CHECK)
        .word(1)
        .bytes(key.as_bytes())
        .send(stream)?;
    Ok(read_byte(stream)? == READY)
}

/// Waits up to `within` (not zero) for `key` to be set; if it is not,
/// cancels the wait, whose answer must come within `reply`. Whether it is
/// set.
pub(super) fn wait_until_set(
    stream: &TcpStream,
    key: &str,
    within: Duration,
    reply: Duration,
) -> io::Result<bool> {
    Query::new(WAIT)
        .word(1)
        .bytes(key.as_bytes())
        .send(stream)?;
    stream.set_read_timeout(Some(within))?;
    match read_byte(stream) {
        Ok(STOP_WAITING) => return Ok(true),
        Ok(other) => return Err(garbled(format!("a wait with {other}"))),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        Err(e) => return Err(e),
    }
    Query::new(CANCEL_WAIT).send(stream)?;
    stream.set_read_timeout(Some(reply))?;
    // The key may have come just before the cancel: then both answers.
    match read_byte(stream)? {
        WAIT_CANCELED => Ok(false),
        STOP_WAITING if read_byte(stream)? == WAIT_CANCELED => Ok(true),
        other => Err(garbled(format!("a cancelled wait with {other}"))),
    }
}

impl Store {
    /// `key` as it is named in the launcher's store; `None` at rank 0's.
    pub(super) fn agent_key(&self, key: &str) -> Option<String> {
        self.agent.as_ref().map(|prefix| format!("/{prefix}{key}"))
    }

    /// `key` in the launcher's store (this store must be one).
    fn at_agent(&self, key: &str) -> String {
        self.agent_key(key).unwrap_or_default()
    }

    /// What rank 0's store checks when a rank says hello, checked by the
    /// ranks themselves: the first rank sets the job's world size, and
    /// every rank counts itself in under its rank. A rank that finds a
    /// conflict ends the rendezvous for all.
    pub(super) fn register_at_agent(&mut self, rank: usize, world: usize) -> Result<(), CommError> {
        self.fail_if_poisoned()?;
        let (key, ours) = (self.at_agent(WORLD_SIZE_KEY), world.to_string());
        let agreed = self.exchange(Duration::ZERO, |s| {
            compare_set(s, &key, b"", ours.as_bytes())
        })?;
        let refusal = if agreed != ours.as_bytes() {
            Some(Rejection::WorldSizeMismatch {
                rank,
                rank_world_size: world,
                master_world_size: String::from_utf8_lossy(&agreed).parse().unwrap_or(0),
            })
        } else {
            let key = self.at_agent(&format!("comm/rank/{rank}"));
            let count = self.exchange(Duration::ZERO, |s| add(s, &key, 1))?;
            (count > 1).then_some(Rejection::DuplicateRank { rank })
        };
        match refusal {
            Some(reason) => {
                // Best effort: this rank's own error says it all.
                let _ = self.poison_at_agent(&reason);
                Err(reason.into())
            }
            None => self.fail_if_poisoned(),
        }
    }

    /// [`Store::wait_for`] at the launcher's store: waits in slices, and
    /// between them fails with the reason a rank that gave up left.
    pub(super) fn wait_at_agent(
        &mut self,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Vec<u8>>, CommError> {
        let deadline = Instant::now() + wait;
        loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(POISON_LOOK);
            let reply = self.reply_timeout;
            let set = match slice.is_zero() {
                true => self.exchange(Duration::ZERO, |s| check(s, key))?,
                false => self.exchange(slice, |s| wait_until_set(s, key, slice, reply))?,
            };
            if set {
                return self.exchange(Duration::ZERO, |s| get(s, key)).map(Some);
            }
            self.fail_if_poisoned()?;
            if slice.is_zero() {
                return Ok(None);
            }
        }
    }

    /// Ends the rendezvous with `reason`, unless a rank already did.
    pub(super) fn poison_at_agent(&mut self, reason: &Rejection) -> Result<(), CommError> {
        let key = self.at_agent(POISON_KEY);
        let value = Response::Rejected(reason.clone()).encode();
        self.exchange(Duration::ZERO, |s| compare_set(s, &key, b"", &value))
            .map(drop)
    }

    /// The reason a rank left under [`POISON_KEY`], as this rank's error.
    fn fail_if_poisoned(&mut self) -> Result<(), CommError> {
        let key = self.at_agent(POISON_KEY);
        if !self.exchange(Duration::ZERO, |s| check(s, &key))? {
            return Ok(());
        }
        let value = self.exchange(Duration::ZERO, |s| get(s, &key))?;
        match Response::decode(&value) {
            Ok(Response::Rejected(reason)) => Err(reason.into()),
            _ => Err(CommError::Store {
                master: self.master.clone(),
                detail: format!(
                    "key {key:?} holds no reason this program wrote: another program uses this job's keys"
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
