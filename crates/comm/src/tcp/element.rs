//! The element types the ring reduces, and the per-type scratch space.

use std::ops::{Add, Mul};

use bytemuck::Pod;

/// Element type tag carried in collective headers, so ranks that disagree on
/// the type are caught instead of reinterpreting each other's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    F32,
    F64,
}

impl Dtype {
    pub(crate) fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        }
    }
}

/// Receive buffers kept between collectives so that large all-reduces do
/// not allocate (and page-fault) a fresh segment buffer on every call.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    f32: Vec<f32>,
    f64: Vec<f64>,
}

/// A plain number the ring can send as bytes, add and scale.
pub(crate) trait Element:
    Pod + Send + Sync + Add<Output = Self> + Mul<Output = Self>
{
    const DTYPE: Dtype;

    /// `1 / count`, the factor of an average.
    fn reciprocal(count: usize) -> Self;

    /// A scratch buffer of at least `len` elements.
    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self];
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;

    fn reciprocal(count: usize) -> Self {
        1.0 / count as f32
    }

    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
        if scratch.f32.len() < len {
            scratch.f32.resize(len, 0.0);
        }
        &mut scratch.f32[..len]
    }
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;

    fn reciprocal(count: usize) -> Self {
        1.0 / count as f64
    }

    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
        if scratch.f64.len() < len {
            scratch.f64.resize(len, 0.0);
        }
        &mut scratch.f64[..len]
    }
}
