//! How the launchers meet: node 0 waits for every other node, each says
//! where it runs and shows it belongs to node 0's job, and a launcher the
//! store refused (a seat taken, another --nnodes) is named in the
//! launchers' words.

use std::time::Instant;

use comm::{CommError, Rejection};

use super::{Membership, NodeGroup, POLL};
use crate::error::LaunchError;

impl NodeGroup {
    /// A node other than 0 says where it runs and checks that it belongs
    /// to node 0's job; a launcher of another job leaves word for node 0,
    /// which ends the job with it (it took a node's seat).
    pub(super) fn show_up(&mut self, rdzv_id: &str, port: u16) -> Result<(), LaunchError> {
        let k = self.node_rank;
        let host = crate::contract::hostname();
        self.store.set(&format!("host/{k}"), host.as_bytes())?;
        let theirs = self.store.get("rdzv_id")?;
        if theirs != rdzv_id.as_bytes() {
            let _ = self.store.set(&format!("refused/{k}"), rdzv_id.as_bytes());
            refuse!(
                Rendezvous,
                "node {k}: --rdzv-id {rdzv_id:?} is not node 0's {:?}: another job holds {}:{port}, or this launcher's --rdzv-id is mistyped",
                String::from_utf8_lossy(&theirs),
                self.master.addr
            );
        }
        if let Some(host) = self.store.look("host/0")? {
            self.master.host = format!("host {}", String::from_utf8_lossy(&host));
        }
        self.store.set(&format!("joined/{k}"), b"")?;
        Ok(())
    }

    /// Node 0 waits up to the join timeout for every other node to join,
    /// so that no worker waits in vain for ranks whose launcher never came
    /// (or came with another job's `--rdzv-id`), and says which.
    pub(super) fn wait_for_nodes(&mut self, rdzv_id: &str, port: u16) -> Result<(), LaunchError> {
        let deadline = Instant::now() + self.rdzv_timeout;
        let mut missing: Vec<usize> = (1..self.members.max).collect();
        loop {
            self.note_away();
            for &k in &missing {
                if let Some(theirs) = self.store.look(&format!("refused/{k}"))? {
                    refuse!(
                        Rendezvous,
                        "node 0: the launcher that joined as node {k} ({}) came with --rdzv-id {:?}, not this job's {rdzv_id:?}; every launcher of a job needs the same --rdzv-id, and another job a rendezvous port of its own",
                        self.host(k),
                        String::from_utf8_lossy(&theirs)
                    );
                }
            }
            let mut still = Vec::new();
            for k in missing {
                if self.store.look(&format!("joined/{k}"))?.is_none() {
                    still.push(k);
                }
            }
            missing = still;
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                // Its own stop ran out the clock, and the others' joins.
                let away = self.away.map_or(String::new(), |away| {
                    format!(
                        "; this launcher was itself stopped (or starved) for {:.1} s meanwhile, which the others may have taken for a lost node 0",
                        away.as_secs_f64()
                    )
                });
                refuse!(
                    Rendezvous,
                    "node 0: node(s) {missing:?} of {} did not join the launchers at {}:{port} within {:?} (the join timeout, --rdzv-timeout): start one launcher on every node with --nnodes {} and this --master-addr/--master-port (or --rdzv-endpoint), or raise --rdzv-timeout for slow starts{away}",
                    self.members.max,
                    self.master.addr,
                    self.rdzv_timeout,
                    self.members.max
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// `e`, or, when the store refused a misfit launcher (and so every
    /// launcher: the rendezvous was under way), the misfit named.
    pub(super) fn explain(&self, e: LaunchError) -> LaunchError {
        match e {
            LaunchError::Store {
                cause: CommError::Rejected(r),
                ..
            } => {
                let at = format!("{}:{}", self.master.addr, self.master.port);
                LaunchError::Rendezvous(format!(
                    "node {}: {}",
                    self.node_rank,
                    misfit(&r, &at, &self.members)
                ))
            }
            e => e,
        }
    }
}

/// Why the launchers' store at `at` refused a launcher (`r`, in the
/// workers' words), in the launchers' words, with the fix. The store counts
/// seats, which for an elastic job (`m`) are more than its machines.
pub(super) fn misfit(r: &Rejection, at: &str, m: &Membership) -> String {
    let fix = "give each job a rendezvous port of its own (--rdzv-endpoint, --master-port), and each launcher of a job the same --nnodes and --max-restarts and its own --node-rank";
    let seats = "seats (--nnodes N, or MAX x (--max-restarts + 1) for --nnodes MIN:MAX)";
    match r {
        Rejection::DuplicateRank { rank } => format!(
            "the launchers at {at} already have a node {rank}: another job holds this rendezvous port, or two launchers were given --node-rank {rank}; {fix}"
        ),
        Rejection::RankOutOfRange { .. } if m.is_elastic() => format!(
            "the launchers at {at} already have all {} {seats} of --nnodes {}:{}: another job holds this rendezvous port, or more launchers were started than the job's restarts can seat; {fix}",
            m.seats, m.min, m.max
        ),
        Rejection::RankOutOfRange { world_size, .. } => format!(
            "the launchers at {at} already have all {world_size} nodes: another job holds this rendezvous port, or more launchers were started than --nnodes; {fix}"
        ),
        Rejection::WorldSizeMismatch {
            rank_world_size,
            master_world_size,
            ..
        } => format!(
            "a launcher came to the launchers at {at} with {rank_world_size} {seats}, node 0 with {master_world_size}; {fix}"
        ),
        other => format!("the launchers at {at} refused a launcher: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::LostMachine;

    #[test]
    fn an_elastic_jobs_full_store_is_named_by_its_nnodes_range_not_only_its_seats() {
        let full = Rejection::RankOutOfRange {
            rank: 8,
            world_size: 8,
        };
        let elastic = misfit(
            &full,
            "n0:29400",
            &Membership::new((1, 2), 3, LostMachine::EndsAttempt),
        );
        assert!(elastic.contains("all 8 seats"), "{elastic}");
        assert!(elastic.contains("--nnodes 1:2"), "{elastic}");
        let fixed = misfit(
            &full,
            "n0:29400",
            &Membership::new((2, 2), 3, LostMachine::EndsAttempt),
        );
        assert!(fixed.contains("all 8 nodes"), "{fixed}");
    }
}
