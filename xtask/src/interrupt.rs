//! Stopping a task on SIGINT, SIGTERM or SIGHUP without leaving anything
//! behind: the handlers only set a flag, which the task checks. A download
//! checks it between reads and while its tool runs, so that it deletes its
//! scratch file or folder on the way out and fails with [`Interrupted`];
//! `main` then exits with [`EXIT_STATUS`]. `cargo xtask test` checks it
//! while its test binaries run, and stops them. A second signal ends the
//! process at once.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The exit status of a fetch stopped by a signal, the first or a second
/// one: 128 + SIGINT, what a shell reports for Ctrl-C.
pub const EXIT_STATUS: u8 = 130;

/// The error of a download stopped by a signal.
#[derive(Debug)]
pub struct Interrupted;

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("interrupted by a signal; nothing was saved")
    }
}

impl std::error::Error for Interrupted {}

/// Whether a stop signal came since [`StopFlag::install`].
#[derive(Clone, Debug)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// From now on SIGINT, SIGTERM and SIGHUP set the returned flag instead
    /// of ending the process; a second signal ends it at once (exit status
    /// [`EXIT_STATUS`]), for a caller that does not look.
    pub fn install() -> Result<Self> {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in [SIGINT, SIGTERM, SIGHUP] {
            // The order matters: the shutdown sees the flag as it was before
            // this signal set it.
            signal_hook::flag::register_conditional_shutdown(
                signal,
                i32::from(EXIT_STATUS),
                Arc::clone(&flag),
            )
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&flag)))
            .with_context(|| format!("cannot install a handler for signal {signal}"))?;
        }
        Ok(Self(flag))
    }

    /// [`Interrupted`] once a signal came.
    pub fn check(&self) -> Result<(), Interrupted> {
        if self.0.load(Ordering::SeqCst) {
            Err(Interrupted)
        } else {
            Ok(())
        }
    }
}

/// A reader that fails once a signal came, checked before and after every
/// read (the signal does not cut a read short: one that blocks ends within
/// the download's stall timeouts).
pub struct Interruptible<R> {
    inner: R,
    stop: StopFlag,
}

impl<R> Interruptible<R> {
    pub fn new(inner: R, stop: StopFlag) -> Self {
        Self { inner, stop }
    }
}

impl<R: Read> Read for Interruptible<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stop.check().map_err(io::Error::other)?;
        let read = self.inner.read(buf);
        self.stop.check().map_err(io::Error::other)?;
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_flag_stops_the_reader_and_says_so() {
        let stop = StopFlag(Arc::new(AtomicBool::new(false)));
        let mut reader = Interruptible::new(&b"abcdef"[..], stop.clone());
        let mut buf = [0; 2];
        assert_eq!(reader.read(&mut buf).unwrap(), 2);
        stop.0.store(true, Ordering::SeqCst);
        let err = reader.read(&mut buf).unwrap_err();
        assert_eq!(
            err.to_string(),
            "interrupted by a signal; nothing was saved"
        );
        // Not ErrorKind::Interrupted, which io::copy would retry forever.
        assert_ne!(err.kind(), io::ErrorKind::Interrupted);
        assert!(stop.check().is_err());
    }
}
