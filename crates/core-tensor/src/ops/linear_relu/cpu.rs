use super::LinearReluKernel;
use crate::ops::{Dropout, LayerKernel, LinearGeom, ParamAt, ReluKernel};
use crate::{Cpu, Result};

/// The two unfused kernels in turn: the reference, and nothing to save on
/// the CPU.
impl LinearReluKernel for Cpu {
    fn linear_relu_fwd(
        &self,
        g: &LinearGeom,
        dropout: Dropout,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        self.layer_fwd(g, x, params, at, y)?;
        self.relu_fwd(dropout, y)
    }

    fn linear_relu_bwd(
        &self,
        g: &LinearGeom,
        dropout: Dropout,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        (y, dy): (&Vec<f32>, &mut Vec<f32>),
        grads: &mut Vec<f32>,
        dx: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        self.relu_bwd(dropout, y, dy)?;
        self.layer_bwd(g, x, params, at, dy, grads, dx)
    }
}
