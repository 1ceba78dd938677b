//! `CNN_MNIST`, the network of the classic PyTorch example:
//!
//! ```text
//! conv1 1→32 3x3 · relu · conv2 32→64 3x3 · relu · maxpool 2x2 · dropout 0.25
//! · flatten · fc1 9216→128 · relu · dropout 0.5 · fc2 128→10
//! ```
//!
//! Parameters are one flat buffer laid out exactly as PyTorch's
//! `state_dict()` (names, shapes, order), so checkpoints map one to one.

use anyhow::Context as _;
use core_tensor::ops::{Conv2dGeom, LinearGeom, ParamAt, PoolGeom};
use core_tensor::{FlatLayout, Ops, ParamSpec, Result, rng};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Values in the flat parameter buffer.
pub const PARAM_COUNT: usize = 1_199_882;
/// Side of the square input image.
pub const IMAGE_SIDE: usize = 28;
pub const CLASSES: usize = 10;
const HIDDEN: usize = 128;
const POOLED: usize = 64 * 12 * 12;

/// Drop probabilities of the two dropout layers, `(after pool, after fc1)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutRates {
    pub pool: f32,
    pub hidden: f32,
}

impl DropoutRates {
    /// The rates of the reference model.
    pub const REFERENCE: Self = Self {
        pool: 0.25,
        hidden: 0.5,
    };
    /// No dropout: used to compare data-parallel runs element for element.
    pub const OFF: Self = Self {
        pool: 0.0,
        hidden: 0.0,
    };
}

/// Whether a forward pass trains (dropout on, seeded per step) or evaluates.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Train { dropout_seed: u64 },
    Eval,
}

/// The network's structure: where each layer's parameters live.
#[derive(Clone, Debug)]
pub struct CnnMnist {
    layout: FlatLayout,
    conv1: ParamAt,
    conv2: ParamAt,
    fc1: ParamAt,
    fc2: ParamAt,
    dropout: DropoutRates,
}

/// Receives, during backward, the news that every gradient from `offset` to
/// the end of the flat buffer is final: the hook for overlapping gradient
/// communication with the rest of the backward pass. The hook may rewrite
/// those final gradients (an in-place all-reduce does); backward only writes
/// below `offset` afterwards.
pub trait GradsReady<B: Ops> {
    fn ready(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        offset: usize,
    ) -> anyhow::Result<()>;
}

impl CnnMnist {
    pub fn new(dropout: DropoutRates) -> Self {
        let specs = vec![
            ParamSpec::new("conv1.weight", &[32, 1, 3, 3]),
            ParamSpec::new("conv1.bias", &[32]),
            ParamSpec::new("conv2.weight", &[64, 32, 3, 3]),
            ParamSpec::new("conv2.bias", &[64]),
            ParamSpec::new("fc1.weight", &[HIDDEN, POOLED]),
            ParamSpec::new("fc1.bias", &[HIDDEN]),
            ParamSpec::new("fc2.weight", &[CLASSES, HIDDEN]),
            ParamSpec::new("fc2.bias", &[CLASSES]),
        ];
        let layout = FlatLayout::new(specs).expect("parameter names are distinct");
        let at = |layer: &str| ParamAt {
            weight: layout
                .range(&format!("{layer}.weight"))
                .expect("declared above"),
            bias: layout
                .range(&format!("{layer}.bias"))
                .expect("declared above"),
        };
        Self {
            conv1: at("conv1"),
            conv2: at("conv2"),
            fc1: at("fc1"),
            fc2: at("fc2"),
            layout,
            dropout,
        }
    }

    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    pub fn dropout(&self) -> DropoutRates {
        self.dropout
    }

