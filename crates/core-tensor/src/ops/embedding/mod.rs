//! An embedding table inside the flat parameter buffer: forward gathers one
//! row per id (`torch.nn.Embedding`), backward scatter-adds the output
//! gradient into the table's rows, samples in batch order, so a row that
//! several samples touch sums their gradients in the same order on every
//! device (no float atomics).

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
use crate::{Backend, Error, Result};

/// `batch` ids into a table of `rows` rows of `dim` values that starts at
/// `offset` in the flat parameter (and gradient) buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct EmbeddingGeom {
    pub batch: usize,
    pub dim: usize,
    pub rows: usize,
    pub offset: usize,
}

impl EmbeddingGeom {
    /// The table's range in the flat buffer.
    pub fn table(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.rows * self.dim
    }

    pub(crate) fn check<B: Backend>(
        &self,
        ids: &B::Storage<u32>,
        flat: &B::Storage<f32>,
        rows_out: &B::Storage<f32>,
    ) -> Result<()> {
        check_len("embedding", "ids", B::len(ids), self.batch)?;
        check_len("embedding", "out", B::len(rows_out), self.batch * self.dim)?;
        if self.table().end > B::len(flat) {
            return Err(Error::InvalidArgument {
                op: "embedding",
                reason: format!(
                    "the table {:?} exceeds the flat buffer of {} elements",
                    self.table(),
                    B::len(flat)
                ),
            });
        }
        Ok(())
    }

    /// The error for an id not below `rows` (the CPU's; a GPU sets its
    /// fault word instead).
    pub(crate) fn bad_id(&self, id: u32) -> Error {
        Error::InvalidArgument {
            op: "embedding",
            reason: format!("id {id} is not below the table's {} rows", self.rows),
        }
    }
}

/// Embedding kernels.
pub trait EmbeddingKernel: Backend {
    /// `out[b] = params[table][ids[b]]`, one row of `dim` per sample.
    fn embedding_fwd(
        &self,
        geom: &EmbeddingGeom,
        ids: &Self::Storage<u32>,
        params: &Self::Storage<f32>,
        out: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// Overwrites the table's range of `grads` with `Σ dout[b]` over the
    /// samples `b` whose id is each row (zero for untouched rows).
    fn embedding_bwd(
        &self,
        geom: &EmbeddingGeom,
        ids: &Self::Storage<u32>,
        dout: &Self::Storage<f32>,
        grads: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// Adds `Σ dout[b]` (in batch order, as [`EmbeddingKernel::embedding_bwd`]
    /// sums) into the rows of `grads` the ids name, zeroing nothing: for a
    /// caller that keeps the table's gradient zero between backward passes
    /// (zeroing the rows it used), so that no pass touches the whole table.
    fn embedding_bwd_add(
        &self,
        geom: &EmbeddingGeom,
        ids: &Self::Storage<u32>,
        dout: &Self::Storage<f32>,
        grads: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
