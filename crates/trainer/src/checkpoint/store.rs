//! The checkpoint directory: atomic saves, the newest valid checkpoint, and
//! keeping only the last few.
//!
//! A save writes `.tmp-<name>/`, syncs each file and the directory, renames
//! it to `<name>/` and syncs the parent, so a checkpoint is either complete
//! under its name or absent; earlier ones are never touched until a newer
//! one is durable. Deletions rename to `.trash-<name>/` first, so a kill
//! mid-deletion leaves nothing that looks like a checkpoint.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use core_tensor::FlatLayout;

use super::{Position, TrainingState, load};

const TMP_PREFIX: &str = ".tmp-";
const TRASH_PREFIX: &str = ".trash-";

/// Test-only: seconds to sleep in the middle of writing a checkpoint's first
/// file, so that a test can kill the process mid-save.
pub const PAUSE_ENV: &str = "TRAINER_TEST_PAUSE_IN_SAVE";

/// A directory of checkpoints, of which the newest `keep` are kept.
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    path: PathBuf,
    keep: usize,
}

/// The result of looking for the newest valid checkpoint.
pub struct Newest {
    pub found: Option<(PathBuf, TrainingState)>,
    /// Newer checkpoints that failed validation, with the reason.
    pub skipped: Vec<(PathBuf, anyhow::Error)>,
}

impl CheckpointDir {
    pub fn new(path: impl Into<PathBuf>, keep: usize) -> Self {
        Self {
            path: path.into(),
            keep: keep.max(1),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checkpoints here by name, oldest first (none if the directory
    /// does not exist yet).
    pub fn list(&self) -> anyhow::Result<Vec<(Position, PathBuf)>> {
        let entries = match fs::read_dir(&self.path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("listing {}", self.path.display())),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", self.path.display()))?;
            if let Some(position) = entry.file_name().to_str().and_then(Position::from_dir_name) {
                found.push((position, entry.path()));
            }
        }
        found.sort();
        Ok(found)
    }

    /// The newest checkpoint that loads and validates.
    pub fn newest_valid(&self, layout: &FlatLayout) -> anyhow::Result<Newest> {
        let mut skipped = Vec::new();
        for (_, path) in self.list()?.into_iter().rev() {
            match load(&path, layout) {
                Ok(state) => {
                    return Ok(Newest {
                        found: Some((path, state)),
                        skipped,
                    });
                }
                Err(e) => skipped.push((path, e)),
            }
        }
        Ok(Newest {
            found: None,
            skipped,
        })
    }

    /// Creates the directory and removes what interrupted saves and
    /// deletions left behind; returns what it removed.
    pub fn prepare(&self) -> anyhow::Result<Vec<PathBuf>> {
        fs::create_dir_all(&self.path)
            .with_context(|| format!("creating {}", self.path.display()))?;
        let mut removed = Vec::new();
        for entry in
            fs::read_dir(&self.path).with_context(|| format!("listing {}", self.path.display()))?
        {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(TMP_PREFIX) || name.starts_with(TRASH_PREFIX) {
                fs::remove_dir_all(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
                removed.push(entry.path());
            }
        }
        Ok(removed)
    }

    /// Writes `state` atomically, then deletes all but the newest `keep`
    /// checkpoints up to it; returns the new checkpoint's path.
    pub fn save(&self, state: &TrainingState, layout: &FlatLayout) -> anyhow::Result<PathBuf> {
        let files = state.encode(layout)?;
        let name = state.position.dir_name();
        let path = self.path.join(&name);
        let tmp = self.path.join(format!("{TMP_PREFIX}{name}"));
        let write = || -> std::io::Result<()> {
            fs::create_dir_all(&self.path)?;
            if tmp.exists() {
                fs::remove_dir_all(&tmp)?;
            }
            fs::create_dir(&tmp)?;
            for (i, (file, bytes)) in files.iter().enumerate() {
                write_synced(&tmp.join(file), bytes, i == 0)?;
            }
            File::open(&tmp)?.sync_all()?;
            // Only an invalid checkpoint can sit at a position training is
            // just passing (a valid one would have been resumed from).
            if path.exists() {
                self.discard(&path)?;
            }
            fs::rename(&tmp, &path)?;
            File::open(&self.path)?.sync_all()
        };
        if let Err(e) = write() {
            // A full disk must not stay full of a checkpoint that failed.
            let _ = fs::remove_dir_all(&tmp);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        self.prune(state.position)?;
        Ok(path)
    }

    /// Deletes checkpoints older than `newest` beyond the `keep` newest.
    fn prune(&self, newest: Position) -> anyhow::Result<()> {
        let older: Vec<_> = self
            .list()?
            .into_iter()
            .filter(|(p, _)| *p < newest)
            .collect();
        let excess = older.len().saturating_sub(self.keep - 1);
        for (_, path) in &older[..excess] {
            self.discard(path)
                .with_context(|| format!("deleting the old checkpoint {}", path.display()))?;
        }
        Ok(())
    }

    /// Removes a checkpoint directory, first renaming it out of sight.
    fn discard(&self, path: &Path) -> std::io::Result<()> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let trash = self.path.join(format!("{TRASH_PREFIX}{name}"));
        fs::rename(path, &trash)?;
        fs::remove_dir_all(&trash)
    }
}

/// Writes `bytes` to `path` and syncs it; `may_pause` honours [`PAUSE_ENV`]
/// halfway through.
fn write_synced(path: &Path, bytes: &[u8], may_pause: bool) -> std::io::Result<()> {
    let mut file = File::create(path)?;
    let (first, rest) = bytes.split_at(bytes.len() / 2);
    file.write_all(first)?;
    if may_pause && let Some(pause) = test_pause()? {
        std::thread::sleep(pause);
    }
    file.write_all(rest)?;
    file.sync_all()
}

fn test_pause() -> std::io::Result<Option<Duration>> {
    let Ok(value) = std::env::var(PAUSE_ENV) else {
        return Ok(None);
    };
    let pause = value
        .parse()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok());
    pause.map(Some).ok_or_else(|| {
        std::io::Error::other(format!("{PAUSE_ENV}={value:?} is not a number of seconds"))
    })
}
