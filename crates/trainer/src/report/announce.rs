//! What rank 0 says about the run as a whole: who started the ranks, and
//! how the run ended (with the saved model and how to load it).

use std::path::Path;

use comm::{LaunchEnv, LaunchSource};

use crate::checkpoint::MODEL_FILE;
use crate::train::RunOutcome;

/// What the last line says of the run besides how it ended.
pub struct Ending {
    pub rank: usize,
    pub world: usize,
    pub epochs: usize,
    /// Whether it saves checkpoints (`--checkpoint-dir`).
    pub saves: bool,
    /// What PyTorch calls the model's module.
    pub pytorch_class: &'static str,
}

/// Who started the ranks, for the start line.
pub fn started_by(launch: Option<&LaunchEnv>) -> &'static str {
    match launch.map(|env| (env.source, env.agent.is_some())) {
        None => "a single process",
        // The built-in launcher describes the job as torchrun does; it is
        // told apart by being this very binary.
        Some(_) if parent_is_this_binary() => "ranks started by the built-in launcher",
        Some((LaunchSource::Torchrun, true)) => "ranks started by torchrun",
        Some((LaunchSource::Torchrun, false)) => "ranks started by a torchrun-style environment",
        Some((LaunchSource::Slurm, _)) => "ranks started by SLURM",
        Some((LaunchSource::Mpi, _)) => "ranks started by MPI (mpirun)",
    }
}

fn parent_is_this_binary() -> bool {
    let parent = std::os::unix::process::parent_id();
    let parent_exe = std::fs::read_link(format!("/proc/{parent}/exe"));
    matches!((parent_exe, std::env::current_exe()), (Ok(a), Ok(b)) if a == b)
}

/// The run's last line: rank 0's for a finished or preempted run (every
/// rank stopped at the same step), every rank's for an interrupt. Stops are
/// reported on stderr, beside the errors a job's log is searched for.
pub fn report_outcome(outcome: &RunOutcome, end: &Ending, saved: Option<&Path>) {
    let line = match outcome {
        RunOutcome::Completed if end.rank == 0 => {
            say!("{}", finished(end, saved));
            return;
        }
        RunOutcome::Preempted { at, saved } if end.rank == 0 => match saved {
            Some(dir) => format!(
                "preempted at epoch {} step {}; checkpoint {}; resume with --resume auto",
                at.epoch,
                at.step,
                dir.display()
            ),
            None => format!(
                "preempted at epoch {} step {}; nothing was saved (no --checkpoint-dir)",
                at.epoch, at.step
            ),
        },
        RunOutcome::Interrupted { at } => format!(
            "rank {}: interrupted at epoch {} step {}; nothing saved",
            end.rank, at.epoch, at.step
        ),
        _ => return,
    };
    tell!("{line}");
}

/// A finished run's last lines: the saved model, and how PyTorch loads it.
fn finished(end: &Ending, saved: Option<&Path>) -> String {
    let done = format!(
        "training finished: {} epoch(s), world size {}",
        end.epochs, end.world
    );
    match saved.map(|dir| dir.join(MODEL_FILE)) {
        None if end.saves => {
            format!("{done}; no checkpoint written: nothing was left to train")
        }
        None => format!("{done}; no model saved (--checkpoint-dir DIR keeps it)"),
        Some(model) => format!(
            "{done}; model saved in {0}\n\
             load it into PyTorch's {1} `model`:\n  \
             from safetensors.torch import load_file\n  \
             model.load_state_dict(load_file({0:?}))",
            model.display().to_string(),
            end.pytorch_class
        ),
    }
}
