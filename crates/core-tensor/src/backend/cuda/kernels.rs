//! What the backend loads: a [`KernelModule`] is one `.cu` file with its
//! entry points. The modules themselves are the ops' (each op's
//! `ops/<op>/cuda.rs` declares its own with `kernel_table!`, launch.rs);
//! [`super::Cuda`] is opened with the list `ops::kernel_modules` makes of
//! them, and loads every module at once, so a name missing from a module
//! fails there, not mid-training.

pub(crate) mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// The virtual architecture of the PTX embedded by build.rs, if nvcc ran.
pub(super) const PTX_ARCH: Option<&str> = ptx::PTX_ARCH;

/// One `.cu` file, compiled as a unit.
#[derive(Debug)]
pub struct KernelModule {
    /// The op, e.g. `conv2d`.
    pub name: &'static str,
    /// The CUDA C++ source, its `#include`s pasted in by build.rs.
    pub source: &'static str,
    /// PTX that nvcc built from `source` at build time, if it was found.
    pub ptx: Option<&'static str>,
    /// The `extern "C"` kernels the op launches.
    pub functions: &'static [&'static str],
}

/// How a kernel parameter's Rust type is spelled in C: what the kernel
/// tables' test signatures are written in (the ops' own types say theirs
/// in `ops/kernels_tests.rs`).
#[cfg(test)]
pub(crate) trait CType {
    const NAME: &'static str;
}

/// `CType` impls, one line per type.
#[cfg(test)]
macro_rules! c_types {
    ($($rust:ty => $c:literal),* $(,)?) => {
        $(impl $crate::backend::cuda::kernels::CType for $rust {
            const NAME: &'static str = $c;
        })*
    };
}
#[cfg(test)]
pub(crate) use c_types;

#[cfg(test)]
c_types! {
    f32 => "float",
    u8 => "unsigned char",
    u16 => "unsigned short",
    u32 => "unsigned int",
    u64 => "unsigned long long",
}
