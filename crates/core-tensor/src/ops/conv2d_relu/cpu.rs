use super::Conv2dReluKernel;
use crate::ops::{Conv2dGeom, Dropout, LayerKernel, ParamAt, ReluKernel};
use crate::{Cpu, Result};

/// The two unfused kernels in turn: the reference, and nothing to save on
/// the CPU.
impl Conv2dReluKernel for Cpu {
    fn conv2d_relu_fwd(
        &self,
        g: &Conv2dGeom,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        self.layer_fwd(g, x, params, at, y)?;
        self.relu_fwd(Dropout::OFF, y)
    }
}
