//! The device bundle's run.sh on a fake bundle (shell stubs for the trainer,
//! the tests and the bench; no GPU, ncu or PyTorch): the summary and the
//! archive are rewritten after every step, a SIGTERM mid-step still leaves
//! both with the step marked, and the budget skips what it leaves no time
//! for. And the rules the GPU machine's notes set: every ncu call at the
//! GPU's own clocks, a default budget that fits one 600 s command.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

const RUN_SH: &str = include_str!("../src/device_bundle/run.sh");

/// A trainer that prints an epoch line per epoch, sleeping forever at
/// batch 256 (a step to interrupt).
const TRAINER: &str = r#"#!/usr/bin/env bash
epochs=5 batch=64
while [ $# -gt 0 ]; do
  case "$1" in --epochs) epochs=$2; shift ;; --batch-size) batch=$2; shift ;; esac
  shift
done
[ "$batch" = 256 ] && exec sleep 600
for e in $(seq 1 "$epochs"); do
  printf 'Epoch %02d/%02d | loss 0.3 | acc 0.9 | test_acc 0.91 | time 0.4s | %d img/s\n' "$e" "$epochs" $((1000 * batch))
done
"#;

/// Writes the executable `bundle/path` holding `text`.
fn put(bundle: &Path, path: &str, text: &str) {
    let file = bundle.join(path);
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, text).unwrap();
    let status = Command::new("chmod").arg("+x").arg(&file).status().unwrap();
    assert!(status.success());
}

/// A bundle folder with run.sh and stubs.
fn fake_bundle() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let put = |path: &str, text: &str| put(dir.path(), path, text);
    put("run.sh", RUN_SH);
    put("build-info.txt", "commit fake\n");
    put("bin/trainer", TRAINER);
    let passed = "#!/bin/sh\necho 'test result: ok. 1 passed; 0 failed'\n";
    put("tests/cuda_parity", passed);
    put("tests/nccl_gpu", passed);
    put(
        "benches/cnn_layers",
        "#!/bin/sh\necho '  conv1 fwd 0.017 0.015'\necho '  sum 0.017 0.015'\n",
    );
    dir
}

fn start(bundle: &Path, args: &[&str]) -> Child {
    Command::new("bash")
        .arg(bundle.join("run.sh"))
        .args(args)
        // No CUDA, ncu or PyTorch of the machine running the tests; the
        // bundle's `fakebin/` where a test puts a stub.
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", bundle.join("fakebin").display()),
        )
        .env("PYTHON", "false")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running bash")
}

/// The files of the archive `.tgz`, and its `logs/summary.txt`.
fn unpack(archive: &Path) -> (String, String) {
    let list = Command::new("tar")
        .arg("tzf")
        .arg(archive)
        .output()
        .unwrap();
    assert!(list.status.success(), "{archive:?} is not a tar.gz");
    let summary = Command::new("tar")
        .arg("xzOf")
        .arg(archive)
        .arg("logs/summary.txt")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&list.stdout).into_owned(),
        String::from_utf8_lossy(&summary.stdout).into_owned(),
    )
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_term_mid_step_leaves_the_summary_and_the_archive() {
    let bundle = fake_bundle();
    let archive: PathBuf = bundle.path().join("out.tgz");
    let archive_arg = archive.to_str().unwrap();
    let run = start(bundle.path(), &["--rounds", "1", "--archive", archive_arg]);
    // Batch 256's first run never ends: wait until run.sh has started it
    // (the archive then holds the steps before it), at most a minute.
    let started = bundle.path().join("logs/train_b256_r1.log");
    for _ in 0..600 {
        if started.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(started.exists(), "run.sh never reached train_b256_r1");
    let (files, summary) = unpack(&archive);
    assert!(files.contains("logs/train_bf16_b64_r1.log"), "{files}");
    assert!(summary.contains("train_tf32_b64_r1"), "{summary}");
    let kill = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = run.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let (_, summary) = unpack(&archive);
    assert!(
        summary.contains("train_b64_r1") && summary.contains("Epoch 05/05"),
        "{summary}"
    );
    let interrupted = summary
        .lines()
        .find(|l| l.starts_with("train_b256_r1 "))
        .unwrap_or_else(|| panic!("no train_b256_r1 row in:\n{summary}"));
    assert!(
        interrupted.contains("FAIL") && interrupted.contains("interrupted by SIGTERM"),
        "{summary}"
    );
    // Nothing after the interrupted step ran.
    assert!(!summary.contains("train_tf32_b256_r1"), "{summary}");
}

#[test]
fn steps_the_budget_leaves_no_time_for_are_skipped() {
    let bundle = fake_bundle();
    let run = start(
        bundle.path(),
        &["--budget", "10", "--only", "^train_b64_r1$"],
    );
    let out = run.wait_with_output().unwrap();
    let summary = fs::read_to_string(bundle.path().join("logs/summary.txt")).unwrap();
    let row = summary
        .lines()
        .find(|l| l.starts_with("train_b64_r1 "))
        .unwrap_or_else(|| panic!("no train_b64_r1 row in:\n{summary}\n{}", text(&out)));
    assert!(row.contains("skipped out of time (--budget 10)"), "{row}");
    // --only: no other training step has a row.
    assert!(!summary.contains("train_tf32"), "{summary}");
}

/// An ncu stub: profiling (any call at the GPU's clocks) prints a line,
/// the stall metrics are refused as an unknown name would be.
const NCU_REFUSING_STALLS: &str = r#"#!/bin/sh
case "$*" in
  *"--clock-control none"*smsp__average_warps*) echo "==ERROR== Failed to find metric smsp__average_warps_x"; exit 1 ;;
  *"--clock-control none"*) echo "==PROF== Disconnected" ;;
  *) exit 3 ;;
