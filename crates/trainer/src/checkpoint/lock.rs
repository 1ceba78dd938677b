//! One job per checkpoint directory: a job holds `DIR/trainer.lock` for
//! its whole life, so that a second job on the same `--checkpoint-dir` (a
//! resubmitted batch script) is refused at its start instead of training
//! beside the first and interleaving checkpoints with it.
//!
//! The hold is an exclusive `flock` (`std::fs::File::try_lock`) on the
//! file: the kernel keeps it for the open file, and drops it when the
//! process ends however it ends, a `SIGKILL` or a crash included, so a dead
//! job never keeps the directory. Linux's NFS client turns `flock` into a
//! whole-file byte-range lock that the server arbitrates between machines;
//! Lustre does so when mounted with `-o flock`; GPFS and CephFS lock across
//! their nodes (README "Checkpoints and resuming"). The holder writes who
//! it is into the file ([`Holder`]: host, pid, job id, since when), which a
//! refused job names.
//!
//! Which process holds it: node 0's launcher of ours, when the trainer
//! runs under one (it outlives its workers, so a `--max-restarts` restart
//! opens no window for a stranger), else rank 0 (one process, `--spawn
//! threads`, torchrun, srun, mpirun: a restart there is the job starting
//! again). A launcher's workers learn that it holds the directory from
//! [`HELD_VAR`], its [`Holder::token`], which rank 0 checks against the
//! file before it goes on without taking the lock itself.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comm::launch_var::{SLURM_JOB_ID, TORCHELASTIC_RUN_ID};
use serde::{Deserialize, Serialize};

/// The lock file, in the checkpoint directory. It is never deleted (a
/// deletion would let two jobs lock two different files of one name).
pub const LOCK_FILE: &str = "trainer.lock";

/// The variable a launcher that holds the directory gives its workers:
/// the token it wrote into the lock file.
pub const HELD_VAR: &str = "TRAINER_CHECKPOINT_DIR_HELD";

/// How long a refused job waits for a holder that has just taken the lock
/// to write its name into the file.
const NAME_WAIT: Duration = Duration::from_secs(5);

/// Which process of the job holds the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Node 0's launcher, for all its workers and their restarts.
    Launcher,
    /// Rank 0 of the job (or its only process).
    Rank0,
}

/// Who holds a checkpoint directory, as its lock file says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub host: String,
    pub pid: u32,
    pub role: Role,
    /// The scheduler's or launcher's job id, where one was given.
    pub job: Option<String>,
    /// When it took the directory, UTC (`2026-12-02T02:30:00Z`).
    pub since: String,
    /// A random value, the launcher's workers' [`HELD_VAR`].
    pub token: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.role {
            Role::Launcher => "a launcher",
            Role::Rank0 => "rank 0",
        };
        write!(f, "{role}, pid {} on host {}", self.pid, self.host)?;
        if let Some(job) = &self.job {
            write!(f, ", {job}")?;
        }
        write!(f, ", since {}", self.since)
    }
}

impl Holder {
    /// This process as `role`, of the job `job` names (else of the one the
    /// environment names: SLURM's, torchrun's).
    fn this_process(role: Role, job: Option<&str>) -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let job = (var(SLURM_JOB_ID).map(|id| format!("SLURM job {id}")))
            .or_else(|| var(TORCHELASTIC_RUN_ID).map(|id| format!("torchrun run {id}")))
            .or_else(|| job.map(|id| format!("job {id}")));
        Self {
            host: launcher::contract::hostname(),
            pid: std::process::id(),
            role,
            job,
            since: utc(SystemTime::now()),
            token: format!("{:032x}", rand::random::<u128>()),
        }
    }
}

/// Why a job may not have its checkpoint directory.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another job holds it.
    #[error(
        "--checkpoint-dir {} is in use by another job ({}): wait for that job to end (or stop it), or give this one another --checkpoint-dir",
        .dir.display(), held_by(.holder)
    )]
    Held {
        dir: PathBuf,
        /// `None`: its lock file does not say (yet).
        holder: Option<Box<Holder>>,
    },
    /// Its file system takes no locks.
    #[error(
        "--checkpoint-dir {}: its file system takes no locks, so this job cannot hold the directory against a second one: mount Lustre with -o flock (NFS without -o nolock), or choose a directory on a file system with locks",
        .dir.display()
    )]
    Unsupported {
        dir: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    /// The OS refused what the lock was `doing` with `path`.
    #[error("{doing} {}", .path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
}

fn held_by(holder: &Option<Box<Holder>>) -> String {
    match holder {
        Some(holder) => format!("held by {holder}"),
        None => format!("its {LOCK_FILE} is locked but names no holder"),
    }
}

/// A process's hold on a checkpoint directory, for as long as it lives.
#[derive(Debug)]
pub enum Hold {
    /// This process holds the lock.
    Own(DirLock),
    /// The launcher that started this worker holds it for the job.
    Launcher(Holder),
}

