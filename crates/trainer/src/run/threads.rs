//! `--spawn threads`: the ranks of one machine as threads of this process
//! (PyTorch's DataParallel in spirit), through the same per-rank code as
//! worker processes. The data set is read once and shared read-only; the
//! ranks meet in memory ([`LocalCommunicator`], bitwise the TCP ring's
//! results), so there is no port, no store and no child process.
//!
//! Signals: the process's handlers feed one [`StopRequest`] that every
//! rank checks, and the ranks agree on the stop step as processes do. A
//! rank that fails drops its communicator, so the others fail at their
//! next collective instead of waiting for the timeout.

use anyhow::{Context, anyhow, bail};
use comm::LocalCommunicator;
use launcher::NodePlan;
use launcher::contract::RunEnd;

use super::device::{choose_device, expects_gpu};
use super::{JobComm, JobFlags, Process, memory_fit, run_end};
use crate::stop::{StopRequest, install_worker_handlers};
use crate::topology::Topology;

/// Who started the ranks, for the start-up line.
pub(crate) const THREADS: &str = "ranks run as threads of one process";

/// Runs the `plan.nproc` ranks of a one-machine job as threads and returns
/// how they ended; an error names every rank that failed.
pub fn run(job: &JobFlags, plan: &NodePlan, max_restarts: u32) -> anyhow::Result<RunEnd> {
    if plan.nnodes > 1 {
        bail!(
            "--spawn threads runs the ranks of one machine; a job of {} machines needs --spawn processes",
            plan.nnodes
        );
    }
    if max_restarts > 0 {
        bail!(
            "--max-restarts restarts worker processes; with --spawn threads restart the whole run with --resume auto"
        );
    }
    let stop = StopRequest::new();
    install_worker_handlers(&stop)?;
    let world = plan.nproc;
    let stages = job.pipeline.pipeline_stages as usize;
    let machine = |rank| Topology::new((rank, world), (rank, world), stages);
    let first = machine(0)?;
    let data = job.model.model.entry().load(&job.model)?;
    // The machine's memory once, for all its ranks: its message is said
    // once, and no thread starts for a table it cannot hold.
    let gpu = expects_gpu(&job.device);
    memory_fit::check_host(data.as_ref(), job, &first, gpu)?;
    let process = Process {
        job,
        data: data.as_ref(),
        started_by: THREADS,
        flight_dir: job.flight_dir(std::process::id()),
    };
    let comms = LocalCommunicator::job(world, job.join.timeout());
    let ends: Vec<anyhow::Result<RunEnd>> = std::thread::scope(|scope| {
        let ranks: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (process, stop) = (&process, stop.clone());
                std::thread::Builder::new()
                    .name(format!("rank{rank}"))
                    .spawn_scoped(scope, move || {
                        let me = machine(rank)?;
                        let device = choose_device(&job.device, &me)?;
                        // A GPU that failed to open: this rank's replica
                        // is in the machine's memory after all.
                        if device.is_gpu() != gpu {
                            memory_fit::check_host(process.data, job, &me, device.is_gpu())?;
                        }
                        memory_fit::check_device(process.data, &me, &device)?;
                        let comm = (world > 1).then_some(JobComm::Local(comm));
                        let outcome = process.run_rank(me, device, comm, stop, None)?;
                        Ok(run_end(&outcome))
                    })
                    .with_context(|| format!("starting the thread of rank {rank}"))
            })
            .collect();
        ranks
            .into_iter()
            .enumerate()
            .map(|(rank, thread)| {
                thread?
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("rank {rank} panicked")))
            })
            .collect()
    });
    combine(ends)
}

/// One ending for the job: every failure is printed (the first one found
/// is often a peer noticing the real one), then the job fails; otherwise a
/// preemption or signal of any rank stands for all.
fn combine(ends: Vec<anyhow::Result<RunEnd>>) -> anyhow::Result<RunEnd> {
    let world = ends.len();
    let mut errors = Vec::new();
    let mut end = RunEnd::Finished;
    for result in ends {
        match result {
            Ok(RunEnd::Finished) => {}
            Ok(other) => end = other,
            Err(e) => errors.push(e),
        }
    }
    for line in error_lines(&errors) {
        tell!("{line}");
    }
    if !errors.is_empty() {
        bail!(
            "{} of {world} rank threads failed (their errors are above)",
            errors.len()
        );
    }
    Ok(end)
}

/// A line per distinct message, in the order first met: a check of the
/// whole machine fails alike on every rank.
fn error_lines(errors: &[anyhow::Error]) -> Vec<String> {
    let mut said: Vec<(String, usize)> = Vec::new();
    for e in errors {
        let text = format!("{e:#}");
        match said.iter_mut().find(|(s, _)| *s == text) {
            Some((_, ranks)) => *ranks += 1,
            None => said.push((text, 1)),
        }
    }
    said.into_iter()
        .map(|(text, ranks)| match ranks {
            1 => format!("error: {text}"),
            n => format!("error: {text} ({n} ranks alike)"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_failure_on_several_ranks_is_said_once() {
        let errors = [
            anyhow!("the table does not fit"),
            anyhow!("rank 3: lost rank 0"),
            anyhow!("the table does not fit"),
        ];
        assert_eq!(
            error_lines(&errors),
            [
                "error: the table does not fit (2 ranks alike)",
                "error: rank 3: lost rank 0"
            ]
        );
        let ends = errors.into_iter().map(Err).collect();
        let err = combine(ends).unwrap_err().to_string();
        assert_eq!(err, "3 of 3 rank threads failed (their errors are above)");
    }
}
