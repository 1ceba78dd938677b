//! `ToyModel`, the network of PyTorch's DDP tutorial, on synthetic data:
//!
//! ```text
//! net1 Linear 10→10 · relu · net2 Linear 10→5, MSE loss, plain SGD
//! ```
//!
//! Parameters are one flat buffer laid out as PyTorch's `state_dict()`
//! (`net1.weight`, `net1.bias`, `net2.weight`, `net2.bias`).

mod data;

use std::sync::LazyLock;

use anyhow::Context as _;
use core_tensor::ops::{LinearGeom, MseGeom, ParamAt};
use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

pub use data::ToyData;

use super::{GradsReady, Metric, Mode, Model, Optimizer, pytorch_default_init};

pub const IN_FEATURES: usize = 10;
pub const HIDDEN: usize = 10;
pub const OUT_FEATURES: usize = 5;

const NET1: LinearGeom = LinearGeom {
    batch: 1,
    in_features: IN_FEATURES,
    out_features: HIDDEN,
};
const NET2: LinearGeom = LinearGeom {
    batch: 1,
    in_features: HIDDEN,
    out_features: OUT_FEATURES,
};

/// The two layers' `state_dict` layout, built once per process.
pub fn toy_layout() -> &'static FlatLayout {
    static LAYOUT: LazyLock<FlatLayout> = LazyLock::new(|| {
        let mut specs = Vec::new();
        for (name, g) in [("net1", NET1), ("net2", NET2)] {
            specs.push(ParamSpec::new(
                &format!("{name}.weight"),
                &[g.out_features, g.in_features],
            ));
            specs.push(ParamSpec::new(&format!("{name}.bias"), &[g.out_features]));
        }
        FlatLayout::new(specs).expect("parameter names are distinct")
    });
    &LAYOUT
}

/// The network: where each layer's parameters live.
#[derive(Clone, Debug)]
pub struct ToyModel {
    net1: ParamAt,
    net2: ParamAt,
}

impl Default for ToyModel {
    fn default() -> Self {
        let at = |layer: &str| {
            let range = |part: &str| {
                toy_layout()
                    .range(&format!("{layer}.{part}"))
                    .expect("declared in toy_layout")
            };
            ParamAt {
                weight: range("weight"),
                bias: range("bias"),
            }
        };
        Self {
            net1: at("net1"),
            net2: at("net2"),
        }
    }
}

/// Every buffer one pass over `batch` samples needs.
#[derive(Debug)]
pub struct ToyBuffers<B: Ops> {
    pub batch: usize,
    /// Filled by [`ToyData`]: `batch` rows of inputs and of targets.
    pub x: B::Storage<f32>,
    pub target: B::Storage<f32>,
    hidden: B::Storage<f32>,
    out: B::Storage<f32>,
    /// `(dout, dhidden)`, for training only.
    grads: Option<(B::Storage<f32>, B::Storage<f32>)>,
}

fn linear(geom: LinearGeom, batch: usize) -> LinearGeom {
    LinearGeom { batch, ..geom }
}

impl<B: Ops> Model<B> for ToyModel {
    type Buffers = ToyBuffers<B>;

    fn kind(&self) -> &'static str {
        "toy"
    }

    fn metric(&self) -> Metric {
        Metric::None
    }

    fn optimizer(&self) -> Optimizer {
        Optimizer::Sgd
    }

    fn layout(&self) -> &FlatLayout {
        toy_layout()
    }

    fn init_params(&self, seed: u64) -> Vec<f32> {
        let tensors = [NET1, NET2].map(|g| {
            [
                (g.out_features * g.in_features, g.in_features),
                (g.out_features, g.in_features),
            ]
        });
        pytorch_default_init(seed, tensors.as_flattened())
    }

    fn buffers(&self, b: &B, batch: usize, train: bool) -> Result<ToyBuffers<B>> {
        let (hidden, out) = (batch * HIDDEN, batch * OUT_FEATURES);
        let grads = train
            .then(|| Ok::<_, core_tensor::Error>((b.zeros(out)?, b.zeros(hidden)?)))
            .transpose()?;
        Ok(ToyBuffers {
            batch,
            x: b.zeros(batch * IN_FEATURES)?,
            target: b.zeros(out)?,
            hidden: b.zeros(hidden)?,
            out: b.zeros(out)?,
            grads,
        })
    }

    fn forward(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        params: &B::Storage<f32>,
        _: Mode,
    ) -> Result<()> {
        let n = buf.batch;
        b.linear_fwd(
            &linear(NET1, n),
            &buf.x,
            params,
            &self.net1,
            &mut buf.hidden,
        )?;
        b.relu_fwd(&mut buf.hidden)?;
        b.linear_fwd(
            &linear(NET2, n),
            &buf.hidden,
            params,
            &self.net2,
            &mut buf.out,
        )
    }

    fn metric_sum(&self, _: &B, _: &ToyBuffers<B>, _: &mut B::Storage<f32>) -> Result<()> {
        Ok(())
    }

    fn loss(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        let geom = MseGeom {
            batch: buf.batch,
            features: OUT_FEATURES,
        };
        let (dout, _) = buf
            .grads
            .as_mut()
            .context("the loss gradient needs buffers built for training")?;
        Ok(b.mse_fwd_bwd(&geom, &buf.out, &buf.target, Some(dout), loss_sum)?)
    }

    fn backward(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        _: u64,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let n = buf.batch;
        let (dout, dhidden) = buf
            .grads
            .as_mut()
            .context("backward needs buffers built for training")?;
        let net2 = linear(NET2, n);
        b.linear_bwd(
            &net2,
            &buf.hidden,
            params,
            &self.net2,
            dout,
            grads,
            Some(dhidden),
        )?;
        hook.ready(b, grads, self.net2.weight.start)?;
        b.relu_bwd(&buf.hidden, dhidden)?;
        b.linear_bwd(
            &linear(NET1, n),
            &buf.x,
            params,
            &self.net1,
            dhidden,
            grads,
            None,
        )?;
        hook.ready(b, grads, self.net1.weight.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_named_and_shaped_like_pytorchs_state_dict() {
        let got: Vec<(String, Vec<usize>)> = toy_layout()
            .views()
            .iter()
            .map(|v| (v.spec.name.clone(), v.spec.shape.clone()))
            .collect();
        let want = [
            ("net1.weight", vec![10, 10]),
            ("net1.bias", vec![10]),
            ("net2.weight", vec![5, 10]),
            ("net2.bias", vec![5]),
        ];
        assert_eq!(got, want.map(|(n, s)| (n.to_string(), s)));
        let params = <ToyModel as Model<core_tensor::Cpu>>::init_params(&ToyModel::default(), 3);
        assert_eq!(params.len(), 165);
        let bound = 1.0 / 10f32.sqrt();
        assert!(params.iter().all(|p| p.abs() <= bound));
    }
}
