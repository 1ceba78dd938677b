//! `cargo xtask fetch-data` against local servers that accept a connection
//! and then stall, and what a download leaves behind when it is stopped.
//! The hidden `--stall-secs` shortens the stall window so that each case
//! fails in seconds; the deadline below only turns a hang into a failure.

use fashion_mnist::{FILES, SYSTEM_DIR, TEST_LABELS};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

/// Far above what any case needs (seconds); a download that hangs fails
/// the test instead of the suite.
const DEADLINE: Duration = Duration::from_secs(90);

/// What the server does after reading a request.
#[derive(Clone, Copy)]
enum Stall {
    /// Sends nothing at all, and keeps the connection open.
    Silent,
    /// Sends response headers promising 100 kB, then one byte every 100 ms.
    Trickle,
    /// No stall: answers HTTP 503 at once, a quick transient failure.
    Busy,
}

/// A local server and the number of requests it has read.
struct Server {
    base: String,
    requests: Arc<AtomicUsize>,
}

impl Server {
    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Serves every connection on its own thread as `stall` says.
fn stalling_server(stall: Stall) -> Server {
    serving(stall, HashMap::new())
}

/// Serves the paths in `whole` in full, the others as `stall` says.
fn serving(stall: Stall, whole: HashMap<String, Vec<u8>>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let base = format!("http://{}/", listener.local_addr().expect("address"));
    let requests = Arc::new(AtomicUsize::new(0));
    let (count, whole) = (Arc::clone(&requests), Arc::new(whole));
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (count, whole) = (Arc::clone(&count), Arc::clone(&whole));
            thread::spawn(move || serve(stream, stall, &count, &whole));
        }
    });
    Server { base, requests }
}

fn serve(
    mut stream: TcpStream,
    stall: Stall,
    count: &AtomicUsize,
    whole: &HashMap<String, Vec<u8>>,
) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    let path = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .trim_start_matches('/')
        .to_owned();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    // Counted before the answer, which may end the client's run.
    count.fetch_add(1, Ordering::SeqCst);
    if let Some(body) = whole.get(&path) {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        let _ = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body));
        return;
    }
    match stall {
        // Held open until the client gives up and closes it.
        Stall::Silent => while reader.read_line(&mut line).is_ok_and(|n| n > 0) {},
        Stall::Trickle => {
            let head = "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            while stream.write_all(b"x").is_ok() {
                sleep(Duration::from_millis(100));
            }
        }
        Stall::Busy => {
            let head = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
        }
    }
}

fn xtask(args: &[&str], dest: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.arg("fetch-data").args(args).arg("--dest").arg(dest);
    cmd
}

/// Starts `cmd` with its stdout and stderr in files under `logs`.
fn spawn(cmd: &mut Command, logs: &Path) -> Child {
    cmd.stdout(File::create(logs.join("stdout")).expect("stdout file"))
        .stderr(File::create(logs.join("stderr")).expect("stderr file"))
        .spawn()
        .expect("xtask runs")
}

/// Waits for `child`, killing it (and failing) past `DEADLINE`.
fn finish(mut child: Child, logs: &Path) -> Output {
    let started = Instant::now();
    let status: ExitStatus = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            child.kill().expect("kill");
            child.wait().expect("reap");
            panic!(
                "fetch-data still running after {DEADLINE:?}:\n{}",
                std::fs::read_to_string(logs.join("stderr")).unwrap_or_default()
            );
        }
        sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: std::fs::read(logs.join("stdout")).expect("stdout"),
        stderr: std::fs::read(logs.join("stderr")).expect("stderr"),
    }
}

