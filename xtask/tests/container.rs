//! The trainer's container image: `cargo xtask image` builds it (once per
//! test run, with mmdebstrap), Charliecloud's `ch-run` runs it, and what
//! runs inside ends bit for bit where the same run on the host does, also
//! after a SIGTERM and a resume, and under SLURM (`slurm-submit
//! --container`). The recipes for other engines are checked against it.
//!
//! Needs root, `mmdebstrap` and `ch-run` (`apt-get install mmdebstrap
//! charliecloud-runtime`) and apt sources that reach a Debian mirror.
//! Without them the tests that need the image print that they were skipped
//! and pass, unless REQUIRE_CONTAINER=1, which turns the skip into a
//! failure. The errors a user meets without them: `container_errors.rs`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use common::{Cluster, TRAIN, build_trainer, skip, text, workspace_root};

/// The trainer's flags for the runs compared here: 60 steps, two ranks.
const RUN: &str = "--world-size 2 --epochs 1 --max-steps 60 --seed 3 --device cpu --threads 1 \
                   --timeout 60 --checkpoint-every 10 --checkpoint-dir ckpt --metrics run.jsonl \
                   --tensorboard tb --eval-samples 500";

/// Where a finished run's parameters are: the checkpoint at its end.
const FINAL_MODEL: &str = "ckpt/ckpt-e0002-s000000/model.safetensors";

/// A hanging run fails its test instead of blocking the suite.
const DEADLINE: Duration = Duration::from_secs(180);

/// The image, built once per test binary; held by one test at a time, as
/// one builds it again in place (and two cores run one training well).
struct Built {
    dir: PathBuf,
    tarball: PathBuf,
    sha256: String,
    /// The build's standard output.
    said: String,
}

static IMAGE: Mutex<Option<Built>> = Mutex::new(None);

/// Why the image cannot be built and run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for tool in ["mmdebstrap", "ch-run"] {
        if !std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()) {
            return Some(format!("{tool} is not on PATH"));
        }
    }
    let uid = Command::new("id").arg("-u").output();
    if !uid.is_ok_and(|out| text(&out.stdout).trim() == "0") {
        return Some("building the image needs root (mmdebstrap's root mode)".into());
    }
    None
}

/// The image, or `None` when the test is to be skipped.
fn image() -> Option<Held> {
    if let Some(why) = missing_prerequisite() {
        skip("REQUIRE_CONTAINER", &why, "mmdebstrap charliecloud-runtime");
        return None;
    }
    let mut held = IMAGE.lock().unwrap_or_else(PoisonError::into_inner);
    if held.is_none() {
        build_trainer();
        *held = Some(build_image());
    }
    Some(Held(held))
}

/// The built image, held: no other test of this binary runs meanwhile.
struct Held(MutexGuard<'static, Option<Built>>);

impl std::ops::Deref for Held {
    type Target = Built;
    fn deref(&self) -> &Built {
        self.0.as_ref().expect("built when taken")
    }
}

/// Runs `cargo xtask image` on the dev trainer into the test's target folder.
fn build_image() -> Built {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["image", "--profile", "dev", "--no-build", "--out"])
        .arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join("container-image"))
        // Not the last commit's time: a checkout without its history builds too.
        .env("SOURCE_DATE_EPOCH", "1764547200")
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo xtask image failed:\n{}",
        text(&out.stderr)
    );
    let said = text(&out.stdout);
    let lines: Vec<&str> = said.lines().collect();
    let [.., dir, tarball] = lines.as_slice() else {
        panic!("no two paths at the end of:\n{said}");
    };
    let tarball = PathBuf::from(tarball);
    Built {
        dir: PathBuf::from(dir),
        sha256: sha256(&tarball),
        tarball,
        said,
    }
}

fn sha256(file: &Path) -> String {
    let out = Command::new("sha256sum").arg(file).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// The trainer `cargo xtask image` copied: cargo's dev build.
fn host_trainer() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("debug/trainer")
}

/// A synthetic data set of the real shape, written once per test binary.
fn dataset() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        fashion_mnist::synth::write_dataset(dir.path(), fashion_mnist::Layout::FASHION_MNIST)
            .unwrap();
        dir
    })
    .path()
}

