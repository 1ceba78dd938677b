//! [`FlightLog`]: one rank's recorders, and the file they are dumped to.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use super::record::{RankRecord, record_path, unix_micros};
use super::recorder::Recorder;

/// A rank's flight recorders (one per communicator) and where they are
/// dumped: cheap to clone, shared by whatever may dump them (the rank's
/// error path, a signal, a watchdog about to end the process).
#[derive(Clone)]
pub struct FlightLog(Arc<Inner>);

impl std::fmt::Debug for FlightLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightLog")
            .field("rank", &self.0.rank)
            .field("path", &self.0.path)
            .finish()
    }
}

struct Inner {
    rank: usize,
    world: usize,
    host: String,
    path: PathBuf,
    recorders: Mutex<Vec<Arc<Recorder>>>,
}

impl FlightLog {
    /// The log of `rank` of `world` on `host`, dumped to `dir/rank-R.json`.
    pub fn new(rank: usize, world: usize, host: impl Into<String>, dir: &Path) -> Self {
        Self(Arc::new(Inner {
            rank,
            world,
            host: host.into(),
            path: record_path(dir, rank),
            recorders: Mutex::new(Vec::new()),
        }))
    }

    /// Adds a communicator's recorder to what is dumped.
    pub fn add(&self, recorder: Arc<Recorder>) {
        self.recorders().push(recorder);
    }

    fn recorders(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Recorder>>> {
        // A push or a clone cannot leave the list half-changed.
        self.0
            .recorders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whose log this is.
    pub fn rank(&self) -> usize {
        self.0.rank
    }

    /// Where the dump goes.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// The record as it stands, written for `reason`.
    pub fn snapshot(&self, reason: &str) -> RankRecord {
        let recorders = self.recorders().clone();
        RankRecord {
            rank: self.0.rank,
            world: self.0.world,
            host: self.0.host.clone(),
            pid: std::process::id(),
            reason: reason.to_string(),
            dumped_at_us: unix_micros(SystemTime::now()),
            groups: recorders.iter().map(|r| r.snapshot()).collect(),
        }
    }

    /// Writes the record (atomically) for `reason`; returns where, or
    /// `None` when nothing was recorded yet (no communicator, one rank).
    pub fn dump(&self, reason: &str) -> std::io::Result<Option<&Path>> {
        if self.recorders().is_empty() {
            return Ok(None);
        }
        self.snapshot(reason).write(&self.0.path)?;
        Ok(Some(&self.0.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::{Kind, State};

    #[test]
    fn a_dump_holds_every_communicator_of_the_rank() {
        let dir = tempfile::tempdir().unwrap();
        let log = FlightLog::new(1, 2, "node-a", dir.path());
        assert_eq!(log.dump("nothing yet").unwrap(), None);
        let (job, grads) = (Recorder::new("job", 1, 2), Recorder::new("gradients", 1, 2));
        log.add(job.clone());
        log.add(grads.clone());
        let seq = job.queue(Kind::AllReduceF64, None, 16);
        job.start(seq);
        grads.queue(Kind::AllReduce, Some(0), 4096);
        let path = log.dump("SIGUSR2").unwrap().unwrap().to_path_buf();
        assert_eq!(path, dir.path().join("rank-1.json"));
        let back = RankRecord::read(&path).unwrap();
        assert_eq!(
            (back.rank, back.world, back.reason.as_str()),
            (1, 2, "SIGUSR2")
        );
        assert_eq!(back.host, "node-a");
        let groups: Vec<_> = back.groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(groups, ["job", "gradients"]);
        assert_eq!(back.groups[0].entries[0].state, State::Started);
        assert_eq!(back.groups[1].entries[0].state, State::Queued);
    }
}
