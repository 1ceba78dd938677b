//! `cargo xtask fetch-data` against a throw-away HTTP server on 127.0.0.1.

use fashion_mnist::{FILES, SYSTEM_DIR, TEST_LABELS};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::thread;

/// What the test server answers for one path.
#[derive(Clone)]
enum Reply {
    Body(Vec<u8>),
    Status(u16, &'static str),
}

/// A minimal HTTP/1.1 server: one request per connection, answers from a
/// fixed table (404 for anything else), records the paths it was asked for.
/// It serves at most `max_requests` connections, then its thread ends.
struct Server {
    base_url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(replies: HashMap<String, Reply>, max_requests: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let base_url = format!("http://{}/", listener.local_addr().expect("bound address"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        thread::spawn(move || {
            for stream in listener.incoming().take(max_requests) {
                let Ok(stream) = stream else { continue };
                serve(stream, &replies, &log);
            }
        });
        Self { base_url, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("log lock").clone()
    }
}

/// Answers one request, logging its path before the answer goes out (the
/// client may be done, and the test looking, before this thread runs again).
fn serve(
    stream: TcpStream,
    replies: &HashMap<String, Reply>,
    log: &Mutex<Vec<String>>,
) -> Option<()> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    let path = request_line
        .split_whitespace()
        .nth(1)?
        .trim_start_matches('/')
        .to_owned();
    // Drain the headers up to the blank line.
    let mut header = String::new();
    while reader.read_line(&mut header).ok()? > 2 {
        header.clear();
    }
    log.lock().expect("log lock").push(path.clone());
    let (status, reason, body) = match replies.get(&path) {
        Some(Reply::Body(body)) => (200, "OK", body.clone()),
        Some(Reply::Status(status, reason)) => (*status, *reason, Vec::new()),
        None => (404, "Not Found", Vec::new()),
    };
    let mut stream = stream;
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(&body).ok()
}

fn fetch_data(url: &str, dest: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["fetch-data", "--url", url, "--dest"])
        .arg(dest)
        .output()
        .expect("xtask runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dest exists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

fn gzip(content: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("file.gz");
    fashion_mnist::synth::write_gz(&path, content).expect("write gz");
    std::fs::read(path).expect("read gz")
}

#[test]
fn corrupt_download_is_rejected_and_leaves_no_file() {
    // The first file fetched is the test labels; serve a valid gzip of the
    // wrong content (synthetic labels) in its place.
    assert_eq!(FILES[0].name, TEST_LABELS);
    let replies = HashMap::from([(
        TEST_LABELS.to_owned(),
        Reply::Body(gzip(&fashion_mnist::synth::labels_idx(10_000))),
    )]);
    let server = Server::start(replies, 4);
    let dest = tempfile::tempdir().expect("tempdir");

    let output = fetch_data(&server.base_url, dest.path());
    let message = stderr(&output);
    assert!(!output.status.success(), "{message}");
    assert!(message.contains(TEST_LABELS), "{message}");
    assert!(message.contains("failed verification"), "{message}");
    assert!(message.contains("SHA-256 checksum mismatch"), "{message}");
    assert_eq!(
        dir_entries(dest.path()),
        Vec::<String>::new(),
        "no file, not even a temporary one"
    );
    assert_eq!(server.requests(), vec![TEST_LABELS.to_owned()]);
}

#[test]
fn non_gzip_download_is_rejected() {
    let replies = HashMap::from([(
        TEST_LABELS.to_owned(),
        Reply::Body(b"<html>moved</html>".to_vec()),
    )]);
    let server = Server::start(replies, 4);
    let dest = tempfile::tempdir().expect("tempdir");

    let output = fetch_data(&server.base_url, dest.path());
    let message = stderr(&output);
    assert!(!output.status.success(), "{message}");
    assert!(message.contains("not a gzip file"), "{message}");
    assert_eq!(dir_entries(dest.path()), Vec::<String>::new());
}

#[test]
fn http_error_status_is_reported_with_the_url() {
    let replies = HashMap::from([(
        TEST_LABELS.to_owned(),
        Reply::Status(503, "Service Unavailable"),
    )]);
    let server = Server::start(replies, 4);
    let dest = tempfile::tempdir().expect("tempdir");

    let output = fetch_data(&server.base_url, dest.path());
    let message = stderr(&output);
    assert!(!output.status.success(), "{message}");
    assert!(
        message.contains(&format!("{}{TEST_LABELS}", server.base_url)),
        "{message}"
    );
    assert!(message.contains("HTTP 503"), "{message}");
    assert_eq!(dir_entries(dest.path()), Vec::<String>::new());
}

#[test]
fn refused_connection_names_the_url() {
    // Bind and drop a listener to get a loopback port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}/");
    let dest = tempfile::tempdir().expect("tempdir");

    let output = fetch_data(&url, dest.path());
    let message = stderr(&output);
    assert!(!output.status.success(), "{message}");
    assert!(
        message.contains(&format!("cannot download {url}{TEST_LABELS}")),
        "{message}"
    );
    assert_eq!(dir_entries(dest.path()), Vec::<String>::new());
}

#[test]
fn fetches_verifies_and_then_skips_the_real_files() {
    let system = Path::new(SYSTEM_DIR);
    if !FILES.iter().all(|file| system.join(file.name).is_file()) {
        println!(
            "skipped: FashionMNIST is not installed in {SYSTEM_DIR} (apt-get install dataset-fashion-mnist)"
        );
        return;
    }
    let replies: HashMap<String, Reply> = FILES
        .iter()
        .map(|file| {
            let body = std::fs::read(system.join(file.name)).expect("readable");
            (file.name.to_owned(), Reply::Body(body))
        })
        .collect();
    let server = Server::start(replies, 8);
    let dest = tempfile::tempdir().expect("tempdir");
    let mut expected: Vec<String> = FILES.iter().map(|file| file.name.to_owned()).collect();
    expected.sort();

    let first = fetch_data(&server.base_url, dest.path());
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(dir_entries(dest.path()), expected);
    assert_eq!(server.requests().len(), 4);
    fashion_mnist::FashionMnist::load(dest.path()).expect("the fetched data set loads");
    #[cfg(unix)]
    for file in &FILES {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dest.path().join(file.name))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o044,
            0o044,
            "{} must be readable by others",
            file.name
        );
    }

    let second = fetch_data(&server.base_url, dest.path());
    let message = stderr(&second);
    assert!(second.status.success(), "{message}");
    assert_eq!(
        message
            .matches("already present and valid, skipped")
            .count(),
        4,
        "{message}"
    );
    assert_eq!(server.requests().len(), 4, "nothing is downloaded twice");
}

/// Without a network (here: a closed local port) the MovieLens download is
/// one clear error and leaves no ratings file.
#[test]
fn movielens_without_a_network_is_a_clear_error() {
    let dest = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/ml-latest-small.zip");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["fetch-data", "movielens", "--url", &url, "--dest"])
        .arg(dest.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("is there a network?") || err.contains("cannot run `curl`"),
        "{err}"
    );
    assert!(!dest.path().join("ratings.csv").exists());
}
