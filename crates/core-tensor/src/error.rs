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
    /// surfaces at the next synchronization).
    #[error("CUDA driver: {0}")]
    CudaDriver(#[from] cudarc::driver::DriverError),
    /// An NVRTC call failed.
    #[error("NVRTC: {0}")]
    Nvrtc(#[from] cudarc::nvrtc::result::NvrtcError),
    /// A kernel could not be queued (bad launch configuration or arguments).
    #[error("launching CUDA kernel `{kernel}`: {source}")]
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
