//! The img/s samples of one archive: the trainer's runs by configuration
//! and batch size (`train_tf32_b512_r2.log`: TF32, batch 512, round 2; the
//! 2026-11-27 names without a round, `train.log` for float32 at batch 64,
//! count as one sample), and PyTorch's cases (`torch_suite.log`, one line a
//! round; the 2026-11-27 `torch_gpu*_b*.log`, one line each).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Repeated measurements of one rate.
#[derive(Clone, Debug, Default)]
pub(super) struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    pub fn median(&self) -> Option<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(v[n / 2]),
            _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
        }
    }

    /// Half the range as a share of the median, in %: the spread shown.
    pub fn spread(&self) -> Option<f64> {
        let (lo, hi) = self
            .0
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        self.median().map(|m| 50.0 * (hi - lo) / m)
    }

    /// `107,470`, or `107,470 ±0.4% (3)` when repeated; `–` when empty.
    pub fn cell(&self) -> String {
        match (self.median(), self.0.len()) {
            (None, _) => "–".into(),
            (Some(m), 1) => grouped(m),
            (Some(m), n) => format!("{} ±{:.1}% ({n})", grouped(m), self.spread().unwrap_or(0.0)),
        }
    }
}

/// A rate with thousands separators.
pub(super) fn grouped(rate: f64) -> String {
    let digits = format!("{rate:.0}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && c != '-' && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Everything timed in one archive.
#[derive(Default)]
pub(super) struct Runs {
    /// The trainer, by (configuration, batch): `f32`, `tf32`, `bf16`, a
    /// lever (`cp_async`, `wide_tf32`, `unfused`, ...) or `base`.
    pub ours: BTreeMap<(String, u32), Samples>,
    /// Test accuracy after the last epoch of 5-epoch runs, by configuration.
    pub accuracy: BTreeMap<String, f64>,
    /// PyTorch, by (precision, how it steps, batch): `adam`, `fused`,
    /// `graph`, `compile`, or `tutorial` (the DataLoader loop).
    pub torch: BTreeMap<(String, String, u32), Samples>,
}

impl Runs {
    pub fn read(dir: &Path) -> Self {
        let mut runs = Self::default();
        let Ok(entries) = fs::read_dir(dir) else {
            return runs;
        };
        let mut names: Vec<_> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".log").map(str::to_owned)
            })
            .collect();
        names.sort();
        for name in names {
            let Ok(log) = fs::read_to_string(dir.join(format!("{name}.log"))) else {
                continue;
            };
            if name == "torch_suite" {
                runs.torch_suite(&log);
            } else if let Some(key) = torch_step(&name) {
                if let Some(rate) = images_per_second(&log) {
                    runs.torch.entry(key).or_default().push(rate);
                }
            } else if let Some((config, batch)) = trainer_step(&name) {
                if let Some(rate) = images_per_second(&log) {
                    runs.ours
                        .entry((config.clone(), batch))
                        .or_default()
                        .push(rate);
                }
                if let Some(acc) = five_epoch_accuracy(&log) {
                    runs.accuracy.entry(config).or_insert(acc);
                }
            }
        }
        runs
    }

    pub fn ours(&self, config: &str, batch: u32) -> Samples {
        self.ours
            .get(&(config.to_owned(), batch))
            .cloned()
            .unwrap_or_default()
    }

    /// PyTorch's fastest way at `precision` and `batch` (by median), the
    /// seeds' DataLoader loop left out, and its name.
    pub fn best_torch(&self, precision: &str, batch: u32) -> Option<(&str, &Samples)> {
        self.torch
            .iter()
            .filter(|((p, how, b), _)| p == precision && *b == batch && how != "tutorial")
            .filter_map(|((_, how, _), s)| Some((how.as_str(), s, s.median()?)))
            .max_by(|a, b| a.2.total_cmp(&b.2))
            .map(|(how, s, _)| (how, s))
    }

    /// The lines of `gpu_suite.py`:
    /// `torch V on-device bf16 fused batch 512 rep 2: 301234 img/s (...)`.
    fn torch_suite(&mut self, log: &str) {
        for line in log.lines() {
            let Some(rest) = line.split(" on-device ").nth(1) else {
                continue;
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            let [precision, how, "batch", batch, "rep", _, rate, "img/s", ..] = words[..] else {
                continue;
            };
            let (Ok(batch), Ok(rate)) = (batch.parse(), rate.parse()) else {
                continue;
            };
            self.torch
                .entry((precision.to_owned(), how.to_owned(), batch))
                .or_default()
                .push(rate);
        }
    }
}

