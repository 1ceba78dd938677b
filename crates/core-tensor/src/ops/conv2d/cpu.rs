use rayon::prelude::*;

use super::Conv2dGeom;
use super::wide::{self, Layout, Wide, WideBwd};
use crate::gemm::{MatMut, MatRef, Parallelism, matmul};
use crate::ops::{LayerKernel, ParamAt};
use crate::{Cpu, Result};

impl LayerKernel<Conv2dGeom> for Cpu {
    fn layer_fwd(
        &self,
        g: &Conv2dGeom,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        g.lens()?.check::<Self>(x, params, at, y)?;
        let (w, b) = (&params[at.weight.clone()], &params[at.bias.clone()]);
        let (in_len, out_len, ohw) = (g.in_image_len(), g.out_image_len(), g.out_h() * g.out_w());
        let per_group = g.batch.div_ceil(self.threads()).max(1);
        if let Some(isa) = wide::isa_for(g) {
            let layout = Layout::new(isa, g);
            let wide = Wide::new(&layout, w, b);
            self.for_each_chunk(y, per_group * out_len, |group, y_group| {
                let (mut scratch, mut padded) = (Vec::new(), Vec::new());
                for (i, y_n) in y_group.chunks_mut(out_len).enumerate() {
                    let n = group * per_group + i;
                    let x_n = layout.image(x, n * in_len, &mut padded);
                    wide.forward(x_n, &mut scratch, y_n);
                }
            });
            return Ok(());
        }
        // Images are split into one contiguous group per thread; each group
        // reuses one im2col scratch buffer, sized to stay in L2.
        self.for_each_chunk(y, per_group * out_len, |group, y_group| {
            let mut col = vec![0.0; g.patch_len() * ohw];
            for (i, y_n) in y_group.chunks_mut(out_len).enumerate() {
                let n = group * per_group + i;
                im2col(g, &x[n * in_len..(n + 1) * in_len], &mut col);
                for (row, &bias) in y_n.chunks_mut(ohw).zip(b) {
                    row.fill(bias);
                }
                matmul(
                    MatMut::row_major(y_n, g.out_channels, ohw),
                    true,
                    MatRef::row_major(w, g.out_channels, g.patch_len()),
                    MatRef::row_major(&col, g.patch_len(), ohw),
                    Parallelism::None,
                );
            }
        });
        Ok(())
    }

    fn layer_bwd(
        &self,
        g: &Conv2dGeom,
        x: &Vec<f32>,
        params: &Vec<f32>,
        at: &ParamAt,
        dy: &Vec<f32>,
        grads: &mut Vec<f32>,
        dx: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        g.lens()?
            .check_bwd::<Self>(x, params, at, dy, grads, dx.as_deref())?;
        let w = &params[at.weight.clone()];
        let layout = wide::bwd_isa_for(g).map(|isa| Layout::new(isa, g));
        let wide = layout
            .as_ref()
            .map(|layout| WideBwd::new(layout, w, dx.is_some()));
        let (wlen, blen) = (g.weight_len(), g.out_channels);
        let groups = self.partials(g.batch);
        let per_group = g.batch.div_ceil(groups);
        // Each group of images accumulates its own partial dW/db; the partials
        // are then summed in group order, so the result depends only on the
        // number of groups (the thread count, or fixed), never on scheduling.
        let mut partials = vec![0.0f32; groups * (wlen + blen)];
        let group_work = |group: usize, partial: &mut [f32], dx: Option<&mut [f32]>| {
            let first = group * per_group;
            let images = first..(first + per_group).min(g.batch);
            match &wide {
                Some(bwd) => wide_bwd_group(g, bwd, x, dy, images, partial, dx),
                None => bwd_group(g, x, w, dy, images, partial, dx),
            }
        };
        let in_group = per_group * g.in_image_len();
        match dx {
            _ if groups == 1 => group_work(0, &mut partials, dx.map(|d| d.as_mut_slice())),
            Some(dx) => self.run(|| {
                partials
                    .par_chunks_mut(wlen + blen)
                    .zip(dx.par_chunks_mut(in_group))
                    .enumerate()
                    .for_each(|(i, (p, d))| group_work(i, p, Some(d)))
            }),
            None => self.run(|| {
                partials
                    .par_chunks_mut(wlen + blen)
                    .enumerate()
                    .for_each(|(i, p)| group_work(i, p, None))
            }),
        }
        let (dw, db) = (at.weight.clone(), at.bias.clone());
        grads[dw.clone()].copy_from_slice(&partials[..wlen]);
        grads[db.clone()].copy_from_slice(&partials[wlen..wlen + blen]);
        for partial in partials.chunks(wlen + blen).skip(1) {
            grads[dw.clone()]
                .iter_mut()
                .zip(&partial[..wlen])
                .for_each(|(a, b)| *a += b);
            grads[db.clone()]
                .iter_mut()
                .zip(&partial[wlen..])
                .for_each(|(a, b)| *a += b);
        }
        Ok(())
    }
}

