//! Who runs each attempt of a job of several machines. A fixed job
//! (`--nnodes N`) runs every attempt on its N machines, seat k of the
//! launchers' store being node rank k. An elastic one (`--nnodes MIN:MAX`)
//! has more seats than machines, so that a machine that comes back takes a
//! new one: node 0 picks each attempt's machines from the seats whose
//! launchers are there (in seat order, at most MAX, at least MIN, waiting
//! up to the join timeout for MIN), numbers them 0.. for the attempt's
//! workers, and a launcher left out stands by for the next attempt or the
//! job's end. In a live elastic job (`LostMachine::LeavesPlace`) a lost machine
//! does not end the attempt: its place stands vacant while the others'
//! ranks go on, and node 0 seats the next launcher that stands by there,
//! in the running attempt, its ranks joining the job as newcomers.

use std::time::{Duration, Instant};

use comm::{CommError, Store};

use super::{NodeGroup, POLL};
use crate::error::LaunchError;
use crate::heartbeat;
use crate::plan::NodeSlot;

/// How long node 0 waits for more machines once MIN are there, before the
/// first attempt of an elastic job (torchrun's `last_call_timeout`).
const LAST_CALL: Duration = Duration::from_secs(30);

/// Where node 0 says which attempt runs (or is about to).
const CURRENT_KEY: &str = "attempt/current";

/// Where node 0 says the job is over, for launchers standing by (and, in
/// a live job, for machines whose ranks joined too late to train).
pub(super) const END_KEY: &str = "job/end";

fn members_key(attempt: u32) -> String {
    format!("attempt/{attempt}/members")
}

fn port_key(attempt: u32) -> String {
    format!("attempt/{attempt}/port")
}

fn left_key(seat: usize) -> String {
    format!("standby/{seat}/left")
}

/// Where node 0 says it gave up on seat `seat` in a live `attempt`, for
/// that machine's launcher, should it come back to it.
pub(super) fn vacated_key(attempt: u32, seat: usize) -> String {
    format!("attempt/{attempt}/vacated/{seat}")
}

/// The machines of a job: how many at least and at most, the seats at the
/// launchers' store, and those of the running attempt.
pub struct Membership {
    pub min: usize,
    pub max: usize,
    /// `max`, or for an elastic job enough for every machine to come back
    /// once per restart.
    pub seats: usize,
    /// The seats of the running attempt's machines, node 0's first: the
    /// machine at position p is node rank p of the attempt.
    pub current: Vec<usize>,
    /// Node 0, in a live job: the positions of `current` whose machine was
    /// lost while the attempt went on, for the next launcher that stands by,
    /// and the seats of those machines, which are not seated again.
    vacant: Vec<usize>,
    lost: Vec<usize>,
    pub lost_machine: LostMachine,
}

/// What a machine lost from an elastic job's running attempt does to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostMachine {
    /// Ends it, to be restarted without the machine (torchrun's way).
    EndsAttempt,
    /// Leaves its place vacant while the other machines' ranks go on (a
    /// live job, whose ranks re-form the job over those left), for the
    /// next launcher that joins.
    LeavesPlace,
}

impl Membership {
    /// The machines of a job of `min` to `max` machines restarted (or, a
    /// live one, its workers replaced) at most `max_restarts` times.
    pub fn new((min, max): (usize, usize), max_restarts: u32, lost_machine: LostMachine) -> Self {
        let seats = match min < max {
            true => max * (max_restarts as usize + 1),
            false => max,
        };
        Membership {
            min,
            max,
            seats,
            current: (0..max).collect(),
            vacant: Vec::new(),
            lost: Vec::new(),
            lost_machine,
        }
    }

    pub fn is_elastic(&self) -> bool {
        self.min < self.max
    }

    /// The running attempt's machines other than node 0 (a vacant place's
    /// lost one not among them).
    pub fn others(&self) -> Vec<usize> {
        (self.current.iter().enumerate())
            .filter(|&(p, &s)| s != 0 && !self.vacant.contains(&p))
            .map(|(_, &s)| s)
            .collect()
    }

    /// Whether a machine lost from the running attempt leaves its place
    /// vacant (a live elastic job) instead of ending the attempt.
    pub fn goes_on_without_machines(&self) -> bool {
        self.is_elastic() && self.lost_machine == LostMachine::LeavesPlace
    }

    /// Leaves the place of `seat`'s machine vacant.
    pub(super) fn vacate(&mut self, seat: usize) {
        if let Some(p) = self.current.iter().position(|&s| s == seat) {
            self.vacant.push(p);
            self.lost.push(seat);
        }
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
        let Some((port, members)) = self.wait_for_attempt(attempt)? else {
            return Ok(self.leave());
        };
        if members.contains(&self.node_rank) {
            return Ok(self.run(attempt, members, port));
        }
        let or_live = match self.members.goes_on_without_machines() {
            true => " (or, the job being live, a lost machine's place in this one)",
            false => "",
        };
        tell!(
            "launcher: node {}: attempt {attempt} runs on {} machine(s) without this one; standing by for the next restart{or_live}",
            self.node_rank,
            members.len()
        );
        Ok(match self.stand_by(attempt)? {
            Some((attempt, port, members)) => self.run(attempt, members, port),
            None => self.leave(),
        })
    }

