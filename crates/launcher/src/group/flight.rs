//! The flight records of a failed attempt, handed by every node to node 0
//! through the launchers' store (as bytes: the group knows no records).

use std::time::{Duration, Instant};

use super::{NodeGroup, POLL};

fn key(attempt: u32, node: usize) -> String {
    format!("attempt/{attempt}/flight/{node}")
}

impl NodeGroup {
    /// A node other than 0: hands node 0 its part of the flight records of
    /// `attempt` (before it says its workers ended).
    pub fn hand_over_flight(&mut self, attempt: u32, part: &[u8]) {
        if !self.lost && self.server.is_none() {
            let _ = self.store.set(&key(attempt, self.node_rank), part);
        }
    }

    /// Node 0: the other nodes' parts of `attempt`'s flight records, each
    /// waited for up to `wait` (not for a node that left, fell silent, or
    /// ended without one).
    pub fn flight_handovers(&mut self, attempt: u32, wait: Duration) -> Vec<Vec<u8>> {
        if self.server.is_none() {
            return Vec::new();
        }
        let until = Instant::now() + wait;
        let mut parts = Vec::new();
        for node in self.members.others() {
            loop {
                // The node hands its part over before it says it ended, so
                // a look after the watch finds a part the watch ended on.
                let Ok(seen) = self.watch(node, attempt) else {
                    return parts;
                };
                let gone = seen.ended || seen.departed || self.silent(node, seen.beat).is_some();
                match self.store.look(&key(attempt, node)) {
                    Ok(Some(part)) => {
                        parts.push(part);
                        break;
                    }
                    Ok(None) if gone || Instant::now() >= until => break,
                    Ok(None) => std::thread::sleep(POLL),
                    Err(_) => return parts,
                }
            }
        }
        parts
    }
}
