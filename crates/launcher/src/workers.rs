//! The launcher's side of one worker process: its output relayed with a
//! rank prefix, rank 0's progress drawn, signals passed on, and the end
//! of it.

use std::io::{BufRead, BufReader, PipeReader, Read};
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::contract::progress::Progress;
use crate::say::bar;

/// A worker process, with the threads relaying its output.
pub(super) struct Worker {
    pub rank: usize,
    pub child: Child,
    /// The last `error:` line the worker printed, to quote if it fails.
    last_error: Arc<Mutex<Option<String>>>,
    readers: Vec<JoinHandle<()>>,
    pub status: Option<ExitStatus>,
}

impl Worker {
    pub fn attach(rank: usize, mut child: Child) -> Self {
        let last_error = Arc::new(Mutex::new(None));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(relay(rank, out, false, last_error.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(relay(rank, err, true, last_error.clone()));
        }
        Self {
            rank,
            child,
            last_error,
            readers,
            status: None,
        }
    }

    /// Draws the progress records the worker sends on `pipe` as the
    /// terminal's bar, until the worker ends.
    pub fn draw_progress(&mut self, pipe: PipeReader) {
        self.readers.push(std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                match Progress::parse(&line) {
                    Some(Progress::At(p)) => bar::show(p.epoch, (p.step, p.steps), &p.note),
                    Some(Progress::Done) => bar::hide(),
                    None => {}
                }
            }
            bar::hide();
        }));
    }

    /// Gives the threads relaying an ended worker's output a moment to
    /// reach its end, so that its last `error:` line is known.
    pub fn settle(&self) {
        let until = Instant::now() + Duration::from_millis(200);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The last `error:` line the worker printed, if any.
    pub fn said(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    pub fn describe_failure(&self) -> String {
        let status = self
            .status
            .map_or("killed by the launcher".to_string(), |s| s.to_string());
        match self.said() {
            Some(line) => format!("rank {} failed ({status}): {line}", self.rank),
            None => format!(
                "rank {} failed ({status}) without an error message",
                self.rank
            ),
        }
    }
}

/// Copies a worker's output line by line, prefixed with its rank.
fn relay(
    rank: usize,
    stream: impl Read + Send + 'static,
    is_stderr: bool,
    last_error: Arc<Mutex<Option<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if is_stderr {
                if let Some(msg) = line.strip_prefix("error: ")
                    && let Ok(mut slot) = last_error.lock()
                {
                    *slot = Some(msg.to_string());
                }
                tell!("[rank {rank}] {line}");
            } else {
                say!("[rank {rank}] {line}");
            }
        }
    })
}

/// Passes `signal` to every worker still running.
pub(super) fn forward(workers: &[Worker], signal: i32) {
    for w in workers.iter().filter(|w| w.status.is_none()) {
        // SAFETY: kill has no memory-safety preconditions; the pid is a
        // child not yet reaped, so it cannot have been reused.
        unsafe {
            libc::kill(w.child.id() as libc::pid_t, signal);
        }
    }
}

/// Kills workers still running and drains their output.
pub(super) fn stop(workers: &mut [Worker]) {
    for w in workers.iter_mut() {
        if w.status.is_none() {
            let _ = w.child.kill();
            w.status = w.child.wait().ok();
        }
        for reader in w.readers.drain(..) {
            let _ = reader.join();
        }
    }
}
