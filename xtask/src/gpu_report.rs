//! `cargo xtask gpu-report LOGS`: the tables of docs/gpu.md from the logs of
//! one device-bundle run (the `logs/` folder `run.sh` writes, or the
//! `--archive` it packs), so that a session with a GPU spends its time on
//! the numbers rather than on copying them out of twenty files.
//!
//! Prints Markdown: images/s per batch size for ours and the best PyTorch
//! (float32, TF32, bf16; the median of the repeated runs and their spread),
//! docs/gpu.md's goal table scored, the 5-epoch accuracies, PyTorch's every
//! case, each lever and the baseline against its default with the
//! prediction, the `cnn_layers` tables, the per-kernel device times and
//! Nsight Compute's sections, and each predicted kernel against its
//! prediction. A step that did not run leaves its cells at "–".

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

mod layers;
mod ncu;
mod predictions;
mod runs;

use runs::{Runs, Samples, grouped};

#[derive(clap::Args)]
pub struct Args {
    /// The logs folder of `run.sh` (`--logs`), or the `.tgz` of `--archive`.
    logs: PathBuf,
}

const BATCHES: [u32; 3] = [64, 256, 512];
const PRECISIONS: [(&str, &str); 3] = [("f32", "float32"), ("tf32", "TF32"), ("bf16", "bf16")];

/// docs/gpu.md's goal table: img/s at batch 64 per precision.
const GOAL_B64: [f64; 3] = [150_000.0, 180_000.0, 200_000.0];
/// docs/gpu.md's goal table: ours ÷ the best PyTorch of the same precision
/// at batch 256 and 512.
const GOAL_TIMES_TORCH: f64 = 1.5;
/// docs/gpu.md's goal for bf16's test accuracy after 5 epochs.
const GOAL_BF16_ACCURACY: f64 = 0.91;

pub fn run(args: Args) -> anyhow::Result<()> {
    let unpacked;
    let dir = if args.logs.is_dir() {
        args.logs.clone()
    } else {
        unpacked = tempfile::tempdir()?;
        let status = Command::new("tar")
            .arg("xzf")
            .arg(&args.logs)
            .arg("-C")
            .arg(unpacked.path())
            .status()
            .context("running tar")?;
        if !status.success() {
            bail!(
                "{}: not a logs folder, and tar could not unpack it",
                args.logs.display()
            );
        }
        find_logs(unpacked.path())?
    };
    print!("{}", report(&dir));
    Ok(())
}

/// The folder of step logs under `root`: `root` itself or one folder down
/// (the archive packs `logs/`).
fn find_logs(root: &Path) -> anyhow::Result<PathBuf> {
    let has_logs = |dir: &Path| {
        fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "log"))
        })
    };
    if has_logs(root) {
        return Ok(root.to_path_buf());
    }
    for entry in fs::read_dir(root)? {
        let path = entry?.path();
        if has_logs(&path) {
            return Ok(path);
        }
    }
    bail!(
        "no step logs (*.log) in {}: is this run.sh's logs?",
        root.display()
    )
}

/// The whole report for the logs in `dir`.
fn report(dir: &Path) -> String {
    let runs = Runs::read(dir);
    let mut out = String::new();
    // run.sh's summary says when the logs are a dry run's (cuda-emu, batch
    // 4, one step): its figures prove that the steps ran, nothing more.
    let summary = fs::read_to_string(dir.join("summary.txt")).unwrap_or_default();
    if summary
        .lines()
        .next()
        .is_some_and(|l| l.contains("dry run"))
    {
        out.push_str(
            "**A dry run's logs** (run.sh --dry-run: cuda-emu, batch 4, one step): the figures below say that each step ran, not how fast.\n\n",
        );
    }
    out.push_str(&throughput(&runs));
    out.push_str(&goals(&runs));
    out.push_str(&accuracy(&runs));
    out.push_str(&torch_cases(&runs));
    out.push_str(&levers(&runs));
    out.push_str(&layers::tables(dir));
    let read = |name: &str| fs::read_to_string(dir.join(format!("{name}.log"))).ok();
    for (name, title) in [
        ("ncu_kernels", "this build, float32"),
        ("ncu_kernels_tf32", "this build, `--tf32`"),
        ("ncu_kernels_bf16", "this build, `--bf16`"),
        ("base_ncu_kernels", "the baseline build"),
    ] {
        if let Some(kernels) = read(name).map(|log| ncu::kernel_times(&log)) {
            out.push_str(&ncu::kernel_table(title, &kernels));
        }
    }
    out.push_str(&predictions::predictions(&read));
    for (name, title) in ncu::DETAIL_LOGS {
        if let Some(log) = read(name) {
            out.push_str(&ncu::detail_table(title, &log));
            out.push_str(&ncu::metrics_table(title, &log));
        }
    }
    out
}