/// `torch_gpu_tf32_b256` → (tf32, adam, 256); `torch_ref_b64` → (f32,
/// tutorial, 64): the 2026-11-27 bundle's one-case PyTorch steps.
fn torch_step(name: &str) -> Option<(String, String, u32)> {
    let (rest, batch) = name.rsplit_once("_b")?;
    let batch = batch.parse().ok()?;
    let (how, precision) = match rest {
        "torch_ref" => ("tutorial", "f32"),
        "torch_gpu" => ("adam", "f32"),
        other => ("adam", other.strip_prefix("torch_gpu_")?),
    };
    Some((precision.to_owned(), how.to_owned(), batch))
}

/// `train_cp_async_tf32_b512_r2` → (cp_async_tf32, 512); `train` →
/// (f32, 64); `base_train_b64` → (base, 64). Not the other `train_*` steps
/// (`train_nccl`, `train_tcp_ws2`): they time something else.
fn trainer_step(name: &str) -> Option<(String, u32)> {
    let name = match name.rsplit_once("_r") {
        Some((head, round)) if !round.is_empty() && round.bytes().all(|b| b.is_ascii_digit()) => {
            head
        }
        _ => name,
    };
    let (name, batch) = match name.rsplit_once("_b") {
        Some((head, b)) if b.parse::<u32>().is_ok() => (head, b.parse().ok()?),
        _ => (name, 64),
    };
    let config = match name {
        "base_train" => "base",
        "train" => "f32",
        other => other.strip_prefix("train_")?,
    };
    const CONFIGS: [&str; 10] = [
        "tf32",
        "bf16",
        "cp_async",
        "cp_async_tf32",
        "wide",
        "wide_tf32",
        "unfused",
        "unfused_bf16",
        "f32",
        "base",
    ];
    CONFIGS
        .contains(&config)
        .then(|| (config.to_owned(), batch))
}

/// The last `N img/s` figure of a trainer or PyTorch log.
pub(super) fn images_per_second(log: &str) -> Option<f64> {
    log.lines().rev().find_map(|line| {
        let before = line
            .split(" img/s")
            .next()
            .filter(|b| b.len() < line.len())?;
        before.rsplit([' ', '|']).next()?.trim().parse().ok()
    })
}

/// `test_acc` of the `Epoch 05/05` line, if the run trained 5 epochs.
fn five_epoch_accuracy(log: &str) -> Option<f64> {
    let line = log.lines().rev().find(|l| l.contains("Epoch 05/05"))?;
    line.split("test_acc ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_give_configuration_and_batch() {
        let t = |n: &str| trainer_step(n).map(|(c, b)| format!("{c} {b}"));
        assert_eq!(t("train").as_deref(), Some("f32 64"));
        assert_eq!(t("train_b512_r3").as_deref(), Some("f32 512"));
        assert_eq!(
            t("train_cp_async_tf32_b64_r1").as_deref(),
            Some("cp_async_tf32 64")
        );
        assert_eq!(t("base_train_b512").as_deref(), Some("base 512"));
        assert_eq!(t("train_tcp_ws2"), None);
        assert_eq!(t("train_nccl"), None);
        let p = torch_step("torch_gpu_bf16_b256").unwrap();
        assert_eq!((p.0.as_str(), p.1.as_str(), p.2), ("bf16", "adam", 256));
    }

    #[test]
    fn samples_show_median_and_spread() {
        let mut s = Samples::default();
        assert_eq!(s.cell(), "–");
        s.push(100_000.0);
        assert_eq!(s.cell(), "100,000");
        s.push(104_000.0);
        s.push(102_000.0);
        assert_eq!(s.cell(), "102,000 ±2.0% (3)");
    }

    #[test]
    fn the_suite_lines_are_cases_and_rounds() {
        let mut runs = Runs::default();
        runs.torch_suite(
            "# torch 2.11 on H200\n\
             torch 2.11.0 on-device bf16 fused batch 512 rep 1: 300000 img/s (1.7 ms/step)\n\
             torch 2.11.0 on-device bf16 fused batch 512 rep 2: 310000 img/s (1.6 ms/step)\n\
             torch 2.11.0 on-device bf16 adam batch 512 rep 1: 200000 img/s (2.5 ms/step)\n\
             torch 2.11.0 on-device f32 compile batch 512: skipped, out of time (--budget 120)\n",
        );
        let (how, best) = runs.best_torch("bf16", 512).unwrap();
        assert_eq!((how, best.median()), ("fused", Some(305_000.0)));
        assert!(runs.best_torch("f32", 512).is_none());
    }
}
