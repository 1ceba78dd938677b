//! `trainer plot run.jsonl -o curves.png`: a `--metrics` file's curves per
//! epoch (training loss, the model's metric train and test: accuracy or
//! RMSE, and samples/s) as one PNG.
//!
//! Text needs a TrueType font, read at run time: `--font FILE`, else DejaVu
//! Sans from Debian's `fonts-dejavu-core` (or the same file elsewhere). No
//! font is an error: curves without axis labels are not worth showing.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;
use plotters::prelude::*;
use plotters::style::register_font;

use crate::bounded_read;

/// Where a font is usually installed (`fonts-dejavu-core` on Debian/Ubuntu).
const FONT_PLACES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// A metrics file's largest size: a row is a few kB, so this is a million
/// epochs and more.
const MAX_METRICS_BYTES: u64 = 1 << 30;

/// A font's largest size (DejaVu Sans is 0.7 MB; CJK fonts reach 20).
const MAX_FONT_BYTES: u64 = 64 << 20;

/// Draws a --metrics file's curves per epoch into a PNG.
#[derive(Debug, Parser)]
#[command(name = "trainer plot")]
pub struct PlotArgs {
    /// The JSON-lines file of a run's --metrics.
    #[arg(value_name = "METRICS")]
    pub metrics: PathBuf,

    /// The PNG to write.
    #[arg(short, long, value_name = "PNG", default_value = "curves.png")]
    pub output: PathBuf,

    /// A TrueType font for the labels [default: DejaVu Sans, from fonts-dejavu-core].
    #[arg(long, value_name = "FILE")]
    pub font: Option<PathBuf>,
}

/// One epoch's numbers, as the metrics file holds them: a model has an
/// accuracy, an RMSE or no metric (`null` where unmeasured).
#[derive(Debug, serde::Deserialize)]
struct Epoch {
    epoch: f64,
    loss: f64,
    #[serde(default)]
    acc: Option<f64>,
    #[serde(default)]
    test_acc: Option<f64>,
    #[serde(default)]
    rmse: Option<f64>,
    #[serde(default)]
    test_rmse: Option<f64>,
    img_per_s: f64,
}

/// Runs `trainer plot`.
pub fn run(args: &PlotArgs) -> anyhow::Result<()> {
    if args.output.is_dir() {
        bail!(
            "-o {}: is a directory; give the PNG file to write",
            args.output.display()
        );
    }
    let png = |e: &std::ffi::OsStr| e.eq_ignore_ascii_case("png");
    if !args.output.extension().is_some_and(png) {
        bail!(
            "-o {}: the image is written as PNG; name it FILE.png",
            args.output.display()
        );
    }
    let created = check_output(&args.output)?;
    let drawn = read(&args.metrics).and_then(|epochs| {
        load_font(args.font.as_deref())?;
        draw(&epochs, &args.output)
            .with_context(|| format!("drawing {}", args.output.display()))?;
        Ok(epochs)
    });
    let epochs = match drawn {
        Ok(epochs) => epochs,
        Err(e) => {
            // Leave no empty PNG behind that the check made.
            if created {
                let _ = std::fs::remove_file(&args.output);
            }
            return Err(e);
        }
    };
    say!("{}: {} epoch(s) drawn", args.output.display(), epochs.len());
    Ok(())
}

/// Refuses an output the PNG cannot be written to before any drawing, in
/// words rather than the drawing backend's nested I/O error; says whether
/// the check created the (empty) file.
fn check_output(output: &Path) -> anyhow::Result<bool> {
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "-o {}: the directory {} does not exist (create it first)",
            output.display(),
            dir.display()
        );
    }
    let existed = output.exists();
    // Opening for append changes nothing in a file already there.
    std::fs::File::options()
        .append(true)
        .create(true)
        .open(output)
        .with_context(|| format!("-o {}: cannot write the PNG there", output.display()))?;
    Ok(!existed)
}

/// Whether `line` is an event's row (a live recovery's), not an epoch's.
fn is_event(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|row| row.get("event").is_some())
}

