//! How a replica comes to be, beyond the backend, data and configuration.

use core_tensor::Ops;

use crate::checkpoint::Checkpoints;
use crate::checkpoint::origin::Origin;
use crate::comm_thread::CommThread;
use crate::ddp::CommHook;
use crate::stop::StopRequest;

/// How a replica comes to be, beyond the backend, data and configuration.
pub struct Setup<B: Ops> {
    /// The host communicator (metrics, the starting state, and gradients
    /// unless `device_hook` averages them); `None` for one rank.
    pub comm: Option<CommThread>,
    /// Rank 0's starting point (ignored on other ranks, which receive it).
    pub origin: Origin,
    /// Averages gradients on the device (NCCL) instead of through `comm`
    /// (or `group`).
    pub device_hook: Option<Box<dyn CommHook<B>>>,
    /// For a model split between ranks ([`Model::partition`](crate::model::Model::partition): a pipeline
    /// stage), the communicator over the ranks training the same part (the
    /// stage's data-parallel group), which averages its gradients unless
    /// `device_hook` does; `None` with one rank per part (nothing to
    /// average).
    pub group: Option<CommThread>,
    /// Checkpoints (on every rank: mid-epoch ones are collective).
    pub checkpoints: Option<Checkpoints>,
    /// Checked once per step.
    pub stop: StopRequest,
    /// The data this rank trains on; `None`: its own shard, as one of
    /// `world_size` replicas.
    pub share: Option<DataShare>,
    /// The flags every rank must give alike, as `(flag, value)`
    /// ([`Cli::shared_flags`](crate::cli::Cli::shared_flags)), checked
    /// against rank 0's before anything else travels: the one check that
    /// ranks agree on the seed, batch size and the rest. Empty (as
    /// [`Setup::fresh`] leaves it), nothing is checked: for ranks built in
    /// one program from one [`TrainConfig`](super::TrainConfig).
    pub shared_flags: Vec<(&'static str, String)>,
}

/// Which shard of the data a rank trains on, and whether it counts the
/// samples in the epoch's numbers: the stages of one pipeline train on
/// the same samples, and only the last stage (which has the loss) counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataShare {
    pub replica: usize,
    pub replicas: usize,
    pub counts: bool,
}

impl<B: Ops> Setup<B> {
    /// A fresh start over `comm`, averaging through it.
    pub fn fresh(comm: Option<CommThread>) -> Self {
        Self {
            comm,
            origin: Origin::Fresh,
            device_hook: None,
            group: None,
            checkpoints: None,
            stop: StopRequest::new(),
            share: None,
            shared_flags: Vec::new(),
        }
    }
}
