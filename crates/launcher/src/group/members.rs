//! Who runs each attempt of a job of several machines. A fixed job
//! (`--nnodes N`) runs every attempt on its N machines, seat k of the
//! launchers' store being node rank k. An elastic one (`--nnodes MIN:MAX`)
//! has more seats than machines, so that a machine that comes back takes a
//! new one: node 0 picks each attempt's machines from the seats whose
//! launchers are there (in seat order, at most MAX, at least MIN, waiting
//! up to the join timeout for MIN), numbers them 0.. for the attempt's
//! workers, and a launcher left out stands by for the next attempt or the
//! job's end.

use std::time::{Duration, Instant};

use comm::Store;

use super::{NodeGroup, POLL};
use crate::error::LaunchError;
use crate::heartbeat;
use crate::plan::NodeSlot;

/// How long node 0 waits for more machines once MIN are there, before the
/// first attempt of an elastic job (torchrun's `last_call_timeout`).
const LAST_CALL: Duration = Duration::from_secs(30);

/// Where node 0 says which attempt runs (or is about to).
const CURRENT_KEY: &str = "attempt/current";

/// Where node 0 says the job is over, for launchers standing by.
const END_KEY: &str = "job/end";

fn members_key(attempt: u32) -> String {
    format!("attempt/{attempt}/members")
}

fn port_key(attempt: u32) -> String {
    format!("attempt/{attempt}/port")
}

fn left_key(seat: usize) -> String {
    format!("standby/{seat}/left")
}

/// The machines of a job: how many at least and at most, the seats at the
/// launchers' store, and those of the running attempt.
pub struct Membership {
    pub min: usize,
    pub max: usize,
    /// `max`, or for an elastic job enough for every machine to come back
    /// once per restart.
    pub seats: usize,
    /// The seats of the running attempt's machines, node 0's first.
    pub current: Vec<usize>,
}

impl Membership {
    /// The machines of a job of `min` to `max` machines restarted at most
    /// `max_restarts` times.
    pub fn new((min, max): (usize, usize), max_restarts: u32) -> Self {
        let seats = match min < max {
            true => max * (max_restarts as usize + 1),
            false => max,
        };
        Membership {
            min,
            max,
            seats,
            current: (0..max).collect(),
        }
    }

    pub fn is_elastic(&self) -> bool {
        self.min < self.max
    }

    /// The running attempt's machines other than node 0.
    pub fn others(&self) -> Vec<usize> {
        self.current.iter().copied().filter(|&s| s != 0).collect()
    }
}

/// What a launcher does next.
pub enum Place {
    /// Runs `attempt` as `slot`, its workers meeting at `master`.
    Run {
        attempt: u32,
        slot: NodeSlot,
        master: (String, u16),
    },
    /// Nothing: the job ended while this launcher stood by.
    JobOver,
}

impl NodeGroup {
    /// The attempt this launcher begins with: the first, or (a machine
    /// joining an elastic job under way) the one node 0 runs now.
    pub fn first_attempt(&mut self) -> Result<u32, LaunchError> {
        if self.server.is_some() {
            return Ok(0);
        }
        Ok(match self.store.look(CURRENT_KEY)? {
            Some(bytes) => u32::from_be_bytes(bytes.try_into().unwrap_or_default()),
            None => 0,
        })
    }

    /// Where this machine runs `attempt`: node 0 picks the attempt's
    /// machines and a free port for its workers' store; the others wait for
    /// them, and one left out waits for the next attempt.
    pub fn place(&mut self, attempt: u32) -> Result<Place, LaunchError> {
        if self.server.is_some() {
            self.store.set(CURRENT_KEY, &attempt.to_be_bytes())?;
            let members = self.choose_members(attempt)?;
            let seats: Vec<String> = members.iter().map(usize::to_string).collect();
            self.store
                .set(&members_key(attempt), seats.join(",").as_bytes())?;
            let port = crate::attempt::free_port()?;
            self.store.set(&port_key(attempt), &port.to_be_bytes())?;
            self.announce(attempt, &members);
            return Ok(self.run(attempt, members, port));
        }
        let mut attempt = attempt;
        let mut standing_by = false;
        loop {
            let Some((port, members)) = self.wait_for_attempt(attempt, standing_by)? else {
                let _ = self.store.set(&left_key(self.node_rank), b"");
                return Ok(Place::JobOver);
            };
            if members.contains(&self.node_rank) {
                return Ok(self.run(attempt, members, port));
            }
            if !standing_by {
                tell!(
                    "launcher: node {}: attempt {attempt} runs on {} machine(s) without this one; standing by for the next restart",
                    self.node_rank,
                    members.len()
                );
            }
            standing_by = true;
            attempt += 1;
        }
    }

    fn run(&mut self, attempt: u32, members: Vec<usize>, port: u16) -> Place {
        let slot = NodeSlot {
            node_rank: members
                .iter()
                .position(|&s| s == self.node_rank)
                .unwrap_or(0),
            nnodes: members.len(),
        };
        self.members.current = members;
        Place::Run {
            attempt,
            slot,
            master: (self.master.addr.clone(), port),
        }
    }

