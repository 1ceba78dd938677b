//! What a flight record holds, as each rank writes it (`rank-R.json`, one
//! small JSON file per rank) and a launcher reads it back.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch, by this machine's clock: a record's
/// times.
pub fn unix_micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum Kind {
    AllReduce = 1,
    /// An exact all-reduce in f64 (metrics, stop votes).
    AllReduceF64 = 2,
    Broadcast = 3,
    Barrier = 4,
    AllGather = 5,
    SendRecv = 6,
}

impl Kind {
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        [
            Self::AllReduce,
            Self::AllReduceF64,
            Self::Broadcast,
            Self::Barrier,
            Self::AllGather,
            Self::SendRecv,
        ]
        .into_iter()
        .find(|k| *k as u8 == code)
    }

    /// Its name in a sentence.
    pub fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all-reduce",
            Self::AllReduceF64 => "all-reduce (f64)",
            Self::Broadcast => "broadcast",
            Self::Barrier => "barrier",
            Self::AllGather => "all-gather",
            Self::SendRecv => "send/recv",
        }
    }
}

/// How far a collective got on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Handed to the communicator (its thread, or the GPU stream), not
    /// begun: the collectives before it have not completed here.
    Queued,
    /// Under way here: it waits for its peers or moves data.
    Started,
    Done,
}

/// One collective as a rank saw it; times in microseconds since the Unix
/// epoch, by this rank's clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub kind: Kind,
    /// The gradient bucket it averages, if it does.
    pub bucket: Option<usize>,
    /// This rank's bytes in it.
    pub bytes: usize,
    pub state: State,
    pub queued_us: u64,
    pub started_us: Option<u64>,
    pub done_us: Option<u64>,
}

/// One communicator's collectives on a rank, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The communicator's name (`job`, `gradients`, …): alike on its members.
    pub group: String,
    /// This rank's place in it, and its size.
    pub rank: usize,
    pub size: usize,
    pub entries: Vec<Entry>,
}

/// What one rank wrote: who, when, why, and its communicators' records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankRecord {
    pub rank: usize,
    pub world: usize,
    pub host: String,
    pub pid: u32,
    /// Why it was written: the rank's error, or the signal that asked.
    pub reason: String,
    pub dumped_at_us: u64,
    pub groups: Vec<GroupRecord>,
}

/// The file rank `rank` writes in `dir`.
pub fn record_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

impl RankRecord {
    /// Writes the record to `path` atomically (a temporary file renamed
    /// over it), so a reader finds the old record or the new one, whole.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{}.tmp", name.unwrap_or_default()));
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, path)
    }

    pub fn read(path: &Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        serde_json::from_slice(&bytes).map_err(std::io::Error::other)
    }

    /// The records in `dir` written at `since_us` or later (a past run's
    /// are stale); files that do not read as records are skipped.
    pub fn read_dir(dir: &Path, since_us: u64) -> Vec<Self> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut found: Vec<Self> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("rank-") && name.ends_with(".json")
            })
            .filter_map(|e| Self::read(&e.path()).ok())
            .filter(|r| r.dumped_at_us >= since_us)
            .collect();
        found.sort_by_key(|r| r.rank);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(rank: usize, dumped_at_us: u64) -> RankRecord {
        RankRecord {
            rank,
            world: 2,
            host: "h".into(),
            pid: 7,
            reason: "SIGUSR2".into(),
            dumped_at_us,
            groups: vec![GroupRecord {
                group: "job".into(),
                rank,
                size: 2,
                entries: vec![Entry {
                    seq: 3,
                    kind: Kind::AllReduceF64,
                    bucket: None,
                    bytes: 16,
                    state: State::Started,
                    queued_us: 10,
                    started_us: Some(11),
                    done_us: None,
                }],
            }],
        }
    }

    #[test]
    fn records_round_trip_and_stale_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = record(1, 2_000);
        fresh.write(&record_path(dir.path(), 1)).unwrap();
        record(0, 500).write(&record_path(dir.path(), 0)).unwrap();
        std::fs::write(dir.path().join("rank-9.json"), b"{ torn").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        assert_eq!(RankRecord::read_dir(dir.path(), 1_000), vec![fresh]);
        assert_eq!(RankRecord::read_dir(dir.path(), 0).len(), 2);
        // The atomic write leaves no temporary file behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
        let text = std::fs::read_to_string(record_path(dir.path(), 1)).unwrap();
        assert!(text.contains("\"all-reduce-f64\""), "{text}");
        assert!(text.contains("\"started\""), "{text}");
    }

    #[test]
    fn kinds_survive_their_code() {
        for kind in [Kind::AllReduce, Kind::SendRecv, Kind::Barrier] {
            assert_eq!(Kind::from_code(kind as u8), Some(kind));
        }
        assert_eq!(Kind::from_code(0), None);
    }
}
