//! Reading Nsight Compute's `--csv` logs: device time per kernel and grid
//! (`ncu_kernels*`), the section figures and explicit metrics per launch
//! (`ncu_detail_*`).

use std::collections::BTreeMap;

/// One metric of one kernel launch in Nsight Compute's `--csv` output.
struct Row {
    id: String,
    /// The kernel's name and grid, e.g. `conv2d_fwd_f32 (576, 1, 1)`: the
    /// grid tells conv1's launches from conv2's.
    kernel: String,
    metric: String,
    unit: String,
    value: String,
}

/// The metric rows of an Nsight Compute `--csv` log (columns found by the
/// header's names; other lines skipped, and so are the rows of a section's
/// rules, which name no metric).
fn ncu_rows(log: &str) -> Vec<Row> {
    let Some(header) = log.lines().find(|l| l.starts_with("\"ID\",")) else {
        return Vec::new();
    };
    let header = csv_fields(header);
    let column = |name: &str| header.iter().position(|h| h == name);
    let names = [
        "ID",
        "Kernel Name",
        "Grid Size",
        "Metric Name",
        "Metric Unit",
        "Metric Value",
    ];
    let Some(at) = names.map(column).into_iter().collect::<Option<Vec<_>>>() else {
        return Vec::new();
    };
    // A metric's row ends after its value: the rule columns the header
    // goes on to name are left out, not left empty.
    log.lines()
        .filter(|l| l.starts_with('"') && !l.starts_with("\"ID\","))
        .map(csv_fields)
        .filter_map(|f| {
            let field = |i: usize| f.get(at[i]).cloned();
            Some(Row {
                id: field(0)?,
                kernel: format!("{} {}", field(1)?, field(2)?),
                metric: field(3).filter(|m| !m.is_empty())?,
                unit: field(4)?,
                value: field(5)?,
            })
        })
        .collect()
}

/// A metric's value as a number: Nsight Compute groups the thousands with
/// commas (`26,592`, `2,614,560,770.16`).
fn number(value: &str) -> Option<f64> {
    value.replace(',', "").parse().ok()
}

/// `amount` in `unit` as microseconds, for the units Nsight Compute gives
/// times in; `None` for any other unit.
fn microseconds(amount: f64, unit: &str) -> Option<f64> {
    let per_unit = match unit {
        "ns" | "nsecond" => 1e-3,
        "us" | "usecond" => 1.0,
        "ms" | "msecond" => 1e3,
        "s" | "second" => 1e6,
        _ => return None,
    };
    Some(amount * per_unit)
}

/// A metric as the tables show it: a time in µs whatever unit it came in,
/// another figure as a plain number and its unit.
fn shown(value: &str, unit: &str) -> String {
    match number(value) {
        Some(amount) => match microseconds(amount, unit) {
            Some(us) => format!("{us:.1} µs"),
            None => format!("{amount} {unit}").trim_end().to_owned(),
        },
        None => format!("{value} {unit}").trim_end().to_owned(),
    }
}

/// Per kernel and grid: launches and summed device time in µs, from the
/// rows of `gpu__time_duration.sum` (else SpeedOfLight's `Duration`).
pub(super) fn kernel_times(log: &str) -> BTreeMap<String, (u32, f64)> {
    let rows = ncu_rows(log);
    let metric = if rows.iter().any(|r| r.metric == "gpu__time_duration.sum") {
        "gpu__time_duration.sum"
    } else {
        "Duration"
    };
    let mut times = BTreeMap::new();
    for row in rows.iter().filter(|r| r.metric == metric) {
        let Some(us) = number(&row.value).and_then(|n| microseconds(n, &row.unit)) else {
            continue;
        };
        let entry = times.entry(row.kernel.clone()).or_insert((0, 0.0));
        entry.0 += 1;
        entry.1 += us;
    }
    times
}

/// The SpeedOfLight and WarpStateStats figures `ncu_detail_*` shows per
/// launch.
const DETAIL: [&str; 4] = [
    "Duration",
    "Compute (SM) Throughput",
    "Memory Throughput",
    "Warp Cycles Per Issued Instruction",
];

