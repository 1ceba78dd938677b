//! Kernels for training the FashionMNIST CNN, behind one device-agnostic seam.
//!
//! * [`Backend`] owns memory on a device (host RAM for [`Cpu`], GPU memory
//!   for [`Cuda`]); every op is a small trait in [`ops`] that each backend
//!   implements, so the model code is written once and runs on any device.
//! * Ops work on flat buffers plus an explicit geometry (`Conv2dGeom`, ...).
//!   Parameters live in one contiguous buffer described by a [`FlatLayout`];
//!   layers address their weights by range, so gradients land in one flat
//!   buffer that a data-parallel all-reduce can use without copies.
//! * Everything is deterministic: the same inputs give the same bits, and the
//!   dropout mask is a pure function of `(seed, element index)` ([`rng`]).

pub mod backend;
mod error;
mod flat;
mod gemm;
pub mod ops;
pub mod rng;
mod simd;
#[cfg(test)]
mod testing;

pub use backend::{
    Backend, Cpu, Cuda, Elem, FIXED_PARTIALS, Fp32Tile, GemmStaging, MatmulPrecision, Products,
    Reductions, RefusedProducts, cuda_available,
};
pub use error::{Error, Result};
pub use flat::{FlatLayout, ParamSpec, ParamView};
pub use ops::Ops;
