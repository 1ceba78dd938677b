//! The models the trainer can train, as plug-ins above the training loop:
//! each a folder (its network, a [`crate::model::Model`]; its data set; its
//! entry) and one line in [`MODELS`]. An entry says what `--model NAME`
//! takes and reads, and trains a rank once the rank has its device and its
//! links (`entry.rs` in each folder).

pub mod cnn;
mod flags;
mod mlp;
pub mod recsys;
pub mod toy;

use anyhow::Result;
use core_tensor::{Cpu, Cuda, Ops};

pub use flags::{ModelFlags, ModelKind};

use crate::model::DropoutRates;
use crate::rank::Rank;
use crate::train::RunOutcome;

/// Every model `--model` names; the first is the default.
pub static MODELS: [&dyn ModelEntry; 3] = [&cnn::ENTRY, &toy::ENTRY, &recsys::ENTRY];

/// What `--model NAME` is.
pub trait ModelEntry: Sync {
    /// Its `--model` name, recorded in its checkpoints.
    fn name(&self) -> &'static str;

    /// One line for `--help`.
    fn about(&self) -> &'static str;

    /// What PyTorch calls the module its checkpoints load into.
    fn pytorch_class(&self) -> &'static str;

    /// Its own flags (its group in [`ModelFlags`]) that were given.
    fn own_flags_given(&self, flags: &ModelFlags) -> Vec<&'static str>;

    /// The flags of other groups that mean something for this model only
    /// (a capability it has), which `--help` does not tie to it.
    fn takes(&self) -> &'static [&'static str] {
        &[]
    }

    /// Stages a pipeline may cut it into (1: it cannot be cut).
    fn max_stages(&self) -> usize {
        1
    }

    /// The dropout rates its flags set (recorded in checkpoints).
    fn dropout(&self, _flags: &ModelFlags) -> DropoutRates {
        DropoutRates::REFERENCE
    }

    /// Its rules between its own flags.
    fn check(&self, _flags: &ModelFlags) -> Result<()> {
        Ok(())
    }

    /// Reads its data set, once per process (rank threads share it).
    fn load(&self, flags: &ModelFlags) -> Result<Box<dyn Loaded>>;
}

/// Who holds which model-sized buffers in one machine's memory, for a
/// model whose parameters may not fit (`recsys::table` counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The ranks train on GPUs, which hold their replicas; else the CPU.
    pub gpu: bool,
    /// The ranks on this machine.
    pub local_ranks: usize,
    /// Gradients are averaged through host memory.
    pub host_exchange: bool,
    /// Rank 0 is on this machine and saves checkpoints.
    pub saves: bool,
    /// Rank 0 is on this machine and resumes from a checkpoint.
    pub loads: bool,
}

/// A GPU's memory as its driver reports it, and the ranks of this machine
/// that train on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuRoom {
    /// Names the GPU in the message, e.g. `cuda:0 (NVIDIA H100 80GB HBM3)`.
    pub name: String,
    pub free: u64,
    pub total: u64,
    pub ranks: usize,
}

/// A model's data set, loaded: what the ranks of a process train on.
pub trait ModelData: Send + Sync {
    /// For the start-up line.
    fn describe(&self, seed: u64) -> String;

    /// Refuses a model this machine's memory cannot hold, its ranks
    /// together, before anything model-sized is made.
    fn check_host(&self, _footprint: &Footprint, _room: Option<u64>) -> Result<()> {
        Ok(())
    }

    /// Refuses a model a GPU's memory cannot hold.
    fn check_gpu(&self, _gpu: &GpuRoom) -> Result<()> {
        Ok(())
    }

    /// Trains `rank` on this data, with a network of its own.
    fn train<B: Ops>(&self, rank: Rank<'_, B>) -> Result<RunOutcome>;
}

/// [`ModelData`] for each device this build has, as one object.
pub trait Loaded: Send + Sync {
    fn describe(&self, seed: u64) -> String;
    fn check_host(&self, footprint: &Footprint, room: Option<u64>) -> Result<()>;
    fn check_gpu(&self, gpu: &GpuRoom) -> Result<()>;
    fn on_cpu(&self, rank: Rank<'_, Cpu>) -> Result<RunOutcome>;
    fn on_cuda(&self, rank: Rank<'_, Cuda>) -> Result<RunOutcome>;
}

impl<T: ModelData> Loaded for T {
    fn describe(&self, seed: u64) -> String {
        ModelData::describe(self, seed)
    }

    fn check_host(&self, footprint: &Footprint, room: Option<u64>) -> Result<()> {
        ModelData::check_host(self, footprint, room)
    }

    fn check_gpu(&self, gpu: &GpuRoom) -> Result<()> {
        ModelData::check_gpu(self, gpu)
    }

    fn on_cpu(&self, rank: Rank<'_, Cpu>) -> Result<RunOutcome> {
        self.train(rank)
    }

    fn on_cuda(&self, rank: Rank<'_, Cuda>) -> Result<RunOutcome> {
        self.train(rank)
    }
}
