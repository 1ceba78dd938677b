//! Checks every `slurm-submit` input before anything is built or submitted, so
//! a typo fails in a second on the login node instead of after a queue wait.

use std::path::Path;

use anyhow::{Result, anyhow, bail};

use super::JobFlags;

/// sbatch's largest `--signal=SIG@SECS` lead time.
const MAX_SIGNAL_SECS: u32 = 65535;

/// A job request whose every field is known to be safe to paste into the
/// batch script.
#[derive(Debug, PartialEq)]
pub struct Job {
    pub name: String,
    pub nodes: u32,
    pub ranks: Ranks,
    pub layout: Layout,
    pub cpus_per_task: Option<u32>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub time: Option<String>,
    pub env: Vec<(String, String)>,
    /// Seconds before the time limit at which every rank gets USR1.
    pub signal_secs: u32,
    /// How many times the job may requeue itself after a preemption.
    pub max_requeues: u32,
}

/// What srun starts on each node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// One task per rank; each is a worker that reads its rank from SLURM.
    PerRank,
    /// One task per node: the trainer's launcher, which starts the node's
    /// ranks itself (`--nproc-per-node`), as `srun torchrun` does.
    PerNode,
}

/// How the ranks of one node are laid out.
#[derive(Debug, PartialEq)]
pub enum Ranks {
    /// One rank per GPU; each rank binds the GPU of its SLURM_LOCALID.
    Gpus(u32),
    /// CPU-only ranks.
    Tasks(u32),
}

impl Ranks {
    pub fn per_node(&self) -> u32 {
        match self {
            Ranks::Gpus(n) | Ranks::Tasks(n) => *n,
        }
    }
}

pub fn job(args: &JobFlags) -> Result<Job> {
    let ranks = match (args.gpus_per_node, args.tasks_per_node) {
        (Some(_), Some(_)) => {
            bail!("give either --gpus-per-node (GPU jobs) or --tasks-per-node (CPU jobs), not both")
        }
        (Some(g), None) => Ranks::Gpus(positive(g, "--gpus-per-node")?),
        (None, Some(t)) => Ranks::Tasks(positive(t, "--tasks-per-node")?),
        (None, None) => Ranks::Tasks(1),
    };
    let signal_secs = positive(args.signal_secs, "--signal-secs")?;
    // sbatch's man page: "sig_time must be an integer between 0 and 65535".
    // Checked apart from --time, which may be long enough to hide it.
    if signal_secs > MAX_SIGNAL_SECS {
        bail!(
            "--signal-secs {signal_secs} is above {MAX_SIGNAL_SECS}, the most sbatch's \
             --signal=USR1@SECS accepts (about 18 hours)"
        );
    }
    if let Some(time) = &args.time
        && time_limit_secs(time)? <= u64::from(signal_secs)
    {
        bail!(
            "--signal-secs {signal_secs} must be below the --time limit {time}: the ranks need the rest of the time to save"
        );
    }
    Ok(Job {
        name: name(&args.job_name, "--job-name")?,
        nodes: positive(args.nodes, "--nodes")?,
        ranks,
        layout: args.layout,
        cpus_per_task: args
            .cpus_per_task
            .map(|c| positive(c, "--cpus-per-task"))
            .transpose()?,
        partition: args.partition.as_deref().map(partition).transpose()?,
        account: args
            .account
            .as_deref()
            .map(|a| name(a, "--account"))
            .transpose()?,
        time: args
            .time
            .as_deref()
            .map(|t| time_limit_secs(t).map(|_| t.to_owned()))
            .transpose()?,
        env: args.env.iter().map(|e| env_var(e)).collect::<Result<_>>()?,
        signal_secs,
        max_requeues: args.max_requeues,
    })
}

fn positive(value: u32, flag: &str) -> Result<u32> {
    if value == 0 {
        bail!("{flag} must be at least 1");
    }
    Ok(value)
}

/// Job, account and partition names end up in `#SBATCH` lines and file
/// names, where spaces and shell metacharacters would break or inject.
fn name(value: &str, flag: &str) -> Result<String> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        bail!(
            "invalid {flag} {value:?}: use 1 to 128 letters, digits, '_', '-' or '.' \
             (no spaces or shell metacharacters)"
        );
    }
    Ok(value.to_owned())
}

/// SLURM accepts a comma-separated list of partitions and picks the first
/// that can run the job.
fn partition(value: &str) -> Result<String> {
    for part in value.split(',') {
        name(part, "--partition").map_err(|_| {
            anyhow!(
                "invalid --partition {value:?}: expected a partition name or a comma-separated \
                 list of them, each made of letters, digits, '_', '-' or '.'"
            )
        })?;
    }
    Ok(value.to_owned())
}