    /// An elastic job says on which machines each attempt runs.
    fn announce(&mut self, attempt: u32, members: &[usize]) {
        if self.members.is_elastic() {
            let hosts: Vec<String> = members.iter().map(|&k| self.host(k)).collect();
            tell!(
                "launcher: attempt {attempt} runs on {} of {}:{} machines ({})",
                members.len(),
                self.members.min,
                self.members.max,
                hosts.join(", ")
            );
        }
    }

    /// Node 0: the machines of `attempt`. A fixed job's are all of them
    /// (they met when the launchers joined); an elastic job's are those
    /// there now, once MIN are (and, before the first attempt, MAX or the
    /// last call for more has passed).
    fn choose_members(&mut self, attempt: u32) -> Result<Vec<usize>, LaunchError> {
        if !self.members.is_elastic() {
            return Ok(self.members.current.clone());
        }
        let (min, max) = (self.members.min, self.members.max);
        let deadline = Instant::now() + self.rdzv_timeout;
        let mut enough_since: Option<Instant> = None;
        loop {
            let mut present: Vec<usize> = std::iter::once(0).chain(self.present()?).collect();
            present.truncate(max);
            let now = Instant::now();
            if present.len() >= min {
                let since = *enough_since.get_or_insert(now);
                let last_call = LAST_CALL.min(self.rdzv_timeout);
                if present.len() == max || attempt > 0 || now >= since + last_call {
                    return Ok(present);
                }
            } else if now >= deadline {
                refuse!(
                    Rendezvous,
                    "node 0: {} machine(s) joined the launchers at {}:{} within {:?} (the join timeout, --rdzv-timeout), fewer than --nnodes {min}:{max} needs: start a launcher on more machines, or raise --rdzv-timeout",
                    present.len(),
                    self.master.addr,
                    self.master.port,
                    self.rdzv_timeout
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Node 0: the seats past 0 whose launchers are there to run an
    /// attempt: joined, not left or fallen silent, and not gone from
    /// standing by. One request for them all.
    fn present(&mut self) -> Result<Vec<usize>, LaunchError> {
        let seats = 1..self.members.seats;
        let keys: Vec<String> = (seats.clone())
            .flat_map(|k| {
                [
                    format!("joined/{k}"),
                    Store::departed_key(k),
                    left_key(k),
                    heartbeat::key(k),
                ]
            })
            .collect();
        let mut values = self.store.look_all(&keys)?.into_iter();
        let mut present = Vec::new();
        for k in seats {
            let mut next = || values.next().flatten();
            let (joined, departed, left, beat) = (next(), next(), next(), next());
            let gone = departed.is_some() || left.is_some();
            if joined.is_some() && !gone && self.silent(k, beat).is_none() {
                present.push(k);
            }
        }
        Ok(present)
    }

    /// A node other than 0: the port and machines of `attempt`, or `None`
    /// when the job ended first. Node 0 may still be waiting for other
    /// nodes to join, or giving its workers their grace; a launcher
    /// standing by waits as long as the job runs. Looks, not a wait in the
    /// store: the heartbeat shares the connection.
    fn wait_for_attempt(
        &mut self,
        attempt: u32,
        standing_by: bool,
    ) -> Result<Option<(u16, Vec<usize>)>, LaunchError> {
        let patience = match attempt {
            0 => self.rdzv_timeout,
            _ if self.members.is_elastic() => self.rdzv_timeout,
            _ => self.timeout * 2,
        } + Duration::from_secs(30);
        let until = Instant::now() + patience;
        let node = self.node_rank;
        let keys = [port_key(attempt), members_key(attempt), END_KEY.to_string()];
        loop {
            let values = match self.store.look_all(&keys) {
                Ok(values) => values,
                Err(e) => refuse!(
                    Rendezvous,
                    "{} (before attempt {attempt})",
                    self.master_lost(&e)
                ),
            };
            match <[_; 3]>::try_from(values) {
                Ok([Some(port), Some(members), _]) => {
                    return decode(&port, &members).map(Some).ok_or_else(|| {
                        LaunchError::Rendezvous(format!(
                            "node {node}: node 0 gave attempt {attempt} a malformed port or machine list"
                        ))
                    });
                }
                Ok([_, _, Some(_)]) => return Ok(None),
                _ if standing_by || Instant::now() < until => std::thread::sleep(POLL),
                _ => refuse!(
                    Rendezvous,
                    "node {node}: node 0 did not start attempt {attempt} within {patience:?}"
                ),
            }
        }
    }

    /// Node 0, at the job's end: says so to the launchers standing by, and
    /// waits (up to `wait`) for them to hear it.
    pub(super) fn dismiss_standby(&mut self, wait: Duration) {
        if self.store.set(END_KEY, b"").is_err() || !self.members.is_elastic() {
            return;
        }
        let until = Instant::now() + wait;
        while let Ok(present) = self.present() {
            let standing_by = present.iter().any(|k| !self.members.current.contains(k));
            if !standing_by || Instant::now() >= until {
                return;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// A port and a list of seats, as node 0 wrote them.
fn decode(port: &[u8], members: &[u8]) -> Option<(u16, Vec<usize>)> {
    let port = u16::from_be_bytes(port.try_into().ok()?);
    let members = std::str::from_utf8(members).ok()?;
    let seats = members.split(',').map(|s| s.parse().ok());
    Some((port, seats.collect::<Option<Vec<usize>>>()?))
}
