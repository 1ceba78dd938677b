//! The trainer: one binary that is either a worker (one rank of a job) or,
//! asked for several ranks or restarts with no launcher around, the launcher
//! of its own workers. See `ARCHITECTURE.md` for the map.

#[macro_use]
extern crate launcher;

pub mod bounded_read;
pub mod checkpoint;
pub mod cli;
pub mod comm_thread;
pub mod data;
pub mod ddp;
pub mod model;
pub mod models;
pub mod monitor;
pub mod output_paths;
pub mod phases;
pub mod pipeline;
pub mod rank;
pub mod report;
pub mod run;
pub mod stop;
pub mod topology;
pub mod train;

use anyhow::bail;
use comm::LaunchEnv;
use launcher::contract::RunEnd;
use launcher::{NodePlan, WorkerSpec};

use crate::checkpoint::restarts::CheckpointRestarts;
use crate::cli::{Cli, Spawn};
use crate::topology::Topology;

/// Runs what the flags and the environment ask for.
pub fn run(cli: Cli) -> anyhow::Result<RunEnd> {
    cli.validate()?;
    let env = LaunchEnv::from_process_env()?;
    let job = &cli.job;
    // Rank 0 (or the launcher) alone writes checkpoints and metrics.
    if env.as_ref().is_none_or(|env| env.rank == 0) {
        let outputs = (&job.checkpoints.checkpoint_dir, &job.outputs.metrics);
        output_paths::prepare(outputs.0.as_deref(), outputs.1.as_deref())?;
    }
    let plan = NodePlan::resolve(&cli.launch, cli.world_size, env.as_ref())?;
    if let Some(plan) = &plan {
        // Once here, rather than by every worker it would start.
        let stages = job.pipeline.pipeline_stages as usize;
        Topology::new((0, plan.world_size()), (0, plan.nproc), stages)?;
    }
    let max_restarts = cli.launch.max_restarts;
    match plan {
        Some(plan) if cli.spawn == Spawn::Threads => run::threads::run(job, &plan, max_restarts),
        Some(plan) => launch(&cli, &plan),
        None => match env {
            Some(env) => {
                if max_restarts > 0 {
                    bail!(
                        "--max-restarts is for this binary's own launcher; under torchrun or srun, restart there (torchrun --max-restarts, srun --requeue) with --resume auto"
                    );
                }
                if cli.spawn == Spawn::Threads {
                    bail!(
                        "--spawn threads is for this binary's own launcher; under torchrun, srun or mpirun every rank is a process"
                    );
                }
                run::run(job, Some(&env))
            }
            None => run::run(job, None),
        },
    }
}

/// This machine's launcher: its workers are this program, restarted from
/// the newest checkpoint in `--checkpoint-dir`.
fn launch(cli: &Cli, plan: &NodePlan) -> anyhow::Result<RunEnd> {
    let (join, checkpoints) = (&cli.job.join, &cli.job.checkpoints);
    let spec =
        WorkerSpec::of_this_process(&cli.launch, join.timeout(), join.auth_token_file.clone())?;
    let restarts = CheckpointRestarts::new(
        checkpoints.checkpoint_dir.as_deref(),
        checkpoints.keep,
        checkpoints.resume.clone(),
    );
    if spec.max_restarts > 0 {
        restarts.preflight()?;
    }
    Ok(launcher::launch(&spec, plan, &restarts)?)
}
