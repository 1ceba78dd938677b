//! Reading within one deadline for a whole exchange.
//!
//! A per-read timeout alone lets a peer that sends one byte just before each
//! timeout hold a frame or a handshake open for ever; [`Deadline`] re-arms
//! the socket's read timeout with what is left before every read and fails
//! with `TimedOut` once the deadline has passed, however the bytes trickle in.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A socket whose read timeout can be set.
pub(crate) trait ReadTimeout {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
}

impl ReadTimeout for &TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
}

#[cfg(target_os = "linux")]
impl ReadTimeout for &std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, timeout)
    }
}

/// `stream`, readable until `at` and no longer; writes pass through.
pub(crate) struct Deadline<S> {
    pub(crate) stream: S,
    pub(crate) at: Instant,
}

impl<S> Deadline<S> {
    /// `stream` with `budget` from now.
    pub(crate) fn after(stream: S, budget: Duration) -> Self {
        Self {
            stream,
            at: Instant::now() + budget,
        }
    }
}

impl<S: Read + ReadTimeout> Read for Deadline<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer did not finish in time",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl<S: Write> Write for Deadline<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