/// Parses a SLURM time limit (`minutes`, `MM:SS`, `HH:MM:SS`, `D-HH`,
/// `D-HH:MM`, `D-HH:MM:SS`) into seconds.
pub fn time_limit_secs(value: &str) -> Result<u64> {
    let invalid = |why: &str| {
        anyhow!(
            "invalid --time {value:?}: {why}; expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM \
             or D-HH:MM:SS (e.g. 90, 30:00, 02:00:00, 1-12)"
        )
    };
    let (days, clock) = match value.split_once('-') {
        Some((d, rest)) => (
            Some(number(d).ok_or_else(|| invalid("bad day count"))?),
            rest,
        ),
        None => (None, value),
    };
    let fields = clock
        .split(':')
        .map(number)
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| invalid("every field must be a number"))?;
    let below = |v: u64, limit: u64, what: &str| {
        if v < limit {
            Ok(v)
        } else {
            Err(invalid(&format!("{what} must be below {limit}")))
        }
    };
    let secs = match (days, fields.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + below(*s, 60, "seconds")?,
        (None, [h, m, s]) => h * 3600 + below(*m, 60, "minutes")? * 60 + below(*s, 60, "seconds")?,
        (Some(d), [h]) => d * 86400 + below(*h, 24, "hours")? * 3600,
        (Some(d), [h, m]) => {
            d * 86400 + below(*h, 24, "hours")? * 3600 + below(*m, 60, "minutes")? * 60
        }
        (Some(d), [h, m, s]) => {
            d * 86400
                + below(*h, 24, "hours")? * 3600
                + below(*m, 60, "minutes")? * 60
                + below(*s, 60, "seconds")?
        }
        _ => return Err(invalid("wrong number of fields")),
    };
    if secs == 0 {
        // SLURM reads a zero limit as "no limit", which is never what a typo meant.
        return Err(invalid(
            "a zero limit means 'unlimited' to SLURM; leave --time out to get the partition's default",
        ));
    }
    Ok(secs)
}

/// One field of a time limit. Capped at nine digits so the arithmetic above
/// cannot overflow a u64.
fn number(field: &str) -> Option<u64> {
    let ok = !field.is_empty() && field.len() <= 9 && field.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| field.parse().ok()).flatten()
}

fn env_var(value: &str) -> Result<(String, String)> {
    let (key, val) = value
        .split_once('=')
        .ok_or_else(|| anyhow!("invalid --env {value:?}: expected KEY=VALUE"))?;
    let mut chars = key.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        bail!(
            "invalid --env {value:?}: the name {key:?} must start with a letter or '_' and \
             contain only letters, digits and '_'"
        );
    }
    Ok((key.to_owned(), val.to_owned()))
}

/// With `--container`, the trainer's `--checkpoint-dir` (if it names one)
/// must be relative: to the output directory, which the container sees
/// at `/output`, so that the script can find it on the host too.
pub fn container_checkpoint_dir(trainer_args: &[String]) -> Result<()> {
    match flag_value(trainer_args, "--checkpoint-dir") {
        Some(dir) if dir.is_empty() || Path::new(dir).is_absolute() || dir.contains("..") => bail!(
            "--checkpoint-dir {dir:?} with --container: give a path relative to --output-dir \
             (the container's working directory, /output), such as `ckpt`, or drop it for the default"
        ),
        _ => Ok(()),
    }
}

/// Paths pasted into `#SBATCH --output=` / `--chdir=` lines: sbatch splits
/// those lines at whitespace and expands `%` patterns, so such paths cannot be
/// carried there faithfully.
pub fn sbatch_path<'a>(path: &'a Path, what: &str) -> Result<&'a str> {
    let text = path
        .to_str()
        .ok_or_else(|| anyhow!("{what} {} is not valid UTF-8", path.display()))?;
    if let Some(bad) = text
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '%' | '"' | '\'' | '\\'))
    {
        bail!(
            "{what} {text:?} contains {bad:?}, which an #SBATCH line cannot carry; \
             choose a path without spaces, quotes, '%' or '\\'"
        );
    }
    Ok(text)
}

