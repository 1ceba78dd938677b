//! How an epoch is reported: the console line and the metrics file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::model::Metric;
use crate::monitor::{GpuUsage, Straggler, Summary};
use crate::phases::{Phase, PhaseSeconds};
use crate::report::recovery::RecoveryEvent;
use crate::train::EpochReport;

/// The epoch line, in the spirit of the reference script.
/// A model without a metric leaves its two columns out; one that is not
/// the image classifier counts samples instead of images. A metric with
/// nothing to measure it on (no test ratings) reads `-`, as the metrics
/// file's `null`.
pub fn epoch_line(r: &EpochReport) -> String {
    let value = |v: f64| {
        if v.is_finite() {
            format!("{v:.4}")
        } else {
            "-".to_string()
        }
    };
    let metric = match r.metric.name() {
        Some(name) => format!(
            " | {name} {} | test_{name} {}",
            value(r.accuracy),
            value(r.test_accuracy)
        ),
        None => String::new(),
    };
    let unit = if r.metric == Metric::Accuracy {
        "img/s"
    } else {
        "samples/s"
    };
    format!(
        "Epoch {:02}/{:02} | loss {:.4}{metric} | time {:.1}s | {:.0} {unit}",
        r.epoch,
        r.epochs,
        r.loss,
        r.train_seconds,
        r.images_per_second()
    )
}

/// One JSON object per epoch, one per line.
#[derive(Serialize)]
struct Row<'a> {
    epoch: usize,
    loss: f64,
    /// The model's metric, train and test: `acc`/`test_acc`,
    /// `rmse`/`test_rmse`, or nothing; `null` where there was nothing to
    /// measure it on.
    #[serde(flatten)]
    metric: BTreeMap<String, Option<f64>>,
    time_s: f64,
    img_per_s: f64,
    #[serde(flatten)]
    shape: Shape<'a>,
    /// Rank 0's training seconds per step phase (see [`Phase`]).
    phase_s: BTreeMap<&'static str, f64>,
    /// Bytes rank 0 sent per optimizer step averaging gradients (a ring
    /// all-reduce's: `2 (world - 1) / world` of what each collective
    /// carries; 0 with one replica).
    grad_bytes_per_step: f64,
    /// Every rank, in rank order.
    ranks: Vec<RankRow>,
    /// The rank more than 10% behind the median busy time, if any.
    straggler: Option<Straggler>,
}

/// The run's shape in a [`Row`], as keys of the row itself.
#[derive(Serialize)]
struct Shape<'a> {
    steps: usize,
    images: u64,
    world_size: usize,
    device: &'a str,
}

/// One rank's epoch in a [`Row`]; `null`: not measured.
#[derive(Serialize)]
struct RankRow {
    rank: usize,
    rss_mib: Option<Summary>,
    cpu_percent: Option<Summary>,
    gpu: Option<GpuUsage>,
    phase_s: BTreeMap<&'static str, f64>,
    eval_s: f64,
    grad_bytes_per_step: f64,
}

/// A report's metric under its own name (see [`Row::metric`]).
fn metric_columns(r: &EpochReport) -> BTreeMap<String, Option<f64>> {
    let Some(name) = r.metric.name() else {
        return BTreeMap::new();
    };
    let measured = |v: f64| v.is_finite().then_some(v);
    BTreeMap::from([
        (name.to_string(), measured(r.accuracy)),
        (format!("test_{name}"), measured(r.test_accuracy)),
    ])
}

fn phase_map(phases: &PhaseSeconds) -> BTreeMap<&'static str, f64> {
    Phase::ALL
        .iter()
        .map(|&p| (p.name(), phases.get(p)))
        .collect()
}

/// A JSON-lines metrics file, flushed after every epoch so that a run that
/// dies keeps the epochs it finished.
pub struct MetricsFile {
    path: PathBuf,
    out: BufWriter<File>,
    world_size: usize,
    device: String,
}

