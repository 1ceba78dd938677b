use cudarc::driver::CudaSlice;

use super::ReluKernel;
use crate::backend::cuda::launch::blocks_for;
use crate::error::check_len;
use crate::{Cuda, Result};

const THREADS: u32 = 256;

impl ReluKernel for Cuda {
    fn relu_fwd(&self, x: &mut CudaSlice<f32>) -> Result<()> {
        if x.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("relu", x.len(), THREADS)?;
        let n = x.len() as u64;
        self.kernel("relu_fwd_f32")?.arg(x).arg(&n).launch(cfg)
    }

    fn relu_bwd(&self, y: &CudaSlice<f32>, dy: &mut CudaSlice<f32>) -> Result<()> {
        check_len("relu_bwd", "dy", dy.len(), y.len())?;
        if y.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("relu", y.len(), THREADS)?;
        let n = y.len() as u64;
        self.kernel("relu_bwd_f32")?
            .arg(y)
            .arg(dy)
            .arg(&n)
            .launch(cfg)
    }
}
