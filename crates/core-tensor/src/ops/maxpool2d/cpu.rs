use super::{Epilogue, MaxPool2dKernel, PoolGeom};
use crate::error::check_len;
use crate::ops::Dropout;
use crate::ops::dropout::mask;
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

/// The gradient `d` routed within one window: all of it to the first input
/// equal to the pooled value, which is exactly the first maximum of a
/// strict `>` scan, as PyTorch picks it (or the first NaN, since with a NaN
/// in the window the pooled value is NaN and only NaNs match). Branch-free:
/// which position wins is data-dependent, and a branch per window
/// mispredicts often enough to dominate the pass.
#[inline]
fn window_route(w: [f32; 4], d: f32) -> [f32; 4] {
    // Non-short-circuit `&`/`|` and a bit mask rather than `if`, so that
    // the compiler emits compares and selects, not branches.
    let nan = w.iter().fold(false, |n, v| n | v.is_nan());
    let max = w[0].max(w[1]).max(w[2].max(w[3]));
    let hit = w.map(|v| (!nan & (v == max)) | (nan & v.is_nan()));
    let earlier = [false, hit[0], hit[0] | hit[1], hit[0] | hit[1] | hit[2]];
    let taken = [
        hit[0],
        hit[1] & !earlier[1],
        hit[2] & !earlier[2],
        !earlier[3],
    ];
    taken.map(|t| f32::from_bits(d.to_bits() & u32::from(t).wrapping_neg()))
}

/// An [`Epilogue`] as the CPU loops apply it: whether ReLU runs, the
/// dropout after it, and the index of the first output the loop sees (the
/// dropout mask's element index is the output's in the whole tensor).
#[derive(Clone, Copy)]
struct Then {
    relu: bool,
    dropout: Dropout,
    first: usize,
}

impl Then {
    fn new(then: Epilogue) -> Result<Self> {
        let (relu, dropout) = then.parts()?;
        Ok(Self {
            relu,
            dropout,
            first: 0,
        })
    }

    /// The same epilogue for a loop whose first output is element `first`.
    fn starting_at(self, first: usize) -> Self {
        Self { first, ..self }
    }

    /// The pooled values of the loop's outputs from `at` on, in place,
    /// after the epilogue (a group of [`MASK_PLANES`] planes at a time).
    fn fwd(&self, at: usize, values: &mut [f32]) {
        mask::relu_dropout_fwd(self.dropout, self.first + at, values);
    }

    /// The gradients `dy` of the loop's outputs from `at` on through the
    /// dropout and the ReLU, which masks by the forward output `y`, into
    /// `out`.
    fn bwd(&self, at: usize, (y, dy): (&[f32], &[f32]), out: &mut [f32]) {
        out.copy_from_slice(dy);
        mask::relu_dropout_bwd(self.dropout, self.first + at, y, out);
    }
}

impl MaxPool2dKernel for Cpu {
    fn maxpool2d_fwd(
        &self,
        g: &PoolGeom,
        then: Epilogue,
        x: &Vec<f32>,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, y)?;
        let then = Then::new(then)?;
        let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
        // Whole planes per thread: every output is one window's maximum,
        // so the split cannot change a bit.
        let per = planes_per_thread(self, g);
        self.for_each_chunk(y, per * out_plane, |i, y| {
            let x = &x[i * per * in_plane..];
            let first = i * per * out_plane;
            fwd_planes(g, then.starting_at(first), x, y);
        });
        Ok(())
    }

    fn maxpool2d_bwd(
        &self,
        g: &PoolGeom,
        then: Epilogue,
        x: &Vec<f32>,
        y: &Vec<f32>,
        dy: &Vec<f32>,
        dx: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, dy)?;
        check_len("maxpool2d", "y", y.len(), dy.len())?;
        check_len("maxpool2d", "dx", dx.len(), x.len())?;
        let then = Then::new(then)?;
        let (in_plane, out_plane) = (g.in_h * g.in_w, g.out_h() * g.out_w());
        let per = planes_per_thread(self, g);
        self.for_each_chunk(dx, per * in_plane, |i, dx| {
            let first = i * per * out_plane;
            let (x, y, dy) = (&x[i * per * in_plane..], &y[first..], &dy[first..]);
            bwd_planes(g, then.starting_at(first), x, (y, dy), dx);
        });
        Ok(())
    }
}

/// Planes (`batch × channels`) per thread, at least one.
fn planes_per_thread(cpu: &Cpu, g: &PoolGeom) -> usize {
    (g.batch * g.channels).div_ceil(cpu.threads()).max(1)
}

/// Planes whose pooled values go through the epilogue's mask in one call:
/// the mask's loop is short for one plane (CNN_MNIST's 144 values), and
/// 16 planes' values stay in the first-level cache.
const MASK_PLANES: usize = 16;

