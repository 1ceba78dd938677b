//! `cargo xtask gpu-report LOGS`: the tables of docs/gpu.md from the logs of
//! one device-bundle run (the `logs/` folder `run.sh` writes, or the
//! `--archive` it packs), so that a session with a GPU spends its time on
//! the numbers rather than on copying them out of twenty files.
//!
//! Prints Markdown: images/s per batch size for ours and PyTorch (float32,
//! TF32 and bf16), the three goals against them, the baseline build
//! beside this one, and the per-kernel device times Nsight Compute
//! measured. A step that did not run leaves its cells at "–".

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

mod ncu;

#[derive(clap::Args)]
pub struct Args {
    /// The logs folder of `run.sh` (`--logs`), or the `.tgz` of `--archive`.
    logs: PathBuf,
    /// The GPU's float32 peak in TFLOP/s, for the FLOP floor (67: the H100
    /// SXM datasheet; an H200 is the same chip).
    #[arg(long, default_value_t = 67.0)]
    peak_tflops: f64,
}

/// Forward and backward of CNN_MNIST per image (the figure).
const FLOP_PER_IMAGE: f64 = 72e6;
const BATCHES: [u32; 3] = [64, 256, 512];

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
    print!("{}", report(&dir, args.peak_tflops));
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
fn report(dir: &Path, peak_tflops: f64) -> String {
    let read = |name: &str| fs::read_to_string(dir.join(format!("{name}.log"))).ok();
    let rate = |name: String| read(&name).and_then(|log| images_per_second(&log));
    let mut out = String::from(
        "| batch | ours | ours `--tf32` | ours `--bf16` | PyTorch (a) | PyTorch (b) | PyTorch (b) TF32 | PyTorch (b) AMP bf16 | FLOP floor |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let floor = peak_tflops * 1e12 / FLOP_PER_IMAGE;
    // Batch 64 is the full run's (`train`, `train_tf32`, `train_bf16`).
    let ours = |b: u32, precision: Precision| {
        let p = precision.suffix();
        rate(if b == 64 {
            format!("train{p}")
        } else {
            format!("train{p}_b{b}")
        })
    };
    for b in BATCHES {
        let cells = [
            ours(b, Precision::Fp32),
            ours(b, Precision::Tf32),
            ours(b, Precision::Bf16),
            rate(format!("torch_ref_b{b}")),
            rate(format!("torch_gpu_b{b}")),
            rate(format!("torch_gpu_tf32_b{b}")),
            rate(format!("torch_gpu_bf16_b{b}")),
            Some(floor),
        ];
        let cells: Vec<String> = cells.iter().map(|c| cell(*c)).collect();
        out.push_str(&format!("| {b} | {} |\n", cells.join(" | ")));
    }
    out.push_str(&format!(
        "\nFLOP floor: {peak_tflops} TFLOP/s float32 / {} MFLOP per image.\n\n",
        FLOP_PER_IMAGE / 1e6
    ));
    out.push_str(&goals(&ours, &rate, floor));
    out.push_str(&beside(&rate, &ours, "baseline", "base_train_b"));
    out.push_str(&beside(&rate, &ours, "`--no-fusion`", "train_unfused_b"));
    out.push_str(&variant(
        &rate,
        &ours,
        ("wide", "square tiles", "wide tiles"),
    ));
    let staging = ("cp_async", "register staging", "cp.async staging");
    out.push_str(&variant(&rate, &ours, staging));
    for (name, title) in [
        ("ncu_kernels", "this build, float32"),
        ("ncu_kernels_tf32", "this build, `--tf32`"),
        ("base_ncu_kernels", "the baseline build"),
    ] {
        if let Some(kernels) = read(name).map(|log| ncu::kernel_times(&log)) {
            out.push_str(&ncu::kernel_table(title, &kernels));
        }
    }
    for (name, title) in [
        ("ncu_detail_f32", "float32"),
        ("ncu_detail_tf32", "`--tf32`"),
        ("ncu_detail_bf16", "`--bf16`"),
        ("ncu_detail_wide", "float32, `--fp32-tile wide`"),
        ("ncu_detail_wide_tf32", "`--tf32 --fp32-tile wide`"),
        ("ncu_detail_cp_async", "float32, `--gemm-staging cp-async`"),
        (
            "ncu_detail_cp_async_tf32",
            "`--tf32 --gemm-staging cp-async`",
        ),
        ("ncu_detail_bias", "the bias gradients' two passes"),
    ] {
        if let Some(log) = read(name) {
            out.push_str(&ncu::detail_table(title, &log));
        }
    }
    out
}

/// The products' precision of a trainer run: its steps' names end in
/// `suffix()` (`train_tf32_b256`), PyTorch's `torch_gpu{suffix}_b…`.
#[derive(Clone, Copy)]
enum Precision {
    Fp32,
    Tf32,
    Bf16,
}

impl Precision {
    fn suffix(self) -> &'static str {
        match self {
            Self::Fp32 => "",
            Self::Tf32 => "_tf32",
            Self::Bf16 => "_bf16",
        }
    }
}

