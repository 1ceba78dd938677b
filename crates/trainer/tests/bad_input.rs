//! Every user mistake ends in one clear line on stderr and a non-zero exit,
//! never a panic.

mod common;

use std::io::Write;

use common::{data_arg, dataset, dataset_copy, run, stderr, trainer};
use fashion_mnist::{TRAIN_IMAGES, TRAIN_LABELS, synth};

/// Asserts a failed run that printed exactly one line containing `needle`.
fn assert_one_line_error(args: &[&str], data: Option<&std::path::Path>, needle: &str) {
    let mut cmd = trainer();
    cmd.args(args).args(["--epochs", "1", "--max-steps", "1"]);
    if let Some(dir) = data {
        cmd.args(data_arg(dir));
    }
    let out = run(&mut cmd);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("note:")).collect();
    assert!(!out.status.success(), "{args:?} succeeded; stderr: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {err}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: `{needle}` not in: {err}"
    );
}

#[test]
fn bad_flag_values_are_one_line_errors() {
    for (flag, value) in [
        ("--batch-size", "0"),
        ("--epochs", "0"),
        ("--lr", "-1"),
        ("--lr", "NaN"),
        ("--threads", "0"),
        ("--eval-samples", "0"),
    ] {
        assert_one_line_error(&[flag, value], None, flag);
    }
}

#[test]
fn more_eval_samples_than_the_test_split_holds_is_one_line_error() {
    let dir = dataset().to_str().expect("a UTF-8 temporary path");
    assert_one_line_error(
        &["--eval-samples", "10001", "--data-dir", dir],
        None,
        "--eval-samples 10001: the test split holds 10000 images",
    );
}

#[test]
fn a_rendezvous_backend_this_launcher_cannot_stand_in_for_is_refused_with_the_reason() {
    for backend in ["etcd", "etcd-v2"] {
        assert_one_line_error(
            &["--nproc-per-node", "2", "--rdzv-backend", backend],
            None,
            "has no etcd client",
        );
    }
    assert_one_line_error(
        &["--rdzv_backend", "zookeeper"],
        None,
        "takes torchrun's c10d and static",
    );
}

#[test]
fn a_missing_dataset_names_the_place_and_both_fixes() {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = trainer();
    let out = run(cmd.args(["--epochs", "1"]).args(data_arg(empty.path())));
    let err = stderr(&out);
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains(&empty.path().display().to_string()), "{err}");
    assert!(
        err.contains("apt-get install dataset-fashion-mnist"),
        "{err}"
    );
    assert!(err.contains("data/fashion-mnist"), "{err}");
}

#[test]
fn a_truncated_gz_is_named() {
    let dir = dataset_copy();
    let path = dir.path().join(TRAIN_IMAGES);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_one_line_error(&[], Some(dir.path()), TRAIN_IMAGES);
}

#[test]
fn a_wrong_magic_number_is_named() {
    let dir = dataset_copy();
    let mut content = synth::labels_idx(60_000);
    content[..4].copy_from_slice(&2051u32.to_be_bytes());
    synth::write_gz(&dir.path().join(TRAIN_LABELS), &content).unwrap();
    assert_one_line_error(&[], Some(dir.path()), "magic number 2051");
}

#[test]
fn a_label_out_of_range_is_named() {
    let dir = dataset_copy();
    let mut content = synth::labels_idx(60_000);
    *content.last_mut().unwrap() = 10;
    synth::write_gz(&dir.path().join(TRAIN_LABELS), &content).unwrap();
    assert_one_line_error(&[], Some(dir.path()), TRAIN_LABELS);
}

#[test]
fn a_file_that_is_not_gzip_is_named() {
    let dir = dataset_copy();
    std::fs::File::create(dir.path().join(TRAIN_LABELS))
        .unwrap()
        .write_all(b"<html>not found</html>")
        .unwrap();
    assert_one_line_error(&[], Some(dir.path()), TRAIN_LABELS);
}

/// Whether this machine has a usable GPU (then the no-GPU paths cannot be
/// exercised, and the tests below say so).
fn gpu_present() -> bool {
    matches!(core_tensor::cuda_available(), Ok(n) if n > 0)
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    if gpu_present() {
        eprintln!("skipped: a GPU is present, so --device cuda does not fail here");
        return;
    }
    assert_one_line_error(&["--device", "cuda"], Some(dataset()), "--device cuda");
}

#[test]
fn auto_without_a_gpu_trains_on_the_cpu_and_says_why() {
    if gpu_present() {
        eprintln!("skipped: a GPU is present, so --device auto picks it");
        return;
    }
    let out = run(trainer()
        .args(["--device", "auto", "--epochs", "1", "--max-steps", "1"])
        .args(data_arg(dataset())));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("no usable GPU (") && err.contains("training on the CPU"),
        "{err}"
    );
}

#[test]
fn nccl_with_the_cpu_device_is_refused_as_a_flag_mistake() {
    assert_one_line_error(
        &["--device", "cpu", "--backend", "nccl"],
        Some(dataset()),
        "with --device cpu use --backend tcp",
    );
}

#[test]
fn nccl_without_a_gpu_is_a_clear_error_naming_the_cpu_rank() {
    if gpu_present() {
        eprintln!("skipped: a GPU is present, so --backend nccl may work here");
        return;
    }
    assert_one_line_error(
        &["--backend", "nccl"],
        Some(dataset()),
        "--backend nccl needs every rank on a GPU of its own with libnccl, but rank(s) [0] train on the CPU",
    );
}

/// A batch the machine cannot hold is an error before its buffers are
/// made (exit 78), not a run the kernel's out-of-memory killer ends. A batch of
/// 60,000 needs about 30 GiB; on a machine with that much to spare the
/// batch would simply train, so the test says it was skipped there.
#[test]
fn a_batch_too_large_for_the_machine_is_one_clear_error() {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let available_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap()
        / (1 << 20) as f64;
    if available_gib > 26.0 {
        eprintln!("skipped: {available_gib:.0} GiB available, a batch of 60000 fits");
        return;
    }
    let mut cmd = trainer();
    cmd.args(["--batch-size", "60000", "--threads", "1"])
        .args(["--epochs", "1", "--max-steps", "1"])
        .args(data_arg(dataset()));
    let out = run(&mut cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("a training batch of 60000 needs")
            && err.contains("but this machine has ")
            && err.contains("the largest batch that fits is "),
        "{err}"
    );
}