fn read(path: &Path) -> anyhow::Result<Vec<Epoch>> {
    // A pipe (`plot /dev/stdin`) has no size to check before reading it.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        bail!(
            "{} is not a regular file (a pipe or a device): save the metrics to a file first and plot that",
            path.display()
        );
    }
    let bytes = bounded_read::read(path, MAX_METRICS_BYTES, "a metrics file")?;
    let text = String::from_utf8(bytes)
        .with_context(|| format!("{}: not a metrics file (not UTF-8 text)", path.display()))?;
    let mut epochs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || is_event(line) {
            continue;
        }
        match serde_json::from_str::<Epoch>(line) {
            Ok(epoch) => epochs.push(epoch),
            // A row cut short by a run that died mid-write (a full disk):
            // the beginning of a row, ended early. The run resumed on the
            // next line (`MetricsFile::append_to`); anything else is not
            // a metrics file and stays refused.
            Err(e) if e.is_eof() && line.starts_with('{') => tell!(
                "warning: {} line {}: an incomplete row (a write cut short), skipped",
                path.display(),
                i + 1
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("{} line {}: not a metrics row", path.display(), i + 1)
                });
            }
        }
    }
    if epochs.is_empty() {
        bail!("{} holds no epochs", path.display());
    }
    // A resumed run appends: the newest row of an epoch counts.
    epochs.sort_by(|a, b| a.epoch.total_cmp(&b.epoch));
    epochs.dedup_by(|later, earlier| {
        let same = later.epoch == earlier.epoch;
        if same {
            std::mem::swap(later, earlier);
        }
        same
    });
    Ok(epochs)
}

fn load_font(choice: Option<&Path>) -> anyhow::Result<()> {
    let path = match choice {
        Some(path) => path.to_path_buf(),
        None => FONT_PLACES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .context(
                "no font for the labels: install fonts-dejavu-core (apt-get install fonts-dejavu-core) or pass --font FILE.ttf",
            )?,
    };
    let bytes = bounded_read::read(&path, MAX_FONT_BYTES, "a TrueType font")?;
    // The plot lives as long as the process; plotters wants the font for good.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a TrueType font", path.display()))
}

type Panel<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// The metric panel's title and curves: accuracy, else RMSE, else none.
fn metric_panel(epochs: &[Epoch]) -> Option<(&'static str, [Curve<'static>; 2])> {
    let has = |value: fn(&Epoch) -> Option<f64>| epochs.iter().any(|e| value(e).is_some());
    if has(|e| e.acc) {
        Some((
            "Accuracy",
            [("train", &BLUE, |e| e.acc), ("test", &RED, |e| e.test_acc)],
        ))
    } else if has(|e| e.rmse) {
        Some((
            "RMSE",
            [
                ("train", &BLUE, |e| e.rmse),
                ("test", &RED, |e| e.test_rmse),
            ],
        ))
    } else {
        None
    }
}

fn draw(epochs: &[Epoch], output: &Path) -> anyhow::Result<()> {
    let metric = metric_panel(epochs);
    let columns = if metric.is_some() { 3 } else { 2 };
    let root = BitMapBackend::new(output, (500 * columns as u32, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, columns));
    let x = |e: &Epoch| e.epoch;
    panel(
        &panels[0],
        epochs,
        "Training loss",
        "loss",
        &[("train", &BLUE, |e: &Epoch| Some(e.loss))],
        x,
    )?;
    if let Some((title, curves)) = &metric {
        panel(&panels[1], epochs, title, &title.to_lowercase(), curves, x)?;
    }
    panel(
        &panels[columns - 1],
        epochs,
        "Throughput (all ranks)",
        "samples / s",
        &[("train", &BLUE, |e: &Epoch| Some(e.img_per_s))],
        x,
    )?;
    root.present()?;
    Ok(())
}

/// A curve: its legend, colour and value per epoch (`None`: no point).
type Curve<'c> = (&'c str, &'c RGBColor, fn(&Epoch) -> Option<f64>);

