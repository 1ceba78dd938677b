//! Fills `job.sbatch.in` with a validated [`Job`].

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::validate::{Job, Layout, Ranks, flag_value};
use crate::image::OUTPUT_MOUNT;

const TEMPLATE: &str = include_str!("job.sbatch.in");

/// Where the job runs and writes, already checked with `validate::sbatch_path`.
pub struct Paths<'a> {
    /// The job's working directory: the workspace root.
    pub workdir: &'a str,
    pub output_dir: &'a str,
    /// What `srun` starts on every rank.
    pub program: &'a Path,
    /// The program is the trainer, which gets the flags that let a
    /// requeued job continue (see [`resume_flags`]).
    pub is_trainer: bool,
    /// Names this submission's checkpoint directory: unique per submission
    /// (job ids are not: a fresh cluster starts again at 1), the same for
    /// every requeue of it.
    pub submission: &'a str,
    /// The image (`cargo xtask image`'s directory) the trainer runs in
    /// with Charliecloud's `ch-run`, the output directory bound at
    /// [`OUTPUT_MOUNT`] as its working directory; `None`: on the host.
    pub container: Option<&'a str>,
}

/// The default checkpoint directory of a submission, as the script says it.
pub fn checkpoint_dir(output_dir: &str, job_name: &str, submission: &str) -> String {
    format!("{output_dir}/{job_name}-{submission}.checkpoints")
}

/// The log file SLURM writes for `job_id` (the script's `--output` with `%j` filled in).
pub fn log_path(output_dir: &Path, job_name: &str, job_id: &str) -> PathBuf {
    output_dir.join(format!("{job_name}-{job_id}.out"))
}

pub fn script(job: &Job, paths: &Paths, program_args: &[String]) -> String {
    let per_node = job.ranks.per_node();
    // A launcher task holds the cores of all the ranks it starts.
    let (tasks, cpus_per_task, srun_comment, launcher_flags) = match job.layout {
        Layout::PerRank => (
            per_node,
            job.cpus_per_task,
            "# One task per rank; each reads its rank from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID.",
            String::new(),
        ),
        Layout::PerNode => (
            1,
            job.cpus_per_task.map(|c| c * per_node),
            "# One task per node: the trainer's launcher, which starts the node's ranks\n\
             # (node index SLURM_NODEID of SLURM_NNODES, meeting on the first node).",
            format!(" --nproc-per-node {per_node}"),
        ),
    };
    let mut directives = vec![
        format!("--job-name={}", job.name),
        format!("--nodes={}", job.nodes),
        format!("--ntasks-per-node={tasks}"),
    ];
    if let Ranks::Gpus(gpus) = job.ranks {
        directives.push(format!("--gpus-per-node={gpus}"));
    }
    if let Some(cpus) = cpus_per_task {
        directives.push(format!("--cpus-per-task={cpus}"));
    }
    for (flag, value) in [
        ("partition", &job.partition),
        ("account", &job.account),
        ("time", &job.time),
    ] {
        if let Some(value) = value {
            directives.push(format!("--{flag}={value}"));
        }
    }
    // The workspace root as working directory makes relative trainer paths
    // (such as the default data directory) mean what they mean for `cargo run`.
    directives.push(format!("--chdir={}", paths.workdir));
    // stdout and stderr of the batch script and of every rank share one file.
    directives.push(format!("--output={}/{}-%j.out", paths.output_dir, job.name));
    // A requeued job keeps its id, so its log is the same file: append.
    directives.push("--open-mode=append".to_owned());
    // USR1 to every rank (not the batch shell) before the time limit: the
    // trainer saves and exits with 75, and the script requeues the job.
    directives.push(format!("--signal=USR1@{}", job.signal_secs));
    directives.push("--requeue".to_owned());
    let directives: String = directives
        .iter()
        .map(|d| format!("#SBATCH {d}"))
        .collect::<Vec<_>>()
        .join("\n");

    let mut exports = String::new();
    if !job.env.is_empty() {
        exports.push_str("# From --env; srun passes the environment on to every rank.\n");
    }
    for (key, value) in &job.env {
        // Writing to a String cannot fail.
        let _ = writeln!(exports, "export {key}={}", shell_quote(value));
    }
    if paths.container.is_some() {
        exports.push_str(
            "# ch-run wants USER, which a batch job started by root may lack.\n\
             export USER=\"${USER:-$(id -un)}\"\n",
        );
    }

    let mut srun = String::new();
    // srun does not inherit the batch job's --cpus-per-task since SLURM
    // 22.05, so each rank would otherwise get a single core.
    if let Some(cpus) = cpus_per_task {
        let _ = write!(srun, "--cpus-per-task={cpus} ");
    }
    if let Some(image) = paths.container {
        // Charliecloud shares the host's network, PIDs (signals reach the
        // ranks) and environment (SLURM's variables, the token); what the
        // job writes lands in the output directory, owned as on the host.
        let _ = write!(
            srun,
            "ch-run -b {}:{OUTPUT_MOUNT} --cd {OUTPUT_MOUNT} {} -- ",
            shell_quote(paths.output_dir),
            shell_quote(image)
        );
    }
    srun.push_str(&shell_quote(&paths.program.to_string_lossy()));
    srun.push_str(&launcher_flags);
    let (checkpoint_dir, resume) = if paths.is_trainer {
        match paths.container {
            None => {
                let default = checkpoint_dir(paths.output_dir, &job.name, paths.submission);
                resume_flags(program_args, &default)
            }
            Some(_) => container_resume_flags(program_args, paths, &job.name),
        }
    } else {
        (String::new(), String::new())
    };
    srun.push_str(&resume);
    for arg in program_args {
        srun.push(' ');
        srun.push_str(&shell_quote(arg));
    }

    fill(
        TEMPLATE,
        &[
            ("directives", &directives),
            ("exports", &exports),
            ("checkpoint_dir", &checkpoint_dir),
            ("srun_comment", srun_comment),
            ("srun_command", &srun),
            ("max_requeues", &job.max_requeues.to_string()),
        ],
    )
}

