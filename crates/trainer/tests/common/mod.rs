//! Shared fixtures for the trainer's end-to-end tests: a synthetic data set
//! of the real sizes, written once per test binary, and a way to run the
//! binary and read what it said.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, channel};

use comm::launch_var;
use fashion_mnist::{Layout, synth};

pub mod live;
pub mod nodes;
pub mod pipeline;

/// A valid synthetic FashionMNIST (60,000 + 10,000 images) in a temp dir
/// that lives as long as the test binary.
pub fn dataset() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        synth::write_dataset(dir.path(), Layout::FASHION_MNIST)
            .expect("writing the synthetic data set");
        dir
    })
    .path()
}

/// A small synthetic data set, loaded, for tests that train in-process.
pub fn small_data(train_len: usize, test_len: usize) -> fashion_mnist::FashionMnist {
    let dir = tempfile::tempdir().expect("temp dir");
    let layout = Layout {
        train_len,
        test_len,
    };
    synth::write_dataset(dir.path(), layout).expect("writing the synthetic data set");
    fashion_mnist::FashionMnist::load_with(dir.path(), layout).expect("loading it back")
}

/// Trains `trainer`'s first epoch: the parameters after each step, and the
/// epoch's report.
pub fn params_after_each_step<B: core_tensor::Ops>(
    trainer: &mut trainer::train::Trainer<B, trainer::models::cnn::CnnMnist>,
) -> (Vec<Vec<f32>>, trainer::train::EpochReport) {
    let mut history = Vec::new();
    let report = trainer
        .train_epoch(1, &mut trainer::train::Silent, &mut |t| {
            history.push(t.params()?);
            Ok(())
        })
        .expect("training one epoch");
    (history, report)
}

/// The SHA-256 of `values`' little-endian bytes, in hex: what a
/// checkpoint's model file holds of them, to record their bits.
pub fn sha256_hex(values: &[f32]) -> String {
    use sha2::{Digest, Sha256};
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    format!("{:x}", Sha256::digest(&bytes))
}

/// `body(rank)` for ranks 0 and 1, each on a thread of its own; the results
/// in rank order.
pub fn on_two_ranks<T: Send>(body: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let body = &body;
                s.spawn(move || body(rank))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

/// A private copy of [`dataset`] to damage.
pub fn dataset_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(dataset()).expect("listing the data set") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).expect("copying");
    }
    dir
}

/// A copy of [`dataset`] with the last training label changed: the same
/// size, other contents.
pub fn relabelled_dataset() -> tempfile::TempDir {
    let dir = dataset_copy();
    let mut labels = synth::labels_idx(60_000);
    *labels.last_mut().unwrap() ^= 1;
    synth::write_gz(&dir.path().join(fashion_mnist::TRAIN_LABELS), &labels).unwrap();
    dir
}

/// The trainer binary's path: cargo's, or `TRAINER_BIN` where the test
/// executable runs away from its build tree (the device bundle).
pub fn trainer_bin() -> std::ffi::OsString {
    std::env::var_os("TRAINER_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_trainer").into())
}

/// The trainer binary, to run.
pub fn trainer() -> Command {
    let mut cmd = Command::new(trainer_bin());
    // Never inherit a launcher's identity from the test environment.
    for var in launch_var::TORCHRUN {
        cmd.env_remove(var);
    }
    for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with(launch_var::SLURM_PREFIX)) {
        cmd.env_remove(var);
    }
    cmd
}

/// A launch of `world_size` one-thread ranks on the test data set for
/// `epochs` epochs, peers given up after `timeout_s` seconds: what the
/// process-level tests start from, adding their own flags.
pub fn job(world_size: usize, epochs: usize, timeout_s: u64) -> Command {
    let mut cmd = trainer();
    cmd.arg("--world-size")
        .arg(world_size.to_string())
        .arg("--epochs")
        .arg(epochs.to_string())
        .args(["--threads", "1", "--timeout"])
        .arg(timeout_s.to_string())
        .args(data_arg(dataset()));
    cmd
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("running the trainer")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `--data-dir dir`, evaluating on the first [`EVAL_SAMPLES`] test images:
/// every epoch of every trainer a test starts would otherwise infer all
/// 10,000 (about 4 s of a core each), for an accuracy that only a few tests
/// read, and none to more than a point.
pub fn data_arg(dir: &Path) -> [PathBuf; 4] {
    [
        PathBuf::from("--data-dir"),
        dir.to_path_buf(),
        PathBuf::from("--eval-samples"),
        PathBuf::from(EVAL_SAMPLES.to_string()),
    ]
}

/// The test images a trainer started by [`data_arg`] evaluates on.
pub const EVAL_SAMPLES: usize = 500;

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An IPv4 address of this machine that is not loopback (`hostname -I`),
/// for a rendezvous other machines could reach; `None`, saying the test is
/// skipped, where there is none.
pub fn outside_address() -> Option<String> {
    let listed = Command::new("hostname").arg("-I").output().ok()?;
    let found = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback());
    if found.is_none() {
        eprintln!("skipped: `hostname -I` names no address of this machine but loopback");
    }
    found.map(|ip| ip.to_string())
}