/// Where a launcher's environment could make a rank of something else.
fn clean(cmd: &mut Command) -> &mut Command {
    let launch = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"];
    for (var, _) in std::env::vars() {
        if launch.contains(&var.as_str()) || var.starts_with("MASTER_") || var.starts_with("SLURM_")
        {
            cmd.env_remove(var);
        }
    }
    cmd
}

/// [`RUN`] on the host, in `out`.
fn on_host(out: &Path) -> Command {
    let mut cmd = Command::new(host_trainer());
    clean(&mut cmd)
        .args(RUN.split_whitespace())
        .arg("--data-dir")
        .arg(dataset())
        .current_dir(out);
    cmd
}

/// [`RUN`] in the image, `out` bound at its /output, the data set at /data.
fn in_image(image: &Built, out: &Path) -> Command {
    let mut cmd = Command::new("ch-run");
    clean(&mut cmd)
        .env("USER", "root")
        .arg("-b")
        .arg(format!("{}:/data", dataset().display()))
        .arg("-b")
        .arg(format!("{}:/output", out.display()))
        .args(["--cd", "/output"])
        .arg(&image.dir)
        .args(["--", "trainer"])
        .args(RUN.split_whitespace())
        .args(["--data-dir", "/data"]);
    cmd
}

fn finished(cmd: &mut Command, what: &str) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, what);
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        text(&out.stderr)
    );
    out
}

fn wait_bounded(mut child: Child, what: &str) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{what} still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The host's run's final parameters, trained once per test binary.
fn host_model() -> &'static [u8] {
    static MODEL: OnceLock<Vec<u8>> = OnceLock::new();
    MODEL.get_or_init(|| {
        let out = tempfile::tempdir().unwrap();
        finished(&mut on_host(out.path()), "the run on the host");
        std::fs::read(out.path().join(FINAL_MODEL)).unwrap()
    })
}

#[test]
fn two_ranks_in_the_image_end_bitwise_as_on_the_host() {
    let Some(image) = image() else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    finished(&mut in_image(&image, out.path()), "the run in the image");
    let model = std::fs::read(out.path().join(FINAL_MODEL)).unwrap();
    assert!(model == host_model(), "the image's run ended elsewhere");
    // What the ranks wrote in the container is the host's user's.
    let uid = std::fs::metadata(out.path()).unwrap().uid();
    let events = std::fs::read_dir(out.path().join("tb")).unwrap();
    let events: Vec<PathBuf> = events.map(|e| e.unwrap().path()).collect();
    assert!(!events.is_empty(), "no TensorBoard events");
    for written in events
        .iter()
        .chain(&[out.path().join(FINAL_MODEL), out.path().join("run.jsonl")])
    {
        let meta = std::fs::metadata(written).unwrap();
        assert_eq!(
            meta.uid(),
            uid,
            "{} is owned by uid {}",
            written.display(),
            meta.uid()
        );
    }
}

