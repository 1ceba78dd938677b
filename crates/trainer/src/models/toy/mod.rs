//! `ToyModel`, the network of PyTorch's DDP tutorial, on synthetic data:
//!
//! ```text
//! net1 Linear 10→10 · relu | net2 Linear 10→5, MSE loss, plain SGD
//! ```
//!
//! Parameters are one flat buffer laid out as PyTorch's `state_dict()`
//! (`net1.weight`, `net1.bias`, `net2.weight`, `net2.bias`). The network
//! is a chain of two segments (`segments.rs`), cut where the tutorial's
//! model-parallel example puts its two devices, which a pipeline may split
//! between two stages; the whole model runs them in turn.

mod data;
mod entry;
mod segments;

use std::ops::Range;
use std::sync::LazyLock;

use core_tensor::ops::ParamAt;
use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

pub use data::ToyData;
pub use entry::{ENTRY, NAME, ToyFlags};

use crate::model::layered::{self, Chain};
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

/// The network: where each layer's parameters live.
#[derive(Clone, Debug)]
pub struct ToyModel {
    net1: ParamAt,
    net2: ParamAt,
}

impl Default for ToyModel {
    fn default() -> Self {
        Self {
            net1: layered::layer_at(toy_layout(), "net1"),
            net2: layered::layer_at(toy_layout(), "net2"),
        }
    }
}

impl ToyModel {
    /// The network over a buffer holding only `part` of the parameters
    /// (see [`layered::param_within`]).
    fn shifted(&self, part: Range<usize>) -> Self {
        Self {
            net1: layered::param_within(&self.net1, &part),
            net2: layered::param_within(&self.net2, &part),
        }
    }
}

/// Every buffer one pass over `batch` samples needs: the inputs, the
/// hidden layer, the outputs, and the targets [`ToyData`] fills.
pub type ToyBuffers<B> = Chain<B, (), f32>;

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
        Chain::new(self, b, batch, train)
    }

    fn forward(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        layered::forward(self, b, buf, params, mode)
    }

    fn metric_sum(&self, b: &B, buf: &ToyBuffers<B>, sum: &mut B::Storage<f32>) -> Result<()> {
        layered::metric_sum(self, b, buf, sum)
    }

    fn loss(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        layered::loss(self, b, buf, loss_sum)
    }

    fn backward(
        &self,
        b: &B,
        buf: &mut ToyBuffers<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: DropoutSeed,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        layered::backward(self, b, buf, (params, grads), dropout_seed, hook)
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
