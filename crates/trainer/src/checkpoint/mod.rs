//! Checkpoints: the training state on disk, and how a run continues from it.
//!
//! A checkpoint is one directory, `ckpt-eEEEE-sSSSSSS`, named by its
//! [`Position`]: epoch `E` (from 1) with `S` of its steps done; the end of
//! epoch 2 is `ckpt-e0003-s000000`. Positions order checkpoints, so "the
//! newest valid checkpoint" is the one with the largest position whose files
//! pass every check. The directory holds two safetensors files:
//!
//! * `model.safetensors`: the parameters under PyTorch's `state_dict` names
//!   and shapes, f32, so `model.load_state_dict(load_file(path))` works;
//! * `state.safetensors`: Adam's moments (`exp_avg.<name>`,
//!   `exp_avg_sq.<name>`), each rank's partial epoch metrics, and in
//!   `__metadata__` the position, the optimizer step, the settings that must
//!   match to continue (the training data's fingerprint among them), and
//!   the model file's checksum;
//! * with `--comm-hook powersgd`, once it has compressed a step,
//!   `powersgd.safetensors`: its `Q`s and every rank's error feedback
//!   ([`HookState`]).
//!
//! Each carries a SHA-256 of its contents in `__metadata__` (see
//! [`digest`]). A directory appears under its final name only once complete
//! and synced ([`store`]), so a kill never damages an earlier checkpoint.

pub mod digest;
mod files;
mod flags;
mod hook_state;
pub mod lock;
pub mod origin;
pub mod restarts;
pub mod resume;
pub mod shared_record;
mod state;
pub mod store;
mod summation;

use std::fmt;

pub use files::load_weights;
pub use flags::CheckpointFlags;
pub use hook_state::{HOOK_FILE, HookState};
pub use state::{MODEL_FILE, STATE_FILE, Settings, TrainingState, load};
pub use store::CheckpointDir;
pub use summation::Summation;

/// Where training stands: in epoch `epoch` (from 1), `step` steps done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub epoch: u64,
    pub step: u64,
}

impl Position {
    /// Before the first step of the run.
    pub const START: Self = Self { epoch: 1, step: 0 };

    /// The directory name of a checkpoint taken here.
    pub fn dir_name(self) -> String {
        format!("ckpt-e{:04}-s{:06}", self.epoch, self.step)
    }

    /// The position a checkpoint directory's name states, if it is one.
    pub fn from_dir_name(name: &str) -> Option<Self> {
        let (epoch, step) = name.strip_prefix("ckpt-e")?.split_once("-s")?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(epoch) || !digits(step) {
            return None;
        }
        Some(Self {
            epoch: epoch.parse().ok()?,
            step: step.parse().ok()?,
        })
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.step == 0 {
            write!(f, "start of epoch {}", self.epoch)
        } else {
            write!(f, "epoch {}, step {}", self.epoch, self.step)
        }
    }
}

/// What rank 0 writes, and when; every rank holds one, since a mid-epoch
/// checkpoint gathers all ranks' partial metrics.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    pub dir: CheckpointDir,
    /// Also checkpoint whenever the optimizer step count is a multiple of this.
    pub every: Option<u64>,
    /// What each records of the flags the job's ranks share
    /// ([`Settings::shared`]); `None` for ranks built in one program.
    pub record: Option<shared_record::SharedRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_by_position() {
        let p = Position {
            epoch: 3,
            step: 120,
        };
        assert_eq!(p.dir_name(), "ckpt-e0003-s000120");
        assert_eq!(Position::from_dir_name(&p.dir_name()), Some(p));
        // Wider numbers than the padding still parse and compare numerically.
        assert_eq!(
            Position::from_dir_name("ckpt-e12345-s1234567"),
            Some(Position {
                epoch: 12345,
                step: 1_234_567
            })
        );
        assert!(
            Position {
                epoch: 2,
                step: 900
            } < Position { epoch: 3, step: 0 }
        );
        for bad in [
            "ckpt-e0003",
            ".tmp-ckpt-e0001-s000002",
            "ckpt-e0001-s00000x",
            "ckpt-e-s1",
            "ckpt-e+1-s2",
        ] {
            assert_eq!(Position::from_dir_name(bad), None, "{bad}");
        }
    }
}
