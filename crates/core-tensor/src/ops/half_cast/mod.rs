//! Casts between float32 and the 16-bit floats gradients may travel in
//! (`--comm-hook bf16|fp16` on NCCL, PyTorch's `bf16_compress_hook` and
//! `fp16_compress_hook`): to 16 bits rounded to nearest even (NaN stays a
//! quiet NaN, overflow becomes infinity), and back exactly. The bit
//! manipulations are spelled out in `cpu.rs` and line for line in
//! `half_cast.cu`, so both devices give the same bits.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::{Backend, Error, Result};

/// A 16-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// bfloat16: float32's top 16 bits (8 bits of precision).
    Bf16,
    /// IEEE binary16 (11 bits of precision, largest finite 65504).
    Fp16,
}

impl Half {
    /// The format's code in the kernels' `format` argument.
    fn code(self) -> u32 {
        match self {
            Half::Bf16 => 0,
            Half::Fp16 => 1,
        }
    }
}

/// The two casts, over a range of two buffers of one length.
pub trait HalfCastKernel: Backend {
    /// `dst[range]` = `src[range]` rounded to `format`.
    fn to_half(
        &self,
        format: Half,
        src: &Self::Storage<f32>,
        dst: &mut Self::Storage<u16>,
        range: Range<usize>,
    ) -> Result<()>;

    /// `dst[range]` = `src[range]` (16-bit floats of `format`) as f32.
    fn widen_half(
        &self,
        format: Half,
        src: &Self::Storage<u16>,
        dst: &mut Self::Storage<f32>,
        range: Range<usize>,
    ) -> Result<()>;
}

/// Refuses buffers of different lengths and a range outside them.
fn check(floats: usize, halves: usize, range: &Range<usize>) -> Result<()> {
    crate::error::check_len("half_cast", "16-bit buffer", halves, floats)?;
    if range.start > range.end || range.end > floats {
        return Err(Error::InvalidArgument {
            op: "half_cast",
            reason: format!("range {range:?} lies outside the {floats}-element buffers"),
        });
    }
    Ok(())
}
