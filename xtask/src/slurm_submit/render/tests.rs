//! The rendered script: golden files, quoting, and what it passes the trainer.

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

/// A job of `nodes` nodes with every option at its default.
pub(super) fn job(nodes: u32, ranks: Ranks) -> Job {
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
        max_requeues: 3,
    }
}

/// A workspace in /home/me/ddp, running `program`.
pub(super) fn paths(program: &str) -> Paths<'_> {
    Paths {
        workdir: "/home/me/ddp",
        output_dir: "/home/me/ddp/logs",
        program: Path::new(program),
        is_trainer: program == TRAINER,
        submission: "1700000000-4242",
        container: None,
    }
}

pub(super) const TRAINER: &str = "/home/me/ddp/target/release/trainer";

pub(super) fn args(list: &[&str]) -> Vec<String> {
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
    // What the user chose stands (clap would refuse a flag given twice),
    // and the script looks there for what a run saved.
    let (lines, flags) = resume_flags(&["--checkpoint-dir=/scratch/my ck"]);
    assert!(
        lines.ends_with("\nCHECKPOINT_DIR='/scratch/my ck'\n"),
        "{lines}"
    );
    assert_eq!(flags, " --resume auto");
    let (lines, flags) = resume_flags(&["--checkpoint-dir", "ck", "--resume", "ck/x"]);
    assert!(lines.ends_with("\nCHECKPOINT_DIR=ck\n"), "{lines}");
    assert_eq!(flags, "");
    assert_eq!(
        resume_flags(&["--checkpoint-dir-x=1"]).1,
        r#" --checkpoint-dir "$CHECKPOINT_DIR" --resume auto"#
    );
    let (_, flags) = resume_flags(&["--resume=auto"]);
    assert_eq!(flags, r#" --checkpoint-dir "$CHECKPOINT_DIR""#);
    // Another program gets its arguments as they are.
    let rendered = script(&job(1, Ranks::Tasks(1)), &paths("/bin/env"), &[]);
    assert!(rendered.contains("srun --kill-on-bad-exit=1 /bin/env || status=$?\n"));
    assert!(!rendered.contains("\nCHECKPOINT_DIR="), "{rendered}");
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

#[test]
fn renders_a_job_in_a_container() {
    let image = "/home/me/ddp/target/image/fmnist-ddp";
    let mut paths = paths("/usr/local/bin/trainer");
    paths.is_trainer = true;
    paths.container = Some(image);
    let script = script(
        &job(2, Ranks::Tasks(1)),
        &paths,
        &args(&["--device", "cpu"]),
    );
    golden("container.sbatch", &script);
    // A checkpoint directory of the trainer's arguments is the output
    // directory's, seen from the host by the script.
    let script = script_with(&paths, &["--checkpoint-dir", "ckpt"]);
    assert!(
        script.contains("CHECKPOINT_DIR=/home/me/ddp/logs/ckpt\n"),
        "{script}"
    );
    assert!(
        script.contains("-- /usr/local/bin/trainer --resume auto --checkpoint-dir ckpt"),
        "{script}"
    );
}

fn script_with(paths: &Paths, list: &[&str]) -> String {
    script(&job(1, Ranks::Tasks(1)), paths, &args(list))
}
