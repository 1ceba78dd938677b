//! The store as the arbiter of a job whose membership changes (live
//! recovery): who trains together in each generation.
//!
//! A member enlists for the next generation when its ring failed, when the
//! job lets a newcomer in, or when it starts. The store, hosted by node 0's
//! launcher (the one process that cannot be lost), closes the generation
//! when every member still connected has enlisted; a member connected but
//! silent (hung, stopped) is waited for while the others' timeouts name it
//! a suspect (a short grace after the last suspicion), or for the job's
//! timeout at most, and is then evicted: told so if it ever asks again.
//! The first generation waits for every slot of the job.
//!
//! Rank 0 of a generation is a member whose state holds the most steps (the
//! lowest slot among them): it heals the others; the rest follow by slot.
//! No generation forms of newcomers alone: a job whose every member with
//! state was lost answers `Lost`, and one whose members finished, `JobOver`.
//! Until a member enlists holding state, the job has not trained (its
//! generations failed as they formed: a peer lost while the NCCL
//! communicators formed), and the next generation forms as the first, of
//! every slot, each member starting from its flags.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::State;

/// The key a generation's rank 0 looks at between steps: how many
/// newcomers wait to join (decimal text; absent or `0`: none).
pub(crate) const WAITING_KEY: &str = "comm/live/waiting";

/// The key a generation's rank 0 sets when the job's training is done:
/// later enlistments are answered `JobOver`.
pub(crate) const OVER_KEY: &str = "comm/live/over";

/// How long the store waits, after the last member named a suspect, for
/// the suspects among the members that have not enlisted: an alive
/// member named by a neighbour that timed out (it was itself waiting on
/// another) enlists within it.
pub(crate) const SUSPECT_GRACE: Duration = Duration::from_secs(2);

/// Generations formed so far, and the one forming.
#[derive(Debug, Default)]
pub(crate) struct Generations {
    /// The newest generation formed (0: none yet).
    current: u64,
    /// The members of recent generations (slot and step, in rank order),
    /// for the enlisted that wake after it formed.
    formed: BTreeMap<u64, Vec<(usize, Option<u64>)>>,
    forming: Forming,
    /// Members left out of a generation while still connected.
    evicted: BTreeMap<usize, u64>,
    /// Whether a member ever enlisted holding state: the job has trained.
    trained: bool,
}

/// The next generation, as the enlisted make it up.
#[derive(Debug, Default)]
struct Forming {
    enlisted: BTreeMap<usize, Option<u64>>,
    suspects: BTreeSet<usize>,
    /// When the first member holding state enlisted: the timeout runs
    /// from then.
    first_member: Option<Instant>,
    last_suspicion: Option<Instant>,
}

/// What an enlisted member hears, now or later.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Formed {
        number: u64,
        members: Vec<(usize, Option<u64>)>,
    },
    Evicted {
        generation: u64,
    },
    Lost,
}

/// How many formed generations the store remembers.
const REMEMBERED: usize = 4;

impl Generations {
    /// `slot` enlists (again) for the next generation, holding `step`
    /// optimizer steps of state (`None`: none), suspecting `suspect`.
    /// The number it waits for, or its verdict right away.
    pub(crate) fn enlist(
        &mut self,
        slot: usize,
        step: Option<u64>,
        suspect: Option<usize>,
    ) -> Result<u64, Verdict> {
        if let Some(&generation) = self.evicted.get(&slot) {
            return Err(Verdict::Evicted { generation });
        }
        let forming = &mut self.forming;
        forming.enlisted.insert(slot, step);
        let now = Instant::now();
        if step.is_some() {
            forming.first_member.get_or_insert(now);
            self.trained = true;
        }
        if let Some(suspect) = suspect.filter(|&s| s != slot) {
            forming.suspects.insert(suspect);
            forming.last_suspicion = Some(now);
        }
        Ok(self.current + 1)
    }

    /// Withdraws `slot`'s enlistment (it gave up waiting).
    pub(crate) fn withdraw(&mut self, slot: usize) {
        self.forming.enlisted.remove(&slot);
    }

    /// `slot`'s connection closed: it is no member to wait for, and a
    /// newcomer may take the slot.
    pub(crate) fn left(&mut self, slot: usize) {
        self.forming.enlisted.remove(&slot);
        self.evicted.remove(&slot);
    }

    /// Newcomers enlisted that the current generation does not hold.
    pub(crate) fn waiting(&self) -> usize {
        let current = self.formed.get(&self.current);
        let member = |slot: &usize| current.is_some_and(|m| m.iter().any(|(s, _)| s == slot));
        (self.forming.enlisted.keys())
            .filter(|s| !member(s))
            .count()
    }

