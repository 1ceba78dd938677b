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
