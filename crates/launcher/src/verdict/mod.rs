//! The flight recorder's offline analysis: from the records the ranks
//! wrote (`comm::flight`) and what the launcher saw of the ranks that
//! wrote none, one sentence on who held the job up, at which collective,
//! after doing what. A pure function of its [`Evidence`].
//!
//! Every member of a communicator runs its collectives in one order, so
//! sequence numbers line up across ranks. The collective the waiting
//! ranks are stuck in is the lowest one started but not done; a member
//! that has not started it (nor completed it) is behind, and one with no
//! record at all cannot be seen, only named. Kinds and sizes that differ
//! at one sequence number (ranks calling different collectives: a
//! desynchronised job) are reported first.

use std::collections::BTreeMap;

use comm::flight::{Entry, Kind, RankRecord, State};
use serde::{Deserialize, Serialize};

mod format;
#[cfg(test)]
mod tests;

use format::{about, bytes, ranks, ranks_on_nodes};

/// A waiting rank that has waited less than this is not held up: its
/// record is a snapshot of a job in step (SIGUSR2 to a healthy job).
const IN_STEP_SECS: f64 = 1.0;

/// What the launcher knows of a rank that wrote no record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Silence {
    /// Stopped (SIGSTOP, a debugger): it can neither run nor write.
    Stopped,
    /// Running, but did not answer SIGUSR2 (hung where its signal thread
    /// cannot run, or out of memory).
    Unanswered,
    /// Ended as said (e.g. "killed by signal 9") before it wrote one.
    Ended(String),
    /// Runs on another node, whose records are not at hand.
    Remote,
}

/// The evidence: the records of one attempt, the job's size, ranks per
/// node (0: unknown), and the launcher's word on ranks that wrote none.
pub struct Evidence<'a> {
    pub records: &'a [RankRecord],
    pub world: usize,
    pub nproc: usize,
    pub silent: &'a [(usize, Silence)],
}

/// One rank's collectives on one communicator.
struct Member<'a> {
    rank: usize,
    dumped_at_us: u64,
    entries: &'a [Entry],
}

impl Member<'_> {
    fn last_done(&self) -> Option<u64> {
        (self.entries.iter())
            .filter(|e| e.state == State::Done)
            .map(|e| e.seq)
            .max()
    }

    /// The collective it is inside: the lowest started and not done.
    fn inside(&self) -> Option<&Entry> {
        self.entries.iter().find(|e| e.state == State::Started)
    }

    fn at(&self, seq: u64) -> Option<&Entry> {
        self.entries.iter().find(|e| e.seq == seq)
    }

    /// Seconds from `entry`'s start to this rank's dump.
    fn waited(&self, entry: &Entry) -> f64 {
        let since = entry.started_us.unwrap_or(entry.queued_us);
        self.dumped_at_us.saturating_sub(since) as f64 / 1e6
    }
}

/// What one communicator's records say.
struct Finding {
    text: String,
    /// The longest a rank waited in it; orders the findings.
    waited: f64,
    /// Whether it names a rank as the one behind.
    blames: bool,
}

/// The verdict on an attempt, or `None` without a single record.
pub fn verdict(evidence: &Evidence) -> Option<String> {
    let groups = communicators(evidence.records);
    if groups.is_empty() {
        return None;
    }
    let named = groups.len() > 1;
    let mut mismatches = Vec::new();
    let mut findings = Vec::new();
    for (group, members) in &groups {
        let label = |seq: u64| match named {
            true => format!("#{seq} of {group}"),
            false => format!("#{seq}"),
        };
        mismatches.extend(mismatch(members, &label));
        findings.extend(hold_up(evidence, group, members, &label));
    }
    findings.sort_by(|a, b| {
        (b.blames, b.waited)
            .partial_cmp(&(a.blames, a.waited))
            .unwrap()
    });
    let main = match findings.into_iter().next() {
        Some(f) if f.waited >= IN_STEP_SECS => f.text,
        _ => in_step(&groups, evidence.world),
    };
    mismatches.truncate(1);
    mismatches.push(main);
    Some(mismatches.join("; "))
}

/// Every communicator's members, by its name, in rank order.
fn communicators(records: &[RankRecord]) -> BTreeMap<&str, Vec<Member<'_>>> {
    let mut groups: BTreeMap<&str, Vec<Member>> = BTreeMap::new();
    for record in records {
        for g in &record.groups {
            groups.entry(&g.group).or_default().push(Member {
                rank: record.rank,
                dumped_at_us: record.dumped_at_us,
                entries: &g.entries,
            });
        }
    }
    groups
}

/// The first collective the members disagree on: other kinds, or other
/// sizes where every member moves the same bytes.
fn mismatch(members: &[Member], label: &dyn Fn(u64) -> String) -> Option<String> {
    let mut by_seq: BTreeMap<u64, Vec<(usize, &Entry)>> = BTreeMap::new();
    for m in members {
        for e in m.entries {
            by_seq.entry(e.seq).or_default().push((m.rank, e));
        }
    }
    let same_size = |k: Kind| !matches!(k, Kind::AllGather | Kind::SendRecv);
    by_seq.into_iter().find_map(|(seq, calls)| {
        let mut sorts: Vec<(Kind, Option<usize>, Vec<usize>)> = Vec::new();
        for (rank, e) in calls {
            let size = same_size(e.kind).then_some(e.bytes);
            match sorts.iter_mut().find(|(k, b, _)| (*k, *b) == (e.kind, size)) {
                Some((_, _, ranks)) => ranks.push(rank),
                None => sorts.push((e.kind, size, vec![rank])),
            }
        }
        (sorts.len() > 1).then(|| {
            let calls: Vec<String> = (sorts.iter())
                .map(|(kind, size, ranks_calling)| {
                    let size = size.map_or(String::new(), |b| format!(" ({})", bytes(b)));
                    format!("{} {}{size}", ranks(ranks_calling), kind.name())
                })
                .collect();
            format!(
                "ranks disagree on collective {}: {} (the ranks call other collectives: a bug, or other flags)",
                label(seq),
                calls.join(", ")
            )
        })
    })
}

