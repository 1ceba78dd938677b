//! The optimizers a replica steps with, chosen once at setup: the model's
//! Adam or SGD over the whole buffer ([`dense`]), or for `--sparse-adam`
//! Adam over the dense parameters and SparseAdam's lazy step over the rows
//! of the model's row tables a step moved ([`lazy`]). Each runs behind the
//! finiteness guard, which it fills itself with what it reads.

mod dense;
mod lazy;

use anyhow::bail;
use core_tensor::Ops;

use super::TrainConfig;
use super::replica::Replica;
use crate::ddp::Averaging;
use crate::model::{Model, Optimizer as Kind};

/// The rows of the model's row tables a step moved: every replica's (the
/// union the sparse exchange formed), or with one replica this rank's.
pub struct StepRows<'a, B: Ops> {
    pub ids: Option<&'a [u32]>,
    /// The same ids on the device, where the sparse exchange left them.
    pub on_device: Option<&'a B::Storage<u32>>,
}

/// One optimizer's update.
pub trait Optimizer<B: Ops> {
    /// Updates `replica` (its step count already counts this update)
    /// behind the finiteness guard, which first reads `loss` (the epoch's
    /// running sum: non-finite from the first bad step on) and every
    /// gradient the update reads.
    fn step(
        &mut self,
        b: &B,
        replica: &mut Replica<B>,
        loss: &B::Storage<f32>,
        rows: StepRows<'_, B>,
    ) -> anyhow::Result<()>;
}

/// The optimizer of `model` as `cfg` asks, over `averaging` among
/// `replicas`.
pub fn choose<B: Ops, M: Model<B>>(
    model: &M,
    cfg: &TrainConfig,
    averaging: &Averaging<B>,
    replicas: usize,
) -> anyhow::Result<Box<dyn Optimizer<B>>> {
    if cfg.sparse_adam {
        return Ok(Box::new(lazy::LazyAdam::plan(
            model, cfg, averaging, replicas,
        )?));
    }
    Ok(match model.optimizer() {
        Kind::Adam => Box::new(dense::Adam(cfg.adam)),
        Kind::Sgd => Box::new(dense::Sgd(cfg.adam.lr as f32)),
    })
}

/// The error of a lazy optimizer without rows to update.
fn no_rows() -> anyhow::Error {
    anyhow::anyhow!("--sparse-adam: the model names no rows of its table")
}

/// Refuses a model that cannot step lazily.
fn refuse_kind(kind: Kind, model: &str) -> anyhow::Result<()> {
    match kind {
        Kind::Adam => Ok(()),
        Kind::Sgd => bail!("--sparse-adam updates with Adam; --model {model} trains with SGD"),
    }
}
