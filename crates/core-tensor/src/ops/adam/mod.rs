//! Adam, fused over the flat parameter buffer, computed exactly as PyTorch's
//! single-tensor `torch.optim.Adam` (no weight decay, no amsgrad):
//!
//! ```text
//! m = m + (1 − β1)·(g − m)                 # exp_avg.lerp_(grad, 1 − β1)
//! v = β2·v + (1 − β2)·g·g                  # exp_avg_sq.mul_(β2).addcmul_(grad, grad, 1 − β2)
//! p = p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)
//! ```
//! The bias corrections are computed on the host in f64, as Python does,
//! and handed to every backend as the same f32 scalars.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

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
}

/// The fused optimizer step.
pub trait AdamKernel: Backend {
    /// Updates `params`, `m` and `v` in place from `grads`, unless `guard`
    /// (see [`crate::ops::finite`]) says a non-finite value was seen.
    fn adam_step(
        &self,
        scalars: &AdamScalars,
        params: &mut Self::Storage<f32>,
        grads: &Self::Storage<f32>,
        m: &mut Self::Storage<f32>,
        v: &mut Self::Storage<f32>,
        guard: &Self::Storage<u32>,
    ) -> Result<()>;
}
