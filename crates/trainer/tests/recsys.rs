//! `--model recsys`: the MovieLens recommender on generated ratings files,
//! end to end through the binary; bad files are one clear error.

mod common;

use std::path::Path;

use common::{run, stderr, stdout, trainer};
use trainer::models::recsys::synth::write_ratings;

fn recsys(ratings: &Path, args: &[&str]) -> std::process::Output {
    let out = run(trainer()
        .args(["--model", "recsys", "--device", "cpu", "--ratings"])
        .arg(ratings)
        .args(args));
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out
}

/// The `key value` pairs of rank 0's epoch lines.
fn column(out: &std::process::Output, key: &str) -> Vec<f64> {
    stdout(out)
        .lines()
        .filter_map(|l| l.split(&format!("| {key} ")).nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// The ratings' standard deviation, from the start-up line.
fn ratings_std(out: &std::process::Output) -> f64 {
    let err = stderr(out);
    let at = err.find("std ").expect("the start line names the std");
    err[at + 4..].split(')').next().unwrap().parse().unwrap()
}

#[test]
fn the_test_rmse_falls_well_under_the_ratings_std() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 60_000, 300, 200, 1).unwrap();
    let out = recsys(
        &path,
        &[
            "--world-size",
            "2",
            "--epochs",
            "10",
            "--batch-size",
            "64",
            "--lr",
            "0.01",
        ],
    );
    let rmse = column(&out, "test_rmse");
    let std = ratings_std(&out);
    assert_eq!(rmse.len(), 10, "{}", stdout(&out));
    assert!(
        rmse[9] < 0.6 * std,
        "test RMSE {rmse:?} against the ratings' std {std}"
    );
}

/// A run resumed from a mid-epoch checkpoint streams past the batches
/// already trained and prints the same epochs as the run that wrote it.
#[test]
fn a_mid_epoch_checkpoint_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 20_000, 100, 80, 2).unwrap();
    let (first, second) = (dir.path().join("a"), dir.path().join("b"));
    let common = ["--world-size", "2", "--epochs", "2", "--checkpoint-dir"];
    let mut args: Vec<&str> = common.to_vec();
    args.extend([
        first.to_str().unwrap(),
        "--checkpoint-every",
        "30",
        "--keep",
        "100",
    ]);
    let straight = recsys(&path, &args);
    let mid = first.join("ckpt-e0001-s000030");
    let mut args: Vec<&str> = common.to_vec();
    args.extend([second.to_str().unwrap(), "--resume", mid.to_str().unwrap()]);
    let resumed = recsys(&path, &args);
    for key in ["loss", "rmse", "test_rmse"] {
        let want = column(&straight, key);
        assert_eq!(want.len(), 2, "{}", stdout(&straight));
        assert_eq!(column(&resumed, key), want, "{key}: {}", stderr(&resumed));
    }
    // The stream's chunks are shuffled per rank: another world cannot go
    // on with the epoch, and says so (exit 78: no restart would help).
    let third = dir.path().join("c");
    let args = [
        "--epochs",
        "2",
        "--checkpoint-dir",
        third.to_str().unwrap(),
        "--resume",
        mid.to_str().unwrap(),
    ];
    let out = run(trainer()
        .args(["--model", "recsys", "--device", "cpu", "--ratings"])
        .arg(&path)
        .args(args));
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("an epoch begun on 2 replicas cannot go on with 1"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_ratings_files_are_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let header = "userId,movieId,rating,timestamp\n";
    let cases = [
        (dir.path().join("missing.csv"), "cannot open"),
        (file("empty.csv", ""), "empty"),
        (file("header.csv", "a,b\n1,2,3,4\n"), "header"),
        (
            file("bad.csv", &format!("{header}1,2,4.0,5\n1,x,3,4\n")),
            "line 3",
        ),
        (
            file("big.csv", &format!("{header}99999999,2,4.0,5\n")),
            "beyond the limit",
        ),
        (file("short.csv", &format!("{header}1,2\n")), "line 2"),
        (
            file("huge.csv", &format!("{header}1,2,3e38,5\n")),
            "line 2: the rating 3",
        ),
        (
            file("endless.csv", &format!("{header}{}", "7".repeat(10_000))),
            "line 2 is longer than 4096 bytes",
        ),
        (dir.path().to_path_buf(), "is a directory"),
    ];
    let binary = dir.path().join("binary.csv");
    std::fs::write(&binary, [0xff_u8, 0xfe, 0x00, b'\n']).unwrap();
    let cases = cases.into_iter().chain([(binary, "line 1 is not UTF-8")]);
    for (path, needle) in cases {
        let out = run(trainer()
            .args([
                "--model",
                "recsys",
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--ratings",
            ])
            .arg(&path));
        let err = stderr(&out);
        assert!(
            !out.status.success() && !err.contains("panicked"),
            "{path:?}: {err}"
        );
        assert!(err.contains(needle), "{path:?}: `{needle}` not in {err}");
    }
}

/// The trainer on `ratings`, stopped after `limit`: `None` if it was still
/// running then (a FIFO it opened and waits on).
fn recsys_within(ratings: &Path, limit: std::time::Duration) -> Option<std::process::Output> {
    let mut child = trainer()
        .args(["--model", "recsys", "--device", "cpu", "--epochs", "1"])
        .arg("--ratings")
        .arg(ratings)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

/// A FIFO is refused before it is opened (opening one without a writer
/// blocks), and so is a process substitution's pipe, which the chunks
/// could not read again: one error naming the file.
#[test]
fn pipes_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.csv");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success());
    let out = recsys_within(&fifo, std::time::Duration::from_secs(30))
        .expect("the trainer waited on the FIFO");
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("fifo.csv: must be a regular file"),
        "not named: {err}"
    );

    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 2_000, 50, 40, 1).unwrap();
    let substituted = std::process::Command::new("bash")
        .args([
            "-c",
            r#""$0" --model recsys --device cpu --epochs 1 --ratings <(cat "$1")"#,
        ])
        .arg(trainer().get_program())
        .arg(&path)
        .output();
    let Ok(out) = substituted else {
        return; // no bash here
    };
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("must be a regular file"), "{err}");
}

