//! `cargo xtask slurm-submit`: builds the trainer (release profile unless
//! `--profile` says otherwise), renders a batch
//! script for it, submits that with `sbatch`, and with `--wait` follows the
//! job to its end. Everything the user typed is validated first.

mod follow;
mod render;
mod validate;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::image::TRAINER_PATH;
use crate::trainer_build::{find_on_path, profile_name, trainer, workspace_root};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  cargo xtask slurm-submit --nodes 2 --gpus-per-node 4 --partition gpu --time 02:00:00 -- --epochs 10
  cargo xtask slurm-submit --tasks-per-node 2 --wait -- --device cpu --epochs 1
  cargo xtask slurm-submit --gpus-per-node 8 --env NCCL_DEBUG=INFO --dry-run")]
pub struct Args {
    #[command(flatten)]
    job: JobFlags,
    /// Where the script, the log (NAME-JOBID.out) and the trainer's checkpoints
    /// (NAME-SUBMISSION.checkpoints) go; relative to the workspace root.
    #[arg(long, default_value = "logs", value_name = "DIR")]
    output_dir: PathBuf,
    /// Print the batch script; build and submit nothing.
    #[arg(long, conflicts_with = "wait")]
    dry_run: bool,
    /// Follow the job: stream its log and exit with its outcome (0 only when COMPLETED).
    #[arg(long)]
    wait: bool,
    /// With --wait: cancel the job if it is still queued after this many seconds.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pending_timeout: u64,
    /// Submit the trainer as already built instead of running `cargo build --profile PROFILE -p trainer`.
    #[arg(long)]
    no_build: bool,
    /// The cargo profile of the trainer to build and submit: `release`, or `dev`
    /// (target/debug/trainer: it trains as fast, every profile optimising the numeric crates,
    /// and is already built after `cargo test`).
    #[arg(long, default_value = "release", value_name = "PROFILE", value_parser = profile_name)]
    profile: String,
    /// Run this program under srun instead of the trainer (a wrapper script, a profiler, another
    /// build); nothing is built.
    #[arg(long, value_name = "PATH")]
    program: Option<PathBuf>,
    /// Run the trainer inside this image (the directory `cargo xtask image` prints) with
    /// Charliecloud: `srun ch-run IMAGE -- trainer`, the --output-dir bound at /output, the
    /// trainer's working directory. The image's trainer runs; nothing is built.
    #[arg(long, value_name = "IMAGE", conflicts_with = "program")]
    container: Option<PathBuf>,
    /// Arguments for the trainer, after `--`.
    #[arg(last = true, value_name = "TRAINER_ARGS")]
    trainer_args: Vec<String>,
}

/// What the batch job is: where it runs, how many ranks, how long, and how
/// it requeues itself (`validate::job` reads them).
#[derive(clap::Args, Debug)]
pub struct JobFlags {
    /// Nodes to allocate.
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// GPUs per node, with one rank per GPU (GPU jobs).
    #[arg(long, value_name = "N")]
    gpus_per_node: Option<u32>,
    /// Ranks per node for a CPU-only job (default 1; pass `-- --device cpu` to the trainer).
    #[arg(long, value_name = "N")]
    tasks_per_node: Option<u32>,
    /// CPU cores for each rank.
    #[arg(long, value_name = "N")]
    cpus_per_task: Option<u32>,
    /// One srun task per rank, or one per node running the trainer's own
    /// launcher for the node's ranks (torchrun's layout under SLURM).
    #[arg(long, value_enum, default_value_t = validate::Layout::PerRank)]
    layout: validate::Layout,
    /// Partition (queue), or a comma-separated list of them [default: the cluster's default].
    #[arg(long)]
    partition: Option<String>,
    /// Wall-clock limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS [default: the partition's].
    #[arg(long)]
    time: Option<String>,
    /// Account to charge [default: your default account].
    #[arg(long)]
    account: Option<String>,
    /// Job name, shown by squeue and used in the log file name.
    #[arg(long, default_value = "fmnist-ddp")]
    job_name: String,
    /// Seconds before the time limit at which SLURM sends USR1 to every rank: the trainer saves a
    /// checkpoint and exits with 75, and the job requeues itself to continue from it. 1 to 65535
    /// (sbatch's range), and below --time.
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    signal_secs: u32,
    /// How many times the job may requeue itself after a preemption (exit 75), counted by
    /// SLURM_RESTART_COUNT; a run that saved no checkpoint is never requeued (0: never).
    #[arg(long, default_value_t = 3, value_name = "N")]
    max_requeues: u32,
    /// Exported to every rank (repeatable), e.g. --env NCCL_DEBUG=INFO.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let job = validate::job(&args.job)?;
    let root = workspace_root();
    // `Path::join` keeps an absolute --output-dir as it is.
    let output_dir = std::path::absolute(root.join(&args.output_dir))
        .with_context(|| format!("resolving --output-dir {}", args.output_dir.display()))?;
    let output_dir_text = validate::sbatch_path(&output_dir, "--output-dir")?;
    let workdir = validate::sbatch_path(&root, "the workspace root")?;
    let container = args.container.as_deref().map(container_image).transpose()?;
    if let Some(image) = &container {
        validate::container_checkpoint_dir(&args.trainer_args)?;
        if !args.dry_run && find_on_path("ch-run").is_none() {
            bail!(
                "`ch-run` is not on PATH, and --container {image} runs the trainer with it; install \
                 Charliecloud on the login and compute nodes (Debian/Ubuntu: `apt-get install \
                 charliecloud-runtime`) or drop --container"
            );
        }
    }
    let container = container
        .as_deref()
        .map(|image| validate::sbatch_path(Path::new(image), "--container"))
        .transpose()?;
    let sbatch = if args.dry_run {
        None
    } else {
        Some(find_on_path("sbatch").with_context(no_sbatch_help)?)
    };
    let program = match (&args.program, container) {
        (Some(program), _) => existing_program(program)?,
        (None, Some(_)) => PathBuf::from(TRAINER_PATH),
        (None, None) => trainer(
            &root,
            &args.profile,
            !(args.no_build || args.dry_run),
            !args.dry_run,
        )?,
    };
    // Seconds and pid: unique to this submission, kept by its requeues.
    let submitted = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let submission = format!("{submitted}-{}", std::process::id());
    let paths = render::Paths {
        workdir,
        output_dir: output_dir_text,
        program: &program,
        is_trainer: args.program.is_none(),
        submission: &submission,
        container,
    };
    let script = render::script(&job, &paths, &args.trainer_args);
    let Some(sbatch) = sbatch else {
        print!("{script}");
        return Ok(());
    };

