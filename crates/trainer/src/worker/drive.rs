//! A rank's training run from its start-up line to its last report, with
//! rank 0's metrics file, TensorBoard events and progress display.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use core_tensor::Ops;

use launcher::contract::hostname;

use super::Job;
use crate::announce::report_outcome;
use crate::metrics::{MetricsFile, epoch_line};
use crate::model::Model;
use crate::monitor::Monitor;
use crate::progress::Console;
use crate::tensorboard::EventWriter;
use crate::train::{Progress, RunOutcome, Silent, Trainer};

/// Trains `trainer` to the end, with rank 0's start-up line, metrics,
/// TensorBoard and progress display, and reports how it ended.
pub(super) fn drive<B: Ops, M: Model<B>>(
    trainer: &mut Trainer<B, M>,
    job: &Job<'_>,
    device: String,
    resumed: bool,
    monitor: Monitor,
) -> anyhow::Result<RunOutcome> {
    let Job {
        cli,
        info,
        data,
        gradients,
        ..
    } = *job;
    let lead = info.rank == 0;
    trainer.watch(monitor);
    if lead {
        tell!(
            "training on {device}, world size {} ({}){gradients}, {}",
            info.world_size,
            job.started_by,
            data.describe(cli.seed)
        );
        if trainer.first_epoch() > cli.epochs as usize {
            tell!(
                "note: the checkpoint is past epoch {}: nothing left to train (raise --epochs to go on)",
                cli.epochs
            );
        }
    }
    let mut metrics = match (&cli.metrics, lead) {
        // A resumed run adds to the rows of the epochs before it.
        (Some(path), true) if resumed => {
            Some(MetricsFile::append_to(path, info.world_size, device)?)
        }
        (Some(path), true) => Some(MetricsFile::create(path, info.world_size, device)?),
        _ => None,
    };
    let board = match (&cli.tensorboard, lead) {
        (Some(dir), true) => Some(Rc::new(RefCell::new(
            EventWriter::create(dir, &hostname()).context("rank 0: --tensorboard")?,
        ))),
        _ => None,
    };
    let mut progress: Box<dyn Progress> = if lead {
        let line_every = Duration::from_secs_f64(cli.progress_seconds);
        Box::new(Console::new(cli.log_every, line_every, board.clone()))
    } else {
        Box::new(Silent)
    };
    let outcome = trainer.run(progress.as_mut(), &mut |report| {
        if lead {
            say!("{}", epoch_line(report));
            if let Some(s) = report.straggler {
                tell!(
                    "note: rank {} is {:.0}% behind the median rank (its steps' time, waiting for gradients excluded)",
                    s.rank,
                    100.0 * (s.ratio - 1.0)
                );
            }
            if let Some(m) = &mut metrics {
                m.append(report)?;
            }
            if let Some(board) = &board {
                board.borrow_mut().epoch(report)?;
            }
        }
        Ok(())
    })?;
    report_outcome(&outcome, info, cli, trainer.last_checkpoint());
    Ok(outcome)
}