fn run(cmd: &mut Command) -> (Output, String) {
    let logs = tempfile::tempdir().expect("tempdir");
    let output = finish(spawn(cmd, logs.path()), logs.path());
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dest exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A FashionMNIST fetch from a server that stalls so, with a 1 s window:
/// it fails and leaves nothing (no `.part` file) in its destination. The
/// server's URL and what the fetch said.
fn fetch_stalled_by(stall: Stall) -> (String, String) {
    let base = stalling_server(stall).base;
    let dest = tempfile::tempdir().expect("tempdir");
    let (out, err) = run(&mut xtask(
        &["--url", &base, "--stall-secs", "1"],
        dest.path(),
    ));
    assert!(!out.status.success(), "{err}");
    assert_eq!(entries(dest.path()), Vec::<String>::new(), "no .part file");
    (base, err)
}

#[test]
fn a_server_that_never_answers_fails_naming_the_url() {
    let (base, err) = fetch_stalled_by(Stall::Silent);
    assert!(
        err.contains(&format!(
            "cannot download {base}{TEST_LABELS}: the server accepted the connection \
             but sent no response headers within 1 s"
        )),
        "{err}"
    );
}

#[test]
fn a_body_that_trickles_in_fails_as_a_stall() {
    let (base, err) = fetch_stalled_by(Stall::Trickle);
    assert!(
        err.contains(&format!(
            "download of {base}{TEST_LABELS} was interrupted; nothing was saved: \
             the transfer stalled: fewer than 1000 bytes arrived in 1 s"
        )),
        "{err}"
    );
}

/// Runs `cmd`, sends it `signal` (`INT`, `TERM`) once the entries of `dest`
/// are `ready`, and waits for its end.
fn stop_when_ready(
    cmd: &mut Command,
    dest: &Path,
    ready: impl Fn(&[String]) -> bool,
    signal: &str,
) -> (Output, String) {
    let logs = tempfile::tempdir().expect("tempdir");
    let child = spawn(cmd, logs.path());
    let started = Instant::now();
    while !ready(&entries(dest)) {
        assert!(started.elapsed() < DEADLINE, "{dest:?} never got ready");
        sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    let out = finish(child, logs.path());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

/// A FashionMNIST fetch from a server that trickles, stopped by `signal`
/// while a file comes: exit status 130, one `error:` line naming the file's
/// URL, no temporary file. The first file, which the server sends whole
/// where Debian's package is installed, was verified before: it stays.
fn fetch_stopped_by(signal: &str) {
    let whole: HashMap<String, Vec<u8>> = std::fs::read(Path::new(SYSTEM_DIR).join(TEST_LABELS))
        .map(|body| HashMap::from([(TEST_LABELS.to_owned(), body)]))
        .unwrap_or_default();
    let kept: Vec<String> = whole.keys().cloned().collect();
    let server = serving(Stall::Trickle, whole);
    let dest = tempfile::tempdir().expect("tempdir");
    // The temporary file appears once the handlers are in place and the
    // body is coming.
    let (out, err) = stop_when_ready(
        &mut xtask(&["--url", &server.base], dest.path()),
        dest.path(),
        |names| names.iter().any(|name| name.ends_with(".part")),
        signal,
    );
    assert_eq!(out.status.code(), Some(130), "{err}");
    let coming = FILES[kept.len()].name;
    assert!(
        err.contains(&format!(
            "error: downloading {}{coming}: interrupted by a signal; nothing was saved",
            server.base
        )),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert_eq!(entries(dest.path()), kept, "no temporary or partial file");
}

#[test]
fn a_fetch_stopped_by_sigint_saves_nothing_of_the_file_under_way() {
    fetch_stopped_by("INT");
}

#[test]
fn a_fetch_stopped_by_sigterm_saves_nothing_of_the_file_under_way() {
    fetch_stopped_by("TERM");
}

/// `fetch-data movielens` from a server that answers as `stall` says, with
/// a stall window of `secs`: it fails and leaves nothing (no scratch
/// folder) in its destination. The server, the zip's URL and what the
/// fetch said.
fn movielens_fails_on(stall: Stall, secs: &str) -> (Server, String, String) {
    let server = stalling_server(stall);
    let url = format!("{}ml-latest-small.zip", server.base);
    let dest = tempfile::tempdir().expect("tempdir");
    let (out, err) = run(&mut xtask(
        &["movielens", "--url", &url, "--stall-secs", secs],
        dest.path(),
    ));
    assert!(!out.status.success(), "{err}");
    assert_eq!(entries(dest.path()), Vec::<String>::new(), "{err}");
    (server, url, err)
}

/// curl's retries would wait a stall window each (three in all).
#[test]
fn movielens_gives_up_on_a_silent_server_at_once_and_leaves_nothing() {
    let (server, url, err) = movielens_fails_on(Stall::Silent, "1");
    assert!(
        err.contains(&format!("downloading {url} (is there a network?)"))
            && err.contains(
                "timed out: no connection within 20 s, or under 1000 bytes/s for 1 s; \
                 a stall is not retried"
            ),
        "{err}"
    );
    assert_eq!(server.requests(), 1, "a stall is not retried");
    // stderr is a file here: curl's progress meter stays off.
    assert!(!err.contains('\r'), "{err:?}");
}

/// Retries are kept for what fails fast.
#[test]
fn movielens_retries_a_busy_server_twice() {
    let (server, _, err) = movielens_fails_on(Stall::Busy, "30");
    assert!(err.contains("503"), "{err}");
    assert_eq!(server.requests(), 3, "{err}");
}

#[test]
fn movielens_stopped_by_sigterm_removes_its_scratch_folder() {
    let url = format!("{}ml-latest-small.zip", stalling_server(Stall::Silent).base);
    let dest = tempfile::tempdir().expect("tempdir");
    // The scratch folder appears once the signal handlers are in place.
    let (out, err) = stop_when_ready(
        &mut xtask(&["movielens", "--url", &url], dest.path()),
        dest.path(),
        |names| !names.is_empty(),
        "TERM",
    );
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted by a signal; nothing was saved"),
        "{err}"
    );
    assert_eq!(
        entries(dest.path()),
        Vec::<String>::new(),
        "no scratch folder"
    );
}

#[test]
fn a_later_run_removes_scratch_left_by_a_dead_run_only() {
    // Above Linux's largest pid (2^22): no such process can run.
    let dead = 4_999_999;
    let alive = std::process::id();
    let dest = tempfile::tempdir().expect("tempdir");
    let stale_part = format!(".{TEST_LABELS}.{dead}-abc123.part");
    let live_part = format!(".{TEST_LABELS}.{alive}-abc123.part");
    let stale_dir = format!(".movielens.{dead}-abc123");
    std::fs::write(dest.path().join(&stale_part), b"half").expect("write");
    std::fs::write(dest.path().join(&live_part), b"half").expect("write");
    std::fs::create_dir(dest.path().join(&stale_dir)).expect("mkdir");
    std::fs::write(dest.path().join(&stale_dir).join("movielens.zip"), b"x").expect("write");
    // A closed port: each run fails at once, after its sweep.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let base = format!("http://127.0.0.1:{port}/");

    let (out, err) = run(&mut xtask(&["--url", &base], dest.path()));
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&stale_part) && err.contains("left behind by an interrupted run"),
        "{err}"
    );
    let url = format!("{base}ml-latest-small.zip");
    let (out, err) = run(&mut xtask(&["movielens", "--url", &url], dest.path()));
    assert!(!out.status.success(), "{err}");
    // The live process's file stays: it may be a concurrent run's.
    assert_eq!(entries(dest.path()), vec![live_part]);
}
