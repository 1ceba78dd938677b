//! `cargo xtask gpu-report` on lines copied from a real run's logs (the
//! H100 run of 2026-11-27, `fixtures/gpu_report/`): Nsight Compute writes
//! its figures with thousands separators inside the quotes (`"26,592"`),
//! times in `ns`, and ends a metric's row before the rule columns its
//! header names, which once left every `ncu_detail_*` cell at "–".

use std::path::Path;
use std::process::Command;

fn report() -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu_report");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("gpu-report")
        .arg(&fixtures)
        .output()
        .expect("running xtask gpu-report");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn nsight_compute_sections_show_real_figures() {
    let text = report();
    // Durations in µs, the other figures in their units; no cell left out.
    for row in [
        "| `linear_fwd_partial_f32 (2, 1, 36)` | 26.6 µs | 15.19 % | 21.65 % | 6.42 cycle |",
        "| `conv2d_fwd_f32 (576, 1, 1)` | 86.3 µs | 54.04 % | 64.42 % | 10.24 cycle |",
    ] {
        assert!(text.contains(row), "no {row:?} in:\n{text}");
    }
    let sections = text
        .split("Nsight Compute sections, float32:")
        .nth(1)
        .expect("the ncu_detail_f32 section");
    assert_eq!(sections.matches("| `").count(), 2, "{sections}");
    assert!(!sections.contains('–'), "{sections}");
}

#[test]
fn kernel_times_add_up_in_microseconds() {
    let text = report();
    for line in [
        "Kernels, this build, float32 (Nsight Compute, 4 launches, 136 µs):",
        "| `conv2d_bwd_bias_f32 (32, 1, 1)` | 1 | 90.0 | 66.3% |",
        "| `relu_bwd_f32 (5408, 1, 1)` | 1 | 8.9 | 6.6% |",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
}