    /// Fresh parameters from PyTorch's default distributions: for both
    /// `Conv2d` and `Linear`, weights (kaiming-uniform with a = √5) and biases
    /// are uniform in ±1/√fan_in. Deterministic in `seed`.
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut params = vec![0.0; self.layout.len()];
        for (layer, fan_in) in [
            (&self.conv1, 9),
            (&self.conv2, 32 * 9),
            (&self.fc1, POOLED),
            (&self.fc2, HIDDEN),
        ] {
            let bound = 1.0 / (fan_in as f32).sqrt();
            for range in [layer.weight.clone(), layer.bias.clone()] {
                params[range]
                    .iter_mut()
                    .for_each(|p| *p = rng.random_range(-bound..bound));
            }
        }
        params
    }

    fn conv1_geom(batch: usize) -> Conv2dGeom {
        Conv2dGeom {
            batch,
            in_channels: 1,
            in_h: 28,
            in_w: 28,
            out_channels: 32,
            kernel: 3,
            stride: 1,
            padding: 0,
        }
    }
    fn conv2_geom(batch: usize) -> Conv2dGeom {
        Conv2dGeom {
            batch,
            in_channels: 32,
            in_h: 26,
            in_w: 26,
            out_channels: 64,
            kernel: 3,
            stride: 1,
            padding: 0,
        }
    }
    fn pool_geom(batch: usize) -> PoolGeom {
        PoolGeom {
            batch,
            channels: 64,
            in_h: 24,
            in_w: 24,
        }
    }
    fn fc1_geom(batch: usize) -> LinearGeom {
        LinearGeom {
            batch,
            in_features: POOLED,
            out_features: HIDDEN,
        }
    }
    fn fc2_geom(batch: usize) -> LinearGeom {
        LinearGeom {
            batch,
            in_features: HIDDEN,
            out_features: CLASSES,
        }
    }

    /// The two dropout layers' seeds for one step: independent streams.
    fn dropout_seeds(seed: u64) -> (u64, u64) {
        (rng::derive_seed(seed, &[1]), rng::derive_seed(seed, &[2]))
    }

    /// Runs the network on `act.x`, leaving the logits in `act.logits` and
    /// every activation backward needs in `act`.
    pub fn forward<B: Ops>(
        &self,
        b: &B,
        act: &mut Activations<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        let n = act.batch;
        b.conv2d_fwd(
            &Self::conv1_geom(n),
            &act.x,
            params,
            &self.conv1,
            &mut act.a1,
        )?;
        b.relu_fwd(&mut act.a1)?;
        b.conv2d_fwd(
            &Self::conv2_geom(n),
            &act.a1,
            params,
            &self.conv2,
            &mut act.a2,
        )?;
        b.relu_fwd(&mut act.a2)?;
        b.maxpool2d_fwd(&Self::pool_geom(n), &act.a2, &mut act.pooled)?;
        if let Mode::Train { dropout_seed } = mode {
            let (s1, _) = Self::dropout_seeds(dropout_seed);
            b.dropout_fwd(self.dropout.pool, s1, &mut act.pooled)?;
        }
        b.linear_fwd(
            &Self::fc1_geom(n),
            &act.pooled,
            params,
            &self.fc1,
            &mut act.hidden,
        )?;
        b.relu_fwd(&mut act.hidden)?;
        if let Mode::Train { dropout_seed } = mode {
            let (_, s2) = Self::dropout_seeds(dropout_seed);
            b.dropout_fwd(self.dropout.hidden, s2, &mut act.hidden)?;
        }
        b.linear_fwd(
            &Self::fc2_geom(n),
            &act.hidden,
            params,
            &self.fc2,
            &mut act.logits,
        )
    }

    /// Back-propagates `act.dlogits` (set by the loss), writing every
    /// parameter gradient into `grads` and telling `hook` as soon as each
    /// layer's gradients are final (last layer first).
    ///
    /// The ReLU masks read the post-dropout activations: where dropout zeroed
    /// a unit its gradient is already zero, elsewhere the sign is unchanged.
    pub fn backward<B: Ops>(
        &self,
        b: &B,
        act: &mut Activations<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: u64,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let n = act.batch;
        let (s1, s2) = Self::dropout_seeds(dropout_seed);
        let g = act
            .grads
            .as_mut()
            .context("backward needs activations built with gradients")?;
        b.linear_bwd(
            &Self::fc2_geom(n),
            &act.hidden,
            params,
            &self.fc2,
            &g.dlogits,
            grads,
            Some(&mut g.dhidden),
        )?;
        hook.ready(b, grads, self.fc2.weight.start)?;
        b.dropout_bwd(self.dropout.hidden, s2, &mut g.dhidden)?;
        b.relu_bwd(&act.hidden, &mut g.dhidden)?;
        b.linear_bwd(
            &Self::fc1_geom(n),
            &act.pooled,
            params,
            &self.fc1,
            &g.dhidden,
            grads,
            Some(&mut g.dpooled),
        )?;
        hook.ready(b, grads, self.fc1.weight.start)?;
        b.dropout_bwd(self.dropout.pool, s1, &mut g.dpooled)?;
        b.maxpool2d_bwd(&Self::pool_geom(n), &act.a2, &g.dpooled, &mut g.da2)?;
        b.relu_bwd(&act.a2, &mut g.da2)?;
        b.conv2d_bwd(
            &Self::conv2_geom(n),
            &act.a1,
            params,
            &self.conv2,
            &g.da2,
            grads,
            Some(&mut g.da1),
        )?;
        hook.ready(b, grads, self.conv2.weight.start)?;
        b.relu_bwd(&act.a1, &mut g.da1)?;
        b.conv2d_bwd(
            &Self::conv1_geom(n),
            &act.x,
            params,
            &self.conv1,
            &g.da1,
            grads,
            None,
        )?;
        hook.ready(b, grads, self.conv1.weight.start)
    }
}