/// The `ncu_detail_*` steps of run.sh and their titles.
pub(super) const DETAIL_LOGS: [(&str, &str); 8] = [
    ("ncu_detail_bf16", "`--bf16`"),
    ("ncu_detail_tf32", "`--tf32`"),
    ("ncu_detail_f32", "float32"),
    ("ncu_detail_cp_async", "float32, `--gemm-staging cp-async`"),
    (
        "ncu_detail_cp_async_tf32",
        "`--tf32 --gemm-staging cp-async`",
    ),
    ("ncu_detail_wide", "float32, `--fp32-tile wide`"),
    ("ncu_detail_wide_tf32", "`--tf32 --fp32-tile wide`"),
    ("ncu_detail_bias", "the bias gradients' two passes"),
];

/// The explicit metrics run.sh asks for beside the sections (and two
/// section figures), with the column names they head.
const METRICS: [(&str, &str); 12] = [
    ("Registers Per Thread", "registers"),
    ("Achieved Occupancy", "occupancy"),
    ("smsp__inst_executed.sum", "warp instructions"),
    (
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "tensor pipe",
    ),
    (
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "barrier",
    ),
    (
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "long sb",
    ),
    (
        "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
        "short sb",
    ),
    (
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
        "MIO",
    ),
    (
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "conflicts ld",
    ),
    (
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "conflicts st",
    ),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "local ld"),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "local st"),
];

/// Each launch of a log: its ID, kernel and grid, and figures by metric.
type Launch = (String, String, BTreeMap<String, String>);

fn launches(log: &str) -> Vec<Launch> {
    let mut launches: Vec<Launch> = Vec::new();
    for row in ncu_rows(log) {
        if launches.last().is_none_or(|l| l.0 != row.id) {
            launches.push((row.id.clone(), row.kernel.clone(), BTreeMap::new()));
        }
        if let Some(last) = launches.last_mut() {
            last.2.insert(row.metric, shown(&row.value, &row.unit));
        }
    }
    launches
}

/// One row per launch with the figures `columns` name (metric, heading);
/// none when no launch has any of them.
fn launch_table(heading: &str, log: &str, columns: &[(&str, &str)]) -> String {
    let launches = launches(log);
    let any = launches
        .iter()
        .any(|l| columns.iter().any(|(m, _)| l.2.contains_key(*m)));
    if !any {
        return String::new();
    }
    let names: Vec<&str> = columns.iter().map(|c| c.1).collect();
    let mut out = format!(
        "{heading}:\n\n| kernel, grid | {} |\n|---|{}\n",
        names.join(" | "),
        "---|".repeat(columns.len())
    );
    for (_, kernel, metrics) in launches {
        let cells: Vec<&str> = columns
            .iter()
            .map(|(m, _)| metrics.get(*m).map_or("–", String::as_str))
            .collect();
        out.push_str(&format!("| `{kernel}` | {} |\n", cells.join(" | ")));
    }
    out.push('\n');
    out
}

/// One row per launch of an `ncu_detail_*` log with the [`DETAIL`] metrics.
pub(super) fn detail_table(title: &str, log: &str) -> String {
    let columns = DETAIL.map(|m| (m, m));
    launch_table(&format!("Nsight Compute sections, {title}"), log, &columns)
}

/// One row per launch with the [`METRICS`]: registers, occupancy,
/// instructions, the stall ratios (warps stalled per issuing cycle), the
/// shared-memory bank conflicts and the local-memory (spill) bytes.
pub(super) fn metrics_table(title: &str, log: &str) -> String {
    launch_table(&format!("Nsight Compute metrics, {title}"), log, &METRICS)
}

/// The fields of one CSV line: quoted (a comma inside is text, `""` one
/// quote) or bare (Nsight Compute ends a metric's row with a bare, empty
/// field).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.trim_end().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().expect("one field at least").push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(String::new()),
            c => fields.last_mut().expect("one field at least").push(c),
        }
    }
    fields
}