impl MetricsFile {
    pub fn create(path: &Path, world_size: usize, device: String) -> anyhow::Result<Self> {
        Self::open(path, false, world_size, device)
    }

    /// Opens an existing file to add rows to (a resumed run), or creates it.
    pub fn append_to(path: &Path, world_size: usize, device: String) -> anyhow::Result<Self> {
        Self::open(path, true, world_size, device)
    }

    fn open(path: &Path, append: bool, world_size: usize, device: String) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file = File::options()
            .read(append)
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .with_context(|| format!("opening the metrics file {}", path.display()))?;
        let mut out = BufWriter::new(file);
        if append {
            start_on_a_fresh_line(&mut out, path)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            out,
            world_size,
            device,
        })
    }

    pub fn append(&mut self, r: &EpochReport) -> anyhow::Result<()> {
        let row = Row {
            epoch: r.epoch,
            loss: r.loss,
            metric: metric_columns(r),
            time_s: r.train_seconds,
            img_per_s: r.images_per_second(),
            shape: Shape {
                steps: r.steps,
                images: r.images,
                world_size: self.world_size,
                device: &self.device,
            },
            phase_s: phase_map(&r.ranks[0].phases),
            grad_bytes_per_step: r.ranks[0].grad_bytes_per_step,
            ranks: r
                .ranks
                .iter()
                .enumerate()
                .map(|(rank, s)| RankRow {
                    rank,
                    rss_mib: s.usage.rss_mib,
                    cpu_percent: s.usage.cpu_percent,
                    gpu: s.usage.gpu,
                    phase_s: phase_map(&s.phases),
                    eval_s: s.eval_seconds,
                    grad_bytes_per_step: s.grad_bytes_per_step,
                })
                .collect(),
            straggler: r.straggler,
        };
        write_row(&mut self.out, &self.path, &row)
    }

    /// Adds a live recovery's row (`"event": "live_recovery"`), between
    /// the epochs' rows.
    pub fn event(&mut self, event: &RecoveryEvent) -> anyhow::Result<()> {
        write_row(&mut self.out, &self.path, event)
    }
}

