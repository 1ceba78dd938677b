use super::ReluKernel;
use crate::error::check_len;
use crate::{Cpu, Result};

impl ReluKernel for Cpu {
    fn relu_fwd(&self, x: &mut Vec<f32>) -> Result<()> {
        // `max` would turn NaN into 0 and hide a diverged run; keep NaN.
        x.iter_mut()
            .for_each(|v| *v = if *v < 0.0 { 0.0 } else { *v });
        Ok(())
    }

    fn relu_bwd(&self, y: &Vec<f32>, dy: &mut Vec<f32>) -> Result<()> {
        check_len("relu_bwd", "dy", dy.len(), y.len())?;
        // A select rather than a branch, so the loop vectorizes.
        dy.iter_mut()
            .zip(y)
            .for_each(|(d, &y)| *d = if y > 0.0 { *d } else { 0.0 });
        Ok(())
    }
}
