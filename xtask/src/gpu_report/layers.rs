//! The `cnn_layers` tables: each layer call's median time (ms, between CUDA
//! events) per configuration, one table per batch size, from the
//! `bench_cnn_layers[_CONFIG]_bBATCH.log` steps.

use std::fs;
use std::path::Path;

/// The bench steps' configurations, as their names give them, and the
/// column each heads.
const CONFIGS: [(&str, &str); 8] = [
    ("", "float32"),
    ("tf32", "TF32"),
    ("bf16", "bf16"),
    ("cp_async", "cp.async"),
    ("cp_async_tf32", "cp.async TF32"),
    ("wide", "wide"),
    ("wide_tf32", "wide TF32"),
    ("unfused", "unfused"),
];

/// `(call, median ms)` per line of one `cnn_layers` log, in its order.
fn medians(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let [.., median, _min] = words[..] else {
                return None;
            };
            median.parse::<f64>().ok()?;
            let call = words[..words.len() - 2].join(" ");
            Some((call, median.to_owned()))
        })
        .collect()
}

/// One table per batch size that has a `cnn_layers` log.
pub(super) fn tables(dir: &Path) -> String {
    let mut out = String::new();
    for batch in [64, 256, 512] {
        let columns: Vec<(&str, Vec<(String, String)>)> = CONFIGS
            .iter()
            .filter_map(|(config, title)| {
                let sep = if config.is_empty() { "" } else { "_" };
                let name = format!("bench_cnn_layers{sep}{config}_b{batch}.log");
                let log = fs::read_to_string(dir.join(name)).ok()?;
                Some((*title, medians(&log)))
            })
            .filter(|(_, rows)| !rows.is_empty())
            .collect();
        if columns.is_empty() {
            continue;
        }
        // Every call any column has, in the order they first come (the
        // fused and unfused benches name some calls differently).
        let mut calls: Vec<&str> = Vec::new();
        for (_, rows) in &columns {
            for (call, _) in rows {
                if !calls.contains(&call.as_str()) {
                    calls.push(call);
                }
            }
        }
        // The sum last.
        calls.sort_by_key(|c| *c == "sum");
        let titles: Vec<&str> = columns.iter().map(|c| c.0).collect();
        out.push_str(&format!(
            "`cnn_layers`, batch {batch}, median ms per call:\n\n| call | {} |\n|---|{}\n",
            titles.join(" | "),
            "---|".repeat(titles.len())
        ));
        for call in calls {
            let cells: Vec<&str> = columns
                .iter()
                .map(|(_, rows)| {
                    rows.iter()
                        .find(|(c, _)| c == call)
                        .map_or("–", |(_, m)| m.as_str())
                })
                .collect();
            out.push_str(&format!("| {call} | {} |\n", cells.join(" | ")));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_a_row_and_each_bench_a_column() {
        let dir = tempfile::tempdir().unwrap();
        let head = "# cnn_layers: cuda:0 (H200), batch 64, median of 50 calls\n\
                    # call               median(ms)    min(ms)\n";
        fs::write(
            dir.path().join("bench_cnn_layers_b64.log"),
            format!("{head}  conv1+relu fwd 0.017 0.015\n  conv2+pool fwd 0.070 0.068\n  sum 0.087 0.083\n"),
        )
        .unwrap();
        fs::write(
            dir.path().join("bench_cnn_layers_unfused_b64.log"),
            format!(
                "{head}  conv1 fwd 0.015 0.014\n  relu fwd (conv1) 0.009 0.008\n  sum 0.024 0.022\n"
            ),
        )
        .unwrap();
        let t = tables(dir.path());
        assert!(t.contains("| call | float32 | unfused |"), "{t}");
        assert!(t.contains("| conv1+relu fwd | 0.017 | – |"), "{t}");
        assert!(t.contains("| relu fwd (conv1) | – | 0.009 |"), "{t}");
        assert!(t.trim_end().ends_with("| sum | 0.087 | 0.024 |"), "{t}");
    }
}
