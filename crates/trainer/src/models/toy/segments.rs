//! The toy as a chain of two segments, cut where the DDP tutorial's
//! model-parallel example puts its two devices:
//!
//! ```text
//! net1 · relu | net2
//! ```
//!
//! The same kernels in the same order as one pass over the whole network,
//! so the same bits whichever stage runs a segment. Neither segment keeps
//! buffers of its own: net1's output (after its ReLU) is the cut.

use std::ops::Range;

use core_tensor::ops::{Dropout, LinearGeom, MseGeom, ParamAt};
use core_tensor::{Ops, Result};

use super::{HIDDEN, IN_FEATURES, LAYERS, OUT_FEATURES, ToyModel, toy_layout};
use crate::model::layered::{Io, Layered, layer_at};
use crate::model::{DropoutSeed, Mode};

impl<B: Ops> Layered<B> for ToyModel {
    type Acts = ();
    /// `OUT_FEATURES` values.
    type Target = f32;

    fn segments(&self) -> usize {
        LAYERS.len()
    }

    /// In the whole model's flat buffer: each segment's layer, weight then
    /// bias.
    fn segment_params(&self, s: usize) -> Range<usize> {
        let at = layer_at(toy_layout(), LAYERS[s].0);
        at.weight.start..at.bias.end
    }

    fn width(&self, cut: usize) -> usize {
        [IN_FEATURES, HIDDEN, OUT_FEATURES][cut]
    }

    fn target_width(&self) -> usize {
        OUT_FEATURES
    }

    fn within(&self, part: Range<usize>) -> Self {
        self.shifted(part)
    }

    fn acts(&self, _: &B, _: usize, _: usize, _: bool) -> Result<()> {
        Ok(())
    }

    fn forward_segment(
        &self,
        b: &B,
        (s, n): (usize, usize),
        x: &B::Storage<f32>,
        y: &mut B::Storage<f32>,
        _: &mut (),
        params: &B::Storage<f32>,
        _: Mode,
    ) -> Result<()> {
        let (geom, at) = self.layer(s, n);
        b.layer_fwd(&geom, x, params, at, y)?;
        match s {
            0 => b.relu_fwd(Dropout::OFF, y),
            _ => Ok(()),
        }
    }

    fn backward_segment(
        &self,
        b: &B,
        (s, n): (usize, usize),
        io: Io<'_, B>,
        _: &mut (),
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        _: DropoutSeed,
    ) -> Result<()> {
        let Io { x, y, dy, dx } = io;
        if s == 0 {
            b.relu_bwd(Dropout::OFF, y, dy)?;
        }
        let (geom, at) = self.layer(s, n);
        b.layer_bwd(&geom, x, params, at, dy, grads, dx)
    }

    /// None: the toy has no metric.
    fn output_metric(
        &self,
        _: &B,
        _: usize,
        _: (&B::Storage<f32>, &B::Storage<f32>),
        _: &mut B::Storage<f32>,
    ) -> Result<()> {
        Ok(())
    }

    /// The mean squared error (over a sample's outputs), summed over the
    /// batch.
    fn output_loss(
        &self,
        b: &B,
        batch: usize,
        (y, target): (&B::Storage<f32>, &B::Storage<f32>),
        dy: &mut B::Storage<f32>,
        loss_sum: &mut B::Storage<f32>,
    ) -> Result<()> {
        let geom = MseGeom {
            batch,
            features: OUT_FEATURES,
        };
        b.mse_fwd_bwd(&geom, y, target, Some(dy), loss_sum)
    }
}

impl ToyModel {
    /// Segment `s`'s layer over `batch` samples, and where its parameters
    /// live.
    fn layer(&self, s: usize, batch: usize) -> (LinearGeom, &ParamAt) {
        let (_, out_features, in_features) = LAYERS[s];
        let geom = LinearGeom {
            batch,
            in_features,
            out_features,
        };
        (geom, [&self.net1, &self.net2][s])
    }
}
