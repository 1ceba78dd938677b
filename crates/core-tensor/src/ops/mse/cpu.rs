use super::{MseGeom, MseKernel};
use crate::{Cpu, Result};

impl MseKernel for Cpu {
    fn mse_fwd_bwd(
        &self,
        g: &MseGeom,
        y: &Vec<f32>,
        target: &Vec<f32>,
        mut dy: Option<&mut Vec<f32>>,
        loss_sum: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(y, target, dy.as_deref(), loss_sum)?;
        let scale = 2.0 / (g.batch * g.features) as f32;
        let inv_features = 1.0 / g.features as f32;
        let mut total = 0.0f32;
        for (row, (y, t)) in y
            .chunks(g.features)
            .zip(target.chunks(g.features))
            .enumerate()
        {
            let mut sq = 0.0f32;
            for (c, (&y, &t)) in y.iter().zip(t).enumerate() {
                let d = y - t;
                sq += d * d;
                if let Some(dy) = dy.as_deref_mut() {
                    dy[row * g.features + c] = d * scale;
                }
            }
            total += sq * inv_features;
        }
        loss_sum[0] += total;
        Ok(())
    }
}
