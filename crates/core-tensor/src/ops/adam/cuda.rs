use std::ops::Range;

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::{AdamKernel, AdamScalars, SparseAdamScalars, check_range, check_rows, check_state};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::ops::RowsGeom;
use crate::{Cuda, Result};

// SAFETY: repr(C), seven f32 fields, mirrored by `AdamScalars` in adam.cu;
// passed by value, it holds no pointer.
unsafe impl DeviceRepr for AdamScalars {}
// SAFETY: repr(C), four f32 fields, mirrored by `SparseAdamScalars` in adam.cu;
// passed by value, it holds no pointer.
unsafe impl DeviceRepr for SparseAdamScalars {}

kernel_table! {
    adam (ADAM_SRC, ADAM_PTX) {
        adam_step_f32(
            params: Out<f32>,
            grads: In<f32>,
            m: Out<f32>,
            v: Out<f32>,
            guard: In<u32>,
            s: Val<AdamScalars>,
            start: Val<u64>,
            end: Val<u64>,
        );
        sparse_adam_step_f32(
            params: Out<f32>,
            grads: In<f32>,
            m: Out<f32>,
            v: Out<f32>,
            ids: In<u32>,
            guard: In<u32>,
            fault: Out<u32>,
            s: Val<SparseAdamScalars>,
            g: Val<RowsGeom>,
        );
    }
}

const THREADS: u32 = 256;

impl AdamKernel for Cuda {
    fn adam_step_range(
        &self,
        s: &AdamScalars,
        range: Range<usize>,
        params: &mut CudaSlice<f32>,
        grads: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        guard: &CudaSlice<u32>,
    ) -> Result<()> {
        check_state::<Self>(params, grads, m, v, guard)?;
        check_range(&range, params.len())?;
        if range.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("adam", range.len(), THREADS)?;
        let (start, end) = (range.start as u64, range.end as u64);
        // SAFETY: `grads`, `m` and `v` have as many elements as `params`,
        // `range` lies inside them, the guard has its two; every thread
        // checks its index against `end`.
        unsafe { adam_step_f32(self, cfg, params, grads, m, v, guard, s, &start, &end) }
    }

    /// An id not below the row count or not above the one before it (an
    /// error on the CPU) is reported by the next synchronization as
    /// [`crate::Error::KernelFault`]; its row is left alone.
    fn sparse_adam_step(
        &self,
        s: &SparseAdamScalars,
        g: &RowsGeom,
        ids: &CudaSlice<u32>,
        params: &mut CudaSlice<f32>,
        grads: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        guard: &CudaSlice<u32>,
    ) -> Result<()> {
        check_state::<Self>(params, grads, m, v, guard)?;
        check_rows::<Self>(g, ids, params.len())?;
        let values = g.count * g.dim;
        if values == 0 {
            return Ok(());
        }
        let cfg = blocks_for("adam", values, THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: `grads`, `m` and `v` have as many elements as
            // `params`, which holds the table; `ids` holds at least `count`
            // ids, a bad one sets the fault word instead of addressing the
            // table; every thread checks its index against `count·dim`.
            unsafe { sparse_adam_step_f32(self, cfg, params, grads, m, v, ids, guard, fault, s, g) }
        })
    }
}
