//! `ToyModel`, the network of PyTorch's DDP tutorial, on synthetic data:
//!
//! ```text
//! net1 Linear 10→10 · relu · net2 Linear 10→5, MSE loss, plain SGD
//! ```
//!
//! Parameters are one flat buffer laid out as PyTorch's `state_dict()`
//! (`net1.weight`, `net1.bias`, `net2.weight`, `net2.bias`).

mod data;
mod entry;

use std::sync::LazyLock;

use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

pub use data::ToyData;
pub use entry::{ENTRY, NAME, ToyFlags};

use super::mlp::{Mlp, MlpBuffers};
use crate::model::{DropoutSeed, GradsReady, Metric, Mode, Model, Optimizer, pytorch_default_init};

pub const IN_FEATURES: usize = 10;
pub const HIDDEN: usize = 10;
pub const OUT_FEATURES: usize = 5;

/// `(name, out_features, in_features)` of the two layers.
const LAYERS: [(&str, usize, usize); 2] = [
    ("net1", HIDDEN, IN_FEATURES),
    ("net2", OUT_FEATURES, HIDDEN),
];

/// The two layers' `state_dict` layout, built once per process.
pub fn toy_layout() -> &'static FlatLayout {
    static LAYOUT: LazyLock<FlatLayout> = LazyLock::new(|| {
        let mut specs = Vec::new();
        for (name, out, inp) in LAYERS {
            specs.push(ParamSpec::new(format!("{name}.weight"), &[out, inp]));
            specs.push(ParamSpec::new(format!("{name}.bias"), &[out]));
        }
        FlatLayout::new(specs).expect("parameter names are distinct")
    });
    &LAYOUT
}

/// The network.
#[derive(Clone, Debug)]
pub struct ToyModel {
    mlp: Mlp,
}

impl Default for ToyModel {
    fn default() -> Self {
        Self {
            mlp: Mlp::new(toy_layout(), "net1", "net2").expect("declared in toy_layout"),
        }
    }
}

/// Every buffer one pass over `batch` samples needs.
#[derive(Debug)]
pub struct ToyBuffers<B: Ops> {
    /// Filled by [`ToyData`]: `batch` rows of inputs and of targets.
    pub x: B::Storage<f32>,
    pub target: B::Storage<f32>,
    mlp: MlpBuffers<B>,
}

impl<B: Ops> Model<B> for ToyModel {
    type Buffers = ToyBuffers<B>;

    fn kind(&self) -> &'static str {
        NAME
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
        let tensors = LAYERS.map(|(_, out, inp)| [(out * inp, inp), (out, inp)]);
        pytorch_default_init(seed, tensors.as_flattened())
    }

    fn buffers(&self, b: &B, batch: usize, train: bool) -> Result<ToyBuffers<B>> {
        Ok(ToyBuffers {
            x: b.zeros(batch * IN_FEATURES)?,
            target: b.zeros(batch * OUT_FEATURES)?,
            mlp: self.mlp.buffers(b, batch, train)?,
        })
    }

    fn forward(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        params: &B::Storage<f32>,
        _: Mode,
    ) -> Result<()> {
        self.mlp.forward(b, &buf.x, params, &mut buf.mlp)
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
        self.mlp.mse(b, &mut buf.mlp, &buf.target, loss_sum)
    }

    fn backward(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        _: DropoutSeed,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        self.mlp
            .backward(b, &buf.x, params, grads, &mut buf.mlp, None, hook)
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
