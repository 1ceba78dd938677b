//! A rank's training run from its start-up line to its last report, with
//! rank 0's metrics file, TensorBoard events and progress display.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use core_tensor::Ops;

use launcher::contract::hostname;

use super::RankJob;
use crate::model::Model;
use crate::monitor::Monitor;
use crate::phases::Phase;
use crate::report::announce::{Ending, report_outcome};
use crate::report::metrics::{MetricsFile, epoch_line};
use crate::report::progress::Console;
use crate::report::recovery::RecoveryEvent;
use crate::report::sample_ledger::SampleLedger;
use crate::report::tensorboard::EventWriter;
use crate::topology::Topology;
use crate::train::{Progress, RunOutcome, Silent, Trainer};

/// Trains `trainer` to the end, with rank 0's start-up line, metrics,
/// TensorBoard and progress display, and reports how it ended.
/// `recovered`: the live recovery this generation began with, if it did.
pub(super) fn train_and_report<B: Ops, M: Model<B>>(
    trainer: &mut Trainer<B, M>,
    (topology, job): (&Topology, &RankJob<'_>),
    (device, resumed, recovered): (String, bool, Option<RecoveryEvent>),
    monitor: Monitor,
) -> anyhow::Result<RunOutcome> {
    let (lead, world, epochs) = (topology.leads(), topology.world, trainer.epochs());
    let outputs = job.outputs;
    trainer.watch(monitor);
    if lead {
        tell!("training on {device}, {}", job.about);
        if trainer.first_epoch() > epochs {
            tell!(
                "note: the checkpoint is past epoch {epochs}: nothing left to train (raise --epochs to go on)"
            );
        }
    }
    let mut metrics = match (&outputs.metrics, lead) {
        // A resumed run adds to the rows of the epochs before it.
        (Some(path), true) if resumed => Some(MetricsFile::append_to(path, world, device)?),
        (Some(path), true) => Some(MetricsFile::create(path, world, device)?),
        _ => None,
    };
    let board = match (&outputs.tensorboard, lead) {
        (Some(dir), true) => Some(Rc::new(RefCell::new(
            EventWriter::create(dir, &hostname()).context("rank 0: --tensorboard")?,
        ))),
        _ => None,
    };
    if let (Some(event), true) = (&recovered, lead) {
        tell!("{}", event.line());
        if let Some(m) = &mut metrics {
            m.event(event)?;
        }
        if let Some(board) = &board {
            let at = event.after_global_step;
            let values = [
                ("recovery/seconds", event.seconds),
                ("recovery/world_size", event.world_size as f64),
            ];
            board.borrow_mut().scalars(at, &values)?;
        }
    }
    if let (Some(path), true) = (&outputs.sample_ledger, lead) {
        let ledger = SampleLedger::open(path, trainer.global_step())?;
        trainer.record_samples(Box::new(ledger));
    }
    let mut progress: Box<dyn Progress> = if lead {
        let line_every = Duration::from_secs_f64(outputs.progress_seconds);
        Box::new(Console::new(outputs.log_every, line_every, board.clone()))
    } else {
        Box::new(Silent)
    };
    // A pipeline stage's time in the schedule, and its part waiting for
    // the others: each epoch's phases of this rank.
    let mut schedule = [0.0f64; 2];
    let outcome = trainer.run(progress.as_mut(), &mut |report| {
        if let Some(mine) = report.ranks.get(topology.rank) {
            let phase = |p| mine.phases.get(p);
            schedule[0] += phase(Phase::Forward) + phase(Phase::Backward);
            schedule[0] += phase(Phase::PipelineWait);
            schedule[1] += phase(Phase::PipelineWait);
        }
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
    if topology.stages > 1 {
        let [total, waiting] = schedule;
        tell!(
            "pipeline stage {} (rank {}): idle {:.1}% of {total:.1} s in the schedule (waiting for the other stages)",
            topology.stage(),
            topology.rank,
            100.0 * waiting / total.max(f64::MIN_POSITIVE)
        );
    }
    let end = Ending {
        rank: topology.rank,
        world,
        epochs,
        saves: job.checkpoints.checkpoint_dir.is_some(),
        pytorch_class: job.pytorch_class,
    };
    report_outcome(&outcome, &end, trainer.last_checkpoint());
    Ok(outcome)
}
