//! Where a job's restarted workers continue (the launcher's [`Restarts`]):
//! from the newest checkpoint in `--checkpoint-dir` (`--resume auto`), or,
//! while it holds none, as the first attempt started. Node 0's launcher
//! holds the directory for the job meanwhile ([`super::lock`]).

use std::ffi::OsString;
use std::path::Path;
use std::sync::OnceLock;

use launcher::{Refusal, Restarts, without_flag};

use super::CheckpointDir;
use super::lock::{DirLock, HELD_VAR, Role};
use super::resume::{self, ResumeFrom};

/// The checkpoints a restart continues from, and where the first attempt
/// started.
pub struct CheckpointRestarts {
    dir: Option<CheckpointDir>,
    first: Option<ResumeFrom>,
    /// The job's id at the rendezvous (`--rdzv-id`), for the lock file.
    job: Option<String>,
    /// The directory's lock, once this launcher holds it.
    held: OnceLock<DirLock>,
}

impl CheckpointRestarts {
    /// Restarts from `dir` (keeping `keep` checkpoints), the first attempt
    /// having started from `first` (`--resume`).
    pub fn new(dir: Option<&Path>, keep: u32, first: Option<ResumeFrom>) -> Self {
        Self {
            dir: dir.map(|d| CheckpointDir::new(d, keep as usize)),
            first,
            job: None,
            held: OnceLock::new(),
        }
    }

    /// The same, naming the job `job` in the directory's lock file.
    pub fn of_job(self, job: Option<String>) -> Self {
        Self { job, ..self }
    }

    /// What the launcher checks before its first start, so that a restart
    /// (which adds `--resume auto`) cannot turn a refused start into a
    /// resumed one (see [`resume::preflight`]).
    pub fn preflight(&self) -> anyhow::Result<()> {
        match &self.dir {
            Some(dir) => resume::preflight(self.first.as_ref(), dir),
            None => Ok(()),
        }
    }
}

impl Restarts for CheckpointRestarts {
    /// Continue from the newest checkpoint in the directory (`--resume
    /// auto`); while it holds none, the first attempt's flags, so that a
    /// `--resume PATH` from elsewhere is resumed, or refused, again instead
    /// of becoming a fresh start (`--resume auto` over no checkpoint).
    fn args(&self, first: &[OsString]) -> Vec<OsString> {
        match self.dir.as_ref().map(CheckpointDir::list) {
            Some(Ok(list)) if list.is_empty() => first.to_vec(),
            _ => resume_auto(first),
        }
    }

    /// The newest checkpoint by name (the workers validate it, and pass
    /// over one that does not load), or, with none yet, where the first
    /// attempt started.
    fn continues_from(&self) -> String {
        match self.dir.as_ref().map(CheckpointDir::list) {
            Some(Ok(mut list)) => match (list.pop(), &self.first) {
                (Some((_, path)), _) => {
                    format!("the newest valid checkpoint ({} or older)", path.display())
                }
                (None, Some(ResumeFrom::Path(path))) => format!(
                    "{} again (no checkpoint in --checkpoint-dir yet)",
                    path.display()
                ),
                (None, _) => "the start (no checkpoint yet)".to_string(),
            },
            Some(Err(e)) => format!("the newest valid checkpoint (listing failed: {e:#})"),
            None => "the start".to_string(),
        }
    }

    fn after_preemption(&self) -> String {
        match self.dir {
            Some(_) => "continue with --resume auto",
            None => "nothing was saved (no --checkpoint-dir)",
        }
        .to_string()
    }

    /// Takes the checkpoint directory for the job's life; the workers get
    /// [`HELD_VAR`], by which rank 0 knows it need not (and must not)
    /// take it again.
    fn hold(&self) -> Result<Vec<(OsString, OsString)>, Refusal> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        let lock = match self.held.get() {
            Some(lock) => lock,
            None => {
                let lock = DirLock::take(dir.path(), Role::Launcher, self.job.as_deref())?;
                self.held.get_or_init(|| lock)
            }
        };
        Ok(vec![(HELD_VAR.into(), lock.holder().token.clone().into())])
    }
}

/// The flags of a restart from the newest checkpoint: whatever `--resume`
/// said, `--resume auto` (`--init-from` still applies if there is none).
fn resume_auto(args: &[OsString]) -> Vec<OsString> {
    let mut args = without_flag(args.iter().cloned(), "--resume");
    args.extend(["--resume", "auto"].map(OsString::from));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn restarts_resume_auto_whatever_the_first_attempt_resumed() {
        let workers = os(&["--world-size", "2", "--resume=ckpt", "--epochs", "4"]);
        assert_eq!(
            resume_auto(&workers),
            os(&["--world-size", "2", "--epochs", "4", "--resume", "auto"])
        );
        let spaced = os(&["--resume", "ckpt", "--init-from", "w.safetensors"]);
        assert_eq!(
            resume_auto(&spaced),
            os(&["--init-from", "w.safetensors", "--resume", "auto"])
        );
    }

    /// Until the job has saved a checkpoint, a restart starts as the first
    /// attempt did: a `--resume PATH` that was refused is refused again,
    /// not turned into a fresh start by `--resume auto` over nothing.
    #[test]
    fn a_restart_before_any_checkpoint_starts_as_the_first_attempt_did() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ckpt");
        let from = ResumeFrom::Path("elsewhere/ckpt-e0001-s000004".into());
        let restarts = CheckpointRestarts::new(Some(&dir), 3, Some(from));
        let first = os(&["--resume", "elsewhere/ckpt-e0001-s000004"]);
        assert_eq!(restarts.args(&first), first);
        assert_eq!(
            restarts.continues_from(),
            "elsewhere/ckpt-e0001-s000004 again (no checkpoint in --checkpoint-dir yet)"
        );
        std::fs::create_dir_all(dir.join("ckpt-e0001-s000002")).unwrap();
        assert_eq!(restarts.args(&first), os(&["--resume", "auto"]));
    }
}