/// Ours and the best PyTorch per batch and precision.
fn throughput(runs: &Runs) -> String {
    let mut out = String::from(
        "img/s: the median of the repeated runs, ± half their range (runs); PyTorch's best way \
         of stepping in brackets.\n\n| batch | ours | ours `--tf32` | ours `--bf16` | PyTorch | \
         PyTorch TF32 | PyTorch AMP bf16 |\n|---|---|---|---|---|---|---|\n",
    );
    for b in BATCHES {
        let ours = PRECISIONS.map(|(p, _)| runs.ours(p, b).cell());
        let torch = PRECISIONS.map(|(p, _)| match runs.best_torch(p, b) {
            Some((how, s)) => format!("{} ({how})", s.cell()),
            None => "–".into(),
        });
        out.push_str(&format!(
            "| {b} | {} | {} |\n",
            ours.join(" | "),
            torch.join(" | ")
        ));
    }
    out.push('\n');
    out
}

/// docs/gpu.md's goal table, scored.
fn goals(runs: &Runs) -> String {
    let verdict = |met: bool| if met { "met" } else { "not met" };
    let mut out = String::from("| goal | float32 | TF32 | bf16 |\n|---|---|---|---|\n");
    let b64: Vec<String> = PRECISIONS
        .iter()
        .zip(GOAL_B64)
        .map(|((p, _), goal)| match runs.ours(p, 64).median() {
            Some(m) => format!("{} ≥ {}: {}", grouped(m), grouped(goal), verdict(m >= goal)),
            None => format!("– (goal {})", grouped(goal)),
        })
        .collect();
    out.push_str(&format!("| batch 64, img/s | {} |\n", b64.join(" | ")));
    for b in [256, 512] {
        let cells: Vec<String> = PRECISIONS
            .iter()
            .map(|(p, _)| {
                let ours = runs.ours(p, b).median();
                let torch = runs.best_torch(p, b).and_then(|(_, s)| s.median());
                match ours.zip(torch) {
                    Some((o, t)) => {
                        format!("{:.2}×: {}", o / t, verdict(o / t >= GOAL_TIMES_TORCH))
                    }
                    None => "–".into(),
                }
            })
            .collect();
        out.push_str(&format!(
            "| batch {b}, ours ÷ best PyTorch (≥ {GOAL_TIMES_TORCH}×) | {} |\n",
            cells.join(" | ")
        ));
    }
    out.push('\n');
    out
}

/// The test accuracy of each 5-epoch run, bf16's against its goal.
fn accuracy(runs: &Runs) -> String {
    if runs.accuracy.is_empty() {
        return "Test accuracy after 5 epochs: no 5-epoch run in these logs.\n\n".into();
    }
    let cells: Vec<String> = PRECISIONS
        .iter()
        .map(|(p, title)| match runs.accuracy.get(*p) {
            Some(a) if *p == "bf16" => format!(
                "{title} {a:.4} (goal ≥ {GOAL_BF16_ACCURACY}: {})",
                if *a >= GOAL_BF16_ACCURACY {
                    "met"
                } else {
                    "not met"
                }
            ),
            Some(a) => format!("{title} {a:.4}"),
            None => format!("{title} –"),
        })
        .collect();
    format!(
        "Test accuracy after 5 epochs at batch 64: {}.\n\n",
        cells.join(", ")
    )
}

