use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::{Half, HalfCastKernel, check};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::{Cuda, Result};

kernel_table! {
    half_cast (HALF_CAST_SRC, HALF_CAST_PTX) {
        to_half_f32(src: In<f32>, dst: Out<u16>, format: Val<u32>, start: Val<u64>, end: Val<u64>);
        from_half_f32(src: In<u16>, dst: Out<f32>, format: Val<u32>, start: Val<u64>, end: Val<u64>);
    }
}

const THREADS: u32 = 256;

impl HalfCastKernel for Cuda {
    fn to_half(
        &self,
        format: Half,
        src: &CudaSlice<f32>,
        dst: &mut CudaSlice<u16>,
        range: Range<usize>,
    ) -> Result<()> {
        check(src.len(), dst.len(), &range)?;
        if range.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("half_cast", range.len(), THREADS)?;
        let (start, end, code) = (range.start as u64, range.end as u64, format.code());
        // SAFETY: `check` ran: both buffers hold `start..end`; every thread
        // checks its index against `end`.
        unsafe { to_half_f32(self, cfg, src, dst, &code, &start, &end) }
    }

    fn widen_half(
        &self,
        format: Half,
        src: &CudaSlice<u16>,
        dst: &mut CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        check(dst.len(), src.len(), &range)?;
        if range.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("half_cast", range.len(), THREADS)?;
        let (start, end, code) = (range.start as u64, range.end as u64, format.code());
        // SAFETY: as in `to_half`.
        unsafe { from_half_f32(self, cfg, src, dst, &code, &start, &end) }
    }
}