/// Pools the planes of `x` into those of `y` (as many as `y` holds), each
/// group of planes through `then` while it is in cache.
fn fwd_planes(g: &PoolGeom, then: Then, x: &[f32], y: &mut [f32]) {
    let (in_plane, out_plane, ow) = (g.in_h * g.in_w, g.out_h() * g.out_w(), g.out_w());
    let mut at = 0;
    let groups = x
        .chunks(MASK_PLANES * in_plane)
        .zip(y.chunks_mut(MASK_PLANES * out_plane));
    for (xs, ys) in groups {
        for (src, dst) in xs
            .chunks_exact(in_plane)
            .zip(ys.chunks_exact_mut(out_plane))
        {
            // Pairs of input rows pool into one output row; an odd last row
            // or column is dropped by `chunks_exact`.
            for (pair, row) in src.chunks_exact(2 * g.in_w).zip(dst.chunks_exact_mut(ow)) {
                let (top, bottom) = pair.split_at(g.in_w);
                let windows = top.chunks_exact(2).zip(bottom.chunks_exact(2));
                for (out, (t, b)) in row.iter_mut().zip(windows) {
                    *out = window_max([t[0], t[1], b[0], b[1]]);
                }
            }
        }
        if then.relu {
            then.fwd(at, ys);
        }
        at += ys.len();
    }
}

/// Routes the gradient of the planes of `dy`, through `then`'s masks (by
/// the forward output `y`), onto those of `dx` (as many as `dx` holds).
fn bwd_planes(g: &PoolGeom, then: Then, x: &[f32], (y, dy): (&[f32], &[f32]), dx: &mut [f32]) {
    if g.in_h % 2 == 1 || g.in_w % 2 == 1 {
        // The dropped last row/column gets no gradient; nothing else
        // below writes there.
        dx.fill(0.0);
    }
    let (in_plane, out_plane, ow) = (g.in_h * g.in_w, g.out_h() * g.out_w(), g.out_w());
    let planes = dx.len() / in_plane;
    let (y, dy) = (&y[..planes * out_plane], &dy[..planes * out_plane]);
    // One output row's windows as structure of arrays: `soa[k][j]` is
    // position k (row-major) of window j. Routed over unit-stride arrays the
    // loop vectorizes; over the interleaved rows it stayed scalar.
    let mut soa = [(); 4].map(|_| vec![0.0f32; ow]);
    let mut masked = vec![
        0.0f32;
        if then.relu {
            MASK_PLANES * out_plane
        } else {
            0
        }
    ];
    let mut at = 0;
    let groups = x
        .chunks(MASK_PLANES * in_plane)
        .zip(dy.chunks(MASK_PLANES * out_plane))
        .zip(dx.chunks_mut(MASK_PLANES * in_plane));
    for ((xs, grads), dxs) in groups {
        let grads = match then.relu {
            false => grads,
            true => {
                let masked = &mut masked[..grads.len()];
                then.bwd(at, (&y[at..at + grads.len()], grads), masked);
                &*masked
            }
        };
        at += grads.len();
        let planes = xs
            .chunks_exact(in_plane)
            .zip(grads.chunks_exact(out_plane))
            .zip(dxs.chunks_exact_mut(in_plane));
        for ((src, grad), dst) in planes {
            let rows = src
                .chunks_exact(2 * g.in_w)
                .zip(dst.chunks_exact_mut(2 * g.in_w));
            for ((pair, dpair), grad_row) in rows.zip(grad.chunks_exact(ow)) {
                let (top, bottom) = pair.split_at(g.in_w);
                let [p0, p1, p2, p3] = &mut soa;
                deinterleave(top, p0, p1);
                deinterleave(bottom, p2, p3);
                let windows = p0
                    .iter_mut()
                    .zip(p1.iter_mut())
                    .zip(p2.iter_mut().zip(p3.iter_mut()));
                for (&d, ((a, b), (c, e))) in grad_row.iter().zip(windows) {
                    [*a, *b, *c, *e] = window_route([*a, *b, *c, *e], d);
                }
                let (dtop, dbottom) = dpair.split_at_mut(g.in_w);
                interleave(p0, p1, dtop);
                interleave(p2, p3, dbottom);
            }
        }
    }
}

/// Splits the window columns of one input row into the left and right
/// positions (a trailing odd column is skipped).
fn deinterleave(row: &[f32], left: &mut [f32], right: &mut [f32]) {
    for ((pair, l), r) in row.chunks_exact(2).zip(left).zip(right) {
        (*l, *r) = (pair[0], pair[1]);
    }
}

/// The inverse of [`deinterleave`].
fn interleave(left: &[f32], right: &[f32], row: &mut [f32]) {
    for ((pair, l), r) in row.chunks_exact_mut(2).zip(left).zip(right) {
        (pair[0], pair[1]) = (*l, *r);
    }
}
