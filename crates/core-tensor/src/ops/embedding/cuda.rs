use cudarc::driver::{CudaSlice, DeviceRepr};

use super::{EmbeddingGeom, EmbeddingKernel};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::{Cuda, Result};

// SAFETY: repr(C), four usize fields, mirrored by `EmbeddingGeom` in
// embedding.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for EmbeddingGeom {}

kernel_table! {
    embedding (EMBEDDING_SRC, EMBEDDING_PTX) {
        embedding_fwd_f32(ids: In<u32>, params: In<f32>, out: Out<f32>, fault: Out<u32>, g: Val<EmbeddingGeom>);
        embedding_bwd_zero_f32(grads: Out<f32>, g: Val<EmbeddingGeom>);
        embedding_bwd_f32(ids: In<u32>, dout: In<f32>, grads: Out<f32>, fault: Out<u32>, g: Val<EmbeddingGeom>);
    }
}

const THREADS: u32 = 256;

impl EmbeddingKernel for Cuda {
    /// An id not below the row count (an error on the CPU) is reported by
    /// the next synchronization as [`crate::Error::KernelFault`].
    fn embedding_fwd(
        &self,
        g: &EmbeddingGeom,
        ids: &CudaSlice<u32>,
        params: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, params, out)?;
        if out.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("embedding", out.len(), THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: `check` matched `ids` and `out` to `g` and the table to
            // `params`; an id past the table sets the fault word instead of
            // reading; every thread checks its index.
            unsafe { embedding_fwd_f32(self, cfg, ids, params, out, fault, g) }
        })
    }

    /// One thread per table element zeroes the table's gradient; then one
    /// thread per column walks the batch in order, so each row's sum is
    /// the CPU's, bit for bit.
    fn embedding_bwd(
        &self,
        g: &EmbeddingGeom,
        ids: &CudaSlice<u32>,
        dout: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, grads, dout)?;
        let table = g.rows * g.dim;
        if table == 0 {
            return Ok(());
        }
        let zero = blocks_for("embedding", table, THREADS)?;
        let columns = blocks_for("embedding", g.dim, THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: as in `embedding_fwd`, with `dout` matched to `g` and
            // the table to `grads`; the zeroing threads check their index
            // against the table, the column threads theirs against `dim`.
            unsafe {
                embedding_bwd_zero_f32(self, zero, grads, g)?;
                embedding_bwd_f32(self, columns, ids, dout, grads, fault, g)
            }
        })
    }

    /// The column threads of [`EmbeddingKernel::embedding_bwd`] alone.
    fn embedding_bwd_add(
        &self,
        g: &EmbeddingGeom,
        ids: &CudaSlice<u32>,
        dout: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, grads, dout)?;
        if g.rows * g.dim == 0 {
            return Ok(());
        }
        let columns = blocks_for("embedding", g.dim, THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: as in `embedding_fwd`, with `dout` matched to `g` and
            // the table to `grads`; the column threads check their index
            // against `dim`.
            unsafe { embedding_bwd_f32(self, columns, ids, dout, grads, fault, g) }
        })
    }
}
