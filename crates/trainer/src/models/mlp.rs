//! Linear → ReLU → Linear with an MSE loss: the head of the recommender.

use anyhow::Context as _;
use core_tensor::ops::{Dropout, LinearGeom, MseGeom, ParamAt};
use core_tensor::{FlatLayout, Ops, Result};

use crate::model::GradsReady;

/// The two layers, `{fc1}.weight`/`.bias` and `{fc2}.…` of a layout.
#[derive(Clone, Debug)]
pub struct Mlp {
    fc1: ParamAt,
    fc2: ParamAt,
    /// `fc1`'s geometry at batch size 1; `fc2` maps its output to `outputs`.
    geom: LinearGeom,
    outputs: usize,
}

/// The MLP's activations for one batch, and their gradients when training.
#[derive(Debug)]
pub struct MlpBuffers<B: Ops> {
    batch: usize,
    hidden: B::Storage<f32>,
    pub out: B::Storage<f32>,
    /// `(dout, dhidden)`.
    grads: Option<(B::Storage<f32>, B::Storage<f32>)>,
}

impl<B: Ops> MlpBuffers<B> {
    /// The loss gradient at the output, once [`Mlp::mse`] has written it.
    pub fn dout(&self) -> Option<&B::Storage<f32>> {
        self.grads.as_ref().map(|(dout, _)| dout)
    }
}

impl Mlp {
    /// The layers named `fc1` and `fc2` in `layout` (their shapes give the
    /// sizes).
    pub fn new(layout: &FlatLayout, fc1: &str, fc2: &str) -> anyhow::Result<Self> {
        let at = |layer: &str| -> anyhow::Result<(ParamAt, Vec<usize>)> {
            let view = |part: &str| {
                let name = format!("{layer}.{part}");
                let v = layout.views().iter().find(|v| v.spec.name == name).cloned();
                v.with_context(|| format!("no {name} in the layout"))
            };
            let (w, b) = (view("weight")?, view("bias")?);
            Ok((
                ParamAt {
                    weight: w.range,
                    bias: b.range,
                },
                w.spec.shape,
            ))
        };
        let ((fc1, shape1), (fc2, shape2)) = (at(fc1)?, at(fc2)?);
        Ok(Self {
            fc1,
            fc2,
            geom: LinearGeom {
                batch: 1,
                in_features: shape1[1],
                out_features: shape1[0],
            },
            outputs: shape2[0],
        })
    }

    /// Where `fc2`'s bias lives.
    pub fn output_bias(&self) -> usize {
        self.fc2.bias.start
    }

    fn fc1(&self, batch: usize) -> LinearGeom {
        LinearGeom { batch, ..self.geom }
    }

    fn fc2(&self, batch: usize) -> LinearGeom {
        LinearGeom {
            batch,
            in_features: self.geom.out_features,
            out_features: self.outputs,
        }
    }

    fn mse_geom(&self, batch: usize) -> MseGeom {
        MseGeom {
            batch,
            features: self.outputs,
        }
    }

    pub fn buffers<B: Ops>(&self, b: &B, batch: usize, train: bool) -> Result<MlpBuffers<B>> {
        let (hidden, out) = (batch * self.geom.out_features, batch * self.outputs);
        let grads = train
            .then(|| Ok::<_, core_tensor::Error>((b.zeros(out)?, b.zeros(hidden)?)))
            .transpose()?;
        Ok(MlpBuffers {
            batch,
            hidden: b.zeros(hidden)?,
            out: b.zeros(out)?,
            grads,
        })
    }

    pub fn forward<B: Ops>(
        &self,
        b: &B,
        x: &B::Storage<f32>,
        params: &B::Storage<f32>,
        buf: &mut MlpBuffers<B>,
    ) -> Result<()> {
        let n = buf.batch;
        b.layer_fwd(&self.fc1(n), x, params, &self.fc1, &mut buf.hidden)?;
        b.relu_fwd(Dropout::OFF, &mut buf.hidden)?;
        b.layer_fwd(&self.fc2(n), &buf.hidden, params, &self.fc2, &mut buf.out)
    }

    /// Adds the batch's summed squared error (the mean over outputs per
    /// sample) to `sum`; training buffers also get the loss gradient.
    pub fn mse<B: Ops>(
        &self,
        b: &B,
        buf: &mut MlpBuffers<B>,
        target: &B::Storage<f32>,
        sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        let (dout, _) = buf
            .grads
            .as_mut()
            .context("the loss gradient needs buffers built for training")?;
        Ok(b.mse_fwd_bwd(&self.mse_geom(buf.batch), &buf.out, target, Some(dout), sum)?)
    }

    /// [`Self::mse`] without the gradient (evaluation, metrics).
    pub fn squared_error<B: Ops>(
        &self,
        b: &B,
        buf: &MlpBuffers<B>,
        target: &B::Storage<f32>,
        sum: &mut B::Storage<f32>,
    ) -> Result<()> {
        b.mse_fwd_bwd(&self.mse_geom(buf.batch), &buf.out, target, None, sum)
    }

    /// Back-propagates the loss gradient to `grads` (telling `hook` after
    /// each layer) and, given `dx`, to the input.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Ops>(
        &self,
        b: &B,
        x: &B::Storage<f32>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        buf: &mut MlpBuffers<B>,
        dx: Option<&mut B::Storage<f32>>,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let n = buf.batch;
        let (dout, dhidden) = buf
            .grads
            .as_mut()
            .context("backward needs buffers built for training")?;
        let fc2 = self.fc2(n);
        b.layer_bwd(
            &fc2,
            &buf.hidden,
            params,
            &self.fc2,
            dout,
            grads,
            Some(dhidden),
        )?;
        hook.ready(b, grads, self.fc2.weight.start)?;
        b.relu_bwd(Dropout::OFF, &buf.hidden, dhidden)?;
        b.layer_bwd(&self.fc1(n), x, params, &self.fc1, dhidden, grads, dx)?;
        hook.ready(b, grads, self.fc1.weight.start)
    }
}
