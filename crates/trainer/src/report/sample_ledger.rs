//! `--sample-ledger FILE`: rank 0's record of the samples each committed
//! step trained, one JSON line a step:
//!
//! ```text
//! {"global_step":31,"epoch":1,"step":31,"samples":[…],"padding":[…]}
//! ```
//!
//! `samples` are the step's samples seen for the first time in its epoch;
//! `padding` the ones seen before (the epoch's last global batch, padded
//! with its first samples). So an epoch trained each sample once exactly
//! when no index occurs twice in its lines' `samples` and every index of
//! the split occurs there.
//!
//! The file follows the model's lineage: a run resumed from a checkpoint
//! keeps the lines up to the checkpoint's step and drops the rest (the
//! steps a failed attempt trained after it, which the resumed run trains
//! again), rewriting the file whole under a temporary name first.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::train::{CommittedStep, SampleRecord};

/// The ledger file, open for appending.
pub struct SampleLedger {
    path: PathBuf,
    file: File,
    /// The epoch of the last line, and the samples its lines hold so far.
    epoch: u64,
    seen: HashSet<u32>,
    /// The last line's global step (0: none).
    last: u64,
}

/// One line of the file.
#[derive(Debug, Serialize, Deserialize)]
pub struct LedgerLine {
    pub global_step: u64,
    pub epoch: u64,
    pub step: u64,
    pub samples: Vec<u32>,
    pub padding: Vec<u32>,
}

impl SampleLedger {
    /// Opens the ledger of a run that starts after `global_step` steps: a
    /// new file for a fresh run (0), else the file's lines up to that step.
    pub fn open(path: &Path, global_step: u64) -> anyhow::Result<Self> {
        let context = || format!("--sample-ledger {}", path.display());
        let kept = match global_step {
            0 => Vec::new(),
            at => lines_up_to(path, at).with_context(context)?,
        };
        let epoch = kept.last().map_or(0, |l| l.epoch);
        let seen = (kept.iter().filter(|l| l.epoch == epoch))
            .flat_map(|l| l.samples.iter().copied())
            .collect();
        // The kept lines go to a file of their own first: a crash leaves
        // the old ledger or the new one, never a part of either.
        let partial = path.with_extension("partial");
        let mut file = File::create(&partial).with_context(context)?;
        for line in &kept {
            writeln!(file, "{}", serde_json::to_string(line)?).with_context(context)?;
        }
        file.sync_all().with_context(context)?;
        std::fs::rename(&partial, path).with_context(context)?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(context)?;
        Ok(SampleLedger {
            path: path.to_path_buf(),
            file,
            epoch,
            seen,
            last: kept.last().map_or(0, |l| l.global_step),
        })
    }
}

impl SampleRecord for SampleLedger {
    fn committed(&mut self, step: &CommittedStep<'_>) -> anyhow::Result<()> {
        if step.epoch != self.epoch {
            self.epoch = step.epoch;
            self.seen.clear();
        }
        let (samples, padding) = step.samples.iter().partition(|&&i| self.seen.insert(i));
        let line = LedgerLine {
            global_step: step.global_step,
            epoch: step.epoch,
            step: step.step,
            samples,
            padding,
        };
        // One write a line: a worker killed between steps leaves whole lines.
        let text = format!("{}\n", serde_json::to_string(&line)?);
        (self.file.write_all(text.as_bytes()))
            .with_context(|| format!("writing --sample-ledger {}", self.path.display()))?;
        self.last = step.global_step;
        Ok(())
    }

    fn last_step(&self) -> u64 {
        self.last
    }
}

/// The lines of the ledger at `path` up to global step `at` (none if there
/// is no file: the run before kept none). A last line cut short (a worker
/// killed as it wrote) is dropped; any other line that does not parse is
/// an error naming it.
fn lines_up_to(path: &Path, at: u64) -> anyhow::Result<Vec<LedgerLine>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let count = text.lines().count();
    let mut kept = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line: LedgerLine = match serde_json::from_str(line) {
            Ok(line) => line,
            Err(_) if n + 1 == count && !text.ends_with('\n') => break,
            Err(e) => bail!(
                "line {} is not a ledger line ({e}): move the file away",
                n + 1
            ),
        };
        if line.global_step <= at {
            kept.push(line);
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(global_step: u64, epoch: u64, samples: &[u32]) -> CommittedStep<'_> {
        CommittedStep {
            global_step,
            epoch,
            step: global_step,
            samples,
        }
    }

    fn read(path: &Path) -> Vec<LedgerLine> {
        lines_up_to(path, u64::MAX).unwrap()
    }

    #[test]
    fn a_sample_seen_before_in_its_epoch_is_padding() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let mut ledger = SampleLedger::open(&path, 0).unwrap();
        ledger.committed(&step(1, 1, &[3, 1])).unwrap();
        ledger.committed(&step(2, 1, &[0, 2, 3])).unwrap();
        ledger.committed(&step(3, 2, &[3, 0])).unwrap();
        let lines = read(&path);
        assert_eq!(lines[1].samples, [0, 2]);
        assert_eq!(lines[1].padding, [3]);
        // A new epoch starts afresh.
        assert_eq!(lines[2].samples, [3, 0]);
        assert!(lines[2].padding.is_empty());
    }

    #[test]
    fn a_resumed_run_keeps_the_lines_up_to_its_checkpoint_and_what_they_saw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let mut ledger = SampleLedger::open(&path, 0).unwrap();
        for (s, samples) in [[0, 1], [2, 3], [4, 5]].iter().enumerate() {
            ledger.committed(&step(s as u64 + 1, 1, samples)).unwrap();
        }
        drop(ledger);
        // A torn last line, as a kill mid-write leaves it.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"global_step\":4,\"ep").unwrap();
        drop(file);
        // Resumed from step 2's checkpoint: step 3 is trained again.
        let mut ledger = SampleLedger::open(&path, 2).unwrap();
        ledger.committed(&step(3, 1, &[1, 4])).unwrap();
        let lines = read(&path);
        assert_eq!(
            lines.iter().map(|l| l.global_step).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(lines[2].samples, [4]);
        assert_eq!(lines[2].padding, [1]);
        assert!(!path.with_extension("partial").exists());
    }

    #[test]
    fn a_line_that_is_not_the_ledgers_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        std::fs::write(&path, "not json\n{}\n").unwrap();
        let e = SampleLedger::open(&path, 5).err().unwrap();
        let text = format!("{e:#}");
        assert!(text.contains("line 1 is not a ledger line"), "{text}");
        assert!(text.contains("--sample-ledger"), "{text}");
    }
}