/// Every PyTorch case: precision and batch down, the way of stepping across.
fn torch_cases(runs: &Runs) -> String {
    const HOWS: [&str; 5] = ["tutorial", "adam", "fused", "graph", "compile"];
    let mut rows = String::new();
    for b in BATCHES {
        for (p, title) in PRECISIONS {
            let cells = HOWS.map(|how| {
                runs.torch
                    .get(&(p.to_owned(), how.to_owned(), b))
                    .map_or("–".into(), Samples::cell)
            });
            if cells.iter().any(|c| c != "–") {
                rows.push_str(&format!("| {b} | {title} | {} |\n", cells.join(" | ")));
            }
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "PyTorch, img/s:\n\n| batch | precision | DataLoader loop | Adam | fused Adam | CUDA graph | \
         torch.compile |\n|---|---|---|---|---|---|---|\n{rows}\n"
    )
}

/// A lever (or the baseline build) beside the default it changes: `(lever,
/// default, what, predicted lever ÷ default)`.
type Lever = (&'static str, &'static str, &'static str, Option<(f64, f64)>);

/// The predictions: cp.async staging 1–3 % slower in float32, 4–8 % in
/// TF32 ("cp.async staging"); the three fusions together about 3.5 % of
/// the step at batch 64 and 512 (conv2's pool 2–2.5 %, conv1's ReLU about
/// 1 %, fc1's ReLU 0.5 %), so `--no-fusion` 2–5 % slower; none was written
/// for the wide tiles' whole step.
const LEVERS: [Lever; 7] = [
    (
        "cp_async",
        "f32",
        "`--gemm-staging cp-async`, float32",
        Some((0.97, 0.99)),
    ),
    (
        "cp_async_tf32",
        "tf32",
        "`--gemm-staging cp-async`, TF32",
        Some((0.92, 0.96)),
    ),
    ("wide", "f32", "`--fp32-tile wide`, float32", None),
    ("wide_tf32", "tf32", "`--fp32-tile wide`, TF32", None),
    (
        "unfused",
        "f32",
        "`--no-fusion`, float32",
        Some((0.95, 0.98)),
    ),
    (
        "unfused_bf16",
        "bf16",
        "`--no-fusion`, bf16",
        Some((0.95, 0.98)),
    ),
    ("base", "f32", "the baseline build (float32)", None),
];

fn levers(runs: &Runs) -> String {
    let mut rows = String::new();
    for (lever, default, what, predicted) in LEVERS {
        for b in BATCHES {
            let (l, d) = (runs.ours(lever, b), runs.ours(default, b));
            let Some(lm) = l.median() else {
                continue;
            };
            let ratio = d.median().map(|dm| lm / dm);
            let (pred, verdict) = match (predicted, ratio) {
                (Some((lo, hi)), Some(r)) => (
                    format!("{lo:.2}–{hi:.2}×"),
                    if r < lo {
                        "below"
                    } else if r > hi {
                        "above"
                    } else {
                        "inside"
                    },
                ),
                (Some((lo, hi)), None) => (format!("{lo:.2}–{hi:.2}×"), "–"),
                (None, _) => ("–".into(), "–"),
            };
            rows.push_str(&format!(
                "| {what} | {b} | {} | {} | {} | {pred} | {verdict} |\n",
                d.cell(),
                l.cell(),
                ratio.map_or("–".into(), |r| format!("{r:.3}×"))
            ));
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "Levers against their default, img/s (lever ÷ default; predictions from docs/gpu.md):\n\n\
         | lever | batch | default | lever | lever ÷ default | predicted | verdict |\n\
         |---|---|---|---|---|---|---|\n{rows}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_found_in_the_folder_or_one_down() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find_logs(dir.path()).is_err());
        fs::create_dir(dir.path().join("logs")).unwrap();
        fs::write(dir.path().join("logs/train_b64_r1.log"), "").unwrap();
        assert_eq!(find_logs(dir.path()).unwrap(), dir.path().join("logs"));
    }
}
