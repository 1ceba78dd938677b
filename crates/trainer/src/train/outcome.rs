//! What the loop tells: each epoch's numbers, how a run ended, and the
//! progress of an epoch as it goes.

use std::path::PathBuf;

use crate::checkpoint::Position;
use crate::model::Metric;
use crate::monitor::{RankStats, Straggler};

/// One epoch's numbers, already reduced over all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    pub epoch: usize,
    pub epochs: usize,
    /// Mean training loss per sample.
    pub loss: f64,
    /// What `accuracy` and `test_accuracy` hold: the model's metric
    /// (`NaN` both for [`Metric::None`]).
    pub metric: Metric,
    pub accuracy: f64,
    pub test_accuracy: f64,
    /// Seconds spent training (evaluation excluded).
    pub train_seconds: f64,
    pub steps: usize,
    pub images: u64,
    /// Optimizer steps since training began, at the end of this epoch.
    pub global_step: u64,
    /// Every rank's resource use and where its time went (device time: the
    /// work itself on a CPU, CUDA events on a GPU), in rank order.
    pub ranks: Vec<RankStats>,
    /// The rank far behind the others doing the same work, if one is.
    pub straggler: Option<Straggler>,
}

impl EpochReport {
    /// Training images per second, all ranks together.
    pub fn images_per_second(&self) -> f64 {
        self.images as f64 / self.train_seconds
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// Every epoch trained.
    Completed,
    /// All ranks stopped at `at` on a preemption request; rank 0 saved the
    /// checkpoint `saved` there (`None`: no checkpoint directory, or another
    /// rank).
    Preempted {
        at: Position,
        saved: Option<PathBuf>,
    },
    /// This rank stopped at `at` on an interrupt, saving nothing.
    Interrupted { at: Position },
    /// A generation of a live job (`--recovery live`) ended after the
    /// step committed at `at`: its members form the next one.
    Regroup { at: Position, why: Regroup },
}

/// Why a generation of a live job ended before its training did.
#[derive(Clone, Debug, PartialEq)]
pub enum Regroup {
    /// A peer was lost, as `error` says; `silent`: the rank that stopped
    /// answering, when that is how.
    PeerLost {
        error: String,
        silent: Option<usize>,
    },
    /// Newcomers wait: the ranks agreed to let them in after this step.
    Newcomers,
}

impl Regroup {
    /// The regroup that `e`, a rank's error, calls for: a lost or silent
    /// peer, or a ring broken by it, or an NCCL communicator its watchdog
    /// aborted for one (a peer's failure, or a collective past the
    /// timeout, whose silent peer NCCL does not name); `None` for any other
    /// error (a misconfiguration, a bad file, a non-finite loss), which no
    /// new generation would mend.
    pub fn after(e: &anyhow::Error) -> Option<Regroup> {
        use comm::CommError;
        let comm = e.chain().find_map(|c| c.downcast_ref::<CommError>())?;
        let silent = match comm {
            CommError::PeerTimeout { peer, .. } => Some(*peer),
            CommError::PeerLost { .. }
            | CommError::Broken(_)
            | CommError::NcclPeerLost { .. }
            | CommError::NcclTimeout { .. } => None,
            _ => return None,
        };
        Some(Regroup::PeerLost {
            error: format!("{e:#}"),
            silent,
        })
    }
}

/// Per-step progress, for a progress bar.
pub trait Progress {
    /// An epoch of `steps` steps begins, at step `done` (a resumed run
    /// starts part-way through; 0 otherwise).
    fn start_epoch(&mut self, epoch: usize, steps: usize, done: usize);
    fn step(&mut self);
    fn finish_epoch(&mut self);
    /// Every how many optimizer steps [`Progress::running`] wants this
    /// rank's running numbers (`None`: never). Backends outside host memory
    /// skip them: reading would wait for the device.
    fn running_every(&self) -> Option<u64> {
        None
    }
    fn running(&mut self, _numbers: &Running) {}
}

/// This rank's numbers since its epoch began, mid-epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Running {
    /// Optimizer steps since training began (over all epochs).
    pub global_step: u64,
    /// Mean loss per sample and accuracy of this rank's samples so far.
    pub loss: f64,
    pub accuracy: f64,
    /// Images this epoch so far, all ranks together (assuming equal shards).
    pub images: u64,
    /// The epoch's training seconds when `images` was counted (a resumed
    /// run's seconds before it included, checkpoint pauses not): the rate
    /// is `images / train_seconds`, as in the epoch line.
    pub train_seconds: f64,
}

/// No progress display (other ranks, non-terminal output, tests).
pub struct Silent;
impl Progress for Silent {
    fn start_epoch(&mut self, _: usize, _: usize, _: usize) {}
    fn step(&mut self) {}
    fn finish_epoch(&mut self) {}
}