    /// A launcher standing by, its job over.
    fn leave(&mut self) -> Place {
        let _ = self.store.set(&left_key(self.node_rank), b"");
        Place::JobOver
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

    /// Node 0, in a live job: seats the first launcher standing by in a
    /// vacant place of the running `attempt`, which it hears from the
    /// attempt's machine list; its workers join the job as newcomers, in
    /// the lost ranks' seats at the workers' store.
    pub(super) fn fill_vacancy(&mut self, attempt: u32) -> Result<(), CommError> {
        let Some(&place) = self.members.vacant.first() else {
            return Ok(());
        };
        let present = self.present()?;
        let members = &self.members;
        let waiting = (present.into_iter())
            .find(|s| !members.current.contains(s) && !members.lost.contains(s));
        let Some(seat) = waiting else {
            return Ok(());
        };
        self.members.vacant.remove(0);
        let lost = std::mem::replace(&mut self.members.current[place], seat);
        let seats: Vec<String> = self.members.current.iter().map(usize::to_string).collect();
        self.store
            .set(&members_key(attempt), seats.join(",").as_bytes())?;
        tell!(
            "launcher: seat {seat} ({}) takes the place of node {place} (seat {lost}, lost) in the running attempt {attempt}: its ranks join the live job",
            self.host(seat)
        );
        Ok(())
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
    fn present(&mut self) -> Result<Vec<usize>, CommError> {
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
    /// nodes to join, or giving its workers their grace. Looks, not a wait
    /// in the store: the heartbeat shares the connection.
    fn wait_for_attempt(&mut self, attempt: u32) -> Result<Option<(u16, Vec<usize>)>, LaunchError> {
        let patience = match attempt {
            _ if attempt == 0 || self.members.is_elastic() => self.rdzv_timeout,
            _ => self.timeout * 2,
        } + Duration::from_secs(30);
        let until = Instant::now() + patience;
        let node = self.node_rank;
        let keys = [port_key(attempt), members_key(attempt), END_KEY.to_string()];
        loop {
            match <[_; 3]>::try_from(self.look_before(attempt, &keys)?) {
                Ok([Some(port), Some(members), _]) => {
                    return self.decode(attempt, &port, &members).map(Some);
                }
                Ok([_, _, Some(_)]) => return Ok(None),
                _ if Instant::now() < until => std::thread::sleep(POLL),
                _ => refuse!(
                    Rendezvous,
                    "node {node}: node 0 did not start attempt {attempt} within {patience:?}"
                ),
            }
        }
    }

    /// A node other than 0 left out of attempt `running`: waits, as long
    /// as the job runs, to be seated in a later attempt, or (a live job)
    /// in `running` itself, in the place of a machine lost from it. The
    /// attempt, its port and its machines; `None` when the job ended.
    fn stand_by(
        &mut self,
        mut running: u32,
    ) -> Result<Option<(u32, u16, Vec<usize>)>, LaunchError> {
        loop {
            let next = running + 1;
            let keys = [
                port_key(running),
                members_key(running),
                port_key(next),
                members_key(next),
                END_KEY.to_string(),
            ];
            let mut values = self.look_before(running, &keys)?.into_iter();
            let mut value = || values.next().flatten();
            let (port, members) = (value(), value());
            let (next_port, next_members, end) = (value(), value(), value());
            if let (Some(port), Some(members)) = (port, members) {
                let (port, members) = self.decode(running, &port, &members)?;
                if members.contains(&self.node_rank) {
                    return Ok(Some((running, port, members)));
                }
            }
            if let (Some(port), Some(members)) = (next_port, next_members) {
                let (port, members) = self.decode(next, &port, &members)?;
                if members.contains(&self.node_rank) {
                    return Ok(Some((next, port, members)));
                }
                running = next;
                continue;
            }
            if end.is_some() {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// One look at the launchers' store before this node runs `attempt`,
    /// an error naming node 0's loss if it fails.
    fn look_before(
        &mut self,
        attempt: u32,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, LaunchError> {
        match self.store.look_all(keys) {
            Ok(values) => Ok(values),
            Err(e) => refuse!(
                Rendezvous,
                "{} (before attempt {attempt})",
                self.master_lost(&e)
            ),
        }
    }

    /// `attempt`'s port and machines, as node 0 wrote them.
    fn decode(
        &self,
        attempt: u32,
        port: &[u8],
        members: &[u8],
    ) -> Result<(u16, Vec<usize>), LaunchError> {
        decode(port, members).ok_or_else(|| {
            LaunchError::Rendezvous(format!(
                "node {}: node 0 gave attempt {attempt} a malformed port or machine list",
                self.node_rank
            ))
        })
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
