//! The trainer: one binary that is either a worker (one rank of a job) or,
//! asked for several ranks or restarts with no launcher around, the launcher
//! of its own workers. See `ARCHITECTURE.md` for the map.

#[macro_use]
mod say;

pub mod announce;
pub mod bounded_read;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod ddp;
pub mod launcher;
pub mod metrics;
pub mod model;
pub mod monitor;
pub mod output_paths;
pub mod pipeline;
pub mod plot;
pub mod progress;
pub mod stop;
pub mod tensorboard;
pub mod train;
pub mod worker;

use anyhow::bail;
use comm::LaunchEnv;

use crate::cli::Cli;
use crate::stop::RunEnd;

/// Runs what the flags and the environment ask for.
pub fn run(cli: Cli) -> anyhow::Result<RunEnd> {
    cli.validate()?;
    let env = LaunchEnv::from_process_env()?;
    // Rank 0 (or the launcher) alone writes checkpoints and metrics.
    if env.as_ref().is_none_or(|env| env.rank == 0) {
        output_paths::prepare(&cli)?;
    }
    let plan = launcher::NodePlan::resolve(&cli, env.as_ref())?;
    if let Some(plan) = &plan
        && cli.pipeline_stages > 1
    {
        // Once here, rather than by every worker it would start.
        pipeline::PipelinePlace::of(0, plan.world_size(), cli.pipeline_stages as usize)?;
    }
    match plan {
        Some(plan) if cli.spawn == cli::Spawn::Threads => worker::threads::run(&cli, &plan),
        Some(plan) => launcher::launch(&cli, &plan),
        None => match env {
            Some(env) => {
                if cli.max_restarts > 0 {
                    bail!(
                        "--max-restarts is for this binary's own launcher; under torchrun or srun, restart there (torchrun --max-restarts, srun --requeue) with --resume auto"
                    );
                }
                if cli.spawn == cli::Spawn::Threads {
                    bail!(
                        "--spawn threads is for this binary's own launcher; under torchrun, srun or mpirun every rank is a process"
                    );
                }
                worker::run(&cli, Some(&env))
            }
            None => worker::run(&cli, None),
        },
    }
}