    /// The verdict of generation `number` for `slot`, once formed.
    pub(crate) fn verdict(&self, number: u64, slot: usize) -> Option<Verdict> {
        if let Some(&generation) = self.evicted.get(&slot) {
            return Some(Verdict::Evicted { generation });
        }
        let members = self.formed.get(&number)?;
        Some(Verdict::Formed {
            number,
            members: members.clone(),
        })
    }

    /// Forms the next generation if it is complete: `connected`, the slots
    /// whose members are connected; `world`, the job's slots; `timeout`,
    /// the longest a connected member is waited for. `Some(Lost)` when no
    /// generation can form: no member with state is left.
    pub(crate) fn try_form(
        &mut self,
        connected: &BTreeSet<usize>,
        (world, timeout): (usize, Duration),
    ) -> Option<Verdict> {
        let forming = &self.forming;
        let enlisted = &forming.enlisted;
        if enlisted.is_empty() {
            return None;
        }
        let expected: Vec<usize> = (connected.iter())
            .filter(|s| !self.evicted.contains_key(s))
            .copied()
            .collect();
        let all_in = expected.iter().all(|s| enlisted.contains_key(s));
        if self.current == 0 || !self.trained {
            // The first generation, or one after generations that never
            // trained: every slot of the job, from scratch.
            return (all_in && enlisted.len() == world).then(|| self.form(&expected));
        }
        if enlisted.values().all(Option::is_none) {
            // Newcomers alone hold nothing to train from: they wait for
            // the members, unless none is left.
            // (A newcomer in a lost member's slot is connected, and enlisted.)
            let members = self
                .formed
                .get(&self.current)
                .map_or(&[][..], Vec::as_slice);
            let alive =
                (members.iter()).any(|(s, _)| connected.contains(s) && !enlisted.contains_key(s));
            return (!alive).then_some(Verdict::Lost);
        }
        let suspects_out = expected
            .iter()
            .all(|s| enlisted.contains_key(s) || forming.suspects.contains(s))
            && forming
                .last_suspicion
                .is_some_and(|t| t.elapsed() >= SUSPECT_GRACE);
        let timed_out = forming.first_member.is_some_and(|t| t.elapsed() >= timeout);
        (all_in || suspects_out || timed_out).then(|| self.form(&expected))
    }

    /// Forms the next generation of those enlisted, evicting the
    /// `expected` that are not.
    fn form(&mut self, expected: &[usize]) -> Verdict {
        let forming = std::mem::take(&mut self.forming);
        let number = self.current + 1;
        for &slot in expected {
            if !forming.enlisted.contains_key(&slot) {
                self.evicted.insert(slot, number);
            }
        }
        let mut members: Vec<(usize, Option<u64>)> = forming.enlisted.into_iter().collect();
        // The most advanced first (lowest slot among equals), then by slot.
        let lead = (members.iter().enumerate())
            .max_by_key(|(_, (slot, step))| (*step, std::cmp::Reverse(*slot)))
            .map_or(0, |(i, _)| i);
        let leader = members.remove(lead);
        members.insert(0, leader);
        self.current = number;
        self.formed.insert(number, members.clone());
        while self.formed.len() > REMEMBERED {
            self.formed.pop_first();
        }
        Verdict::Formed { number, members }
    }
}

