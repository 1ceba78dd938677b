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

#[test]
fn the_2026_11_27_run_is_scored_against_the_goal_table() {
    let text = report();
    for line in [
        "| 64 | 107,470 | 124,545 | – | 38,341 (adam) | 36,445 (adam) | – |",
        "| 512 | 142,902 | 167,788 | – | 214,465 (adam) | 281,515 (adam) | – |",
        "| batch 64, img/s | 107,470 ≥ 150,000: not met | 124,545 ≥ 180,000: not met | – (goal 200,000) |",
        "| batch 256, ours ÷ best PyTorch (≥ 1.5×) | 1.01×: not met | 1.38×: not met | – |",
        "Test accuracy after 5 epochs at batch 64: float32 0.9175, TF32 0.9140, bf16 –.",
        "| 64 | float32 | 25,787 | 38,341 | – | – | – |",
        "| `--fp32-tile wide`, float32 | 512 | 142,902 | 133,150 | 0.932× | – | – |",
        "| the baseline build (float32) | 64 | 107,470 | 66,228 | 0.616× | – | – |",
        "| conv2 bwd | 1.893 | 1.614 | 2.078 |",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    // Not a configuration of ours: the NCCL and two-rank runs.
    assert!(!text.contains("97,249"), "{text}");
}

/// The steps of today's run.sh, written as its logs would be, packed as
/// `--archive` packs them: repeated rounds, the PyTorch suite, the levers,
/// and Nsight Compute's metrics.
#[test]
fn a_synthetic_archive_with_the_new_steps() {
    let root = tempfile::tempdir().unwrap();
    let logs = root.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let write = |name: &str, text: &str| std::fs::write(logs.join(name), text).unwrap();
    let epoch = |rate: u32| {
        format!("Epoch 02/02 | loss 0.4 | acc 0.8 | test_acc 0.87 | time 0.4s | {rate} img/s\n")
    };
    for (r, rate) in [(1, 150_000), (2, 154_000), (3, 152_000)] {
        write(&format!("train_b64_r{r}.log"), &epoch(rate));
        write(
            &format!("train_cp_async_b64_r{r}.log"),
            &epoch(rate - 3_000),
        );
    }
    write(
        "train_bf16_b64_r1.log",
        "Epoch 05/05 | loss 0.25 | acc 0.91 | test_acc 0.9123 | time 0.3s | 210000 img/s\n",
    );
    write("train_bf16_b512_r1.log", &epoch(400_000));
    write(
        "torch_suite.log",
        "# torch 2.11.0 on NVIDIA H200\n\
         torch 2.11.0 on-device bf16 adam batch 512 rep 1: 250000 img/s (2.0 ms/step over 200 steps)\n\
         torch 2.11.0 on-device bf16 graph batch 512 rep 1: 260000 img/s (1.9 ms/step over 200 steps)\n\
         torch 2.11.0 on-device bf16 graph batch 512 rep 2: 270000 img/s (1.9 ms/step over 200 steps)\n\
         torch 2.11.0 on-device bf16 compile batch 512: skipped, out of time (--budget 120)\n",
    );
    let header = "\"ID\",\"Kernel Name\",\"Grid Size\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"";
    let row = |id: u32, kernel: &str, metric: &str, unit: &str, value: &str| {
        format!(
            "\"{id}\",\"{kernel}\",\"(4608, 1, 1)\",\"s\",\"{metric}\",\"{unit}\",\"{value}\"\n"
        )
    };
    let detail = |kernel: &str, us: &str| {
        [
            header.to_owned() + "\n",
            row(0, kernel, "Duration", "usecond", us),
            row(0, kernel, "gpu__time_duration.sum", "usecond", us),
            row(0, kernel, "Registers Per Thread", "register/thread", "64"),
            row(
                0,
                kernel,
                "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
                "",
                "0.42",
            ),
            row(
                0,
                kernel,
                "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
                "byte",
                "0",
            ),
        ]
        .concat()
    };
    write(
        "ncu_detail_tf32.log",
        &detail("conv2d_pool_fwd_tf32", "68.0"),
    );
    write(
        "ncu_detail_bf16.log",
        &detail("conv2d_pool_fwd_bf16", "59.0"),
    );
    let archive = root.path().join("logs.tgz");
    let tar = Command::new("tar")
        .arg("czf")
        .arg(&archive)
        .arg("-C")
        .arg(root.path())
        .arg("logs")
        .status()
        .expect("running tar");
    assert!(tar.success());
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("gpu-report")
        .arg(&archive)
        .output()
        .expect("running xtask gpu-report");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        // The median of three rounds, ± half their range.
        "| 64 | 152,000 ±1.3% (3) | – | 210,000 | – | – | – |",
        "| 512 | – | – | 400,000 | – | – | 265,000 ±1.9% (2) (graph) |",
        "| batch 64, img/s | 152,000 ≥ 150,000: met | – (goal 180,000) | 210,000 ≥ 200,000: met |",
        "| batch 512, ours ÷ best PyTorch (≥ 1.5×) | – | – | 1.51×: met |",
        "bf16 0.9123 (goal ≥ 0.91: met)",
        "| 512 | bf16 | – | 250,000 | – | 265,000 ±1.9% (2) | – |",
        "| `--gemm-staging cp-async`, float32 | 64 | 152,000 ±1.3% (3) | 149,000 ±1.3% (3) | 0.980× | 0.97–0.99× | inside |",
        "| `conv2d_pool_fwd_bf16 (4608, 1, 1)` ÷ `conv2d_pool_fwd_tf32` | 59.0 ÷ 68.0 µs | 0.87× | 0.80–0.91× | inside |",
        "| `conv2d_pool_fwd_bf16 (4608, 1, 1)` | 64 register/thread | – | – | – | 0.42 | – | – | – | – | – | 0 byte | – |",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(!text.contains("A dry run's logs"), "{text}");
}

/// The logs of `run.sh --dry-run` (cuda-emu): the report reads them, and
/// says first that their figures only prove the steps ran.
#[test]
fn a_dry_runs_logs_are_reported_as_such() {
    let logs = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(logs.path().join(name), text).unwrap();
    write(
        "summary.txt",
        "# commit b7afd5c, budget 480 s, 144 s so far, dry run (batch 4, one step)\nstep result detail\n",
    );
    write(
        "train_b64_r1.log",
        "Epoch 01/01 | loss 2.2810 | acc 0.0000 | test_acc 0.0625 | time 2.4s | 2 img/s\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("gpu-report")
        .arg(logs.path())
        .output()
        .expect("running xtask gpu-report");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("**A dry run's logs**"), "{text}");
    assert!(text.contains("| 64 | 2 |"), "{text}");
}
