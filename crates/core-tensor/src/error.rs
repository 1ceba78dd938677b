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
    /// A CUDA library is not installed or not on the loader's search path.
    #[error("{library} could not be loaded: it comes with {provider}; {hint}")]
    CudaLibraryMissing {
        library: &'static str,
        provider: &'static str,
        hint: &'static str,
    },
    /// The GPU is too old for a feature that was asked for.
    #[error(
        "{feature} needs compute capability {}.{} or later; {device} has {}.{}: {fix}",
        need.0, need.1, have.0, have.1
    )]
    GpuTooOld {
        feature: &'static str,
        device: String,
        have: (i32, i32),
        need: (i32, i32),
        fix: &'static str,
    },
    /// The requested GPU does not exist.
    #[error("CUDA device {ordinal} requested, but {count} device(s) are visible")]
    NoCudaDevice { ordinal: usize, count: usize },
    /// A CUDA driver call failed (launches included; a kernel that faults
    /// surfaces at the next synchronization). Like every variant that wraps
    /// another error, the message leaves the cause to the error's
    /// [`source`](std::error::Error::source), printed by `anyhow`'s `{:#}`
    /// or [`Error::with_causes`].
    #[error("a CUDA driver call failed")]
    CudaDriver(#[from] cudarc::driver::DriverError),
    /// An NVRTC call failed.
    #[error("an NVRTC call failed")]
    Nvrtc(#[from] cudarc::nvrtc::result::NvrtcError),
    /// A kernel could not be queued (bad launch configuration or arguments).
    #[error("launching CUDA kernel `{kernel}`")]
    KernelLaunch {
        kernel: &'static str,
        source: cudarc::driver::DriverError,
    },
    /// A kernel module could not be compiled or loaded.
    #[error("CUDA kernels `{module}`: {reason}")]
    KernelBuild {
        module: &'static str,
        reason: String,
    },
    /// A CUDA kernel found invalid input (reported at the next
    /// synchronization, since kernels run asynchronously).
    #[error("a CUDA kernel found invalid input: {0}")]
    KernelFault(String),
    /// A buffer could not be allocated: `device` (the host, or a GPU) has
    /// not that much memory left for this process.
    #[error(
        "out of memory: {device} could not give {:.2} GiB ({bytes} bytes)",
        *bytes as f64 / (1u64 << 30) as f64
    )]
    OutOfMemory { device: String, bytes: u64 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The message followed by each cause, `": "` between them, as
    /// `anyhow`'s `{:#}` prints an error: for a caller that prints it
    /// without `anyhow`.
    pub fn with_causes(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        text
    }
}

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

#[cfg(test)]
mod tests {
    use super::Error;
    use cudarc::nvrtc::result::NvrtcError;
    use cudarc::nvrtc::sys::nvrtcResult;

    #[test]
    fn a_wrapped_error_is_stated_once() {
        let err = Error::from(NvrtcError(nvrtcResult::NVRTC_ERROR_COMPILATION));
        let text = err.with_causes();
        assert_eq!(text.matches("NVRTC_ERROR_COMPILATION").count(), 1, "{text}");
        assert!(text.starts_with("an NVRTC call failed: "), "{text}");
    }
}