    // SLURM cannot create the log's directory, and a job whose --output
    // directory is missing fails without writing anything anywhere.
    std::fs::create_dir_all(&output_dir)
        .with_context(|| format!("creating the output directory {}", output_dir.display()))?;
    // Named after the job id once sbatch has assigned one.
    let draft = output_dir.join(format!(
        "{}-submitting-{}.sbatch",
        job.name,
        std::process::id()
    ));
    std::fs::write(&draft, &script)
        .with_context(|| format!("writing the batch script {}", draft.display()))?;
    // With --wait the job is submitted held, so that follow::release can
    // clear a stale log before the job can write its own.
    let job_id = submit(&sbatch, &draft, args.wait)?;
    let log = render::log_path(&output_dir, &job.name, &job_id);
    if args.wait {
        follow::release(&job_id, &log)?;
    }
    let kept = output_dir.join(format!("{}-{job_id}.sbatch", job.name));
    std::fs::rename(&draft, &kept)
        .with_context(|| format!("renaming {} to {}", draft.display(), kept.display()))?;
    println!("script: {}", kept.display());
    println!("job: {job_id}");
    println!("log: {}", log.display());
    if paths.is_trainer {
        let checkpoints = render::checkpoint_dir(output_dir_text, &job.name, &submission);
        println!("checkpoints (unless --checkpoint-dir says otherwise): {checkpoints}");
    }
    if args.wait {
        follow::follow(&job_id, &log, Duration::from_secs(args.pending_timeout))?;
    } else {
        println!("watch: squeue -j {job_id}   cancel: scancel {job_id}");
    }
    Ok(())
}

fn no_sbatch_help() -> String {
    "`sbatch` is not on PATH. slurm-submit must run where the SLURM client tools are installed, \
     usually a cluster's login node. To submit from another machine, install them (Debian/Ubuntu: \
     `apt-get install slurm-client`) and point SLURM_CONF at the cluster's slurm.conf; to try the \
     workflow on this machine, see slurm/local-cluster.sh. --dry-run shows the script without sbatch."
        .to_owned()
}

/// `--container IMAGE`'s absolute path, once it is seen to be an image of
/// `cargo xtask image`.
fn container_image(image: &Path) -> Result<String> {
    let absolute = std::path::absolute(image)
        .with_context(|| format!("resolving --container {}", image.display()))?;
    let build = "build one with `cargo xtask image` and pass the directory it prints";
    if !absolute.is_dir() {
        bail!(
            "--container {}: no such directory; {build}",
            absolute.display()
        );
    }
    let trainer = absolute.join(TRAINER_PATH.trim_start_matches('/'));
    if !trainer.is_file() {
        bail!(
            "--container {} holds no {TRAINER_PATH}, so it is no image of `cargo xtask image`; {build}",
            absolute.display()
        );
    }
    absolute
        .into_os_string()
        .into_string()
        .map_err(|path| anyhow::anyhow!("--container {}: not valid UTF-8", path.display()))
}

fn existing_program(program: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(program)
        .with_context(|| format!("resolving --program {}", program.display()))?;
    if !absolute.is_file() {
        bail!("--program {}: no such file", absolute.display());
    }
    Ok(absolute)
}

/// Submits the script, held if `hold`; returns the job id.
fn submit(sbatch: &Path, script: &Path, hold: bool) -> Result<String> {
    let out = Command::new(sbatch)
        .arg("--parsable")
        .args(hold.then_some("--hold"))
        .arg(script)
        .output()
        .with_context(|| format!("running {}", sbatch.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "sbatch rejected the job: {} (script kept at {})",
            String::from_utf8_lossy(&out.stderr).trim(),
            script.display()
        );
    }
    // --parsable prints "jobid" or, on federated clusters, "jobid;cluster".
    let job_id = stdout.trim().split(';').next().unwrap_or_default();
    if job_id.is_empty() || !job_id.bytes().all(|b| b.is_ascii_digit()) {
        bail!("unexpected output from `sbatch --parsable`: {stdout:?}");
    }
    Ok(job_id.to_owned())
}