impl State {
    /// The slots whose members are connected now.
    pub(super) fn connected_slots(&self) -> BTreeSet<usize> {
        (self.registered.iter().enumerate())
            .filter(|(_, r)| **r)
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Publishes how many newcomers wait ([`WAITING_KEY`]).
    pub(super) fn publish_waiting(&mut self) {
        let waiting = self.generations.waiting();
        (self.values).insert(WAITING_KEY.to_string(), waiting.to_string().into_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(600);

    fn slots(s: &[usize]) -> BTreeSet<usize> {
        s.iter().copied().collect()
    }

    fn formed(v: Option<Verdict>) -> Vec<(usize, Option<u64>)> {
        match v {
            Some(Verdict::Formed { members, .. }) => members,
            other => panic!("expected a generation, got {other:?}"),
        }
    }

    /// A job of `world` slots whose first generation formed.
    fn started(world: usize) -> Generations {
        let mut g = Generations::default();
        for slot in 0..world {
            assert_eq!(g.enlist(slot, None, None), Ok(1));
        }
        let all = slots(&(0..world).collect::<Vec<_>>());
        assert_eq!(formed(g.try_form(&all, (world, LONG))).len(), world);
        g
    }

    #[test]
    fn the_first_generation_waits_for_every_slot() {
        let mut g = Generations::default();
        g.enlist(0, None, None).unwrap();
        g.enlist(2, None, None).unwrap();
        assert_eq!(g.try_form(&slots(&[0, 2]), (3, LONG)), None);
        g.enlist(1, None, None).unwrap();
        let members = formed(g.try_form(&slots(&[0, 1, 2]), (3, LONG)));
        assert_eq!(members, vec![(0, None), (1, None), (2, None)]);
    }

    #[test]
    fn survivors_form_without_the_departed_and_the_most_advanced_leads() {
        let mut g = started(4);
        // Slot 0 died; slot 3 committed one step more than slots 1 and 2.
        g.left(0);
        g.enlist(1, Some(9), None).unwrap();
        g.enlist(3, Some(10), None).unwrap();
        assert_eq!(g.try_form(&slots(&[1, 2, 3]), (4, LONG)), None);
        assert_eq!(g.enlist(2, Some(9), None), Ok(2));
        let members = formed(g.try_form(&slots(&[1, 2, 3]), (4, LONG)));
        assert_eq!(members, vec![(3, Some(10)), (1, Some(9)), (2, Some(9))]);
        assert_eq!(
            g.verdict(2, 1),
            Some(Verdict::Formed { number: 2, members })
        );
    }

    #[test]
    fn a_newcomer_waits_for_the_members_and_they_take_it_in() {
        let mut g = started(2);
        g.left(1);
        g.enlist(0, Some(5), None).unwrap();
        formed(g.try_form(&slots(&[0]), (2, LONG)));
        // The replacement of slot 1 waits, alone, for as long as it takes.
        g.enlist(1, None, None).unwrap();
        assert_eq!(g.waiting(), 1);
        assert_eq!(g.try_form(&slots(&[0, 1]), (2, Duration::ZERO)), None);
        g.enlist(0, Some(7), None).unwrap();
        let members = formed(g.try_form(&slots(&[0, 1]), (2, LONG)));
        assert_eq!(members, vec![(0, Some(7)), (1, None)]);
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn a_silent_member_is_evicted_after_the_grace_once_suspected() {
        let mut g = started(3);
        g.enlist(0, Some(4), Some(2)).unwrap();
        g.enlist(1, Some(4), None).unwrap();
        // Slot 2 is connected but stopped: within the grace it is waited for.
        assert_eq!(g.try_form(&slots(&[0, 1, 2]), (3, LONG)), None);
        g.forming.last_suspicion = Some(Instant::now() - SUSPECT_GRACE);
        let members = formed(g.try_form(&slots(&[0, 1, 2]), (3, LONG)));
        assert_eq!(members, vec![(0, Some(4)), (1, Some(4))]);
        // When it wakes, it hears that it left, until its connection closes.
        assert_eq!(
            g.enlist(2, Some(4), None),
            Err(Verdict::Evicted { generation: 2 })
        );
        assert_eq!(g.verdict(2, 2), Some(Verdict::Evicted { generation: 2 }));
        g.left(2);
        assert_eq!(g.enlist(2, None, None), Ok(3));
    }

    #[test]
    fn an_unsuspected_silent_member_is_waited_for_up_to_the_timeout() {
        let mut g = started(2);
        g.enlist(0, Some(1), None).unwrap();
        assert_eq!(g.try_form(&slots(&[0, 1]), (2, LONG)), None);
        let members = formed(g.try_form(&slots(&[0, 1]), (2, Duration::ZERO)));
        assert_eq!(members, vec![(0, Some(1))]);
    }

    #[test]
    fn newcomers_whose_members_are_all_gone_hear_the_job_is_lost() {
        let mut g = started(2);
        g.enlist(0, Some(3), None).unwrap();
        g.enlist(1, Some(3), None).unwrap();
        formed(g.try_form(&slots(&[0, 1]), (2, LONG)));
        g.left(0);
        g.left(1);
        g.enlist(1, None, None).unwrap();
        assert_eq!(g.try_form(&slots(&[1]), (2, LONG)), Some(Verdict::Lost));
    }

    #[test]
    fn a_job_that_never_trained_forms_again_of_every_slot_from_scratch() {
        // Slot 1 was lost as the first generation's communicators formed:
        // nobody holds state, and nothing was lost with it.
        let mut g = started(2);
        g.left(1);
        g.enlist(0, None, None).unwrap();
        assert_eq!(g.try_form(&slots(&[0]), (2, Duration::ZERO)), None);
        // Its replacement completes the job's slots.
        g.enlist(1, None, None).unwrap();
        let members = formed(g.try_form(&slots(&[0, 1]), (2, LONG)));
        assert_eq!(members, vec![(0, None), (1, None)]);
    }
}
