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
pub mod error_file;
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

use std::ffi::OsString;

use anyhow::{Context, bail};
use clap::Parser;
use comm::LaunchEnv;
use launcher::contract::RunEnd;
use launcher::{NodePlan, OnFailure, Restarts, WorkerSpec};

use crate::checkpoint::lock;
use crate::checkpoint::restarts::CheckpointRestarts;
use crate::cli::{Cli, Spawn};
use crate::run::Recovery;
use crate::topology::Topology;

/// Runs what the flags and the environment ask for.
pub fn run(cli: Cli) -> anyhow::Result<RunEnd> {
    cli.validate()?;
    let env = LaunchEnv::from_process_env()?;
    let cli = match &env {
        Some(env) => restarted_by_torchrun(cli, env)?,
        None => cli,
    };
    let job = &cli.job;
    let plan = NodePlan::resolve(&cli.launch, cli.world_size, env.as_ref())?;
    // Rank 0 (or the launcher) alone writes checkpoints and metrics. A
    // launcher of an elastic job leaves the check to its rank 0: a machine
    // that comes back joins a restart, whose checkpoints are there.
    let elastic = plan.as_ref().is_some_and(NodePlan::is_elastic);
    let rank_0 = env.as_ref().is_none_or(|env| env.rank == 0);
    if rank_0 && !elastic {
        let outputs = (&job.checkpoints.checkpoint_dir, &job.outputs.metrics);
        output_paths::prepare(outputs.0.as_deref(), outputs.1.as_deref())?;
    }
    // One job per checkpoint directory, held as long as this runs: by node
    // 0's launcher for its workers (`CheckpointRestarts::hold`), else here
    // by rank 0, unless its launcher said that it holds it.
    let launches_processes = plan.is_some() && cli.spawn == Spawn::Processes;
    let _hold = match &job.checkpoints.checkpoint_dir {
        Some(dir) if rank_0 && !launches_processes => {
            let inherited = std::env::var(lock::HELD_VAR).ok();
            Some(lock::hold_as_rank_0(dir, inherited.as_deref())?)
        }
        _ => None,
    };
    if let Some(plan) = &plan {
        // Once here, rather than by every worker it would start.
        let stages = job.pipeline.pipeline_stages as usize;
        if plan.is_elastic() && stages > 1 {
            bail!(
                "--pipeline-stages {stages} with an elastic --nnodes: a pipeline's stages are cut for a fixed number of ranks; give a fixed --nnodes"
            );
        }
        Topology::new((0, plan.world_size()), (0, plan.nproc), stages)?;
    }
    let max_restarts = cli.launch.max_restarts;
    match plan {
        Some(_) if cli.spawn == Spawn::Threads && job.join.link_mbps.is_some() => bail!(
            "--link-mbps paces the host's TCP/Unix-socket ring, and --spawn threads ranks share memory instead: use --spawn processes (the default)"
        ),
        Some(plan) if cli.spawn == Spawn::Threads => run::threads::run(job, &plan, max_restarts),
        Some(plan) => launch(&cli, &plan),
        None => match env {
            Some(env) => {
                if max_restarts > 0 {
                    bail!(
                        "--max-restarts is for this binary's own launcher; under torchrun or srun, restart there: torchrun --max-restarts (its restarts continue from the newest checkpoint in --checkpoint-dir), or srun --requeue with --resume auto"
                    );
                }
                if cli.spawn == Spawn::Threads {
                    bail!(
                        "--spawn threads is for this binary's own launcher; under torchrun, srun or mpirun every rank is a process"
                    );
                }
                if job.join.recovery == Recovery::Live && !env.launcher_store {
                    bail!(
                        "--recovery live needs this binary's own launcher, whose store outlives every rank and which starts a lost rank's replacement; under torchrun, srun or mpirun a lost rank stops every rank by design (torchrun restarts them all): use --recovery restart there, or launch with `trainer --nproc-per-node N` (one launcher per machine, as `cargo xtask slurm-submit --layout per-node` does)"
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
    let mut spec = WorkerSpec::of_this_process(
        &cli.launch,
        (join.timeout(), join.rdzv_timeout()),
        join.auth(),
    )?;
    // One directory for the workers of every attempt, which this launcher
    // reads after a failure: named for it when the user named none.
    let flight = cli.job.flight_dir(std::process::id());
    if cli.job.flight.flight_recorder.is_none() {
        spec.args
            .extend(["--flight-recorder".into(), flight.clone().into()]);
    }
    spec.flight_recorder = Some(flight);
    spec.on_failure = match cli.job.join.recovery {
        Recovery::Restart => OnFailure::RestartAll,
        Recovery::Live => OnFailure::Replace,
    };
    let restarts = CheckpointRestarts::new(
        checkpoints.checkpoint_dir.as_deref(),
        checkpoints.keep,
        checkpoints.resume.clone(),
    )
    .of_job(cli.launch.rdzv.rdzv_id.clone());
    // An elastic job's machine may join a restart, its first attempt
    // resuming: the first attempt's rank 0 checks (and refuses for good).
    if spec.max_restarts > 0 && !plan.is_elastic() {
        restarts.preflight()?;
    }
    Ok(launcher::launch(&spec, plan, &restarts)?)
}

/// The flags of a worker that torchrun restarted (`TORCHELASTIC_RESTART_COUNT`
/// above 0): with a `--checkpoint-dir`, those with which this binary's own
/// launcher restarts its workers (continue from the newest checkpoint);
/// else `cli` as it is.
fn restarted_by_torchrun(cli: Cli, env: &LaunchEnv) -> anyhow::Result<Cli> {
    let restart = env.agent.as_ref().map_or(0, |agent| agent.restart_count);
    let checkpoints = &cli.job.checkpoints;
    if restart == 0 || checkpoints.checkpoint_dir.is_none() {
        return Ok(cli);
    }
    let restarts = CheckpointRestarts::new(
        checkpoints.checkpoint_dir.as_deref(),
        checkpoints.keep,
        checkpoints.resume.clone(),
    );
    if env.rank == 0 {
        tell!(
            "torchrun restart {restart}: continuing from {}",
            restarts.continues_from()
        );
    }
    let mut args = std::env::args_os();
    let program = args.next().unwrap_or_else(|| OsString::from("trainer"));
    let first: Vec<OsString> = args.collect();
    let cli = Cli::try_parse_from(std::iter::once(program).chain(restarts.args(&first)))
        .context("reading the flags of a restart again")?;
    cli.validate()?;
    Ok(cli)
}
