use super::{ClassGeom, CrossEntropyKernel};
use crate::error::check_len;
use crate::{Cpu, Error, Result};

impl CrossEntropyKernel for Cpu {
    fn cross_entropy_fwd_bwd(
        &self,
        g: &ClassGeom,
        logits: &Vec<f32>,
        labels: &Vec<u8>,
        dlogits: &mut Vec<f32>,
        loss_sum: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(logits, labels)?;
        check_len("cross_entropy", "dlogits", dlogits.len(), logits.len())?;
        check_len("cross_entropy", "loss_sum", loss_sum.len(), 1)?;
        let inv_batch = 1.0 / g.batch as f32;
        let mut total = 0.0f32;
        let rows = logits
            .chunks(g.classes)
            .zip(dlogits.chunks_mut(g.classes))
            .zip(labels);
        for ((z, dz), &label) in rows {
            let label = usize::from(label);
            if label >= g.classes {
                return Err(Error::InvalidArgument {
                    op: "cross_entropy",
                    reason: format!("label {label} is not below the {} classes", g.classes),
                });
            }
            let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum_exp: f32 = z.iter().map(|&v| (v - max).exp()).sum();
            let log_sum = sum_exp.ln();
            total += log_sum - (z[label] - max);
            for (c, (d, &v)) in dz.iter_mut().zip(z).enumerate() {
                let softmax = (v - max).exp() / sum_exp;
                *d = (softmax - if c == label { 1.0 } else { 0.0 }) * inv_batch;
            }
        }
        loss_sum[0] += total;
        Ok(())
    }
}