/// The lines `child` writes to stderr (which must be piped), as they come,
/// from a thread that ends with the stream.
pub fn stderr_lines(child: &mut Child) -> (Receiver<String>, std::thread::JoinHandle<()>) {
    let (tx, rx) = channel();
    let reader = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let relay = std::thread::spawn(move || {
        reader
            .lines()
            .map_while(Result::ok)
            .for_each(|l| drop(tx.send(l)))
    });
    (rx, relay)
}

/// Reads `lines` (a child's, from [`stderr_lines`]) into `log` until one
/// contains `needle`, and returns it (also kept in `log`); fails, showing
/// `log`, when none comes within `within`.
pub fn wait_for_line(
    lines: &Receiver<String>,
    log: &mut Vec<String>,
    needle: &str,
    within: std::time::Duration,
) -> String {
    let until = std::time::Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                log.push(line.clone());
                if line.contains(needle) {
                    return line;
                }
            }
            Err(e) => panic!("no {needle:?} ({e}):\n{}", log.join("\n")),
        }
    }
}

/// A checkpoint file's bytes as a test compares them between runs given
/// other flags: a state file without its record of the flags
/// (`shared_settings`, which names them) and the checksum that covers it,
/// any other file as it is.
pub fn without_flag_record(name: &Path, bytes: Vec<u8>) -> Vec<u8> {
    if !name.ends_with(trainer::checkpoint::STATE_FILE) {
        return bytes;
    }
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let metadata = header["__metadata__"].as_object_mut().unwrap();
    assert!(metadata.remove("shared_settings").is_some(), "no record");
    assert!(metadata.remove("sha256").is_some(), "no checksum");
    let header = serde_json::to_vec(&header).unwrap();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.extend_from_slice(&bytes[8 + len..]);
    out
}

/// The checkpoint a one-epoch run writes at its end, in `dir`.
pub fn final_state(dir: &Path) -> trainer::checkpoint::TrainingState {
    let end = dir.join(trainer::checkpoint::Position { epoch: 2, step: 0 }.dir_name());
    trainer::checkpoint::load(&end, trainer::models::cnn::cnn_layout()).unwrap()
}

/// The pid the launcher announced for `rank`, if `line` is that announcement.
pub fn launcher_pid(line: &str, rank: usize) -> Option<String> {
    line.strip_prefix(&format!("launcher: started rank {rank} (pid "))
        .and_then(|r| r.split(')').next())
        .map(str::to_string)
}

/// Waits until `dir` exists (a checkpoint being written), failing the test
/// after `limit`.
pub fn wait_for_dir(dir: &Path, limit: std::time::Duration) {
    let start = std::time::Instant::now();
    while !dir.is_dir() {
        assert!(
            start.elapsed() < limit,
            "no {} after {limit:?}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Re-runs `tests` of this binary on cuda-emu with `gpus` emulated GPUs
/// (so that each rank has one and may use NCCL); see
/// [`cuda_emu::rerun_on_emulator`]. One at a time: the emulator runs one
/// kernel launch at a time in a process anyway (its shared memory is
/// static), so side by side they would only interleave.
pub fn rerun_on_emulated_gpus(gpus: usize, tests: &[&str]) {
    let mut args = vec!["--exact", "--test-threads=1"];
    args.extend(tests);
    cuda_emu::rerun_on_emulator(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &args,
        &[("CUDA_EMU_DEVICES", &gpus.to_string())],
        tests.len(),
    );
}

/// The emulated GPU `ordinal`, in the re-run only.
pub fn emulated_gpu(ordinal: usize) -> Option<core_tensor::Cuda> {
    use core_tensor::Backend;
    if !cuda_emu::in_emulator() {
        return None;
    }
    let gpu = core_tensor::Cuda::new(ordinal).expect("the emulator is loaded");
    assert!(gpu.describe().contains("cuda-emu"), "{}", gpu.describe());
    Some(gpu)
}

/// The Python named by `$python_var` (else `python3`) when it can run
/// `import {modules}`; else `None`, saying the test is skipped, or failing
/// when `$require_var` is 1 (as in CI).
pub fn python_with(python_var: &str, modules: &str, require_var: &str) -> Option<String> {
    let python = std::env::var(python_var).unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(python);
    }
    let why = format!("`{python}` cannot import {modules} (set {python_var} to a Python that can)");
    assert!(
        std::env::var(require_var).as_deref() != Ok("1"),
        "{require_var}=1, but {why}"
    );
    eprintln!("skipped: {why}");
    None
}
