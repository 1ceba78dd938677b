use rayon::prelude::*;

use super::{AdamKernel, AdamScalars};
use crate::error::check_len;
use crate::ops::GUARD_LEN;
use crate::{Cpu, Result};

/// One element of the update; the CUDA kernel mirrors this line for line.
#[inline]
fn update(s: &AdamScalars, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
    *m += s.one_minus_beta1 * (g - *m);
    *v = *v * s.beta2 + s.one_minus_beta2 * g * g;
    let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
    *p += -s.step_size * (*m / denom);
}

impl AdamKernel for Cpu {
    fn adam_step(
        &self,
        s: &AdamScalars,
        params: &mut Vec<f32>,
        grads: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        guard: &Vec<u32>,
    ) -> Result<()> {
        for (name, len) in [("grads", grads.len()), ("m", m.len()), ("v", v.len())] {
            check_len("adam", name, len, params.len())?;
        }
        check_len("adam", "guard", guard.len(), GUARD_LEN)?;
        if guard[0] != 0 {
            return Ok(());
        }
        // Element-wise, so splitting across threads cannot change a bit.
        if self.threads() == 1 {
            params
                .iter_mut()
                .zip(grads)
                .zip(m.iter_mut().zip(v.iter_mut()))
                .for_each(|((p, &g), (m, v))| update(s, p, g, m, v));
        } else {
            self.run(|| {
                params
                    .par_iter_mut()
                    .zip(grads.par_iter())
                    .zip(m.par_iter_mut().zip(v.par_iter_mut()))
                    .with_min_len(1 << 14)
                    .for_each(|((p, &g), (m, v))| update(s, p, g, m, v))
            });
        }
        Ok(())
    }
}
