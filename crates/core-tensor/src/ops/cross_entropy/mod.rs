//! Cross-entropy over logits, fused with its gradient: a numerically stable
//! log-softmax, the mean loss over the batch, and
//! `dlogits = (softmax − onehot(label)) / batch`.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
use crate::{Backend, Result};

/// `batch` rows of `classes` logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct ClassGeom {
    pub batch: usize,
    pub classes: usize,
}

impl ClassGeom {
    pub(crate) fn check<B: Backend>(
        &self,
        logits: &B::Storage<f32>,
        labels: &B::Storage<u8>,
    ) -> Result<()> {
        check_len(
            "cross_entropy",
            "logits",
            B::len(logits),
            self.batch * self.classes,
        )?;
        check_len("cross_entropy", "labels", B::len(labels), self.batch)
    }
}

/// Cross-entropy kernels.
pub trait CrossEntropyKernel: Backend {
    /// Writes `dlogits` for the batch-mean loss and adds the *sum* of the
    /// per-sample losses to `loss_sum[0]`, so that a whole epoch accumulates
    /// on the device without a host round trip per step.
    fn cross_entropy_fwd_bwd(
        &self,
        geom: &ClassGeom,
        logits: &Self::Storage<f32>,
        labels: &Self::Storage<u8>,
        dlogits: &mut Self::Storage<f32>,
        loss_sum: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
