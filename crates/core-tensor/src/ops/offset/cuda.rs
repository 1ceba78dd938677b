use cudarc::driver::{CudaSlice, DeviceRepr};

use super::{OffsetGeom, OffsetKernel};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::{Cuda, Result};

// SAFETY: repr(C), two usize fields, mirrored by `OffsetGeom` in offset.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for OffsetGeom {}

kernel_table! {
    offset (OFFSET_SRC, OFFSET_PTX) {
        offset_fwd_f32(offsets: In<f32>, y: Out<f32>, g: Val<OffsetGeom>);
        offset_bwd_f32(dy: In<f32>, d_offsets: Out<f32>, g: Val<OffsetGeom>);
    }
}

const THREADS: u32 = 256;

impl OffsetKernel for Cuda {
    fn offset_fwd(
        &self,
        g: &OffsetGeom,
        offsets: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(offsets, y)?;
        if g.batch == 0 || g.k == 0 {
            return Ok(());
        }
        let cfg = blocks_for("offset", g.batch, THREADS)?;
        // SAFETY: `offsets` holds `batch·k` elements and `y` `batch`
        // (checked above); each thread checks its row against `batch`.
        unsafe { offset_fwd_f32(self, cfg, offsets, y, g) }
    }

    fn offset_bwd(
        &self,
        g: &OffsetGeom,
        dy: &CudaSlice<f32>,
        d_offsets: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(d_offsets, dy)?;
        if g.batch == 0 || g.k == 0 {
            return Ok(());
        }
        let cfg = blocks_for("offset", g.batch, THREADS)?;
        // SAFETY: as in `offset_fwd`, with `d_offsets` of `batch·k`.
        unsafe { offset_bwd_f32(self, cfg, dy, d_offsets, g) }
    }
}