fn goals(
    ours: &dyn Fn(u32, Precision) -> Option<f64>,
    rate: &dyn Fn(String) -> Option<f64>,
    floor: f64,
) -> String {
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let best = |p: Precision| {
        [256, 512]
            .into_iter()
            .filter_map(|b| ours(b, p))
            .reduce(f64::max)
    };
    let times = |r: Option<f64>| r.map_or("–".to_string(), |r| format!("{r:.2}×"));
    let mut out = String::from("| goal | float32 | `--tf32` | `--bf16` |\n|---|---|---|---|\n");
    // Each goal's ratio for one precision, in the order of `GOALS`.
    let ratios = |p: Precision| {
        [
            ratio(ours(64, p), rate(format!("torch_gpu{}_b64", p.suffix()))),
            ratio(ours(64, p), rate("torch_ref_b64".into())),
            best(p).map(|r| floor / r),
        ]
    };
    let [fp32, tf32, bf16] = [Precision::Fp32, Precision::Tf32, Precision::Bf16].map(ratios);
    const GOALS: [&str; 3] = [
        "≥ 1.5× tuned PyTorch at batch 64 (same precision)",
        "≥ 10× the seeds' loop at batch 64",
        "FLOP floor ÷ ours at batch ≥ 256 (goal ≤ 4×)",
    ];
    for (i, goal) in GOALS.iter().enumerate() {
        out.push_str(&format!(
            "| {goal} | {} | {} | {} |\n",
            times(fp32[i]),
            times(tf32[i]),
            times(bf16[i])
        ));
    }
    out.push('\n');
    out
}