/// The lock this process took; dropped (or the process gone), the
/// directory is free.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    holder: Holder,
}

impl DirLock {
    /// Takes `dir` (creating it) for this process as `role` of the job
    /// `job`, or says who holds it.
    pub fn take(dir: &Path, role: Role, job: Option<&str>) -> Result<Self, LockError> {
        lock(dir, || Holder::this_process(role, job))?.map_err(|holder| LockError::Held {
            dir: dir.to_path_buf(),
            holder: holder.map(Box::new),
        })
    }

    /// Who this process is, as the lock file says.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }
}

impl Drop for DirLock {
    /// Empties the file while still holding it: a finished job names no one.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// Rank 0's hold on `dir`: its launcher's when `inherited` (the
/// [`HELD_VAR`] it was given) is the token in the locked file; else this
/// process's own, taken now.
pub fn hold_as_rank_0(dir: &Path, inherited: Option<&str>) -> Result<Hold, LockError> {
    match lock(dir, || Holder::this_process(Role::Rank0, None))? {
        Ok(lock) => Ok(Hold::Own(lock)),
        Err(Some(holder)) if Some(holder.token.as_str()) == inherited => Ok(Hold::Launcher(holder)),
        Err(holder) => Err(LockError::Held {
            dir: dir.to_path_buf(),
            holder: holder.map(Box::new),
        }),
    }
}

/// Takes `dir`'s lock as `me`, or, another holding it, says whom its file
/// names.
fn lock(dir: &Path, me: impl Fn() -> Holder) -> Result<Result<DirLock, Option<Holder>>, LockError> {
    let io = |doing, path: &Path| {
        let path = path.to_path_buf();
        move |cause| LockError::Io { doing, path, cause }
    };
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let path = dir.join(LOCK_FILE);
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io("opening", &path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Err(named_holder(&mut file))),
        Err(TryLockError::Error(cause)) if no_locks(&cause) => {
            return Err(LockError::Unsupported {
                dir: dir.to_path_buf(),
                cause,
            });
        }
        Err(TryLockError::Error(cause)) => return Err(io("locking", &path)(cause)),
    }
    let holder = me();
    let mut write = || -> std::io::Result<()> {
        file.set_len(0)?;
        file.write_all(&serde_json::to_vec(&holder)?)?;
        file.sync_all()
    };
    write().map_err(io("writing", &path))?;
    Ok(Ok(DirLock { file, holder }))
}

/// The holder the locked `file` names, waiting [`NAME_WAIT`] at most for
/// one that has just taken it to write its name.
fn named_holder(file: &mut File) -> Option<Holder> {
    let start = std::time::Instant::now();
    loop {
        let mut text = String::new();
        let read = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text));
        if let Ok(holder) = serde_json::from_str(&text) {
            return Some(holder);
        }
        if read.is_err() || start.elapsed() > NAME_WAIT {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a lock failed because the file system has none.
fn no_locks(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOLCK | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

/// `t` in UTC as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rest / 3_600, rest % 3_600 / 60, rest % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_civil() {
        let at = |secs| utc(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_178_645), "2026-12-02T02:30:45Z");
    }

    /// `flock` locks belong to open files, so a second open in the same
    /// process meets the first as another job would.
    #[test]
    fn a_second_holder_is_refused_naming_the_first_until_it_lets_go() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ckpt");
        let first = DirLock::take(&dir, Role::Rank0, Some("7")).unwrap();
        let err = DirLock::take(&dir, Role::Rank0, None).unwrap_err();
        let text = err.to_string();
        let me = first.holder();
        assert!(
            matches!(&err, LockError::Held { holder: Some(h), .. } if **h == *me),
            "{text}"
        );
        for part in [&dir.display().to_string(), &me.host, &me.since] {
            assert!(text.contains(part.as_str()), "{part}: {text}");
        }
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("another --checkpoint-dir"), "{text}");
        drop(first);
        let second = DirLock::take(&dir, Role::Launcher, None).unwrap();
        assert_eq!(second.holder().role, Role::Launcher);
    }

    #[test]
    fn a_launchers_worker_goes_on_under_its_token_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let launcher = DirLock::take(tmp.path(), Role::Launcher, None).unwrap();
        let token = launcher.holder().token.clone();
        match hold_as_rank_0(tmp.path(), Some(&token)).unwrap() {
            Hold::Launcher(holder) => assert_eq!(&holder, launcher.holder()),
            Hold::Own(_) => panic!("rank 0 took the launcher's lock"),
        }
        for stranger in [None, Some("0123")] {
            let err = hold_as_rank_0(tmp.path(), stranger).unwrap_err();
            assert!(
                matches!(
                    err,
                    LockError::Held {
                        holder: Some(_),
                        ..
                    }
                ),
                "{err}"
            );
        }
        drop(launcher);
        // The launcher gone, its token names no one: rank 0 holds it.
        assert!(matches!(
            hold_as_rank_0(tmp.path(), Some(&token)).unwrap(),
            Hold::Own(_)
        ));
    }
}
