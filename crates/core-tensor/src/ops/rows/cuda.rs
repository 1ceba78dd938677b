use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};

use super::{RowsGeom, RowsKernel};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::{Cuda, Result};

// SAFETY: repr(C), four usize fields, mirrored by `RowsGeom` in rows.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for RowsGeom {}

kernel_table! {
    rows (ROWS_SRC, ROWS_PTX) {
        rows_gather_f32(ids: In<u32>, flat: In<f32>, rows: Out<f32>, fault: Out<u32>, g: Val<RowsGeom>);
        rows_scatter_f32(ids: In<u32>, rows: In<f32>, flat: Out<f32>, fault: Out<u32>, g: Val<RowsGeom>);
    }
}

const THREADS: u32 = 256;

/// After the buffer checks, one thread per value of the `count` rows;
/// `None` when there are none.
fn launch_for(
    g: &RowsGeom,
    ids: &CudaSlice<u32>,
    flat: &CudaSlice<f32>,
    rows: &CudaSlice<f32>,
) -> Result<Option<LaunchConfig>> {
    g.check::<Cuda>(ids, flat, rows)?;
    let values = g.count * g.dim;
    (values > 0)
        .then(|| blocks_for("rows", values, THREADS))
        .transpose()
}

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
        let Some(cfg) = launch_for(g, ids, flat, rows)? else {
            return Ok(());
        };
        self.with_fault(|fault| {
            // SAFETY: `launch_for` found at least `count` ids and
            // `count·dim` rows and the table inside `flat`; a bad id sets
            // the fault word instead of reading; every thread checks its
            // index against `count·dim`.
            unsafe { rows_gather_f32(self, cfg, ids, flat, rows, fault, g) }
        })
    }

    fn rows_scatter(
        &self,
        g: &RowsGeom,
        ids: &CudaSlice<u32>,
        rows: &CudaSlice<f32>,
        flat: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let Some(cfg) = launch_for(g, ids, flat, rows)? else {
            return Ok(());
        };
        self.with_fault(|fault| {
            // SAFETY: as in `rows_gather`, with the roles of `rows` and
            // `flat` swapped; a bad id writes nothing.
            unsafe { rows_scatter_f32(self, cfg, ids, rows, flat, fault, g) }
        })
    }
}
