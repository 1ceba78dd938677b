//! The launcher's side of the flight recorder: it knows when an attempt
//! failed and which of its workers went silent, so it asks those for their
//! records (SIGUSR2) before it kills them, notes which cannot answer
//! (stopped), gathers the records (node 0: its own machine's, those in a
//! shared directory, and those the other nodes hand over through the
//! launchers' store) and says the [`verdict`](crate::verdict).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use comm::flight::{RankRecord, record_path, unix_micros};
use serde::{Deserialize, Serialize};

use crate::contract::{DUMP_SIGNAL, describe};
use crate::verdict::{Evidence, Silence, verdict};
use crate::workers::{Worker, forward};

/// How long workers asked for their records get to write them.
const ANSWER_WAIT: Duration = Duration::from_secs(3);

/// How often the launcher looks for the records it waits for.
const LOOK: Duration = Duration::from_millis(20);

/// One attempt's flight records: where the workers write them, and what
/// the launcher knows of the job.
#[derive(Clone, Debug)]
pub(crate) struct Flight {
    dir: PathBuf,
    /// When the attempt began: older records are a past attempt's.
    since_us: u64,
    world: usize,
    nproc: usize,
    /// This launcher's node.
    node: usize,
}

/// What a node hands node 0: its ranks' records, and its word on those
/// that wrote none.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct Handover {
    records: Vec<RankRecord>,
    silent: Vec<(usize, Silence)>,
}

impl Flight {
    /// The flight records of an attempt beginning now, in `dir`, of a job
    /// of `world` ranks, `nproc` on each node, this one `node`.
    pub fn begin(dir: &Path, world: usize, nproc: usize, node: usize) -> Self {
        Self {
            dir: dir.to_path_buf(),
            since_us: unix_micros(SystemTime::now()),
            world,
            nproc,
            node,
        }
    }

    /// This node's ranks.
    fn ranks(&self) -> std::ops::Range<usize> {
        self.node * self.nproc..(self.node + 1) * self.nproc
    }

    /// The records in the directory written since `since_us`, or this
    /// attempt's.
    fn read(&self, since_us: Option<u64>) -> Vec<RankRecord> {
        RankRecord::read_dir(&self.dir, since_us.unwrap_or(self.since_us))
    }

    /// Whether every worker of `ranks` wrote a record since `since_us`.
    fn answered(&self, ranks: &[usize], since_us: u64) -> bool {
        ranks.iter().all(|&r| {
            RankRecord::read(&record_path(&self.dir, r))
                .is_ok_and(|rec| rec.dumped_at_us >= since_us)
        })
    }

    /// Waits (up to [`ANSWER_WAIT`]) until `ranks` wrote a record since
    /// `since_us`; returns those that did not.
    fn wait_for(&self, ranks: &[usize], since_us: u64) -> Vec<usize> {
        let until = Instant::now() + ANSWER_WAIT;
        while !self.answered(ranks, since_us) && Instant::now() < until {
            std::thread::sleep(LOOK);
        }
        (ranks.iter().copied())
            .filter(|&r| !self.answered(&[r], since_us))
            .collect()
    }

    /// SIGUSR2 to the launcher, passed on to the `workers`: once they have
    /// written their records, the verdict on them, from a thread of its own
    /// (the watch over the workers goes on meanwhile).
    pub fn on_dump_signal(&self, workers: &[Worker]) {
        let asked = unix_micros(SystemTime::now());
        let ranks: Vec<usize> = workers
            .iter()
            .filter(|w| w.status.is_none())
            .map(|w| w.rank)
            .collect();
        let flight = self.clone();
        std::thread::spawn(move || {
            flight.wait_for(&ranks, asked);
            let records = flight.read(Some(asked));
            let remote: Vec<(usize, Silence)> = (0..flight.world)
                .filter(|r| !flight.ranks().contains(r))
                .map(|r| (r, Silence::Remote))
                .collect();
            let said = flight
                .judge(&records, &remote)
                .unwrap_or_else(|| format!("no rank wrote a record in {}", flight.dir.display()));
            tell!(
                "launcher: flight recorder ({}): {said}",
                describe(DUMP_SIGNAL)
            );
        });
    }

    /// Before the launcher kills `unresponsive` workers: asks them for
    /// their records and waits a moment for them; returns what it knows of
    /// every worker that wrote none (stopped, silent, ended so).
    pub fn ask(&self, workers: &[Worker], unresponsive: &[usize]) -> Vec<(usize, Silence)> {
        let asked = unix_micros(SystemTime::now());
        let mut silent = Vec::new();
        let mut waiting = Vec::new();
        for &i in unresponsive {
            let w = &workers[i];
            if is_stopped(w.child.id()) {
                silent.push((w.rank, Silence::Stopped));
            } else {
                forward(std::slice::from_ref(w), DUMP_SIGNAL);
                waiting.push(w.rank);
            }
        }
        silent.extend(
            (self.wait_for(&waiting, asked).into_iter()).map(|rank| (rank, Silence::Unanswered)),
        );
        for (i, w) in workers.iter().enumerate() {
            if let (Some(status), false) = (w.status, unresponsive.contains(&i)) {
                silent.push((w.rank, Silence::Ended(status.to_string())));
            }
        }
        silent
    }

    /// This node's part of the evidence on the attempt, for node 0.
    pub fn handover(&self, silent: &[(usize, Silence)]) -> Handover {
        let records = self.read(None).into_iter();
        Handover {
            records: records.filter(|r| self.ranks().contains(&r.rank)).collect(),
            silent: silent.to_vec(),
        }
    }

    /// Node 0's verdict on the attempt, from the records here, the other
    /// nodes' `handovers` and its own word on its `silent` workers.
    pub fn conclude(&self, silent: &[(usize, Silence)], handovers: Vec<Handover>) -> String {
        let mut records = self.read(None);
        let mut silent = silent.to_vec();
        for h in handovers {
            records.extend(h.records);
            silent.extend(h.silent);
        }
        // A shared directory and a handover may both hold a rank's record.
        records.sort_by_key(|r| (r.rank, std::cmp::Reverse(r.dumped_at_us)));
        records.dedup_by_key(|r| r.rank);
        self.judge(&records, &silent).unwrap_or_else(|| {
            format!(
                "no rank wrote a record in {} (did the workers start training?)",
                self.dir.display()
            )
        })
    }

    fn judge(&self, records: &[RankRecord], silent: &[(usize, Silence)]) -> Option<String> {
        verdict(&Evidence {
            records,
            world: self.world,
            nproc: self.nproc,
            silent,
        })
    }
}

impl Handover {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A node's handover; a garbled one counts as empty.
    pub fn decode(bytes: &[u8]) -> Self {
        serde_json::from_slice(bytes).unwrap_or_default()
    }
}

/// Whether process `pid` is stopped (SIGSTOP, SIGTSTP) or traced: state
/// `T` or `t` in `/proc/PID/stat`, after the parenthesised command name.
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        (stat.rsplit_once(')'))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "T" || state == "t")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_reads_as_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!is_stopped(pid));
        let stop = std::process::Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status();
        assert!(stop.unwrap().success());
        let until = Instant::now() + Duration::from_secs(10);
        while !is_stopped(pid) && Instant::now() < until {
            std::thread::sleep(LOOK);
        }
        assert!(is_stopped(pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