/// What makes a requeued trainer continue where it stopped: the
/// submission's checkpoint directory `default`, which a requeue keeps
/// (unless the trainer's arguments name one), and `--resume auto` (unless
/// they say where to resume). The script lines that set `CHECKPOINT_DIR`
/// (the trainer's own, so that the script can tell what a run saved),
/// and the (unquoted) words to put before the trainer's arguments.
fn resume_flags(program_args: &[String], default: &str) -> (String, String) {
    let resume = flag_value(program_args, "--resume").is_none();
    if let Some(dir) = flag_value(program_args, "--checkpoint-dir") {
        let lines = format!(
            "# The trainer's checkpoints (its --checkpoint-dir), to tell what a run saved.\n\
             CHECKPOINT_DIR={}\n",
            shell_quote(dir)
        );
        return (lines, if resume { " --resume auto" } else { "" }.to_owned());
    }
    let lines = format!(
        "# The trainer's checkpoints; a requeued job continues from them.\n\
         CHECKPOINT_DIR=\"${{CHECKPOINT_DIR:-{default}}}\"\n"
    );
    let flags = if resume {
        " --checkpoint-dir \"$CHECKPOINT_DIR\" --resume auto"
    } else {
        " --checkpoint-dir \"$CHECKPOINT_DIR\""
    };
    (lines, flags.to_owned())
}

/// [`resume_flags`] for a trainer in a container, which sees the output
/// directory at [`OUTPUT_MOUNT`], its working directory: the script's
/// `CHECKPOINT_DIR` is the host's path, the trainer's flag the container's.
/// A `--checkpoint-dir` among the arguments is relative to the output
/// directory (`validate::container_checkpoint_dir` refuses any other).
fn container_resume_flags(
    program_args: &[String],
    paths: &Paths,
    job_name: &str,
) -> (String, String) {
    let resume = flag_value(program_args, "--resume").is_none();
    let given = flag_value(program_args, "--checkpoint-dir");
    let (host, flag) = match given {
        Some(dir) => (format!("{}/{dir}", paths.output_dir), String::new()),
        None => (
            checkpoint_dir(paths.output_dir, job_name, paths.submission),
            format!(
                " --checkpoint-dir {}",
                checkpoint_dir(OUTPUT_MOUNT, job_name, paths.submission)
            ),
        ),
    };
    let lines = format!(
        "# The trainer's checkpoints as this script sees them (the trainer sees\n\
         # the output directory at {OUTPUT_MOUNT}); a requeued job continues from them.\n\
         CHECKPOINT_DIR={}\n",
        shell_quote(&host)
    );
    let flags = format!("{flag}{}", if resume { " --resume auto" } else { "" });
    (lines, flags)
}

/// Replaces each `{{key}}` in one pass, so that a value which happens to
/// contain a placeholder (an --env value, say) is never expanded itself.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 1024);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let known = after.find("}}").and_then(|end| {
            let (_, value) = values.iter().find(|(key, _)| *key == &after[..end])?;
            Some((end, value))
        });
        match known {
            Some((end, value)) => {
                out.push_str(value);
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Quotes `word` for bash unless it is made only of characters that bash
/// never interprets, which keeps the common case readable.
fn shell_quote(word: &str) -> Cow<'_, str> {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c));
    if plain {
        Cow::Borrowed(word)
    } else {
        Cow::Owned(format!("'{}'", word.replace('\'', r"'\''")))
    }
}

#[cfg(test)]
mod requeue_tests;
#[cfg(test)]
mod tests;
