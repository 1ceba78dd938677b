use cudarc::driver::CudaSlice;

use super::{OffsetGeom, OffsetKernel};
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::blocks_for;
use crate::{Cuda, Result};

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
        unsafe { kernels::offset_fwd_f32(self, cfg, offsets, y, g) }
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
        unsafe { kernels::offset_bwd_f32(self, cfg, dy, d_offsets, g) }
    }
}
