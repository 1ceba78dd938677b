//! Dropout's launch parameters, which every kernel with a dropout epilogue
//! takes (its mask is `dropout.cuh`'s copy of [`Dropout::apply`]).

use cudarc::driver::DeviceRepr;

use super::Dropout;
use crate::Result;
use crate::ops::Epilogue;

/// A dropout epilogue's launch parameters; mirrored by `DropoutArgs` in
/// dropout.cuh.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct DropoutArgs {
    pub seed: u64,
    pub p: f32,
    pub scale: f32,
}

impl DropoutArgs {
    /// `dropout`'s parameters, its probability checked.
    pub fn new(dropout: Dropout) -> Result<Self> {
        dropout.check()?;
        Ok(Self {
            seed: dropout.seed,
            p: dropout.p,
            // The CPU kernel's expression, so kept values scale identically.
            scale: dropout.scale(),
        })
    }

    /// A pooling epilogue's kernel arguments (pool_window.cuh): ReLU on
    /// (1) or off (0), and the dropout.
    pub fn epilogue(then: Epilogue) -> Result<(u32, Self)> {
        let (relu, dropout) = then.parts()?;
        Ok((u32::from(relu), Self::new(dropout)?))
    }
}

// SAFETY: repr(C), a u64 then two f32 fields (no padding), mirrored by
// `DropoutArgs` in dropout.cuh; passed by value, it holds no pointer.
unsafe impl DeviceRepr for DropoutArgs {}