esac
"#;

/// An ncu that refuses the stall metrics (as one that does not know a
/// name would, before profiling): the step runs again with the common
/// metrics, passes, and the refused try's log stays beside.
#[test]
fn an_ncu_refusing_a_metric_gets_the_common_ones() {
    let bundle = fake_bundle();
    put(bundle.path(), "fakebin/ncu", NCU_REFUSING_STALLS);
    let out = start(bundle.path(), &["--only", "^ncu_detail_bf16$"])
        .wait_with_output()
        .unwrap();
    let summary = fs::read_to_string(bundle.path().join("logs/summary.txt")).unwrap();
    let rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("ncu_detail_bf16 "))
        .collect();
    assert_eq!(rows.len(), 1, "{summary}\n{}", text(&out));
    assert!(rows[0].contains(" ok "), "{summary}");
    let refused = bundle
        .path()
        .join("logs/ncu_detail_bf16_metrics_refused.txt");
    assert!(
        fs::read_to_string(refused)
            .unwrap()
            .contains("Failed to find metric")
    );
}

#[test]
fn every_ncu_call_runs_at_the_gpus_clocks() {
    let calls: Vec<&str> = RUN_SH
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains("ncu --"))
        .collect();
    assert!(calls.len() >= 3, "{calls:?}");
    for line in calls {
        assert!(
            line.contains("ncu --clock-control none") || line.contains("ncu --query-metrics"),
            "an ncu call without --clock-control none: {line}"
        );
    }
}

#[test]
fn the_default_budget_fits_one_command() {
    let budget: u32 = RUN_SH
        .lines()
        .find_map(|l| l.strip_prefix("budget="))
        .and_then(|v| v.parse().ok())
        .expect("a budget=N line");
    assert!(budget <= 480, "default budget {budget} s");
}

/// A trainer stub that notes its flags, one call a line, and prints an
/// epoch line.
const NOTING_TRAINER: &str = r#"#!/bin/sh
echo "$*" >>"$(dirname "$0")/calls.txt"
echo 'Epoch 01/01 | loss 0.3 | acc 0.9 | test_acc 0.91 | time 0.4s | 1000 img/s'
"#;

/// `--dry-run` (cuda-emu): every step runs and reports, once, at a size
/// the emulator finishes: one training step of 4 images with 16 test
/// images, the baseline (which cannot shorten its evaluation) on the CPU,
/// one round, every bench at batch 4.
#[test]
fn a_dry_run_runs_every_step_once_and_small() {
    let bundle = fake_bundle();
    let put = |path: &str, text: &str| put(bundle.path(), path, text);
    put("bin/trainer", NOTING_TRAINER);
    put("baseline/bin/trainer", NOTING_TRAINER);
    put(
        "benches/cnn_layers",
        "#!/bin/sh\necho \"$*\" >>\"$(dirname \"$0\")/calls.txt\"\necho '  sum 0.017 0.015'\n",
    );
    let out = start(bundle.path(), &["--dry-run"])
        .wait_with_output()
        .unwrap();
    let summary = fs::read_to_string(bundle.path().join("logs/summary.txt")).unwrap();
    assert!(summary.contains("dry run (batch 4, one step)"), "{summary}");
    let rows: Vec<&str> = summary.lines().skip(2).collect();
    for step in [
        "train_b512_r1",
        "train_unfused_bf16_b512_r1",
        "base_train_b512_r1",
        "train_tcp_ws2",
    ] {
        assert!(
            rows.iter()
                .any(|r| r.starts_with(&format!("{step} ")) && r.contains(" ok ")),
            "{step} did not run:\n{summary}\n{}",
            text(&out)
        );
    }
    assert!(!summary.contains("_r2 "), "a second round ran:\n{summary}");
    let calls = |path: &str| fs::read_to_string(bundle.path().join(path)).unwrap();
    let ours = calls("bin/calls.txt");
    assert_eq!(ours.lines().count(), 9 + 12 + 1, "{ours}");
    for call in ours.lines() {
        for flag in [
            "--batch-size 4",
            "--epochs 1",
            "--max-steps 1",
            "--eval-samples 16",
        ] {
            assert!(call.contains(flag), "{flag} missing in: {call}");
        }
    }
    let base = calls("baseline/bin/calls.txt");
    assert_eq!(base.lines().count(), 2, "{base}");
    for call in base.lines() {
        assert!(
            call.contains("--device cpu") && call.contains("--max-steps 1"),
            "{call}"
        );
        assert!(!call.contains("--eval-samples"), "{call}");
    }
    let benches = calls("benches/calls.txt");
    assert!(
        benches
            .lines()
            .all(|c| c.contains("--reps 1") && c.contains("--batch-size 4")),
        "{benches}"
    );
}
