use super::{DropoutKernel, check_p, keeps};
use crate::{Cpu, Result};

/// Forward and backward are the same map: scale the kept, zero the rest.
fn apply(p: f32, seed: u64, values: &mut [f32]) -> Result<()> {
    check_p(p)?;
    if p == 0.0 {
        return Ok(());
    }
    let scale = 1.0 / (1.0 - p);
    for (i, v) in values.iter_mut().enumerate() {
        *v = if keeps(p, seed, i as u64) {
            *v * scale
        } else {
            0.0
        };
    }
    Ok(())
}

impl DropoutKernel for Cpu {
    fn dropout_fwd(&self, p: f32, seed: u64, x: &mut Vec<f32>) -> Result<()> {
        apply(p, seed, x)
    }

    fn dropout_bwd(&self, p: f32, seed: u64, dy: &mut Vec<f32>) -> Result<()> {
        apply(p, seed, dy)
    }
}
