use cudarc::driver::CudaSlice;

use super::{RowsGeom, RowsKernel};
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::blocks_for;
use crate::{Cuda, Result};

const THREADS: u32 = 256;

/// An id not below the row count or not above the one before it (an error
/// on the CPU) is reported by the next synchronization as
/// [`crate::Error::KernelFault`]; the scatter then leaves that row alone.
impl RowsKernel for Cuda {
    fn rows_gather(
        &self,
        g: &RowsGeom,
        ids: &CudaSlice<u32>,
        flat: &CudaSlice<f32>,
        rows: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, flat, rows)?;
        if g.count * g.dim == 0 {
            return Ok(());
        }
        let cfg = blocks_for("rows", g.count * g.dim, THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: `check` found at least `count` ids and `count·dim`
            // rows and the table inside `flat`; a bad id sets the fault word
            // instead of reading; every thread checks its index against
            // `count·dim`.
            unsafe { kernels::rows_gather_f32(self, cfg, ids, flat, rows, fault, g) }
        })
    }

    fn rows_scatter(
        &self,
        g: &RowsGeom,
        ids: &CudaSlice<u32>,
        rows: &CudaSlice<f32>,
        flat: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, flat, rows)?;
        if g.count * g.dim == 0 {
            return Ok(());
        }
        let cfg = blocks_for("rows", g.count * g.dim, THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: as in `rows_gather`, with the roles of `rows` and
            // `flat` swapped; a bad id writes nothing.
            unsafe { kernels::rows_scatter_f32(self, cfg, ids, rows, flat, fault, g) }
        })
    }
}
