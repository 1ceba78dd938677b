//! Node 0's watch over the other nodes: their launchers leaving the store,
//! falling silent, and saying their workers ended.

use std::time::{Duration, Instant};

use comm::{CommError, Store};

use super::members::vacated_key;
use super::{Elsewhere, LOOK_EVERY, NodeGroup, POLL};
use crate::heartbeat;

impl NodeGroup {
    /// Node 0's look at node `k` in `attempt`, in one request: whether its
    /// launcher left the store, whether it said its workers ended, and its
    /// heartbeat. Read at one instant: a launcher says it ended before it
    /// leaves, so one that did both is never seen gone without its word.
    pub(super) fn watch(&mut self, k: usize, attempt: u32) -> Result<Seen, CommError> {
        let keys = [
            Store::departed_key(k),
            format!("attempt/{attempt}/ended/{k}"),
            heartbeat::key(k),
        ];
        let mut values = self.store.look_all(&keys)?.into_iter();
        let mut next = || values.next().flatten();
        Ok(Seen {
            departed: next().is_some(),
            ended: next().is_some(),
            beat: next(),
        })
    }

    /// How long node `k` has sent no heartbeat, once past the limit (node
    /// 0 only: its own clock), from its `beat` read now.
    pub(super) fn silent(&mut self, k: usize, beat: Option<Vec<u8>>) -> Option<Duration> {
        self.pulse.silent_for(k, beat, Instant::now())
    }

    /// Node 0, after a signal: a node whose launcher left or fell silent
    /// meanwhile (the workers' stop may wait on its ranks), looked for at
    /// most every [`LOOK_EVERY`].
    pub fn vanished_node(&mut self, attempt: u32) -> Option<String> {
        if self.server.is_none() || self.last_look.elapsed() < LOOK_EVERY {
            return None;
        }
        self.last_look = Instant::now();
        self.note_away();
        match self.vanished(attempt).ok().flatten()? {
            Elsewhere::Failed { cause, .. }
            | Elsewhere::Departed(cause)
            | Elsewhere::WentOnWithout(cause) => Some(cause),
            Elsewhere::Signalled(_) | Elsewhere::Over => None,
        }
    }

    /// Node 0: a node whose launcher left, or fell silent, before it said
    /// its workers ended in `attempt`, told to the others as a failure no
    /// restart mends; in an elastic job one that a restart without it
    /// mends while `--nnodes MIN` machines remain; in a live elastic job one
    /// whose place stands vacant while the others go on.
    pub(super) fn vanished(&mut self, attempt: u32) -> Result<Option<Elsewhere>, CommError> {
        let key = |what: &str| format!("attempt/{attempt}/{what}");
        for k in self.members.others() {
            let seen = self.watch(k, attempt)?;
            let cause = if seen.departed && !seen.ended {
                let host = self.host(k);
                match self.away {
                    Some(away) => {
                        let left = format!("node {k}'s launcher ({host}) left");
                        heartbeat::was_away(0, away, self.pulse.limit(), &left)
                    }
                    None => format!(
                        "node {k}'s launcher ({host}) is gone: it left the launchers' store before its workers ended (killed, or its machine lost?){}",
                        heartbeat::NO_GOING_ON
                    ),
                }
            } else if let Some(silent) = self.silent(k, seen.beat)
                && !seen.ended
            {
                // Before the failure: the node reads both in one look.
                let millis = u64::try_from(silent.as_millis()).unwrap_or(u64::MAX);
                let verdict = heartbeat::verdict_key(attempt, k);
                self.store.set(&verdict, &millis.to_le_bytes())?;
                heartbeat::silent_node(k, &self.host(k), silent, self.pulse.limit())
            } else {
                continue;
            };
            let remain = self.members.others().len();
            let restartable = self.members.is_elastic() && remain >= self.members.min;
            let lost = cause.strip_suffix(heartbeat::NO_GOING_ON).unwrap_or(&cause);
            let cause = match (self.members.is_elastic(), restartable) {
                (false, _) => cause.clone(),
                (true, true) => format!(
                    "{lost}; an elastic job goes on without it, on the {remain} machine(s) left"
                ),
                (true, false) => format!(
                    "{lost}; {remain} machine(s) left, fewer than --nnodes {}:{} needs",
                    self.members.min, self.members.max
                ),
            };
            if restartable && self.members.goes_on_without_machines() {
                // Its launcher, should it come back to this attempt, hears
                // that it was given up on.
                self.members.vacate(k);
                self.store.set(&vacated_key(attempt, k), b"")?;
                return Ok(Some(Elsewhere::WentOnWithout(format!(
                    "{lost}; the live job's ranks go on without its ranks, on the {remain} machine(s) left, and the next machine to join takes its place"
                ))));
            }
            // The other nodes hear it as a failure no restart mends, or
            // (elastic) as one a restart without it does.
            if !restartable {
                self.store.set(&key("final"), b"")?;
            }
            self.store.set(&key("failed"), cause.as_bytes())?;
            return Ok(Some(match restartable {
                true => Elsewhere::Failed { cause, restartable },
                false => Elsewhere::Departed(cause),
            }));
        }
        Ok(None)
    }

    /// Says this node's workers ended in `attempt`, the job's last; node 0
    /// then waits (up to `wait`) for the others, so that its store outlives
    /// their last look, and dismisses the launchers standing by.
    pub fn finish(&mut self, attempt: u32, wait: Duration) {
        if self.lost {
            return;
        }
        let _ = self
            .store
            .set(&format!("attempt/{attempt}/ended/{}", self.node_rank), b"");
        if self.server.is_some() && self.members.goes_on_without_machines() {
            // A live job's machines seated late may be waiting to join.
            let _ = self.store.set(super::members::END_KEY, b"");
        }
        if self.server.is_some() {
            let until = Instant::now() + wait;
            for node in self.members.others() {
                // A launcher that left, or fell silent, will say nothing
                // more; a store that fails says nothing either.
                while let Ok(seen) = self.watch(node, attempt) {
                    let gone = seen.departed || self.silent(node, seen.beat).is_some();
                    if seen.ended || gone {
                        break;
                    }
                    if Instant::now() >= until {
                        tell!("launcher: node {node} did not say it ended within {wait:?}");
                        break;
                    }
                    std::thread::sleep(POLL);
                }
            }
            self.dismiss_standby(wait);
        }
    }
}

/// What node 0 saw of another node at one instant ([`NodeGroup::watch`]).
pub(super) struct Seen {
    /// Its launcher left the store.
    pub departed: bool,
    /// Its launcher said its workers ended in the attempt watched.
    pub ended: bool,
    /// Its heartbeat, if it beat yet.
    pub beat: Option<Vec<u8>>,
}