/// The backward pass over a contiguous range of images: accumulates dW and db
/// into `partial` (`[dW | db]`) and writes each image's dx when asked.
fn bwd_group(
    g: &Conv2dGeom,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    images: std::ops::Range<usize>,
    partial: &mut [f32],
    mut dx: Option<&mut [f32]>,
) {
    let (in_len, out_len, ohw, patch) = (
        g.in_image_len(),
        g.out_image_len(),
        g.out_h() * g.out_w(),
        g.patch_len(),
    );
    let (dw, db) = partial.split_at_mut(g.weight_len());
    let mut col = vec![0.0; patch * ohw];
    for (i, n) in images.enumerate() {
        let dy_n = &dy[n * out_len..(n + 1) * out_len];
        add_bias_grad(db, dy_n, ohw);
        im2col(g, &x[n * in_len..(n + 1) * in_len], &mut col);
        let dy_mat = MatRef::row_major(dy_n, g.out_channels, ohw);
        // dW += dy_n · col_nᵀ
        matmul(
            MatMut::row_major(dw, g.out_channels, patch),
            i > 0,
            dy_mat,
            MatRef::row_major(&col, patch, ohw).t(),
            Parallelism::None,
        );
        if let Some(dx) = dx.as_deref_mut() {
            // dcol = Wᵀ · dy_n, scattered back onto the image.
            matmul(
                MatMut::row_major(&mut col, patch, ohw),
                false,
                MatRef::row_major(w, g.out_channels, patch).t(),
                dy_mat,
                Parallelism::None,
            );
            col2im(g, &col, &mut dx[i * in_len..(i + 1) * in_len]);
        }
    }
}

/// [`bwd_group`] on wide rows.
fn wide_bwd_group(
    g: &Conv2dGeom,
    bwd: &WideBwd,
    x: &[f32],
    dy: &[f32],
    images: std::ops::Range<usize>,
    partial: &mut [f32],
    mut dx: Option<&mut [f32]>,
) {
    let (in_len, out_len, ohw) = (g.in_image_len(), g.out_image_len(), g.out_h() * g.out_w());
    let (dw, db) = partial.split_at_mut(g.weight_len());
    let (mut scratch, mut padded) = (bwd.scratch(), Vec::new());
    for (i, n) in images.enumerate() {
        let dy_n = &dy[n * out_len..(n + 1) * out_len];
        add_bias_grad(db, dy_n, ohw);
        let dx_n = dx
            .as_deref_mut()
            .map(|dx| &mut dx[i * in_len..(i + 1) * in_len]);
        let x_n = bwd.layout().image(x, n * in_len, &mut padded);
        bwd.image(x_n, dy_n, &mut scratch, dx_n);
    }
    bwd.dw_into(&scratch, dw);
}

/// `db[o] += Σ dy_n[o][·]`, each plane of `ohw` summed by [`lane_sum`].
fn add_bias_grad(db: &mut [f32], dy_n: &[f32], ohw: usize) {
    for (acc, row) in db.iter_mut().zip(dy_n.chunks(ohw)) {
        *acc += lane_sum(row);
    }
}

