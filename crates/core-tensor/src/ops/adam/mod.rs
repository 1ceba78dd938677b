//! Adam, fused over the flat parameter buffer, computed exactly as PyTorch's
//! single-tensor `torch.optim.Adam` (no weight decay, no amsgrad):
//!
//! ```text
//! m = m + (1 − β1)·(g − m)                 # exp_avg.lerp_(grad, 1 − β1)
//! v = β2·v + (1 − β2)·g·g                  # exp_avg_sq.mul_(β2).addcmul_(grad, grad, 1 − β2)
//! p = p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)
//! ```
//! The bias corrections are computed on the host in f64, as Python does,
//! and handed to every backend as the same f32 scalars. Every operation is
//! rounded once, on the CPU as on the GPU; PyTorch's CPU kernels fuse some
//! (`lerp_`) and round `sqrt` otherwise, so the two agree to a few units in
//! the last place, not bit for bit (`tests/torch_adam.rs`).
//!
//! The lazy step (`sparse_adam_step`) is `torch.optim.SparseAdam`'s
//! arithmetic (`torch/optim/_functional.py`, `sparse_adam`) on the rows of
//! a table that increasing ids name; every other row keeps its parameters
//! and moments bit for bit:
//!
//! ```text
//! Δm = (g − m)·(1 − β1);   m = m + Δm      # exp_avg_update_values
//! Δv = (g·g − v)·(1 − β2); v = v + Δv      # exp_avg_sq_update_values
//! p = p − lr·√(1 − β2ᵗ)/(1 − β1ᵗ) · m / (√v + ε)
//! ```
//! `t` is the step count of the whole parameter (SparseAdam's
//! `state['step']`, one per `step()`), not of the row.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::error::check_len;
use crate::ops::{GUARD_LEN, RowsGeom};
use crate::{Backend, Error, Result};

/// Adam's hyper-parameters; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// The per-step scalars of one Adam update, as the kernels receive them.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct AdamScalars {
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    /// `lr / (1 − β1ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β2ᵗ)`.
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
}

/// The per-step scalars of one lazy (SparseAdam) update.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct SparseAdamScalars {
    pub one_minus_beta1: f32,
    pub one_minus_beta2: f32,
    /// `lr·√(1 − β2ᵗ) / (1 − β1ᵗ)`.
    pub step_size: f32,
    pub eps: f32,
}

impl AdamConfig {
    /// Rejects settings that would silently produce garbage.
    pub fn validate(&self) -> Result<()> {
        let ok = self.lr.is_finite()
            && self.lr > 0.0
            && (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.eps.is_finite()
            && self.eps > 0.0;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                op: "adam",
                reason: format!("invalid hyper-parameters {self:?}"),
            })
        }
    }

    /// The scalars for update number `step` (1 for the first update).
    pub fn scalars(&self, step: u64) -> AdamScalars {
        let t = step.min(i32::MAX as u64) as i32;
        let bias_correction1 = 1.0 - self.beta1.powi(t);
        let bias_correction2 = 1.0 - self.beta2.powi(t);
        AdamScalars {
            beta1: self.beta1 as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            step_size: (self.lr / bias_correction1) as f32,
            bias_correction2_sqrt: bias_correction2.sqrt() as f32,
            eps: self.eps as f32,
        }
    }

    /// The lazy update's scalars for update number `step`, computed as
    /// SparseAdam's Python does: `beta ** step` (C's `pow`), then
    /// `lr * math.sqrt(bias_correction2) / bias_correction1`.
    pub fn sparse_scalars(&self, step: u64) -> SparseAdamScalars {
        let t = step as f64;
        let bias_correction1 = 1.0 - self.beta1.powf(t);
        let bias_correction2 = 1.0 - self.beta2.powf(t);
        SparseAdamScalars {
            one_minus_beta1: (1.0 - self.beta1) as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            step_size: (self.lr * bias_correction2.sqrt() / bias_correction1) as f32,
            eps: self.eps as f32,
        }
    }
}

/// Checks that the moments, the gradients and the guard fit `params`.
pub(crate) fn check_state<B: Backend>(
    params: &B::Storage<f32>,
    grads: &B::Storage<f32>,
    m: &B::Storage<f32>,
    v: &B::Storage<f32>,
    guard: &B::Storage<u32>,
) -> Result<()> {
    let n = B::len(params);
    for (name, len) in [("grads", B::len(grads)), ("m", B::len(m)), ("v", B::len(v))] {
        check_len("adam", name, len, n)?;
    }
    check_len("adam", "guard", B::len(guard), GUARD_LEN)
}

/// Checks that `range` lies inside a buffer of `n` elements.
pub(crate) fn check_range(range: &Range<usize>, n: usize) -> Result<()> {
    if range.start <= range.end && range.end <= n {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op: "adam",
        reason: format!("the range {range:?} is not inside the {n} parameters"),
    })
}

/// Checks that `ids` holds `rows.count` ids and the table lies inside a
/// buffer of `n` elements (the ids' values: `RowsGeom::check_ids`).
pub(crate) fn check_rows<B: Backend>(
    rows: &RowsGeom,
    ids: &B::Storage<u32>,
    n: usize,
) -> Result<()> {
    rows.check_table("adam", B::len(ids), n, "parameters")
}

/// The fused optimizer steps. Each leaves everything as it is when `guard`
/// (see [`crate::ops::finite`]) says a non-finite value was seen.
pub trait AdamKernel: Backend {
    /// Updates `params`, `m` and `v` in place from `grads`, element by
    /// element, within `range` of the buffers (all of equal length).
    #[allow(clippy::too_many_arguments)]
    fn adam_step_range(
        &self,
        scalars: &AdamScalars,
        range: Range<usize>,
        params: &mut Self::Storage<f32>,
        grads: &Self::Storage<f32>,
        m: &mut Self::Storage<f32>,
        v: &mut Self::Storage<f32>,
        guard: &Self::Storage<u32>,
    ) -> Result<()>;

    /// [`AdamKernel::adam_step_range`] over the whole buffers.
    fn adam_step(
        &self,
        scalars: &AdamScalars,
        params: &mut Self::Storage<f32>,
        grads: &Self::Storage<f32>,
        m: &mut Self::Storage<f32>,
        v: &mut Self::Storage<f32>,
        guard: &Self::Storage<u32>,
    ) -> Result<()> {
        let all = 0..Self::len(params);
        self.adam_step_range(scalars, all, params, grads, m, v, guard)
    }

    /// The lazy (SparseAdam) update of the `rows.count` rows of the table
    /// `rows` places in the buffers that the first `rows.count` of `ids`
    /// (increasing, below `rows.rows`) name; every other element is left
    /// as it is.
    #[allow(clippy::too_many_arguments)]
    fn sparse_adam_step(
        &self,
        scalars: &SparseAdamScalars,
        rows: &RowsGeom,
        ids: &Self::Storage<u32>,
        params: &mut Self::Storage<f32>,
        grads: &Self::Storage<f32>,
        m: &mut Self::Storage<f32>,
        v: &mut Self::Storage<f32>,
        guard: &Self::Storage<u32>,
    ) -> Result<()>;
}
