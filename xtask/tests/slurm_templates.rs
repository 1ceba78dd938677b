//! The hand-written scripts in slurm/: valid bash, every directive explained,
//! and the same rendezvous the trainer expects.

use std::path::{Path, PathBuf};
use std::process::Command;

fn slurm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm")
}

fn templates() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(slurm_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sbatch"))
        .collect();
    found.sort();
    let names: Vec<_> = found
        .iter()
        .map(|p| p.file_name().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "cpu.sbatch",
            "multi-node-gpu.sbatch",
            "single-node-gpu.sbatch"
        ],
        "update this test when adding or renaming a template"
    );
    found
}

#[test]
fn scripts_are_valid_bash() {
    let mut scripts = templates();
    scripts.push(slurm_dir().join("local-cluster.sh"));
    for script in scripts {
        let out = Command::new("bash")
            .arg("-n")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bash -n {}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_directive_has_a_comment_above_it() {
    for template in templates() {
        let text = std::fs::read_to_string(&template).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate().skip(1) {
            let directive = line.starts_with("#SBATCH") || line.starts_with("##SBATCH");
            assert!(
                !directive || lines[i - 1].starts_with("# "),
                "{}:{}: {line:?} needs a comment line above it saying what it does",
                template.display(),
                i + 1
            );
        }
    }
}

#[test]
fn templates_use_the_trainers_rendezvous() {
    for template in templates() {
        let text = std::fs::read_to_string(&template).unwrap();
        for needed in [
            r#"MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)""#,
            "export MASTER_ADDR",
            // The trainer falls back to this very formula when MASTER_PORT is unset.
            "$((20000 + SLURM_JOB_ID % 10000))",
            "srun --kill-on-bad-exit=1",
            "#SBATCH --output=logs/%x-%j.out",
            // Preempted jobs come back and continue from their checkpoints.
            "#SBATCH --signal=USR1@",
            "#SBATCH --requeue\n",
            "#SBATCH --open-mode=append\n",
            r#"--checkpoint-dir "$CHECKPOINT_DIR" --resume auto "$@" || status=$?"#,
            "if [ \"$status\" -eq 75 ]; then",
            r#"scontrol requeue "$SLURM_JOB_ID""#,
            r#"exit "$status""#,
        ] {
            assert!(
                text.contains(needed),
                "{} lacks {needed:?}",
                template.display()
            );
        }
        if !template.ends_with("cpu.sbatch") {
            assert!(
                text.contains("#SBATCH --gpus-per-node=4\n")
                    && text.contains("#SBATCH --ntasks-per-node=4\n"),
                "{}: one rank per GPU",
                template.display()
            );
        }
    }
}

/// Like the script `cargo xtask slurm-submit` renders, each hand-written
/// one makes a fresh job secret (64 hex digits from the OS RNG, a given
/// `TRAINER_AUTH_TOKEN` kept) and exports it to the ranks: without one they
/// would accept any peer.
#[test]
fn templates_make_a_fresh_auth_token_per_job() {
    for template in templates() {
        let text = std::fs::read_to_string(&template).unwrap();
        assert!(
            text.contains("\nexport TRAINER_AUTH_TOKEN\n"),
            "{} does not export TRAINER_AUTH_TOKEN",
            template.display()
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("TRAINER_AUTH_TOKEN="))
            .unwrap_or_else(|| panic!("{} makes no TRAINER_AUTH_TOKEN", template.display()));
        let token = |given: Option<&str>| {
            let mut bash = Command::new("bash");
            bash.arg("-c")
                .arg(format!("{line}\nprintf %s \"$TRAINER_AUTH_TOKEN\""))
                .env_remove("TRAINER_AUTH_TOKEN");
            if let Some(given) = given {
                bash.env("TRAINER_AUTH_TOKEN", given);
            }
            let out = bash.output().unwrap();
            assert!(out.status.success(), "{}: {line}", template.display());
            String::from_utf8(out.stdout).unwrap()
        };
        let (first, second) = (token(None), token(None));
        assert!(
            first.len() == 64 && first.bytes().all(|b| b.is_ascii_hexdigit()),
            "{}: token {first:?} is not 64 hex digits",
            template.display()
        );
        assert_ne!(
            first,
            second,
            "{}: the same token twice",
            template.display()
        );
        assert_eq!(token(Some("ab".repeat(32).as_str())), "ab".repeat(32));
    }
}

/// The text of `script` from the line that starts with `first` through the
/// line that starts with `last` (or to the end), for comparing blocks.
fn block<'a>(script: &'a str, first: &str, last: Option<&str>) -> &'a str {
    let start = script
        .find(&format!("\n{first}"))
        .unwrap_or_else(|| panic!("no line {first:?}"));
    let rest = &script[start..];
    let end = match last {
        None => rest.len(),
        Some(last) => {
            let line = 1 + rest
                .find(&format!("\n{last}"))
                .expect("the block's last line");
            rest[line..].find('\n').map_or(rest.len(), |n| line + n + 1)
        }
    };
    &rest[..end]
}

/// Each hand-written script decides on a requeue as the script
/// `cargo xtask slurm-submit` renders does, in the same words: at most
/// MAX_REQUEUES (3 unless the environment says), and never after a run
/// that saved no checkpoint. (`slurm_submit::render::requeue_tests` runs
/// that text in bash.)
#[test]
fn templates_bound_their_requeues_as_the_rendered_script_does() {
    let rendered = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/slurm_submit/job.sbatch.in"),
    )
    .unwrap();
    let rule = |s: &str| block(s, "# The complete checkpoints", Some("saved_before=")).to_owned();
    let decision = |s: &str| block(s, "# 75: the ranks stopped", None).to_owned();
    for template in templates() {
        let text = std::fs::read_to_string(&template).unwrap();
        assert!(
            text.contains("\nMAX_REQUEUES=\"${MAX_REQUEUES:-3}\"\n"),
            "{}: no MAX_REQUEUES",
            template.display()
        );
        assert_eq!(rule(&text), rule(&rendered), "{}", template.display());
        assert_eq!(
            decision(&text),
            decision(&rendered),
            "{}",
            template.display()
        );
    }
}