/// The sum of `xs` in eight interleaved partial sums, added pairwise: it
/// vectorizes, where one running sum is a chain of dependent adds (the bias
/// gradient's sums took as long as the col2im scatter).
fn lane_sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let tail = chunks.remainder().iter().sum::<f32>();
    for chunk in chunks {
        acc.iter_mut().zip(chunk).for_each(|(a, v)| *a += v);
    }
    let [a, b, c, d, e, f, g, h] = acc;
    ((a + e) + (b + f)) + ((c + g) + (d + h)) + tail
}

/// The output columns `[lo, hi)` whose input column `ow·stride + kw − pad`
/// lies inside the image; all others read zero padding.
fn valid_cols(g: &Conv2dGeom, kw: usize) -> (usize, usize) {
    let (ow_n, s, p) = (g.out_w(), g.stride, g.padding);
    let lo = if kw >= p { 0 } else { (p - kw).div_ceil(s) };
    let hi = if g.in_w + p > kw {
        ((g.in_w + p - kw - 1) / s + 1).min(ow_n)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// The input row read by output row `oh` at kernel row `kh`, if inside.
fn input_row(g: &Conv2dGeom, oh: usize, kh: usize) -> Option<usize> {
    (oh * g.stride + kh)
        .checked_sub(g.padding)
        .filter(|&ih| ih < g.in_h)
}

/// Unfolds one image `[C, H, W]` into `col [C·K·K, OH·OW]`.
fn im2col(g: &Conv2dGeom, x: &[f32], col: &mut [f32]) {
    let (oh_n, ow_n, k) = (g.out_h(), g.out_w(), g.kernel);
    let mut rows = col.chunks_mut(oh_n * ow_n);
    for c in 0..g.in_channels {
        let plane = &x[c * g.in_h * g.in_w..(c + 1) * g.in_h * g.in_w];
        for kh in 0..k {
            for kw in 0..k {
                let row = rows.next().expect("col has C·K·K rows");
                let (lo, hi) = valid_cols(g, kw);
                for (oh, out) in row.chunks_mut(ow_n).enumerate() {
                    let Some(ih) = input_row(g, oh, kh) else {
                        out.fill(0.0);
                        continue;
                    };
                    let src = &plane[ih * g.in_w..(ih + 1) * g.in_w];
                    out[..lo].fill(0.0);
                    out[hi..].fill(0.0);
                    let first = lo * g.stride + kw - g.padding;
                    if g.stride == 1 {
                        out[lo..hi].copy_from_slice(&src[first..first + (hi - lo)]);
                    } else {
                        for (o, ow) in out[lo..hi].iter_mut().zip(lo..) {
                            *o = src[ow * g.stride + kw - g.padding];
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: sums `col` back onto the image `dx` (overwritten).
fn col2im(g: &Conv2dGeom, col: &[f32], dx: &mut [f32]) {
    dx.fill(0.0);
    let (oh_n, ow_n, k) = (g.out_h(), g.out_w(), g.kernel);
    let mut rows = col.chunks(oh_n * ow_n);
    for c in 0..g.in_channels {
        let plane = &mut dx[c * g.in_h * g.in_w..(c + 1) * g.in_h * g.in_w];
        for kh in 0..k {
            for kw in 0..k {
                let row = rows.next().expect("col has C·K·K rows");
                let (lo, hi) = valid_cols(g, kw);
                for (oh, src) in row.chunks(ow_n).enumerate() {
                    let Some(ih) = input_row(g, oh, kh) else {
                        continue;
                    };
                    let dst = &mut plane[ih * g.in_w..(ih + 1) * g.in_w];
                    if g.stride == 1 {
                        let first = lo + kw - g.padding;
                        let dst = &mut dst[first..first + (hi - lo)];
                        dst.iter_mut().zip(&src[lo..hi]).for_each(|(d, v)| *d += v);
                    } else {
                        for (ow, &v) in src.iter().enumerate().take(hi).skip(lo) {
                            dst[ow * g.stride + kw - g.padding] += v;
                        }
                    }
                }
            }
        }
    }
}
