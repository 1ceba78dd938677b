//! Fills `job.sbatch.in` with a validated [`Job`].

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::validate::{Job, Layout, Ranks};

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

    let mut srun = String::new();
    // srun does not inherit the batch job's --cpus-per-task since SLURM
    // 22.05, so each rank would otherwise get a single core.
    if let Some(cpus) = cpus_per_task {
        let _ = write!(srun, "--cpus-per-task={cpus} ");
    }
    srun.push_str(&shell_quote(&paths.program.to_string_lossy()));
    srun.push_str(&launcher_flags);
    let (checkpoint_dir, resume) = if paths.is_trainer {
        let default = checkpoint_dir(paths.output_dir, &job.name, paths.submission);
        resume_flags(program_args, &default)
    } else {
        (String::new(), "")
    };
    srun.push_str(resume);
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
        ],
    )
}

/// What makes a requeued trainer continue where it stopped: the
/// submission's checkpoint directory `default`, which a requeue keeps
/// (unless the trainer's arguments name one), and `--resume auto` (unless
/// they say where to resume). The script lines that set `CHECKPOINT_DIR`,
/// and the (unquoted) words to put before the trainer's arguments.
fn resume_flags(program_args: &[String], default: &str) -> (String, &'static str) {
    let given = |flag: &str| {
        program_args
            .iter()
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
    };
    let resume = !given("--resume");
    if given("--checkpoint-dir") {
        return (String::new(), if resume { " --resume auto" } else { "" });
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
mod tests {
    use std::process::Command;

    use super::*;

    fn golden(name: &str, rendered: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        // UPDATE_GOLDEN=1 rewrites the files after an intended template change;
        // review the diff before committing it.
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, rendered).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "reading {}: {e} (run with UPDATE_GOLDEN=1 to create it)",
                path.display()
            )
        });
        assert_eq!(
            rendered,
            expected,
            "rendered script differs from {}",
            path.display()
        );
        let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(
            check.status.success(),
            "bash -n {}: {}",
            path.display(),
            String::from_utf8_lossy(&check.stderr)
        );
    }

    fn job(nodes: u32, ranks: Ranks) -> Job {
        Job {
            name: "fmnist-ddp".into(),
            nodes,
            ranks,
            layout: Layout::PerRank,
            cpus_per_task: None,
            partition: None,
            account: None,
            time: None,
            env: vec![],
            signal_secs: 120,
        }
    }

    fn paths(program: &str) -> Paths<'_> {
        Paths {
            workdir: "/home/me/ddp",
            output_dir: "/home/me/ddp/logs",
            program: Path::new(program),
            is_trainer: program == TRAINER,
            submission: "1700000000-4242",
        }
    }

    const TRAINER: &str = "/home/me/ddp/target/release/trainer";

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn renders_a_minimal_cpu_job() {
        let script = script(
            &job(1, Ranks::Tasks(2)),
            &paths(TRAINER),
            &args(&["--device", "cpu"]),
        );
        golden("cpu-single-node.sbatch", &script);
    }

    #[test]
    fn renders_a_multi_node_gpu_job_with_every_option() {
        let mut job = job(4, Ranks::Gpus(8));
        job.name = "big-run".into();
        job.cpus_per_task = Some(12);
        job.partition = Some("gpu,gpu-long".into());
        job.account = Some("proj42".into());
        job.time = Some("1-12:00:00".into());
        job.env = vec![
            ("NCCL_DEBUG".into(), "INFO".into()),
            ("NCCL_SOCKET_IFNAME".into(), "^lo,docker".into()),
        ];
        let script = script(
            &job,
            &paths(TRAINER),
            &args(&["--epochs", "10", "--batch-size", "256"]),
        );
        golden("gpu-multi-node.sbatch", &script);
    }

    #[test]
    fn renders_one_launcher_per_node() {
        let mut job = job(2, Ranks::Gpus(4));
        job.layout = Layout::PerNode;
        job.cpus_per_task = Some(8);
        let script = script(&job, &paths(TRAINER), &args(&["--epochs", "3"]));
        golden("gpu-launcher-per-node.sbatch", &script);
    }

    #[test]
    fn quotes_what_bash_would_interpret() {
        let mut job = job(1, Ranks::Tasks(1));
        job.env = vec![("NOTE".into(), "it's $HOME; `x`".into())];
        let script = script(
            &job,
            &paths("/opt/my tools/trainer"),
            &args(&["--data-dir", "/data/fashion mnist", "", "*"]),
        );
        golden("quoting.sbatch", &script);
    }

    #[test]
    fn quoted_words_survive_bash() {
        let words = [
            "plain",
            "",
            "two words",
            "it's",
            "$HOME",
            "`id`",
            "a\\b",
            "*",
            "~",
            "x\ny",
            "--k=v",
        ];
        for word in words {
            let out = Command::new("bash")
                .arg("-c")
                .arg(format!("printf '%s' {}", shell_quote(word)))
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                word,
                "quoted as {}",
                shell_quote(word)
            );
        }
    }

    #[test]
    fn placeholders_inside_values_stay_literal() {
        let mut job = job(1, Ranks::Tasks(1));
        job.env = vec![("X".into(), "{{srun_command}}".into())];
        let rendered = script(&job, &paths(TRAINER), &args(&["{{exports}}"]));
        assert!(
            rendered.contains("export X='{{srun_command}}'\n"),
            "{rendered}"
        );
        assert!(
            rendered.contains(" --resume auto '{{exports}}' || status=$?\n"),
            "{rendered}"
        );
        assert!(!rendered.contains("{{directives}}"));
    }

    #[test]
    fn a_requeued_trainer_continues_from_the_jobs_checkpoints() {
        let resume_flags = |given: &[&str]| resume_flags(&args(given), "logs/x-1.checkpoints");
        let (lines, flags) = resume_flags(&["--epochs", "3"]);
        assert!(lines.contains(r#"CHECKPOINT_DIR="${CHECKPOINT_DIR:-logs/x-1.checkpoints}""#));
        assert_eq!(
            flags,
            r#" --checkpoint-dir "$CHECKPOINT_DIR" --resume auto"#
        );
        // What the user chose stands; clap would refuse a flag given twice.
        assert_eq!(
            resume_flags(&["--checkpoint-dir=/scratch/ck"]),
            (String::new(), " --resume auto")
        );
        assert_eq!(
            resume_flags(&["--checkpoint-dir", "ck", "--resume", "ck/x"]),
            (String::new(), "")
        );
        let (_, flags) = resume_flags(&["--resume=auto"]);
        assert_eq!(flags, r#" --checkpoint-dir "$CHECKPOINT_DIR""#);
        // Another program gets its arguments as they are.
        let rendered = script(&job(1, Ranks::Tasks(1)), &paths("/bin/env"), &[]);
        assert!(rendered.contains("srun --kill-on-bad-exit=1 /bin/env || status=$?\n"));
        assert!(!rendered.contains("CHECKPOINT_DIR"));
    }

    #[test]
    fn log_path_matches_the_output_directive() {
        let rendered = script(&job(1, Ranks::Tasks(1)), &paths(TRAINER), &[]);
        assert!(rendered.contains("#SBATCH --output=/home/me/ddp/logs/fmnist-ddp-%j.out\n"));
        assert_eq!(
            log_path(Path::new("/home/me/ddp/logs"), "fmnist-ddp", "4242"),
            Path::new("/home/me/ddp/logs/fmnist-ddp-4242.out")
        );
    }

    #[test]
    fn each_job_makes_its_own_token_at_run_time_and_no_file_holds_it() {
        let rendered = script(&job(1, Ranks::Tasks(1)), &paths(TRAINER), &[]);
        let line = rendered
            .lines()
            .find(|l| l.starts_with("TRAINER_AUTH_TOKEN="))
            .expect("the script makes a job token");
        assert!(
            rendered.contains("export TRAINER_AUTH_TOKEN\n"),
            "{rendered}"
        );
        let made = |_: usize| {
            let out = Command::new("bash")
                .args([
                    "-c",
                    &format!("set -eu; {line}; echo \"$TRAINER_AUTH_TOKEN\""),
                ])
                .env_remove("TRAINER_AUTH_TOKEN")
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let (first, second) = (made(0), made(1));
        assert_eq!(first.len(), 64, "{first:?}");
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()), "{first:?}");
        assert_ne!(first, second, "two jobs share a token");
    }
}
