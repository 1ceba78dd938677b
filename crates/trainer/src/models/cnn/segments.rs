//! The CNN as a chain of four segments, cut where its activations are
//! narrowest between layers:
//!
//! ```text
//! conv1 · relu | conv2 · max-pool · relu · dropout | fc1 · relu · dropout | fc2
//! ```
//!
//! The ReLU after conv2 runs after the pool, on a quarter of the values,
//! in the pool's epilogue with the dropout: max-pooling and ReLU commute
//! (both keep the largest value, or zero), and in backward the pool routes
//! each gradient to the window's first maximum of conv2's output, which is
//! that of its ReLU wherever the gradient survives the ReLU. So the bits
//! are the model's. The ReLU masks of backward read the post-dropout
//! activations: where dropout zeroed a unit its gradient is zero either
//! way, elsewhere the sign is unchanged.
//!
//! Where the device fuses (`Conv2dPoolKernel::fuses`: a GPU, unless
//! `--no-fusion`), conv1 and its ReLU are one op (`conv2d_relu_fwd`),
//! conv2 through the dropout another, which keeps the pooled values and an
//! argmax byte per window instead of conv2's output, and fc1 with its ReLU
//! and dropout a third (`linear_relu_fwd`, and backward `linear_relu_bwd`,
//! which masks the gradient in the bias gradient's pass); the bits are the
//! unfused kernels'.

use std::ops::Range;

use core_tensor::ops::{ClassGeom, Dropout, Epilogue};
use core_tensor::{Ops, Result};

use super::{CLASSES, CONV1, CONV2, CnnMnist, FC1, FC2, IMAGE_SIDE, conv, linear, pool};
use crate::model::layered::{Io, Layered, layer_at};
use crate::model::{DropoutSeed, Mode};

/// Segments, in order.
const SEGMENTS: usize = 4;

/// A segment's own buffers: conv2's output (unfused) or the pool's argmax
/// bytes (fused), and the output's gradient; the other segments keep
/// nothing of their own.
pub struct Inner<B: Ops> {
    a: Option<B::Storage<f32>>,
    argmax: Option<B::Storage<u8>>,
    da: Option<B::Storage<f32>>,
}

impl<B: Ops> Layered<B> for CnnMnist {
    type Acts = Inner<B>;
    /// A class.
    type Target = u8;

    fn segments(&self) -> usize {
        SEGMENTS
    }

    /// In the whole model's flat buffer: each segment's layer, weight then
    /// bias.
    fn segment_params(&self, s: usize) -> Range<usize> {
        let layer = ["conv1", "conv2", "fc1", "fc2"][s];
        let at = layer_at(super::cnn_layout(), layer);
        at.weight.start..at.bias.end
    }

    fn width(&self, cut: usize) -> usize {
        [
            IMAGE_SIDE * IMAGE_SIDE,
            CONV1.out_image_len(),
            FC1.in_features,
            FC1.out_features,
            CLASSES,
        ][cut]
    }

    fn target_width(&self) -> usize {
        1
    }

    fn within(&self, part: Range<usize>) -> Self {
        self.shifted(part)
    }

    fn acts(&self, b: &B, s: usize, batch: usize, train: bool) -> Result<Inner<B>> {
        let a2 = |_| b.zeros(batch * CONV2.out_image_len());
        let (conv2, fused) = (s == 1, b.fuses());
        Ok(Inner {
            a: (conv2 && !fused).then(|| a2(())).transpose()?,
            argmax: (conv2 && fused)
                .then(|| b.zeros(batch * FC1.in_features))
                .transpose()?,
            da: (conv2 && train).then(|| a2(())).transpose()?,
        })
    }

    fn forward_segment(
        &self,
        b: &B,
        (s, n): (usize, usize),
        x: &B::Storage<f32>,
        y: &mut B::Storage<f32>,
        acts: &mut Inner<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        let (pooled, hidden) = self.dropouts_in(mode);
        match s {
            0 => b.layer_relu_fwd(&conv(CONV1, n), Dropout::OFF, x, params, &self.conv1, y),
            1 => {
                let then = Epilogue::ReluDropout(pooled);
                match (&mut acts.argmax, &mut acts.a) {
                    (Some(arg), _) => {
                        b.conv2d_pool_fwd(&conv(CONV2, n), then, x, params, &self.conv2, y, arg)
                    }
                    (None, Some(a2)) => {
                        b.layer_fwd(&conv(CONV2, n), x, params, &self.conv2, a2)?;
                        b.maxpool2d_fwd(&pool(n), then, a2, y)
                    }
                    (None, None) => Err(missing("conv2's output or argmax")),
                }
            }
            2 => b.layer_relu_fwd(&linear(FC1, n), hidden, x, params, &self.fc1, y),
            _ => b.layer_fwd(&linear(FC2, n), x, params, &self.fc2, y),
        }
    }

    fn backward_segment(
        &self,
        b: &B,
        (s, n): (usize, usize),
        io: Io<'_, B>,
        acts: &mut Inner<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: DropoutSeed,
    ) -> Result<()> {
        let (pooled, hidden) = self.dropouts(dropout_seed);
        let Io { x, y, dy, dx } = io;
        match s {
            0 => {
                let g = conv(CONV1, n);
                b.layer_relu_bwd(
                    &g,
                    Dropout::OFF,
                    x,
                    params,
                    &self.conv1,
                    (y, dy),
                    grads,
                    None,
                )
            }
            1 => {
                let then = Epilogue::ReluDropout(pooled);
                let g = conv(CONV2, n);
                match (&acts.argmax, &acts.a, &mut acts.da) {
                    (Some(arg), _, Some(da2)) => {
                        let inputs = (x, params, &self.conv2);
                        b.conv2d_pool_bwd(&g, then, inputs, (arg, y, dy), da2, grads, dx)
                    }
                    (None, Some(a2), Some(da2)) => {
                        b.maxpool2d_bwd(&pool(n), then, a2, y, dy, da2)?;
                        b.layer_bwd(&g, x, params, &self.conv2, da2, grads, dx)
                    }
                    _ => Err(missing("conv2's output or argmax, and its gradient")),
                }
            }
            2 => {
                let g = linear(FC1, n);
                b.layer_relu_bwd(&g, hidden, x, params, &self.fc1, (y, dy), grads, dx)
            }
            _ => b.layer_bwd(&linear(FC2, n), x, params, &self.fc2, dy, grads, dx),
        }
    }

    /// The correct predictions.
    fn output_metric(
        &self,
        b: &B,
        batch: usize,
        (logits, labels): (&B::Storage<f32>, &B::Storage<u8>),
        correct: &mut B::Storage<f32>,
    ) -> Result<()> {
        b.count_correct(&classes(batch), logits, labels, correct)
    }

    /// The cross-entropy.
    fn output_loss(
        &self,
        b: &B,
        batch: usize,
        (logits, labels): (&B::Storage<f32>, &B::Storage<u8>),
        dlogits: &mut B::Storage<f32>,
        loss_sum: &mut B::Storage<f32>,
    ) -> Result<()> {
        b.cross_entropy_fwd_bwd(&classes(batch), logits, labels, dlogits, loss_sum)
    }
}

/// The classes of `batch` samples' logits.
fn classes(batch: usize) -> ClassGeom {
    ClassGeom {
        batch,
        classes: CLASSES,
    }
}

/// A segment's buffers built without what a pass needs.
fn missing(what: &str) -> core_tensor::Error {
    core_tensor::Error::InvalidArgument {
        op: "CNN segment",
        reason: format!("{what}: buffers built for evaluation, or for another segment"),
    }
}