pub(super) fn kernel_table(title: &str, kernels: &BTreeMap<String, (u32, f64)>) -> String {
    let total: f64 = kernels.values().map(|k| k.1).sum();
    let mut rows: Vec<_> = kernels.iter().collect();
    rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
    let mut out = format!(
        "Kernels, {title} (Nsight Compute, {} launches, {total:.0} µs):\n\n| kernel, grid | launches | µs each | share |\n|---|---|---|---|\n",
        kernels.values().map(|k| k.0).sum::<u32>()
    );
    for (name, (count, us)) in rows {
        out.push_str(&format!(
            "| `{name}` | {count} | {:.1} | {:.1}% |\n",
            us / f64::from(*count),
            100.0 * us / total
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_times_sum_per_name_in_microseconds() {
        let log = "==PROF== Connected\n\
            \"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\"Stream\",\"Block Size\",\"Grid Size\",\"Device\",\"CC\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n\
            \"0\",\"1\",\"trainer\",\"h\",\"relu_fwd_f32\",\"1\",\"7\",\"(256, 1, 1)\",\"(32, 1, 1)\",\"0\",\"9.0\",\"m\",\"gpu__time_duration.sum\",\"ns\",\"5,248\"\n\
            \"1\",\"1\",\"trainer\",\"h\",\"relu_fwd_f32\",\"1\",\"7\",\"(256, 1, 1)\",\"(32, 1, 1)\",\"0\",\"9.0\",\"m\",\"gpu__time_duration.sum\",\"usecond\",\"4.75\"\n\
            \"2\",\"1\",\"trainer\",\"h\",\"conv2d_fwd_f32\",\"1\",\"7\",\"(256, 1, 1)\",\"(9, 1, 1)\",\"0\",\"9.0\",\"m\",\"gpu__time_duration.sum\",\"msecond\",\"0.14\"\n";
        let times = kernel_times(log);
        let relu = times["relu_fwd_f32 (32, 1, 1)"];
        assert_eq!(relu.0, 2);
        assert!((relu.1 - 9.998).abs() < 1e-9);
        assert!((times["conv2d_fwd_f32 (9, 1, 1)"].1 - 140.0).abs() < 1e-9);
        let table = kernel_table("t", &times);
        assert!(
            table.starts_with("Kernels, t (Nsight Compute, 3 launches, 150 µs)"),
            "{table}"
        );
        // The costliest first.
        assert!(
            table.find("conv2d").unwrap() < table.find("relu").unwrap(),
            "{table}"
        );
    }

    #[test]
    fn section_metrics_make_one_row_per_launch() {
        let header = "\"ID\",\"Kernel Name\",\"Grid Size\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"";
        let row = |id: &str, kernel: &str, metric: &str, unit: &str, value: &str| {
            format!("\"{id}\",\"{kernel}\",\"(9, 1, 1)\",\"s\",\"{metric}\",\"{unit}\",\"{value}\"")
        };
        let log = [
            "==PROF== Connected".to_string(),
            header.to_string(),
            row("0", "conv2d_fwd_tf32", "Duration", "usecond", "41.2"),
            row("0", "conv2d_fwd_tf32", "Memory Throughput", "%", "61.5"),
            row("1", "conv2d_bwd_input_tf32", "Duration", "msecond", "0.097"),
            row("2", "linear_fwd_tf32", "Duration", "ns", "1,296,500"),
        ]
        .join("\n");
        let table = detail_table("t", &log);
        assert!(
            table.contains("| `conv2d_fwd_tf32 (9, 1, 1)` | 41.2 µs | – | 61.5 % | – |"),
            "{table}"
        );
        assert!(
            table.contains("| `conv2d_bwd_input_tf32 (9, 1, 1)` | 97.0 µs |"),
            "{table}"
        );
        assert!(
            table.contains("| `linear_fwd_tf32 (9, 1, 1)` | 1296.5 µs |"),
            "{table}"
        );
        assert_eq!(detail_table("t", "no profile"), "");
    }

    #[test]
    fn csv_fields_are_quoted_or_bare() {
        assert_eq!(
            csv_fields("\"Duration\",\"ns\",\"26,592\",\n"),
            ["Duration", "ns", "26,592", ""]
        );
        assert_eq!(
            csv_fields("\"a \"\"b\"\"\",,\"\",c"),
            ["a \"b\"", "", "", "c"]
        );
    }
}
