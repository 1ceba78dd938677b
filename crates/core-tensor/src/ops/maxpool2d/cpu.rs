use super::{MaxPool2dKernel, PoolGeom};
use crate::error::check_len;
use crate::{Cpu, Result};

/// The flat offsets (within one plane) of the four inputs of window `(oh, ow)`,
/// in PyTorch's scan order.
fn window(g: &PoolGeom, oh: usize, ow: usize) -> [usize; 4] {
    let top = 2 * oh * g.in_w + 2 * ow;
    [top, top + 1, top + g.in_w, top + g.in_w + 1]
}

/// The position in `offsets` of the first maximum (NaN counts as maximal).
fn argmax(plane: &[f32], offsets: &[usize; 4]) -> usize {
    let mut best = 0;
    for i in 1..4 {
        let (v, b) = (plane[offsets[i]], plane[offsets[best]]);
        if !b.is_nan() && (v > b || v.is_nan()) {
            best = i;
        }
    }
    best
}

impl MaxPool2dKernel for Cpu {
    fn maxpool2d_fwd(&self, g: &PoolGeom, x: &Vec<f32>, y: &mut Vec<f32>) -> Result<()> {
        g.check::<Self>(x, y)?;
        let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
        for (src, dst) in x.chunks(in_plane).zip(y.chunks_mut(out_plane)) {
            for oh in 0..g.out_h() {
                for ow in 0..g.out_w() {
                    let offsets = window(g, oh, ow);
                    dst[oh * g.out_w() + ow] = src[offsets[argmax(src, &offsets)]];
                }
            }
        }
        Ok(())
    }

    fn maxpool2d_bwd(
        &self,
        g: &PoolGeom,
        x: &Vec<f32>,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, dy)?;
        check_len("maxpool2d", "dx", dx.len(), x.len())?;
        dx.fill(0.0);
        let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
        let planes = x
            .chunks(in_plane)
            .zip(dy.chunks(out_plane))
            .zip(dx.chunks_mut(in_plane));
        for ((src, grad), dst) in planes {
            for oh in 0..g.out_h() {
                for ow in 0..g.out_w() {
                    let offsets = window(g, oh, ow);
                    dst[offsets[argmax(src, &offsets)]] = grad[oh * g.out_w() + ow];
                }
            }
        }
        Ok(())
    }
}