/// The value of `flag` among `args` (`--flag V` or `--flag=V`; clap
/// refuses a flag given twice), or `None`.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix(flag) {
            Some("") => Some(args.get(i + 1).map_or("", String::as_str)),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: JobFlags,
    }

    fn parse(argv: &[&str]) -> Result<Job> {
        let cli = Cli::try_parse_from(std::iter::once("slurm-submit").chain(argv.iter().copied()))?;
        job(&cli.args)
    }

    fn error(argv: &[&str]) -> String {
        format!("{:#}", parse(argv).expect_err("input should be rejected"))
    }

    #[test]
    fn accepts_every_slurm_time_format() {
        let cases = [
            ("90", 90 * 60),
            ("30:15", 30 * 60 + 15),
            ("120:00", 120 * 60),
            ("02:00:00", 2 * 3600),
            ("48:30:05", 48 * 3600 + 30 * 60 + 5),
            ("1-12", 86400 + 12 * 3600),
            ("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60),
            ("0-00:00:01", 1),
        ];
        for (text, secs) in cases {
            assert_eq!(time_limit_secs(text).unwrap(), secs, "{text}");
        }
    }

    #[test]
    fn rejects_malformed_times_with_the_formats_listed() {
        for text in [
            "",
            "1h",
            "1:2:3:4",
            "-5",
            "1-",
            "1-2-3",
            "1:60",
            "1:00:60",
            "1:60:00",
            "1-24",
            "1-23:60",
            " 10",
            "10 ",
            "+10",
            "1.5",
            "0",
            "00:00:00",
            "1234567890",
        ] {
            let err = time_limit_secs(text).expect_err(text).to_string();
            assert!(err.contains(&format!("invalid --time {text:?}")), "{err}");
            assert!(err.contains("D-HH:MM:SS"), "{err}");
        }
        assert!(
            time_limit_secs("1:75")
                .unwrap_err()
                .to_string()
                .contains("seconds must be below 60")
        );
        assert!(
            time_limit_secs("0")
                .unwrap_err()
                .to_string()
                .contains("unlimited")
        );
    }

    #[test]
    fn defaults_to_one_cpu_rank_on_one_node() {
        let job = parse(&[]).unwrap();
        assert_eq!(job.nodes, 1);
        assert_eq!(job.ranks, Ranks::Tasks(1));
        assert_eq!(job.name, "fmnist-ddp");
        assert_eq!((job.time, job.partition, job.account), (None, None, None));
    }

    #[test]
    fn keeps_valid_values() {
        let job = parse(&[
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--cpus-per-task",
            "8",
            "--partition",
            "gpu,gpu-long",
            "--account",
            "proj_42",
            "--time",
            "1-00:00",
            "--env",
            "NCCL_DEBUG=INFO",
            "--env",
            "X_=a=b c",
            "--env",
            "EMPTY=",
        ])
        .unwrap();
        assert_eq!(job.ranks, Ranks::Gpus(4));
        assert_eq!(job.cpus_per_task, Some(8));
        assert_eq!(job.partition.as_deref(), Some("gpu,gpu-long"));
        assert_eq!(job.time.as_deref(), Some("1-00:00"));
        let env: Vec<(&str, &str)> = job
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            env,
            [("NCCL_DEBUG", "INFO"), ("X_", "a=b c"), ("EMPTY", "")]
        );
    }

    #[test]
    fn rejects_zero_counts() {
        assert!(error(&["--nodes", "0"]).contains("--nodes must be at least 1"));
        assert!(error(&["--gpus-per-node", "0"]).contains("--gpus-per-node must be at least 1"));
        assert!(error(&["--tasks-per-node", "0"]).contains("--tasks-per-node must be at least 1"));
        assert!(error(&["--cpus-per-task", "0"]).contains("--cpus-per-task must be at least 1"));
    }

    #[test]
    fn rejects_gpus_and_tasks_together() {
        let err = error(&["--gpus-per-node", "2", "--tasks-per-node", "2"]);
        assert!(
            err.contains("--gpus-per-node") && err.contains("--tasks-per-node"),
            "{err}"
        );
    }

    #[test]
    fn rejects_names_with_spaces_or_metacharacters() {
        for (flag, bad) in [
            ("--partition", "gpu nodes"),
            ("--partition", "gpu;rm"),
            ("--partition", "gpu,"),
            ("--job-name", "my job"),
            ("--job-name", "$(reboot)"),
            ("--job-name", ""),
            ("--account", "a|b"),
        ] {
            let err = error(&[flag, bad]);
            assert!(err.contains(&format!("invalid {flag} {bad:?}")), "{err}");
        }
    }

    #[test]
    fn rejects_bad_env_syntax() {
        assert!(error(&["--env", "NOEQUALS"]).contains("expected KEY=VALUE"));
        for bad in ["=x", "1X=y", "A-B=c", "A B=c"] {
            let err = error(&["--env", bad]);
            assert!(err.contains("must start with a letter"), "{bad}: {err}");
        }
    }

    #[test]
    fn rejects_paths_an_sbatch_line_cannot_carry() {
        assert_eq!(
            sbatch_path(Path::new("/scratch/me/logs"), "--output-dir").unwrap(),
            "/scratch/me/logs"
        );
        for bad in ["/my logs", "/logs%j", "/a'b", "/a\\b", "/a\tb"] {
            let err = sbatch_path(Path::new(bad), "--output-dir")
                .unwrap_err()
                .to_string();
            assert!(err.contains("cannot carry"), "{err}");
        }
    }
}
