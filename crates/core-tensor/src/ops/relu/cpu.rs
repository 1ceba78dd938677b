use super::ReluKernel;
use crate::error::check_len;
use crate::ops::Dropout;
use crate::ops::dropout::mask;
use crate::{Cpu, Result};

impl ReluKernel for Cpu {
    fn relu_fwd(&self, dropout: Dropout, x: &mut Vec<f32>) -> Result<()> {
        dropout.check()?;
        mask::relu_dropout_fwd(dropout, 0, x);
        Ok(())
    }

    fn relu_bwd(&self, dropout: Dropout, y: &Vec<f32>, dy: &mut Vec<f32>) -> Result<()> {
        dropout.check()?;
        check_len("relu_bwd", "dy", dy.len(), y.len())?;
        mask::relu_dropout_bwd(dropout, 0, y, dy);
        Ok(())
    }
}