/// This build's float32 img/s beside another run's (`other`, logs
/// `{prefix}{batch}`) at batch 64 and 512: the baseline build, or this
/// build with `--no-fusion`; no table when the other did not run.
fn beside(
    rate: &dyn Fn(String) -> Option<f64>,
    ours: &dyn Fn(u32, Precision) -> Option<f64>,
    other: &str,
    prefix: &str,
) -> String {
    let rows: Vec<String> = [64, 512]
        .into_iter()
        .filter_map(|b| {
            let base = rate(format!("{prefix}{b}"))?;
            let this = ours(b, Precision::Fp32);
            let ratio = this.map_or("–".into(), |t| format!("{:.2}×", t / base));
            Some(format!(
                "| {b} | {} | {} | {ratio} |\n",
                cell(Some(base)),
                cell(this)
            ))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "| batch | {other} img/s | this build img/s | this ÷ {other} |\n|---|---|---|---|\n{}\n",
        rows.concat()
    )
}

/// Training img/s of the default build beside a variant of it (`--fp32-tile
/// wide`: `train_wide_b…`; `--gemm-staging cp-async`: `train_cp_async_b…`),
/// in either precision, where the variant was timed: `usual` and `variant`
/// name the two columns.
fn variant(
    rate: &dyn Fn(String) -> Option<f64>,
    ours: &dyn Fn(u32, Precision) -> Option<f64>,
    (step, usual, variant): (&str, &str, &str),
) -> String {
    let rows: Vec<String> = [64, 512]
        .into_iter()
        .filter_map(|b| {
            let other = rate(format!("train_{step}_b{b}"));
            let other_tf32 = rate(format!("train_{step}_tf32_b{b}"));
            other.or(other_tf32)?;
            let cells = [
                ours(b, Precision::Fp32),
                other,
                ours(b, Precision::Tf32),
                other_tf32,
            ]
            .map(cell);
            Some(format!("| {b} | {} |\n", cells.join(" | ")))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "| batch | {usual} | {variant} | {usual} `--tf32` | {variant} `--tf32` |\n|---|---|---|---|---|\n{}\n",
        rows.concat()
    )
}

/// The last `N img/s` figure of a trainer or PyTorch log.
fn images_per_second(log: &str) -> Option<f64> {
    log.lines().rev().find_map(|line| {
        let before = line
            .split(" img/s")
            .next()
            .filter(|b| b.len() < line.len())?;
        before.rsplit([' ', '|']).next()?.trim().parse().ok()
    })
}

/// A rate with thousands separators, or "–".
fn cell(rate: Option<f64>) -> String {
    let Some(rate) = rate else {
        return "–".to_string();
    };
    let digits = format!("{:.0}", rate);
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_the_last_trainer_or_pytorch_line() {
        let train = "Epoch 01/05 | loss 0.5 | time 0.9s | 65405 img/s\n\
                     Epoch 05/05 | loss 0.2 | time 0.9s | 65557 img/s\ntraining finished";
        assert_eq!(images_per_second(train), Some(65557.0));
        let torch = "torch 2.11.0 on-device H100 batch 64: 23439 img/s (2.73 ms/step)";
        assert_eq!(images_per_second(torch), Some(23439.0));
        assert_eq!(images_per_second("error: no GPU"), None);
    }

    #[test]
    fn the_report_fills_what_ran_and_dashes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| fs::write(dir.path().join(name), text).unwrap();
        write("train.log", "Epoch 05/05 | time 0.9s | 65557 img/s\n");
        write(
            "torch_ref_b64.log",
            "torch ... batch 64: 20266 img/s (3.16 ms/step)\n",
        );
        write(
            "torch_gpu_b64.log",
            "torch ... batch 64: 23439 img/s (2.73 ms/step)\n",
        );
        write("train_b512.log", "Epoch 01/01 | 83142 img/s\n");
        write("train_bf16.log", "Epoch 05/05 | 0.9s | 120000 img/s\n");
        write(
            "torch_gpu_bf16_b64.log",
            "torch ... bf16 batch 64: 40000 img/s (1.6 ms/step)\n",
        );
        write("base_train_b64.log", "Epoch 01/01 | 50000 img/s\n");
        write("train_unfused_b512.log", "Epoch 01/01 | 80000 img/s\n");
        write("train_wide_b512.log", "Epoch 01/01 | 90000 img/s\n");
        write("train_cp_async_tf32_b64.log", "Epoch 01/01 | 70000 img/s\n");
        let text = report(dir.path(), 67.0);
        assert!(
            text.contains("| 64 | 65,557 | – | 120,000 | 20,266 | 23,439 | – | 40,000 | 930,556 |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| ≥ 1.5× tuned PyTorch at batch 64 (same precision) | 2.80× | – | 3.00× |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| ≥ 10× the seeds' loop at batch 64 | 3.23× | – | 5.92× |"),
            "{text}"
        );
        assert!(
            text.contains("| FLOP floor ÷ ours at batch ≥ 256 (goal ≤ 4×) | 11.19× | – | – |"),
            "{text}"
        );
        assert!(text.contains("| 64 | 50,000 | 65,557 | 1.31× |"), "{text}");
        assert!(
            text.contains("| batch | `--no-fusion` img/s | this build img/s"),
            "{text}"
        );
        assert!(text.contains("| 512 | 80,000 | 83,142 | 1.04× |"), "{text}");
        assert!(text.contains("| 512 | 83,142 | 90,000 | – | – |"), "{text}");
        // No wide run at batch 64: no tiles row for it.
        assert!(!text.contains("| 64 | 65,557 | – | – | – |"), "{text}");
        assert!(
            text.contains("| batch | register staging | cp.async staging |"),
            "{text}"
        );
        assert!(text.contains("| 64 | 65,557 | – | – | 70,000 |"), "{text}");
        assert_eq!(find_logs(dir.path()).unwrap(), dir.path());
    }
}