/// Every buffer one forward/backward pass over `batch` images needs,
/// allocated once and reused step after step.
#[derive(Debug)]
pub struct Activations<B: Ops> {
    pub batch: usize,
    pub x: B::Storage<f32>,
    pub labels: B::Storage<u8>,
    a1: B::Storage<f32>,
    a2: B::Storage<f32>,
    pooled: B::Storage<f32>,
    hidden: B::Storage<f32>,
    pub logits: B::Storage<f32>,
    /// What backward needs; `None` for evaluation, which allocates none of
    /// it (a GPU cannot allocate an empty buffer anyway).
    pub grads: Option<ActivationGrads<B>>,
}

/// The gradient of every activation, for backward.
#[derive(Debug)]
pub struct ActivationGrads<B: Ops> {
    /// Written by the loss, read by [`CnnMnist::backward`].
    pub dlogits: B::Storage<f32>,
    dhidden: B::Storage<f32>,
    dpooled: B::Storage<f32>,
    da2: B::Storage<f32>,
    da1: B::Storage<f32>,
}

impl<B: Ops> Activations<B> {
    /// Buffers for `batch` images; `with_grads` false allocates only what
    /// evaluation needs.
    pub fn new(b: &B, batch: usize, with_grads: bool) -> Result<Self> {
        let (a1, a2) = (batch * 32 * 26 * 26, batch * 64 * 24 * 24);
        let grads = with_grads
            .then(|| -> Result<_> {
                Ok(ActivationGrads {
                    dlogits: b.zeros(batch * CLASSES)?,
                    dhidden: b.zeros(batch * HIDDEN)?,
                    dpooled: b.zeros(batch * POOLED)?,
                    da2: b.zeros(a2)?,
                    da1: b.zeros(a1)?,
                })
            })
            .transpose()?;
        Ok(Self {
            batch,
            x: b.zeros(batch * IMAGE_SIDE * IMAGE_SIDE)?,
            labels: b.zeros(batch)?,
            a1: b.zeros(a1)?,
            a2: b.zeros(a2)?,
            pooled: b.zeros(batch * POOLED)?,
            hidden: b.zeros(batch * HIDDEN)?,
            logits: b.zeros(batch * CLASSES)?,
            grads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_named_and_shaped_like_pytorchs_state_dict() {
        let model = CnnMnist::new(DropoutRates::REFERENCE);
        let got: Vec<(String, Vec<usize>)> = model
            .layout()
            .views()
            .iter()
            .map(|v| (v.spec.name.clone(), v.spec.shape.clone()))
            .collect();
        let want = [
            ("conv1.weight", vec![32, 1, 3, 3]),
            ("conv1.bias", vec![32]),
            ("conv2.weight", vec![64, 32, 3, 3]),
            ("conv2.bias", vec![64]),
            ("fc1.weight", vec![128, 9216]),
            ("fc1.bias", vec![128]),
            ("fc2.weight", vec![10, 128]),
            ("fc2.bias", vec![10]),
        ];
        assert_eq!(got, want.map(|(n, s)| (n.to_string(), s)));
        assert_eq!(model.layout().len(), PARAM_COUNT);
    }

    #[test]
    fn init_is_uniform_within_pytorchs_bounds_and_seeded() {
        let model = CnnMnist::new(DropoutRates::REFERENCE);
        let params = model.init_params(0);
        assert_eq!(params, model.init_params(0));
        assert_ne!(params, model.init_params(1));
        for (name, fan_in) in [
            ("conv1", 9.0f32),
            ("conv2", 288.0),
            ("fc1", 9216.0),
            ("fc2", 128.0),
        ] {
            let bound = 1.0 / fan_in.sqrt();
            for part in ["weight", "bias"] {
                let values = &params[model.layout().range(&format!("{name}.{part}")).unwrap()];
                let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert!(max < bound, "{name}.{part}: max |w| {max}, bound {bound}");
                // Thousands of weights per layer: their largest must come close.
                if part == "weight" {
                    assert!(
                        max > 0.9 * bound,
                        "{name}.weight spans only ±{max} of ±{bound}"
                    );
                }
            }
        }
    }
}
