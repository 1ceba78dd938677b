use super::ReluKernel;
use crate::error::check_len;
use crate::ops::Dropout;
use crate::{Cpu, Result};

/// `max(v, 0)`, but NaN stays NaN: `max` would turn it into 0 and hide a
/// diverged run.
#[inline]
fn relu(v: f32) -> f32 {
    if v < 0.0 { 0.0 } else { v }
}

impl ReluKernel for Cpu {
    fn relu_fwd(&self, dropout: Dropout, x: &mut Vec<f32>) -> Result<()> {
        dropout.check()?;
        if dropout.is_off() {
            // Apart, so that the plain loop vectorizes.
            x.iter_mut().for_each(|v| *v = relu(*v));
        } else {
            for (i, v) in x.iter_mut().enumerate() {
                *v = dropout.apply(i as u64, relu(*v));
            }
        }
        Ok(())
    }

    fn relu_bwd(&self, dropout: Dropout, y: &Vec<f32>, dy: &mut Vec<f32>) -> Result<()> {
        dropout.check()?;
        check_len("relu_bwd", "dy", dy.len(), y.len())?;
        let pairs = dy.iter_mut().zip(y);
        if dropout.is_off() {
            // A select rather than a branch, so the loop vectorizes.
            pairs.for_each(|(d, &y)| *d = if y > 0.0 { *d } else { 0.0 });
        } else {
            for (i, (d, &y)) in pairs.enumerate() {
                *d = if y > 0.0 {
                    dropout.apply(i as u64, *d)
                } else {
                    0.0
                };
            }
        }
        Ok(())
    }
}
