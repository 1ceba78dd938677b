use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::{FiniteKernel, check_range, check_rows};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::ops::RowsGeom;
use crate::{Cuda, Result};

kernel_table! {
    finite (FINITE_SRC, FINITE_PTX) {
        guard_finite_f32(
            values: In<f32>,
            loss: In<f32>,
            guard: Out<u32>,
            step: Val<u32>,
            start: Val<u64>,
            end: Val<u64>,
        );
        guard_finite_rows_f32(
            values: In<f32>,
            ids: In<u32>,
            guard: Out<u32>,
            fault: Out<u32>,
            step: Val<u32>,
            g: Val<RowsGeom>,
        );
    }
}

const THREADS: u32 = 256;

impl FiniteKernel for Cuda {
    fn guard_finite_range(
        &self,
        step: u32,
        loss: &CudaSlice<f32>,
        values: &CudaSlice<f32>,
        range: Range<usize>,
        guard: &mut CudaSlice<u32>,
    ) -> Result<()> {
        check_range(step, loss.len(), values.len(), &range, guard.len())?;
        // At least one thread, for the loss.
        let cfg = blocks_for("guard_finite", range.len().max(1), THREADS)?;
        let (start, end) = (range.start as u64, range.end as u64);
        // SAFETY: `check_range` ran: one loss, a two-word guard, `start..end`
        // inside `values`; every thread checks its index against `end`.
        unsafe { guard_finite_f32(self, cfg, values, loss, guard, &step, &start, &end) }
    }

    /// An id not below the row count or not above the one before it (an
    /// error on the CPU) is reported by the next synchronization as
    /// [`crate::Error::KernelFault`]; its row is not read.
    fn guard_finite_rows(
        &self,
        step: u32,
        g: &RowsGeom,
        ids: &CudaSlice<u32>,
        values: &CudaSlice<f32>,
        guard: &mut CudaSlice<u32>,
    ) -> Result<()> {
        check_rows(step, g, ids.len(), values.len(), guard.len())?;
        let checked = g.count * g.dim;
        if checked == 0 {
            return Ok(());
        }
        let cfg = blocks_for("guard_finite", checked, THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: `check_rows` ran: a two-word guard, at least `count`
            // ids, the table inside `values`; a bad id sets the fault word
            // instead of addressing the table; every thread checks its
            // index against `count·dim`.
            unsafe { guard_finite_rows_f32(self, cfg, values, ids, guard, fault, &step, g) }
        })
    }
}
