use super::{MaxPool2dKernel, PoolGeom};
use crate::error::check_len;
use crate::{Cpu, Result};

/// The pooled value of a window: its maximum, or NaN if any input is NaN
/// (PyTorch's rule). Branch-free, so the loops over windows vectorize.
#[inline]
fn window_max(w: [f32; 4]) -> f32 {
    let m = w[0].max(w[1]).max(w[2].max(w[3]));
    if w.iter().any(|v| v.is_nan()) {
        f32::NAN
    } else {
        m
    }
}

/// The window position (0..4, row-major) the gradient goes to: the first
/// input equal to the pooled value, which is exactly the first maximum of a
/// strict `>` scan, as PyTorch picks it (or the first NaN).
#[inline]
fn window_argmax(w: [f32; 4]) -> usize {
    let m = window_max(w);
    w.iter()
        .position(|&v| v == m || (m.is_nan() && v.is_nan()))
        .unwrap_or(0)
}

impl MaxPool2dKernel for Cpu {
    fn maxpool2d_fwd(&self, g: &PoolGeom, x: &Vec<f32>, y: &mut Vec<f32>) -> Result<()> {
        g.check::<Self>(x, y)?;
        let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
        // Whole planes per thread: every output is one window's maximum,
        // so the split cannot change a bit.
        let per = planes_per_thread(self, g);
        self.for_each_chunk(y, per * out_plane, |i, y| {
            let x = &x[i * per * in_plane..];
            fwd_planes(g, x, y);
        });
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
        let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
        let per = planes_per_thread(self, g);
        self.for_each_chunk(dx, per * in_plane, |i, dx| {
            let (x, dy) = (&x[i * per * in_plane..], &dy[i * per * out_plane..]);
            bwd_planes(g, x, dy, dx);
        });
        Ok(())
    }
}

/// Planes (`batch × channels`) per thread, at least one.
fn planes_per_thread(cpu: &Cpu, g: &PoolGeom) -> usize {
    (g.batch * g.channels).div_ceil(cpu.threads()).max(1)
}

/// Pools the planes of `x` into those of `y` (as many as `y` holds).
fn fwd_planes(g: &PoolGeom, x: &[f32], y: &mut [f32]) {
    let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
    for (src, dst) in x.chunks_exact(in_plane).zip(y.chunks_exact_mut(out_plane)) {
        // Pairs of input rows pool into one output row; an odd last row
        // or column is dropped by `chunks_exact`.
        for (pair, row) in src
            .chunks_exact(2 * g.in_w)
            .zip(dst.chunks_exact_mut(g.out_w()))
        {
            let (top, bottom) = pair.split_at(g.in_w);
            let windows = top.chunks_exact(2).zip(bottom.chunks_exact(2));
            for (out, (t, b)) in row.iter_mut().zip(windows) {
                *out = window_max([t[0], t[1], b[0], b[1]]);
            }
        }
    }
}

/// Routes the gradient of the planes of `dy` onto those of `dx` (as many
/// as `dx` holds).
fn bwd_planes(g: &PoolGeom, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    if g.in_h % 2 == 1 || g.in_w % 2 == 1 {
        // The dropped last row/column gets no gradient; nothing else
        // below writes there.
        dx.fill(0.0);
    }
    let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
    let planes = x
        .chunks_exact(in_plane)
        .zip(dy.chunks_exact(out_plane))
        .zip(dx.chunks_exact_mut(in_plane));
    for ((src, grad), dst) in planes {
        let rows = src
            .chunks_exact(2 * g.in_w)
            .zip(dst.chunks_exact_mut(2 * g.in_w));
        for ((pair, dpair), grad_row) in rows.zip(grad.chunks_exact(g.out_w())) {
            let (top, bottom) = pair.split_at(g.in_w);
            let (dtop, dbottom) = dpair.split_at_mut(g.in_w);
            let windows = top.chunks_exact(2).zip(bottom.chunks_exact(2));
            let dwindows = dtop.chunks_exact_mut(2).zip(dbottom.chunks_exact_mut(2));
            for ((&d, (t, b)), (dt, db)) in grad_row.iter().zip(windows).zip(dwindows) {
                let k = window_argmax([t[0], t[1], b[0], b[1]]);
                let pick = |i: usize| if i == k { d } else { 0.0 };
                (dt[0], dt[1], db[0], db[1]) = (pick(0), pick(1), pick(2), pick(3));
            }
        }
    }
}