/// Who holds up the collective the members wait in, if they wait.
fn hold_up(
    evidence: &Evidence,
    group: &str,
    members: &[Member],
    label: &dyn Fn(u64) -> String,
) -> Option<Finding> {
    let nproc = evidence.nproc;
    let stuck = members
        .iter()
        .filter_map(|m| m.inside())
        .map(|e| e.seq)
        .min()?;
    let waiting: Vec<&Member> = (members.iter())
        .filter(|m| m.inside().is_some_and(|e| e.seq == stuck))
        .collect();
    let entry = waiting[0].at(stuck)?;
    let waited = (waiting.iter())
        .filter_map(|m| m.at(stuck).map(|e| m.waited(e)))
        .fold(0.0, f64::max);
    let what = format!("{} {}{}", entry.kind.name(), label(stuck), about(entry));
    let behind: Vec<&Member> = (members.iter())
        .filter(|m| m.last_done().is_none_or(|d| d < stuck))
        .filter(|m| m.inside().is_none_or(|e| e.seq != stuck))
        .collect();
    let missing = missing(evidence, group, members);
    let waiters = ranks(&waiting.iter().map(|m| m.rank).collect::<Vec<_>>());
    let mut clauses = Vec::new();
    if !behind.is_empty() {
        let late: Vec<usize> = behind.iter().map(|m| m.rank).collect();
        let queued = behind.iter().any(|m| m.at(stuck).is_some());
        let never = if queued {
            "queued but never started"
        } else {
            "never started"
        };
        clauses.push(format!("{} {never} {what}", ranks_on_nodes(&late, nproc)));
        clauses.push(last_completed(&behind, label));
        clauses.push(format!("{waiters} waited {waited:.1} s"));
    }
    for (rank, why) in &missing {
        clauses.push(format!("{} {why}", ranks_on_nodes(&[*rank], nproc)));
    }
    let blames = !clauses.is_empty();
    if behind.is_empty() {
        let after = (waiting[0].last_done()).map_or(String::new(), |d| {
            format!(", after completing {}", label(d))
        });
        clauses.push(match blames {
            true => {
                let them = if missing.len() == 1 { "it" } else { "them" };
                format!("{waiters} waited {waited:.1} s for {them} in {what}{after}")
            }
            false => format!(
                "no rank is behind: {waiters} waited {waited:.1} s inside {what}{after}, which every rank started (one is slow inside it, or the network between them)"
            ),
        });
    }
    Some(Finding {
        text: clauses.join("; "),
        waited,
        blames,
    })
}

/// "its last completed collective is #N" for the ranks behind.
fn last_completed(behind: &[&Member], label: &dyn Fn(u64) -> String) -> String {
    let done: Vec<Option<u64>> = behind.iter().map(|m| m.last_done()).collect();
    let its = if behind.len() == 1 { "its" } else { "their" };
    match done.iter().min() {
        Some(Some(first)) if done.iter().all(|d| *d == done[0]) => {
            format!("{its} last completed collective is {}", label(*first))
        }
        Some(Some(first)) => format!(
            "{its} last completed collectives go back to {}",
            label(*first)
        ),
        _ => format!("{its} record holds no completed collective"),
    }
}

/// The members of a job-wide communicator (every rank, numbered as in the
/// job) that wrote no record, and what is known of each.
fn missing(evidence: &Evidence, group: &str, members: &[Member]) -> Vec<(usize, String)> {
    let job_wide = (evidence.records.iter())
        .flat_map(|r| r.groups.iter().map(move |g| (r.rank, g)))
        .filter(|(_, g)| g.group == group)
        .all(|(rank, g)| g.rank == rank && g.size == evidence.world);
    if !job_wide {
        return Vec::new();
    }
    (0..evidence.world)
        .filter(|r| members.iter().all(|m| m.rank != *r))
        .filter(|r| evidence.records.iter().all(|rec| rec.rank != *r))
        .map(|r| {
            let known = evidence.silent.iter().find(|(s, _)| *s == r);
            let why = match known.map(|(_, why)| why) {
                Some(Silence::Stopped) => "is stopped (SIGSTOP, or a debugger) and wrote no record",
                Some(Silence::Unanswered) => {
                    "wrote no record, not even when asked (SIGUSR2): hung where no thread of it runs"
                }
                Some(Silence::Ended(how)) => return (r, format!("ended ({how}) and wrote no record")),
                Some(Silence::Remote) => {
                    "runs on another node, whose records are not here (signal every launcher, or give --flight-recorder a shared directory)"
                }
                None => "wrote no record",
            };
            (r, why.to_string())
        })
        .collect()
}

/// Nothing holds the job up: where the ranks are.
fn in_step(groups: &BTreeMap<&str, Vec<Member>>, world: usize) -> String {
    let places: Vec<String> = (groups.iter())
        .map(|(group, members)| {
            let done: Vec<u64> = members.iter().filter_map(|m| m.last_done()).collect();
            match (done.iter().min(), done.iter().max()) {
                (Some(lo), Some(hi)) if lo == hi => format!("{group} #{lo}"),
                (Some(lo), Some(hi)) => format!("{group} #{lo}-#{hi}"),
                _ => format!("{group} (nothing completed)"),
            }
        })
        .collect();
    format!(
        "no rank is held up: none of the {world} has waited {IN_STEP_SECS:.0} s in a collective (last completed: {})",
        places.join(", ")
    )
}