/// One JSON row and its newline into the file at `path`, flushed: a run
/// that dies keeps it.
fn write_row(out: &mut BufWriter<File>, path: &Path, row: &impl Serialize) -> anyhow::Result<()> {
    let write = |out: &mut BufWriter<File>| -> std::io::Result<()> {
        serde_json::to_writer(&mut *out, row)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    write(out).with_context(|| format!("writing {}", path.display()))
}

/// A run that died mid-write (a full disk, a quota) may have left a row
/// without its newline; the next row must not be glued onto it, or the
/// fragment would take a good row down with it. `trainer plot` skips the
/// fragment itself.
fn start_on_a_fresh_line(out: &mut BufWriter<File>, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = out.get_ref().metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8];
    out.get_ref().read_exact_at(&mut last, len - 1)?;
    if last[0] != b'\n' {
        tell!(
            "note: {} ends in an incomplete row (a write cut short): the new rows start on a line of their own",
            path.display()
        );
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::{RankStats, Usage};

    fn report() -> EpochReport {
        let ranks = vec![
            RankStats {
                phases: PhaseSeconds([0.5, 20.0, 22.0, 1.5, 1.9, 0.0]),
                ..RankStats::default()
            },
            RankStats {
                usage: Usage {
                    rss_mib: Some(Summary {
                        min: 300.0,
                        mean: 310.0,
                        max: 320.0,
                    }),
                    ..Usage::default()
                },
                phases: PhaseSeconds([0.5, 30.0, 22.0, 0.1, 1.9, 0.0]),
                eval_seconds: 0.25,
                grad_bytes_per_step: 2.4e6,
            },
        ];
        EpochReport {
            epoch: 1,
            epochs: 5,
            loss: 0.51234,
            metric: Metric::Accuracy,
            accuracy: 0.81234,
            test_accuracy: 0.874,
            train_seconds: 45.94,
            steps: 938,
            images: 60000,
            global_step: 938,
            straggler: Straggler::find(&ranks, 1),
            ranks,
        }
    }

    #[test]
    fn epoch_line_has_the_reference_layout() {
        assert_eq!(
            epoch_line(&report()),
            "Epoch 01/05 | loss 0.5123 | acc 0.8123 | test_acc 0.8740 | time 45.9s | 1306 img/s"
        );
        let toy = EpochReport {
            metric: Metric::None,
            accuracy: f64::NAN,
            test_accuracy: f64::NAN,
            ..report()
        };
        assert_eq!(
            epoch_line(&toy),
            "Epoch 01/05 | loss 0.5123 | time 45.9s | 1306 samples/s"
        );
    }

    #[test]
    fn metrics_file_has_one_json_object_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/metrics.jsonl");
        let mut file = MetricsFile::create(&path, 2, "cpu".into()).unwrap();
        file.append(&report()).unwrap();
        file.append(&EpochReport {
            epoch: 2,
            ..report()
        })
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1]["epoch"], 2);
        assert_eq!(rows[0]["world_size"], 2);
        assert_eq!(rows[0]["test_acc"], 0.874);
        assert_eq!(rows[0]["phase_s"]["backward"], 22.0);
        assert_eq!(rows[0]["phase_s"]["allreduce_wait"], 1.5);
        let ranks = rows[0]["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2);
        assert_eq!(ranks[0]["rss_mib"], serde_json::Value::Null);
        assert_eq!(ranks[0]["gpu"], serde_json::Value::Null);
        assert_eq!(ranks[1]["rank"], 1);
        assert_eq!(ranks[1]["rss_mib"]["max"], 320.0);
        assert_eq!(ranks[1]["phase_s"]["forward"], 30.0);
        assert_eq!(ranks[1]["eval_s"], 0.25);
        assert_eq!(rows[0]["straggler"]["rank"], 1);
    }

    /// A resumed run after a torn write: the fragment keeps its own line
    /// and every new row parses.
    #[test]
    fn appending_after_a_torn_row_starts_a_new_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let fragment = r#"{"epoch":4,"loss":0.5,"time_s":0.001"#;
        std::fs::write(&path, format!("{{\"epoch\":3}}\n{fragment}")).unwrap();
        let mut file = MetricsFile::append_to(&path, 2, "cpu".into()).unwrap();
        file.append(&report()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], fragment);
        let row: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(row["epoch"], 1);
        // A file that ends well gets no empty line.
        MetricsFile::append_to(&path, 2, "cpu".into())
            .unwrap()
            .append(&report())
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(!text.contains("\n\n"), "{text}");
    }

    /// Each model's metric under its own name: an RMSE is not an accuracy,
    /// a test RMSE over no test ratings is `null`, the toy model has none.
    #[test]
    fn metrics_file_names_each_models_metric() {
        let row = |r: &EpochReport| -> serde_json::Value {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.jsonl");
            MetricsFile::create(&path, 2, "cpu".into())
                .unwrap()
                .append(r)
                .unwrap();
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        let recsys = row(&EpochReport {
            metric: Metric::Rmse,
            accuracy: 0.93,
            test_accuracy: f64::NAN,
            ..report()
        });
        assert_eq!(recsys["rmse"], 0.93);
        assert_eq!(recsys["test_rmse"], serde_json::Value::Null);
        let line = epoch_line(&EpochReport {
            metric: Metric::Rmse,
            accuracy: 0.93,
            test_accuracy: f64::NAN,
            ..report()
        });
        assert!(line.contains("| rmse 0.9300 | test_rmse - |"), "{line}");
        assert!(recsys.get("acc").is_none() && recsys.get("test_acc").is_none());
        let toy = row(&EpochReport {
            metric: Metric::None,
            ..report()
        });
        for key in ["acc", "test_acc", "rmse", "test_rmse"] {
            assert!(toy.get(key).is_none(), "{key}: {toy}");
        }
    }
}
