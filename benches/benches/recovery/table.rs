//! The bench's report: the machine, one row per kill or per world size,
//! medians and maxima.

use crate::job::Cost;

/// The CPU's model name, family, model and widest vector extension, and
/// the CPUs this process may use, from /proc/cpuinfo.
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        (info.lines())
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map_or("?".to_string(), |(_, v)| v.trim().to_string())
    };
    let flags = field("flags");
    let has = |flag: &str| flags.split(' ').any(|f| f == flag);
    let vector = match (has("avx512f"), has("avx2")) {
        (true, _) => "AVX-512",
        (false, true) => "AVX2",
        (false, false) => "no AVX2",
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{} (family {} model {}, {vector}), {cpus} CPU(s)",
        field("model name"),
        field("cpu family"),
        field("model")
    )
}

/// The median and the maximum of `values` (NaN where there are none).
pub fn median_max(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    (median, sorted.last().copied().unwrap_or(f64::NAN))
}

/// The bytes of a recovery's heal, or `?` where the trainer did not say.
fn bytes(heal: Option<u64>) -> String {
    heal.map_or("?".into(), |b| b.to_string())
}

/// One row per kill, then the medians and maxima.
pub fn print_kills(costs: &[Cost]) {
    println!(
        "{:>4} {:>5} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "kill", "rank", "after-step", "detect(s)", "recover(s)", "join-after", "join(s)", "heal(B)"
    );
    for (i, c) in costs.iter().enumerate() {
        println!(
            "{:>4} {:>5} {:>10} {:>10.3} {:>10.3} {:>10} {:>9.3} {:>10}",
            i + 1,
            c.kill.rank,
            c.kill.after_step,
            c.detection,
            c.lost.seconds(),
            c.join.row["after_global_step"].as_u64().unwrap_or(0),
            c.join.seconds(),
            bytes(c.join.heal_bytes())
        );
    }
    let (detect, recover, join) = summary(costs);
    println!(
        "# median/max: detection {:.3}/{:.3} s, recovery {:.3}/{:.3} s, join {:.3}/{:.3} s, heal {} B",
        detect.0,
        detect.1,
        recover.0,
        recover.1,
        join.0,
        join.1,
        bytes(costs.first().and_then(|c| c.join.heal_bytes()))
    );
}

type MedianMax = (f64, f64);

/// Median and maximum of the detections, the survivors' recoveries and
/// the joins.
fn summary(costs: &[Cost]) -> (MedianMax, MedianMax, MedianMax) {
    (
        median_max(costs.iter().map(|c| c.detection)),
        median_max(costs.iter().map(|c| c.lost.seconds())),
        median_max(costs.iter().map(|c| c.join.seconds())),
    )
}

pub fn print_scale_header() {
    println!(
        "{:>5} {:>5} {:>15} {:>15} {:>15} {:>11} {:>8} {:>16}",
        "world",
        "kills",
        "detect med/max",
        "recover med/max",
        "join med/max",
        "heal(B)",
        "job(s)",
        "model"
    );
}

/// One world size's row: `same` whether its model is the undisturbed
/// run's, `hash` its model's.
pub fn print_scale_row(world: usize, costs: &[Cost], seconds: f64, (same, hash): (bool, &str)) {
    let (detect, recover, join) = summary(costs);
    let pair = |(m, x): MedianMax| format!("{m:.3}/{x:.3}");
    println!(
        "{world:>5} {:>5} {:>15} {:>15} {:>15} {:>11} {seconds:>8.1} {hash:>16}{}",
        costs.len(),
        pair(detect),
        pair(recover),
        pair(join),
        bytes(costs.first().and_then(|c| c.join.heal_bytes())),
        if same { "" } else { " DIFFERS" }
    );
}
