//! The CPU's fused op is the two unfused kernels in turn, plus the argmax
//! bytes: the reference the GPU's fused kernels are checked against, with
//! the unfused bits by construction. It saves nothing, so models call the
//! unfused kernels on the CPU ([`Conv2dPoolKernel::fuses`]).

use super::{Conv2dPoolKernel, check_pooled};
use crate::error::check_len;
use crate::ops::dropout::mask;
use crate::ops::{Conv2dGeom, Epilogue, LayerKernel, MaxPool2dKernel, ParamAt, PoolGeom};
use crate::{Backend, Cpu, Result};

/// The place (0–3, row-major) that max-pooling routes window `w`'s
/// gradient to: the first maximum, or the first NaN when there is one
/// (`maxpool2d/cpu.rs`'s `window_route`).
fn window_argmax(w: [f32; 4]) -> u8 {
    let nan = w.iter().any(|v| v.is_nan());
    let max = w[0].max(w[1]).max(w[2].max(w[3]));
    let hit = |v: f32| if nan { v.is_nan() } else { v == max };
    (0..3).find(|&i| hit(w[i])).unwrap_or(3) as u8
}

/// The offsets of window i's four inputs in its plane, row-major.
pub(super) fn window_places(p: &PoolGeom, i: usize) -> [usize; 4] {
    let (ohw, ow) = (p.out_h() * p.out_w(), p.out_w());
    let (plane, r) = (i / ohw, i % ohw);
    let top = plane * p.in_h * p.in_w + 2 * (r / ow) * p.in_w + 2 * (r % ow);
    [top, top + 1, top + p.in_w, top + p.in_w + 1]
}

impl Conv2dPoolKernel for Cpu {
    fn conv2d_pool_fwd(
        &self,
        g: &Conv2dGeom,
        then: Epilogue,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        y: &mut Vec<f32>,
        argmax: &mut Vec<u8>,
    ) -> Result<()> {
        let pool = check_pooled::<Self>(g, y, argmax)?;
        let mut a = self.zeros(g.batch * g.out_image_len())?;
        self.layer_fwd(g, x, params, at, &mut a)?;
        self.maxpool2d_fwd(&pool, then, &a, y)?;
        for (i, arg) in argmax.iter_mut().enumerate() {
            *arg = window_argmax(window_places(&pool, i).map(|k| a[k]));
        }
        Ok(())
    }

    fn conv2d_pool_bwd(
        &self,
        g: &Conv2dGeom,
        then: Epilogue,
        (x, params, at): (&Vec<f32>, &Vec<f32>, &ParamAt),
        (argmax, y, dy): (&Vec<u8>, &Vec<f32>, &Vec<f32>),
        da: &mut Vec<f32>,
        grads: &mut Vec<f32>,
        dx: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let pool = check_pooled::<Self>(g, dy, argmax)?;
        check_len("conv2d_pool", "y", y.len(), dy.len())?;
        check_len("conv2d_pool", "da", da.len(), pool.input_len())?;
        let (relu, dropout) = then.parts()?;
        let mut grad = dy.clone();
        if relu {
            mask::relu_dropout_bwd(dropout, 0, y, &mut grad);
        }
        da.fill(0.0);
        for (i, (&arg, &d)) in argmax.iter().zip(&grad).enumerate() {
            // An argmax past 3 leaves the window zero, as on the GPU.
            if let Some(&k) = window_places(&pool, i).get(usize::from(arg)) {
                da[k] = d;
            }
        }
        self.layer_bwd(g, x, params, at, da, grads, dx)
    }

    fn fuses(&self) -> bool {
        false
    }
}
