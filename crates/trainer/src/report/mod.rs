//! What rank 0 shows and writes about a run: the start and last lines
//! (`announce.rs`), the epoch line and the metrics file (`metrics.rs`),
//! TensorBoard events (`tensorboard.rs`), the progress display
//! (`progress.rs`), the samples each step trained (`sample_ledger.rs`), a
//! live recovery (`recovery.rs`),
//! `trainer plot`'s curves (`plot.rs`), and `trainer
//! flight-report`'s verdict on a job's flight records (`flight_report.rs`).

pub mod announce;
pub mod flight_report;
pub mod metrics;
pub mod plot;
pub mod progress;
pub mod recovery;
pub mod sample_ledger;
pub mod tensorboard;

use std::path::PathBuf;

use clap::Args;
use launcher::flags::seconds;

/// Where and how often rank 0 reports.
#[derive(Clone, Debug, Args)]
pub struct OutputFlags {
    /// Write one JSON line per epoch to this file (rank 0 only).
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,

    /// Write TensorBoard event files into this directory (rank 0 only).
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,

    /// Rank 0's running loss and accuracy every N steps.
    ///
    /// To the progress display and TensorBoard (CPU training; on a GPU, once
    /// per epoch).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_every: u64,

    /// Write the job's samples of each step to this JSONL file (rank 0 only).
    ///
    /// One line a step: its global step, epoch and step, the samples first
    /// seen in the epoch and the padding. A resumed run keeps the lines up
    /// to its checkpoint, so the file shows whether each sample was trained
    /// once (the CNN and toy models; not recsys, whose ratings stream in
    /// chunks).
    #[arg(long, value_name = "PATH")]
    pub sample_ledger: Option<PathBuf>,

    /// Seconds between progress lines when stderr is not a terminal.
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = seconds)]
    pub progress_seconds: f64,
}
