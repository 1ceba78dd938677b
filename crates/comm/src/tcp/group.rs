//! Which ranks form a ring: the whole job, or a sub-group of it (the ranks
//! of one pipeline, or of one stage's data-parallel replicas). A group
//! publishes its members' addresses under its own prefix in the job's
//! store, so any number of groups can form over one store.

use std::time::Instant;

use crate::error::{CommError, Rejection};
use crate::rendezvous::Rendezvous;
use crate::tcp::peer_address::PeerAddress;

/// A ring's members, in ring order, as ranks of the job.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// Store key prefix of the group's addresses.
    prefix: String,
    /// This rank's position in `members`.
    pub(crate) rank: usize,
    members: Vec<usize>,
}

impl Group {
    /// Every rank of a job of `world` ranks.
    pub(crate) fn whole(rank: usize, world: usize) -> Group {
        Group {
            prefix: "comm/tcp/".to_string(),
            rank,
            members: (0..world).collect(),
        }
    }

    /// Every member of generation `number` of a job whose membership
    /// changes, this one at `rank` of `world`.
    pub(crate) fn generation(number: u64, rank: usize, world: usize) -> Group {
        Group {
            prefix: format!("comm/tcp/generation/{number}/"),
            rank,
            members: (0..world).collect(),
        }
    }

    /// The `id`-th sub-group made from a communicator whose rank `me` is
    /// one of `members`: distinct, ascending ranks of a job of `world`.
    pub(crate) fn sub(
        id: u64,
        members: &[usize],
        me: usize,
        world: usize,
    ) -> Result<Group, CommError> {
        let invalid = |reason: String| CommError::InvalidArgument {
            op: "subgroup",
            reason,
        };
        if !members.windows(2).all(|w| w[0] < w[1]) {
            return Err(invalid(format!(
                "members {members:?} must be distinct and in ascending order"
            )));
        }
        if let Some(&outside) = members.iter().find(|&&m| m >= world) {
            return Err(invalid(format!(
                "rank {outside} is not a rank of a world of size {world}"
            )));
        }
        let rank = members.iter().position(|&m| m == me).ok_or_else(|| {
            invalid(format!(
                "rank {me} called it for members {members:?}, which do not include it"
            ))
        })?;
        let list: Vec<String> = members.iter().map(usize::to_string).collect();
        Ok(Group {
            prefix: format!("comm/tcp/group/{id}/{}/", list.join(",")),
            rank,
            members: members.to_vec(),
        })
    }

    pub(crate) fn world(&self) -> usize {
        self.members.len()
    }

    /// The job rank of member `r`.
    pub(crate) fn global(&self, r: usize) -> usize {
        self.members[r]
    }

    pub(crate) fn address_key(&self, r: usize) -> String {
        format!("{}addr/{r}", self.prefix)
    }

    /// Waits for every member's address. On timeout it names all members
    /// still absent (as job ranks), and tells the store, so that every
    /// other waiting rank fails at once with the same list instead of at
    /// its own (slightly later) deadline.
    pub(crate) fn gather_addresses(
        &self,
        rendezvous: &mut Rendezvous,
        deadline: Instant,
    ) -> Result<Vec<PeerAddress>, CommError> {
        let config = rendezvous.config().clone();
        let store = rendezvous.store();
        let world = self.world();
        let keys: Vec<String> = (0..world).map(|r| self.address_key(r)).collect();
        let gathered = (|| {
            // One request for every address, then a wait for each member
            // that had not published yet: on a cluster, where members
            // publish at about the same moment, a request or two a rank,
            // not one per member (at a thousand ranks, a million requests
            // to one store).
            let mut values = store.look_each(&keys)?;
            for r in 0..world {
                if values[r].is_some() {
                    continue;
                }
                let wait = deadline.saturating_duration_since(Instant::now());
                if let Some(value) = store.wait_for(&keys[r], wait)? {
                    values[r] = Some(value);
                    continue;
                }
                let still: Vec<String> = keys[r..].to_vec();
                let later = store.look_each(&still)?;
                let missing = (r..world).zip(later).filter(|(_, v)| v.is_none());
                let reason = Rejection::RanksMissing {
                    missing: missing.map(|(m, _)| self.global(m)).collect(),
                    world_size: config.world_size,
                };
                // Best effort: a store that is gone cannot spread the
                // news, and this rank's own error says it all.
                let _ = store.poison(reason.clone());
                return Err(reason.into());
            }
            (values.into_iter().enumerate())
                .map(|(r, value)| {
                    let value = value.unwrap_or_default();
                    std::str::from_utf8(&value)
                        .ok()
                        .and_then(PeerAddress::decode)
                        .ok_or_else(|| CommError::Store {
                            master: config.master_endpoint(),
                            detail: format!(
                                "rank {} published an address this rank cannot read",
                                self.global(r)
                            ),
                        })
                })
                .collect()
        })();
        // Whether this rank or another one gave up first, report the timeout.
        gathered.map_err(|e| match e {
            CommError::Rejected(Rejection::RanksMissing { missing, .. }) => {
                CommError::RendezvousTimeout {
                    master: config.master_endpoint(),
                    timeout: config.rdzv_timeout,
                    missing,
                    world_size: config.world_size,
                    detail: "they did not register with the store; were they started, with the same MASTER_ADDR and MASTER_PORT?"
                        .to_string(),
                }
            }
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_job_keeps_the_ring_keys() {
        let g = Group::whole(1, 3);
        assert_eq!((g.rank, g.world(), g.global(2)), (1, 3, 2));
        assert_eq!(g.address_key(2), "comm/tcp/addr/2");
    }

    #[test]
    fn a_sub_group_numbers_its_members_and_has_its_own_keys() {
        let g = Group::sub(2, &[1, 3], 3, 4).unwrap();
        assert_eq!((g.rank, g.world(), g.global(0)), (1, 2, 1));
        assert_eq!(g.address_key(0), "comm/tcp/group/2/1,3/addr/0");
    }

    #[test]
    fn bad_member_lists_are_errors() {
        for (members, me, needle) in [
            (&[1, 1][..], 1, "distinct"),
            (&[2, 1][..], 1, "ascending"),
            (&[0, 4][..], 0, "rank 4 is not"),
            (&[0, 2][..], 1, "do not include it"),
        ] {
            let err = Group::sub(1, members, me, 4).unwrap_err().to_string();
            assert!(err.contains(needle), "{members:?}: {err}");
        }
    }
}
