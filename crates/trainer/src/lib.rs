//! The trainer: one binary that is either a worker (one rank of a job) or,
//! asked for several ranks or restarts with no launcher around, the launcher
//! of its own workers. See `ARCHITECTURE.md` for the map.

#[macro_use]
extern crate launcher;

pub mod announce;
pub mod bounded_read;
pub mod checkpoint;
pub mod cli;
pub mod data;
pub mod ddp;
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
use launcher::contract::RunEnd;
use launcher::{NodePlan, WorkerSpec};

use crate::checkpoint::restarts::CheckpointRestarts;
use crate::cli::Cli;

/// Runs what the flags and the environment ask for.
pub fn run(cli: Cli) -> anyhow::Result<RunEnd> {
    cli.validate()?;
    let env = LaunchEnv::from_process_env()?;
    // Rank 0 (or the launcher) alone writes checkpoints and metrics.
    if env.as_ref().is_none_or(|env| env.rank == 0) {
        output_paths::prepare(&cli)?;
    }
    let plan = NodePlan::resolve(&cli.launch, cli.world_size, env.as_ref())?;
    if let Some(plan) = &plan
        && cli.pipeline_stages > 1
    {
        // Once here, rather than by every worker it would start.
        pipeline::PipelinePlace::of(0, plan.world_size(), cli.pipeline_stages as usize)?;
    }
    match plan {
        Some(plan) if cli.spawn == cli::Spawn::Threads => worker::threads::run(&cli, &plan),
        Some(plan) => launch(&cli, &plan),
        None => match env {
            Some(env) => {
                if cli.launch.max_restarts > 0 {
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

/// This machine's launcher: its workers are this program, restarted from
/// the newest checkpoint in `--checkpoint-dir`.
fn launch(cli: &Cli, plan: &NodePlan) -> anyhow::Result<RunEnd> {
    let timeout = std::time::Duration::from_secs_f64(cli.timeout);
    let spec = WorkerSpec::of_this_process(&cli.launch, timeout, cli.auth_token_file.clone())?;
    let restarts =
        CheckpointRestarts::new(cli.checkpoint_dir.as_deref(), cli.keep, cli.resume.clone());
    if spec.max_restarts > 0 {
        restarts.preflight()?;
    }
    launcher::launch(&spec, plan, &restarts)
}
