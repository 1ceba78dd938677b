use rayon::prelude::*;

use super::SgdKernel;
use crate::error::check_len;
use crate::ops::GUARD_LEN;
use crate::{Cpu, Result};

/// One element of the update; the CUDA kernel mirrors this line.
#[inline]
fn update(minus_lr: f32, p: &mut f32, g: f32) {
    *p += minus_lr * g;
}

impl SgdKernel for Cpu {
    fn sgd_step(
        &self,
        lr: f32,
        params: &mut Vec<f32>,
        grads: &Vec<f32>,
        guard: &Vec<u32>,
    ) -> Result<()> {
        check_len("sgd", "grads", grads.len(), params.len())?;
        check_len("sgd", "guard", guard.len(), GUARD_LEN)?;
        if guard[0] != 0 {
            return Ok(());
        }
        let minus_lr = -lr;
        // Element-wise, so splitting across threads cannot change a bit.
        if self.threads() == 1 {
            params
                .iter_mut()
                .zip(grads)
                .for_each(|(p, &g)| update(minus_lr, p, g));
        } else {
            self.run(|| {
                params
                    .par_iter_mut()
                    .zip(grads.par_iter())
                    .with_min_len(1 << 14)
                    .for_each(|(p, &g)| update(minus_lr, p, g))
            });
        }
        Ok(())
    }
}