#[test]
fn sigterm_to_ch_run_saves_a_checkpoint_that_resumes_to_the_same_bytes() {
    let Some(image) = image() else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    // Every save pauses a second, so the signal lands mid-epoch.
    let child = in_image(&image, out.path())
        .env("TRAINER_TEST_PAUSE_IN_SAVE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first = out.path().join("ckpt/ckpt-e0001-s000010");
    let started = Instant::now();
    while !first.is_dir() {
        assert!(started.elapsed() < DEADLINE, "no first checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ch-run execs the program: its pid is the trainer's launcher.
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let stopped = wait_bounded(child, "the signalled run");
    let log = text(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(75), "{log}");
    assert!(log.contains("preempted at epoch 1 step "), "{log}");
    assert!(
        !out.path().join(FINAL_MODEL).exists(),
        "it did not stop: {log}"
    );

    let mut resume = in_image(&image, out.path());
    finished(resume.args(["--resume", "auto"]), "the resumed run");
    let model = std::fs::read(out.path().join(FINAL_MODEL)).unwrap();
    assert!(
        model == host_model(),
        "the resumed run ended elsewhere\n{log}"
    );
}

#[test]
fn a_second_build_gives_the_same_tarball() {
    let Some(first) = image() else {
        return;
    };
    let again = build_image();
    assert_eq!((&again.dir, &again.tarball), (&first.dir, &first.tarball));
    assert_eq!(again.sha256, first.sha256, "{}", again.said);
}

/// What `cargo xtask image --contents` says, as `(key, value)` pairs.
fn contents() -> Vec<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["image", "--contents"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| {
            let (key, value) = l.split_once(' ').unwrap();
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

fn values(contents: &[(String, String)], key: &str) -> Vec<String> {
    contents
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect()
}

/// A recipe's packages, trainer path, mount points, working directory and
/// base image, in `--contents`' terms.
fn recipe(file: &str) -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(workspace_root().join("slurm/container").join(file)).unwrap();
    let mut found = Vec::new();
    let mut put = |key: &str, value: &str| found.push((key.to_owned(), value.to_owned()));
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| *w == "--no-install-recommends") {
            let packages = words[i + 1..]
                .iter()
                .take_while(|w| !["&&", "\\"].contains(w));
            packages.for_each(|p| put("package", p));
        }
        if let Some(i) = words.windows(2).position(|w| w == ["mkdir", "-p"]) {
            words[i + 2..].iter().for_each(|m| put("mount", m));
        }
        match words.as_slice() {
            ["COPY", "trainer", path] | ["trainer", path] => put("trainer", path),
            ["WORKDIR", dir] | ["cd", dir] => put("workdir", dir),
            ["FROM", base] | ["From:", base] => put("base", base),
            _ => {}
        }
    }
    found
}

#[test]
fn the_recipes_describe_the_tested_image() {
    let contents = contents();
    let suite = values(&contents, "suite");
    for file in ["Dockerfile", "fmnist-ddp.def"] {
        let recipe = recipe(file);
        for key in ["package", "trainer", "mount", "workdir"] {
            assert_eq!(
                values(&recipe, key),
                values(&contents, key),
                "{file}: {key}"
            );
        }
        assert_eq!(
            values(&recipe, "base"),
            [format!("debian:{}-slim", suite[0])],
            "{file}"
        );
    }
    let Some(image) = image() else {
        return;
    };
    let status = std::fs::read_to_string(image.dir.join("var/lib/dpkg/status")).unwrap();
    for package in values(&contents, "package") {
        let entry = format!("Package: {package}\nStatus: install ok installed\n");
        assert!(
            status.contains(&entry),
            "{package} is not installed in the image"
        );
    }
    let inside = |path: &str| image.dir.join(path.trim_start_matches('/'));
    let trainer = std::fs::read(inside(&values(&contents, "trainer")[0])).unwrap();
    assert!(
        trainer == std::fs::read(host_trainer()).unwrap(),
        "another trainer"
    );
    for mount in values(&contents, "mount") {
        assert!(inside(&mount).is_dir(), "no mount point {mount}");
    }
    // Nothing of the toolchain.
    for tool in ["usr/bin/cc", "usr/bin/gcc", "usr/bin/ld", "usr/bin/cargo"] {
        assert!(!image.dir.join(tool).exists(), "{tool} is in the image");
    }
}

#[test]
fn a_two_node_slurm_job_in_the_image_ends_as_on_the_host() {
    let Some(image) = image() else {
        return;
    };
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    let model = |extra: &[&str]| {
        let mut args = vec!["--nodes", "2", "--tasks-per-node", "1"];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(TRAIN);
        args.extend_from_slice(&["--seed", "3"]);
        let job = cluster.submit(&args);
        job.assert_completed();
        job.assert_log_has("training finished: 1 epoch(s), world size 2");
        let stdout = text(&job.output.stdout);
        let checkpoints = stdout
            .lines()
            .find_map(|l| {
                l.split("checkpoints (unless --checkpoint-dir says otherwise): ")
                    .nth(1)
            })
            .unwrap_or_else(|| panic!("no checkpoint line:\n{}", job.report()));
        let model = Path::new(checkpoints).join("ckpt-e0002-s000000/model.safetensors");
        std::fs::read(&model)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", model.display(), job.report()))
    };
    let on_host = model(&[]);
    let dir = image.dir.to_str().unwrap();
    let in_image = model(&["--container", dir]);
    assert!(in_image == on_host, "the job in the image ended elsewhere");
}
