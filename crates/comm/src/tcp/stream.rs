//! One ring connection: TCP, or a Unix domain socket between neighbours on
//! the same machine. Both are byte streams with the same failure modes
//! (EOF, reset, timeout), so the ring code does not care which it has.

use crate::deadline::ReadTimeout;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
#[cfg(target_os = "linux")]
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Send buffer of a Unix socket link. The default (~200 KiB) makes the
/// ranks take turns in small steps; 1 MiB let a 2-rank 64 MiB all-reduce on
/// a two-core VM reach ~3.0 GB/s bus bandwidth instead of ~1.9. (TCP sizes
/// its buffers itself, and pinning them measured no better.)
#[cfg(target_os = "linux")]
const UNIX_BUFFER_BYTES: usize = 1 << 20;

#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    #[cfg(target_os = "linux")]
    Unix(UnixStream),
}

impl Stream {
    /// Blocking mode with `timeout` on every read and write, for the
    /// connection handshake.
    pub(crate) fn blocking(&self, timeout: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))
            }
            #[cfg(target_os = "linux")]
            Stream::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))
            }
        }
    }

    /// Non-blocking mode for collectives; Nagle off, so headers and the
    /// tail of a segment go out at once.
    pub(crate) fn non_blocking(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)
            }
            #[cfg(target_os = "linux")]
            Stream::Unix(s) => {
                // Best effort: the kernel caps the size at net.core.wmem_max.
                let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, UNIX_BUFFER_BYTES);
                s.set_nonblocking(true)
            }
        }
    }

    /// Which kind of connection, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Stream::Tcp(_) => "tcp",
            #[cfg(target_os = "linux")]
            Stream::Unix(_) => "unix socket",
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            #[cfg(target_os = "linux")]
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

impl ReadTimeout for &Stream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            #[cfg(target_os = "linux")]
            Stream::Unix(s) => s.set_read_timeout(timeout),
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).read(buf),
            #[cfg(target_os = "linux")]
            Stream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write(buf),
            #[cfg(target_os = "linux")]
            Stream::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
