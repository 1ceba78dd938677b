use thiserror::Error;

/// Errors raised by the kernels and backends.
#[derive(Debug, Error)]
pub enum Error {
    /// A buffer handed to an op does not have the length its geometry implies.
    #[error("{op}: buffer `{buffer}` has {got} elements, expected {expected}")]
    BadLength {
        op: &'static str,
        buffer: &'static str,
        expected: usize,
        got: usize,
    },
    /// A geometry or hyper-parameter that no kernel can run with.
    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
    /// The CPU backend's thread pool could not be created.
    #[error("could not start {threads} CPU worker threads: {reason}")]
    ThreadPool { threads: usize, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks a buffer length, the first thing every kernel does: a wrong length is
/// a programming error upstream, but it must surface as an error, not as
/// memory corruption on a device.
pub(crate) fn check_len(
    op: &'static str,
    buffer: &'static str,
    got: usize,
    expected: usize,
) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::BadLength {
            op,
            buffer,
            expected,
            got,
        })
    }
}
