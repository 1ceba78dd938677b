//! Rank 0's progress, for a launcher to draw: the records a worker sends
//! and the pipe they travel on. A launcher whose stderr is a terminal
//! hands rank 0 the write end of a pipe, an inherited descriptor named by
//! [`PROGRESS_FD_VAR`]; rank 0 writes one [`Progress`] per line to it, and
//! the launcher draws them as a bar below its workers' lines (`say::bar`).
//! Records never mix with the workers' text: without the variable (a
//! launcher writing to a file, torchrun, srun) a worker prints its own
//! progress lines.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The variable naming the descriptor rank 0 writes its records to.
pub const PROGRESS_FD_VAR: &str = "TRAINER_PROGRESS_FD";

/// Where an epoch stands: `step` of `steps` done (those before a resume
/// included), and the program's own words on it (its running loss, a
/// rate), shown as they are.
#[derive(Clone, Debug, PartialEq)]
pub struct Position {
    pub epoch: usize,
    pub step: u64,
    pub steps: u64,
    pub note: String,
}

/// One record: where the epoch stands, or that it ended (the bar goes).
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    At(Position),
    Done,
}

impl Progress {
    /// The record as one line: `at\tEPOCH\tSTEP\tSTEPS\tNOTE\n` or
    /// `done\n`; the note's tabs and control characters become spaces.
    pub fn to_line(&self) -> String {
        match self {
            Self::At(p) => {
                let note: String = (p.note.chars())
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                format!("at\t{}\t{}\t{}\t{note}\n", p.epoch, p.step, p.steps)
            }
            Self::Done => "done\n".to_string(),
        }
    }

    /// A line [`Progress::to_line`] wrote (without its newline); `None`
    /// for anything else.
    pub fn parse(line: &str) -> Option<Self> {
        if line == "done" {
            return Some(Self::Done);
        }
        let mut fields = line.strip_prefix("at\t")?.splitn(4, '\t');
        let position = Position {
            epoch: fields.next()?.parse().ok()?,
            step: fields.next()?.parse().ok()?,
            steps: fields.next()?.parse().ok()?,
            note: fields.next()?.to_string(),
        };
        (position.step <= position.steps).then_some(Self::At(position))
    }
}

/// The worker's end of the pipe its launcher gave it.
pub struct ProgressPipe(File);

impl ProgressPipe {
    /// The pipe [`PROGRESS_FD_VAR`] names, taken once per process (a
    /// second call, or a descriptor that is not an open pipe, gives
    /// `None`: the caller prints its own lines).
    pub fn from_env() -> Option<Self> {
        static TAKEN: AtomicBool = AtomicBool::new(false);
        let fd: RawFd = std::env::var(PROGRESS_FD_VAR).ok()?.parse().ok()?;
        if fd <= 2 || !is_pipe(fd) || TAKEN.swap(true, Ordering::SeqCst) {
            return None;
        }
        // SAFETY: the launcher opened `fd` for this process alone (it
        // closed its own copy after the spawn); nothing else in the
        // process owns it, and `TAKEN` makes this the one owner: the File
        // closes it when dropped.
        let file = unsafe { File::from_raw_fd(fd) };
        // Not passed on to any program this one starts.
        // SAFETY: fcntl on a descriptor we own; no memory is passed.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        Some(Self(file))
    }

    /// Sends one record in one write (atomic on a pipe: a record is far
    /// below `PIPE_BUF`).
    pub fn send(&mut self, record: &Progress) -> io::Result<()> {
        self.0.write_all(record.to_line().as_bytes())
    }
}

/// Whether `fd` is open and a pipe.
fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: fstat writes into a zeroed stat of our own; an fd that is
    // not open gives -1 and touches nothing.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut stat) == 0 && (stat.st_mode & libc::S_IFMT) == libc::S_IFIFO
    }
}

/// Hands the write end of a new pipe to the child `command` starts, as
/// [`PROGRESS_FD_VAR`]: returns the read end, and the write end, which the
/// caller drops once the child is spawned (so that the read end ends with
/// the child).
pub fn pipe_to_child(
    command: &mut std::process::Command,
) -> io::Result<(io::PipeReader, io::PipeWriter)> {
    use std::os::unix::process::CommandExt;
    let (reader, writer) = io::pipe()?;
    let fd = writer.as_raw_fd();
    command.env(PROGRESS_FD_VAR, fd.to_string());
    // SAFETY: the closure runs in the forked child before exec and calls
    // only fcntl (async-signal-safe) on a descriptor the child inherited;
    // it neither allocates nor takes locks.
    unsafe {
        command.pre_exec(move || {
            // Kept across exec: std opens every descriptor close-on-exec.
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok((reader, writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_travel_as_lines() {
        let at = Progress::At(Position {
            epoch: 2,
            step: 372,
            steps: 400,
            note: "loss 0.5000,\tacc 0.7500\n".into(),
        });
        let line = at.to_line();
        assert_eq!(line, "at\t2\t372\t400\tloss 0.5000, acc 0.7500 \n");
        let back = Progress::parse(line.trim_end_matches('\n')).unwrap();
        let Progress::At(p) = back else { panic!() };
        assert_eq!((p.epoch, p.step, p.steps), (2, 372, 400));
        assert_eq!(p.note, "loss 0.5000, acc 0.7500 ");
        assert_eq!(Progress::parse("done"), Some(Progress::Done));
        for bad in [
            "",
            "at\t1\t2",
            "at\tx\t1\t2\tn",
            "at\t1\t5\t4\tn",
            "[rank 0] at",
        ] {
            assert_eq!(Progress::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_child_writes_records_to_the_pipe_it_was_given() {
        use std::io::{BufRead, BufReader};
        let mut sh = std::process::Command::new("sh");
        // Through /dev/fd: dash's `>&N` takes one digit, and with other
        // tests' files open the descriptor may well be 10 or more.
        sh.args([
            "-c",
            "printf 'at\\t1\\t3\\t9\\tok\\n' > /dev/fd/$TRAINER_PROGRESS_FD",
        ]);
        let (reader, writer) = pipe_to_child(&mut sh).unwrap();
        let mut child = sh.spawn().unwrap();
        drop(writer);
        let lines: Vec<String> = BufReader::new(reader).lines().map(Result::unwrap).collect();
        assert!(child.wait().unwrap().success());
        assert_eq!(lines, ["at\t1\t3\t9\tok"]);
        // A file or a closed descriptor is no pipe to take.
        let file = tempfile::tempfile().unwrap();
        assert!(!is_pipe(file.as_raw_fd()));
        assert!(!is_pipe(-1));
    }
}
