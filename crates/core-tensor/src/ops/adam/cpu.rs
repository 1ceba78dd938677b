use std::ops::Range;

use rayon::prelude::*;

use super::{AdamKernel, AdamScalars, SparseAdamScalars, check_range, check_rows, check_state};
use crate::ops::RowsGeom;
use crate::{Cpu, Result};

/// One element of the update; the CUDA kernel mirrors this line for line.
#[inline]
fn update(s: &AdamScalars, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
    *m += s.one_minus_beta1 * (g - *m);
    *v = *v * s.beta2 + s.one_minus_beta2 * g * g;
    let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
    *p += -s.step_size * (*m / denom);
}

/// One element of the lazy update, in SparseAdam's order of operations;
/// the CUDA kernel mirrors it line for line.
#[inline]
fn update_lazy(s: &SparseAdamScalars, p: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
    *m += (g - *m) * s.one_minus_beta1;
    *v += (g * g - *v) * s.one_minus_beta2;
    let denom = v.sqrt() + s.eps;
    *p += -s.step_size * (*m / denom);
}

impl AdamKernel for Cpu {
    fn adam_step_range(
        &self,
        s: &AdamScalars,
        range: Range<usize>,
        params: &mut Vec<f32>,
        grads: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        guard: &Vec<u32>,
    ) -> Result<()> {
        check_state::<Self>(params, grads, m, v, guard)?;
        check_range(&range, params.len())?;
        if guard[0] != 0 {
            return Ok(());
        }
        let (params, grads) = (&mut params[range.clone()], &grads[range.clone()]);
        let (m, v) = (&mut m[range.clone()], &mut v[range]);
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

    /// One row after the other: the rows are few (a batch's), and each
    /// element's update is independent of every other, so no thread count
    /// could change a bit.
    fn sparse_adam_step(
        &self,
        s: &SparseAdamScalars,
        g: &RowsGeom,
        ids: &Vec<u32>,
        params: &mut Vec<f32>,
        grads: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        guard: &Vec<u32>,
    ) -> Result<()> {
        check_state::<Self>(params, grads, m, v, guard)?;
        check_rows::<Self>(g, ids, params.len())?;
        g.check_ids(ids)?;
        if guard[0] != 0 {
            return Ok(());
        }
        for &id in &ids[..g.count] {
            let row = g.offset + id as usize * g.dim..g.offset + (id as usize + 1) * g.dim;
            let (p, gr) = (&mut params[row.clone()], &grads[row.clone()]);
            let (m, v) = (&mut m[row.clone()], &mut v[row]);
            for (((p, &gr), m), v) in p.iter_mut().zip(gr).zip(m).zip(v) {
                update_lazy(s, p, gr, m, v);
            }
        }
        Ok(())
    }
}
