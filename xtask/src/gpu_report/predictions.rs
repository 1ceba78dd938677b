//! The kernels docs/gpu.md predicts, against their predictions: Nsight
//! Compute's device time per launch (`ncu_kernels*`, `ncu_detail_*`).

use super::ncu::kernel_times;

/// docs/gpu.md's kernel predictions as ratios of one kernel's device time
/// under a lever (its own entry point: `_cp` for the cp.async staging) to
/// its time without (the same grid; the clocks cancel):
/// `(lever log, lever kernel, default log, default kernel, lo, hi)`.
const RATIOS: [(&str, &str, &str, &str, f64, f64); 9] = [
    (
        "ncu_detail_cp_async",
        "conv2d_pool_fwd_f32_cp",
        "ncu_detail_f32",
        "conv2d_pool_fwd_f32",
        1.0,
        1.1,
    ),
    (
        "ncu_detail_cp_async",
        "conv2d_bwd_input_f32_cp",
        "ncu_detail_f32",
        "conv2d_bwd_input_f32",
        0.97,
        1.05,
    ),
    (
        "ncu_detail_cp_async",
        "conv2d_bwd_weight_partial_f32_cp",
        "ncu_detail_f32",
        "conv2d_bwd_weight_partial_f32",
        1.0,
        1.1,
    ),
    (
        "ncu_detail_cp_async_tf32",
        "conv2d_pool_fwd_tf32_cp",
        "ncu_detail_tf32",
        "conv2d_pool_fwd_tf32",
        1.1,
        1.25,
    ),
    (
        "ncu_detail_cp_async_tf32",
        "conv2d_bwd_input_tf32_cp",
        "ncu_detail_tf32",
        "conv2d_bwd_input_tf32",
        0.98,
        1.08,
    ),
    (
        "ncu_detail_cp_async_tf32",
        "conv2d_bwd_weight_partial_tf32_cp",
        "ncu_detail_tf32",
        "conv2d_bwd_weight_partial_tf32",
        1.1,
        1.25,
    ),
    (
        "ncu_detail_bf16",
        "conv2d_pool_fwd_bf16",
        "ncu_detail_tf32",
        "conv2d_pool_fwd_tf32",
        0.8,
        0.91,
    ),
    (
        "ncu_detail_bf16",
        "conv2d_bwd_input_bf16",
        "ncu_detail_tf32",
        "conv2d_bwd_input_tf32",
        0.8,
        0.91,
    ),
    (
        "ncu_detail_bf16",
        "conv2d_bwd_weight_partial_bf16",
        "ncu_detail_tf32",
        "conv2d_bwd_weight_partial_tf32",
        0.8,
        0.91,
    ),
];

/// docs/gpu.md's absolute predictions, µs per launch at batch 64 (the bias
/// gradients' two passes): `(log, kernel, lo, hi)`.
const TIMES: [(&str, &str, f64, f64); 2] = [
    ("ncu_kernels", "conv2d_bwd_bias_partial_f32", 3.0, 5.0),
    ("ncu_kernels", "conv2d_bwd_bias_reduce_f32", 1.0, 3.0),
];

fn verdict(x: f64, lo: f64, hi: f64) -> &'static str {
    if x < lo {
        "below"
    } else if x > hi {
        "above"
    } else {
        "inside"
    }
}

/// Each predicted kernel (and grid) the logs have, against its prediction.
pub(super) fn predictions(read: &dyn Fn(&str) -> Option<String>) -> String {
    let times = |log: &str| read(log).map(|l| kernel_times(&l)).unwrap_or_default();
    let name_of = |key: &str| key.split(' ').next().unwrap_or_default().to_owned();
    let mut rows = String::new();
    for (lever_log, lever, default_log, default, lo, hi) in RATIOS {
        let (l, d) = (times(lever_log), times(default_log));
        for (key, (n, us)) in l.iter().filter(|(k, _)| name_of(k) == lever) {
            let grid = key.trim_start_matches(lever);
            let Some((dn, dus)) = d.get(&format!("{default}{grid}")) else {
                continue;
            };
            let (a, b) = (us / f64::from(*n), dus / f64::from(*dn));
            rows.push_str(&format!(
                "| `{key}` ÷ `{default}` | {a:.1} ÷ {b:.1} µs | {:.2}× | {lo:.2}–{hi:.2}× | {} |\n",
                a / b,
                verdict(a / b, lo, hi)
            ));
        }
    }
    for (log, kernel, lo, hi) in TIMES {
        for (key, (n, us)) in times(log).iter().filter(|(k, _)| name_of(k) == kernel) {
            let a = us / f64::from(*n);
            rows.push_str(&format!(
                "| `{key}` ({log}) | {a:.1} µs | – | {lo:.0}–{hi:.0} µs | {} |\n",
                verdict(a, lo, hi)
            ));
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "Kernels against docs/gpu.md's predictions (Nsight Compute device time per launch):\n\n\
         | kernel | measured | ratio | predicted | verdict |\n|---|---|---|---|---|\n{rows}\n"
    )
}
