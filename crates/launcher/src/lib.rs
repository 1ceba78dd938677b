//! The launcher: torchrun's elastic agent in small. It starts this
//! machine's workers (N copies of a program) with torchrun-style variables,
//! prefixes their output with the rank, meets the other machines' launchers
//! in a store node 0's launcher hosts, and when a worker fails stops the
//! others and fails too; with `--max-restarts N` it restarts them all
//! instead, up to N times, with the arguments the program's [`Restarts`]
//! gives (the launcher knows no checkpoints: the program does).
//!
//! Signals to the launcher (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) go on
//! to every worker, which get `--grace` seconds to stop (saving a checkpoint
//! on SIGTERM/SIGUSR1) before they are killed; a signal never restarts
//! them. The workers run in a process group of their own (a terminal's
//! Ctrl-C reaches the launcher alone, which passes it on once) and die with
//! the launcher, even when it is SIGKILLed. What a worker's exit code
//! means to the launcher is [`contract`]. SIGUSR2 only asks the workers for
//! their flight records; after a failed attempt node 0's launcher gathers
//! them and says its [`verdict`] on who held the job up.
//!
//! It depends on `comm` (the store, the auth token, the launch variables)
//! and on no training code.

#[macro_use]
pub mod say;
#[macro_use]
mod error;

mod agent;
mod args;
mod attempt;
pub mod contract;
pub mod flags;
mod flight;
mod group;
mod heartbeat;
mod plan;
mod spec;
mod supervise;
pub mod verdict;
mod workers;

pub use agent::launch;
pub use args::without_flag;
pub use error::{LaunchError, Refusal};
pub use flags::{LaunchFlags, RdzvBackend, RdzvFlags};
pub use plan::NodePlan;
pub use spec::{OnFailure, Restarts, WorkerSpec};
