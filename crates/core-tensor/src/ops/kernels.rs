//! Every op's CUDA kernels, and the GPU opened with all of them. Each op
//! declares its own module and launchers in its `cuda.rs` (`kernel_table!`);
//! build.rs lists the ops that have a `<op>.cu` in their folder, so that a
//! new op's kernels are found without a list kept by hand.

use crate::backend::cuda::KernelModule;
use crate::{Cuda, MatmulPrecision, Products, Result};

/// The kernel modules of the ops named, in that order (build.rs's list,
/// by name).
macro_rules! op_modules {
    ($($op:ident),* $(,)?) => {
        static MODULES: &[KernelModule] = &[$(super::$op::cuda::MODULE),*];

        /// Each op's declared kernels and GEMM families (its kernel table's
        /// test signatures).
        #[cfg(test)]
        pub(super) const SIGNATURES: &[(
            &[(&str, &[(&str, &str)])],
            &[(&str, &str, &[(&str, &str)])],
        )] = &[$((super::$op::cuda::SIGNATURES, super::$op::cuda::FAMILY_SIGNATURES)),*];
    };
}

include!(concat!(env!("OUT_DIR"), "/op_modules.rs"));

/// Every kernel module, in name order: what [`Cuda::new`] loads, and what
/// cuda-emu and the NVRTC tests compile.
pub fn kernel_modules() -> &'static [KernelModule] {
    MODULES
}

impl Cuda {
    /// Opens GPU `ordinal` (a data-parallel rank passes its local rank) and
    /// loads every op's kernels on it; products in float32.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_precision(ordinal, MatmulPrecision::Fp32)
    }

    /// [`Cuda::new`] with the conv2d and linear products in `precision`.
    pub fn with_precision(ordinal: usize, precision: MatmulPrecision) -> Result<Self> {
        Self::with_products(ordinal, Products::from(precision))
    }

    /// [`Cuda::new`] with the conv2d and linear products `products` (see
    /// `Cuda::open` for the GPUs that refuse them).
    pub fn with_products(ordinal: usize, products: Products) -> Result<Self> {
        Self::open(ordinal, products, kernel_modules())
    }
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