fn panel(
    area: &Panel<'_>,
    epochs: &[Epoch],
    title: &str,
    y_label: &str,
    curves: &[Curve<'_>],
    x: impl Fn(&Epoch) -> f64,
) -> anyhow::Result<()> {
    let (first, last) = (x(&epochs[0]), x(&epochs[epochs.len() - 1]));
    let values = || {
        epochs
            .iter()
            .flat_map(|e| curves.iter().filter_map(move |c| (c.2)(e)))
    };
    let (low, high) = values().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let margin = ((high - low) * 0.1).max(high.abs() * 0.01).max(1e-6);
    let x_range = if last > first {
        first..last
    } else {
        first - 0.5..first + 0.5
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, (low - margin)..(high + margin))?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc(y_label)
        .x_labels(epochs.len().clamp(2, 10))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| match high - low {
            span if span >= 10.0 => format!("{v:.0}"),
            _ => format!("{v:.2}"),
        })
        .label_style(("sans-serif", 14))
        .draw()?;
    for &(name, color, value) in curves {
        let points: Vec<(f64, f64)> = epochs
            .iter()
            .filter_map(|e| Some((x(e), value(e)?)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(px, py)| {
                PathElement::new([(px, py), (px + 20, py)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    if curves.len() < 2 {
        return Ok(());
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epochs(rows: &str) -> Vec<Epoch> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), rows).unwrap();
        read(file.path()).unwrap()
    }

    #[test]
    fn the_metric_panel_follows_the_models_metric() {
        let base = r#""loss": 1.5, "img_per_s": 100.0"#;
        let cnn = epochs(&format!(
            r#"{{"epoch": 1, {base}, "acc": 0.8, "test_acc": 0.9}}"#
        ));
        assert_eq!(metric_panel(&cnn).map(|m| m.0), Some("Accuracy"));
        let recsys = epochs(&format!(
            "{{\"epoch\": 1, {base}, \"rmse\": 0.9, \"test_rmse\": null}}\n{{\"epoch\": 2, {base}, \"rmse\": 0.8, \"test_rmse\": 0.85}}"
        ));
        let (title, curves) = metric_panel(&recsys).unwrap();
        assert_eq!(title, "RMSE");
        assert_eq!((curves[1].2)(&recsys[0]), None);
        assert_eq!((curves[1].2)(&recsys[1]), Some(0.85));
        let toy = epochs(&format!(r#"{{"epoch": 1, {base}}}"#));
        assert!(metric_panel(&toy).is_none());
    }

    #[test]
    fn a_row_cut_short_is_skipped_but_garbage_is_refused() {
        let row = |n: u32| format!(r#"{{"epoch": {n}, "loss": 1.5, "img_per_s": 100.0}}"#);
        let torn = r#"{"epoch": 2, "loss": 1.4, "img_"#;
        // Torn at the end (the run died), or followed by the resumed run.
        assert_eq!(epochs(&format!("{}\n{torn}", row(1))).len(), 1);
        assert_eq!(
            epochs(&format!("{}\n{torn}\n{}\n", row(1), row(2))).len(),
            2
        );
        let read_rows = |rows: String| {
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), rows).unwrap();
            format!("{:#}", read(file.path()).unwrap_err())
        };
        let err = read_rows(format!("{}\nnot json\n{}\n", row(1), row(2)));
        assert!(err.contains("line 2: not a metrics row"), "{err}");
        let err = read_rows(format!("{}\n{{\"epoch\": 2}} x\n", row(1)));
        assert!(err.contains("line 2: not a metrics row"), "{err}");
        let err = read_rows(torn.to_string());
        assert!(err.contains("holds no epochs"), "{err}");
    }

    #[test]
    fn a_live_recoverys_rows_are_not_epochs() {
        let row = |n: u32| format!(r#"{{"epoch": {n}, "loss": 1.5, "img_per_s": 100.0}}"#);
        let event = r#"{"event": "live_recovery", "generation": 2, "lost": [1]}"#;
        assert_eq!(
            epochs(&format!("{}\n{event}\n{}\n", row(1), row(2))).len(),
            2
        );
    }

    #[test]
    fn the_output_must_be_a_png_file() {
        let args = |output: &str| PlotArgs {
            metrics: "absent.jsonl".into(),
            output: output.into(),
            font: None,
        };
        let err = run(&args("p6")).unwrap_err().to_string();
        assert!(err.contains("name it FILE.png"), "{err}");
        let err = run(&args("/tmp")).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        let err = run(&args("nod/x.png")).unwrap_err().to_string();
        assert_eq!(
            err,
            "-o nod/x.png: the directory nod does not exist (create it first)"
        );
        // A .png name gets past the name checks to the metrics file, and
        // the failed run leaves no PNG behind.
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("c.PNG");
        let err = format!("{:#}", run(&args(png.to_str().unwrap())).unwrap_err());
        assert!(err.contains("absent.jsonl"), "{err}");
        assert!(!png.exists());
    }

    #[test]
    fn a_pipe_is_refused_with_what_to_do() {
        let err = read(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(
            err.contains("save the metrics to a file first and plot that"),
            "{err}"
        );
    }
}
