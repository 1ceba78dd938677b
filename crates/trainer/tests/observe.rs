//! What a run shows of itself, end to end: a 2-epoch, 2-rank CPU run's
//! metrics rows (every rank's memory, CPU, null GPU and phase times) and
//! its TensorBoard event files, read by the real `tensorboard` package.
//!
//! The TensorBoard check needs Python with `tensorboard`:
//! `TENSORBOARD_PYTHON`, else `python3`. Without it the test says so and
//! passes, unless REQUIRE_TENSORBOARD=1 (as in CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{data_arg, dataset, python_with, run, stderr, trainer};

const EPOCHS: usize = 2;
const STEPS: usize = 6;
const LOG_EVERY: usize = 2;

/// The run's output directory, made once per test binary.
fn observed_run() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = run(trainer()
            .args(["--world-size", "2", "--threads", "1"])
            .args(["--epochs", &EPOCHS.to_string()])
            .args(["--max-steps", &STEPS.to_string()])
            .args(["--log-every", &LOG_EVERY.to_string()])
            .arg("--metrics")
            .arg(dir.path().join("run.jsonl"))
            .arg("--tensorboard")
            .arg(dir.path().join("tb"))
            .args(data_arg(dataset())));
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::write(dir.path().join("stderr.txt"), &out.stderr).unwrap();
        std::fs::write(dir.path().join("stdout.txt"), &out.stdout).unwrap();
        dir
    })
    .path()
}

fn metrics_rows() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(observed_run().join("run.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn metrics_rows_hold_every_ranks_monitoring_and_phase_times() {
    let rows = metrics_rows();
    assert_eq!(rows.len(), EPOCHS);
    for row in &rows {
        let ranks = row["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{row}");
        for (r, rank) in ranks.iter().enumerate() {
            assert_eq!(rank["rank"], r);
            let rss = &rank["rss_mib"];
            assert!(rss["min"].as_f64().unwrap() > 1.0, "{rank}");
            assert!(rss["max"].as_f64() >= rss["mean"].as_f64(), "{rank}");
            assert!(rank["cpu_percent"]["mean"].as_f64().unwrap() >= 0.0);
            assert!(rank["gpu"].is_null(), "a CPU run has no GPU numbers");
            assert!(rank["phase_s"]["forward"].as_f64().unwrap() > 0.0);
            assert!(rank["eval_s"].as_f64().unwrap() > 0.0);
        }
        assert_eq!(row["phase_s"], ranks[0]["phase_s"]);
        assert!(row.get("straggler").is_some(), "null or a rank: {row}");
    }
}

#[test]
fn the_log_says_who_started_the_ranks_once_and_how_to_load_the_model() {
    let err = std::fs::read_to_string(observed_run().join("stderr.txt")).unwrap();
    let out = std::fs::read_to_string(observed_run().join("stdout.txt")).unwrap();
    assert!(
        err.matches("no usable GPU").count() <= 1,
        "the note comes once per machine: {err}"
    );
    assert!(
        err.contains("world size 2 (ranks started by the built-in launcher)"),
        "{err}"
    );
    assert!(
        out.contains("no model saved (--checkpoint-dir DIR keeps it)"),
        "{out}"
    );
}

const READ_SCALARS: &str = "
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
for tag in sorted(acc.Tags()['scalars']):
    events = acc.Scalars(tag)
    print(tag, len(events), events[-1].step, events[-1].value)
";

#[test]
fn tensorboard_reads_loss_accuracy_and_monitoring_from_the_event_files() {
    let Some(python) = python_with("TENSORBOARD_PYTHON", "tensorboard", "REQUIRE_TENSORBOARD")
    else {
        return;
    };
    let tb: PathBuf = observed_run().join("tb");
    let out = Command::new(python)
        .args(["-c", READ_SCALARS])
        .arg(&tb)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let scalars: Vec<(&str, usize, u64, f64)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0],
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    let find = |tag: &str| {
        *scalars
            .iter()
            .find(|s| s.0 == tag)
            .unwrap_or_else(|| panic!("no {tag} in {text}"))
    };
    let (_, count, step, loss) = find("train/loss");
    assert_eq!(count, EPOCHS * STEPS / LOG_EVERY);
    assert_eq!(step, (EPOCHS * STEPS) as u64);
    assert!(loss.is_finite() && loss > 0.0);
    let (_, count, _, accuracy) = find("train/accuracy");
    assert_eq!(count, EPOCHS * STEPS / LOG_EVERY);
    assert!((0.0..=1.0).contains(&accuracy));
    let rows = metrics_rows();
    let (_, count, step, test_accuracy) = find("test/accuracy");
    assert_eq!((count, step), (EPOCHS, (EPOCHS * STEPS) as u64));
    let expected = rows[EPOCHS - 1]["test_acc"].as_f64().unwrap();
    assert!(
        (test_accuracy - expected).abs() < 1e-6,
        "{test_accuracy} vs {expected}"
    );
    for tag in [
        "epoch/train_loss",
        "epoch/img_per_s",
        "monitor/rank0/rss_mib_max",
        "monitor/rank1/cpu_percent_mean",
        "time/rank1/allreduce_wait_s",
        "time/rank0/eval_s",
    ] {
        assert_eq!(find(tag).1, EPOCHS, "{tag}");
    }
    assert!(!text.contains("gpu_"), "no GPU here: {text}");
}

#[test]
fn plot_draws_the_runs_curves_into_a_png() {
    let png = observed_run().join("curves.png");
    let out = run(trainer()
        .arg("plot")
        .arg(observed_run().join("run.jsonl"))
        .arg("-o")
        .arg(&png));
    if !out.status.success() {
        // No font installed: the one acceptable failure, and it says what to install.
        assert!(
            stderr(&out).contains("fonts-dejavu-core"),
            "{}",
            stderr(&out)
        );
        return;
    }
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(bytes[..8], *b"\x89PNG\r\n\x1a\n");
    let size = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((size(16), size(20)), (1500, 480));
    let missing = run(trainer()
        .arg("plot")
        .arg(observed_run().join("nothing.jsonl")));
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("nothing.jsonl"),
        "{}",
        stderr(&missing)
    );
}

/// A log on a full disk loses the epoch lines: the run goes on (its
/// checkpoints and metrics file are what count) but says so once, where a
/// reader that left (EPIPE) is silence by choice.
#[test]
fn epoch_lines_lost_to_a_full_disk_are_said_once() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let out = run(trainer()
        .args(["--model", "toy", "--epochs", "2", "--samples", "256"])
        .stdout(full));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let warning = "stdout: No space left on device: epoch lines are being lost";
    assert_eq!(err.matches(warning).count(), 1, "{err}");
}
