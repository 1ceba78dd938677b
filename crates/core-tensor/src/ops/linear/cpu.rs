use super::LinearGeom;
use crate::gemm::{MatMut, MatRef, matmul};
use crate::ops::{LayerKernel, ParamAt};
use crate::{Cpu, Result};

impl LayerKernel<LinearGeom> for Cpu {
    fn layer_fwd(
        &self,
        g: &LinearGeom,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        g.lens().check::<Self>(x, params, at, y)?;
        let (w, b) = (&params[at.weight.clone()], &params[at.bias.clone()]);
        y.chunks_mut(g.out_features)
            .for_each(|row| row.copy_from_slice(b));
        self.run(|| {
            matmul(
                MatMut::row_major(y, g.batch, g.out_features),
                true,
                MatRef::row_major(x, g.batch, g.in_features),
                MatRef::row_major(w, g.out_features, g.in_features).t(),
                self.gemm_parallelism(),
            )
        });
        Ok(())
    }

    fn layer_bwd(
        &self,
        g: &LinearGeom,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        dy: &Vec<f32>,
        grads: &mut Vec<f32>,
        dx: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        g.lens()
            .check_bwd::<Self>(x, params, at, dy, grads, dx.as_deref())?;
        let dy_mat = MatRef::row_major(dy, g.batch, g.out_features);
        let db = &mut grads[at.bias.clone()];
        db.fill(0.0);
        for row in dy.chunks(g.out_features) {
            db.iter_mut().zip(row).for_each(|(acc, v)| *acc += v);
        }
        self.run(|| {
            matmul(
                MatMut::row_major(&mut grads[at.weight.clone()], g.out_features, g.in_features),
                false,
                dy_mat.t(),
                MatRef::row_major(x, g.batch, g.in_features),
                self.gemm_parallelism(),
            )
        });
        if let Some(dx) = dx {
            let w = MatRef::row_major(&params[at.weight.clone()], g.out_features, g.in_features);
            self.run(|| {
                matmul(
                    MatMut::row_major(dx, g.batch, g.in_features),
                    false,
                    dy_mat,
                    w,
                    self.gemm_parallelism(),
                )
            });
        }
        Ok(())
    }
}