/// With no test ratings the epoch line says `test_rmse -` and TensorBoard
/// gets no `test/rmse` (the metrics file writes `null`), instead of NaN.
#[test]
fn no_test_ratings_is_no_test_rmse_not_nan() {
    use trainer::models::recsys::ratings::parse_line;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 400, 30, 20, 3).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .enumerate()
        .filter(|&(n, l)| n == 0 || !parse_line(l, n as u64 + 1).unwrap().is_test())
        .map(|(_, l)| l)
        .collect();
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
    let board = dir.path().join("tb");
    let out = recsys(
        &path,
        &[
            "--epochs",
            "1",
            "--batch-size",
            "16",
            "--tensorboard",
            board.to_str().unwrap(),
        ],
    );
    assert!(stderr(&out).contains("0 test ratings"), "{}", stderr(&out));
    let line = stdout(&out);
    assert!(line.contains("| test_rmse - |"), "{line}");
    assert!(!line.contains("NaN"), "{line}");
    let events = std::fs::read_dir(&board).unwrap().next().unwrap().unwrap();
    let events = std::fs::read(events.path()).unwrap();
    let has = |tag: &str| events.windows(tag.len()).any(|w| w == tag.as_bytes());
    assert!(has("epoch/train_rmse") && !has("test/rmse"));
}

/// 2,000 generated ratings (lines 2 to 2001) and then `extra`, in a new
/// folder.
fn ratings_and(extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 2_000, 50, 40, 1).unwrap();
    let mut text = std::fs::read_to_string(&path).unwrap();
    text += extra;
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// One huge id makes the table far larger than the file: refused before
/// anything that size is made (here under an address-space limit, where
/// the starting state's allocation aborted the process), naming the id,
/// its line and the sizes, in one line. `spawn`: the extra flags.
fn refuse_an_id_too_large_for_the_machine(spawn: &[&str]) {
    let (_dir, path) = ratings_and("16777215,16777215,3.0,1\n");
    // 4 GiB of parameters, about 20 GiB in all, in 6 GB of address space.
    let out = run(std::process::Command::new("bash")
        .args(["-c", r#"ulimit -v 6000000 && exec "$0" "$@""#])
        .arg(trainer().get_program())
        .args(["--model", "recsys", "--device", "cpu", "--epochs", "1"])
        .args(spawn)
        .arg("--ratings")
        .arg(&path));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        "userId 16777215 on line 2002",
        "4.1 GiB of parameters",
        "must be dense",
    ] {
        assert!(err.contains(needle), "`{needle}` not in {err}");
    }
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn an_id_too_large_for_the_machine_is_refused_before_allocating() {
    refuse_an_id_too_large_for_the_machine(&[]);
}

/// Rank threads share the machine: its memory is checked once, before
/// any starts, not by every rank (which said `(2 ranks alike)` and that 2
/// of 2 rank threads failed).
#[test]
fn rank_threads_check_the_machines_memory_once_before_they_start() {
    refuse_an_id_too_large_for_the_machine(&["--world-size", "2", "--spawn", "threads"]);
}

const EMULATED: [&str; 2] = [
    "emulated_gpu_trains_a_table_that_fits",
    "emulated_gpu_refuses_a_table_past_its_memory",
];

/// `--device cuda` on cuda-emu, whose GPU reports `CUDA_EMU_MEMORY_MIB`.
#[test]
fn recsys_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(1, &EMULATED);
}

/// The trainer on the emulated GPU with `mib` MiB of memory, on generated
/// ratings and `extra`; `None` outside the emulator's re-run.
fn on_emulated_gpu(extra: &str, mib: &str) -> Option<std::process::Output> {
    if !cuda_emu::in_emulator() {
        return None;
    }
    let (_dir, path) = ratings_and(extra);
    Some(run(trainer()
        .env("CUDA_EMU_MEMORY_MIB", mib)
        .args(["--model", "recsys", "--device", "cuda", "--epochs", "1"])
        .args(["--max-steps", "2", "--ratings"])
        .arg(path)))
}

#[test]
fn emulated_gpu_trains_a_table_that_fits() {
    let Some(out) = on_emulated_gpu("", "64") else {
        return;
    };
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(column(&out, "test_rmse").len(), 1, "{}", stdout(&out));
}

/// movieId 3,000,000: a table of 0.4 GiB, whose parameters, gradients and
/// Adam moments (1.5 GiB) the GPU's 1 GiB cannot hold, though this
/// machine's memory holds the starting state; refused naming the GPU.
#[test]
fn emulated_gpu_refuses_a_table_past_its_memory() {
    let Some(out) = on_emulated_gpu("7,3000000,3.0,1\n", "1024") else {
        return;
    };
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        "movieId 3000000 on line 2002",
        "0.4 GiB of parameters",
        "4 copies of them on the GPU",
        "1.5 GiB, but cuda:0 (cuda-emu",
        "has 1.0 GiB in all",
        "--device cpu",
    ] {
        assert!(err.contains(needle), "`{needle}` not in {err}");
    }
    assert_eq!(err.lines().count(), 1, "{err}");
}
