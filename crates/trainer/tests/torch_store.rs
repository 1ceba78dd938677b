//! comm's client of a launcher's store against PyTorch's own c10d
//! `TCPStore` server (the one torchrun's agent hosts), started from
//! Python: ranks form their ring through it, PyTorch reads their keys,
//! and what rank 0's store refuses is refused there too.
//!
//! Needs Python with torch: `TORCH_PYTHON`, else `python3`. Without it the
//! tests say so and pass, unless REQUIRE_TORCH=1 (as in CI).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use comm::{
    AuthToken, CommConfig, CommError, Communicator, ReduceOp, Rejection, Store, StoreHost,
    StoreServer, TcpCommunicator,
};
use common::python_with;

/// A TCPStore server on a free loopback port; each line read from stdin
/// is a key, answered on stdout with its value in hex, or `<unset>`.
const SERVER: &str = r#"
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=30))
print(store.port, flush=True)
for line in sys.stdin:
    key = line.strip()
    print(store.get(key).hex() if store.check([key]) else "<unset>", flush=True)
"#;

/// PyTorch's store, one per test binary (tests keep apart by their keys'
/// prefixes); it ends with the binary, whose end closes its stdin.
struct TorchStore {
    port: u16,
    ask: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    _server: Child,
}

impl TorchStore {
    /// The store, or `None` (the test is skipped) without torch.
    fn get() -> Option<&'static TorchStore> {
        static STORE: OnceLock<Option<TorchStore>> = OnceLock::new();
        STORE
            .get_or_init(|| {
                let python = python_with("TORCH_PYTHON", "torch", "REQUIRE_TORCH")?;
                let mut server = Command::new(python)
                    .args(["-c", SERVER])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("starting PyTorch's TCPStore");
                let mut stdout = BufReader::new(server.stdout.take().unwrap());
                let mut port = String::new();
                stdout.read_line(&mut port).unwrap();
                Some(TorchStore {
                    port: port.trim().parse().expect("the store's port"),
                    ask: Mutex::new((server.stdin.take().unwrap(), stdout)),
                    _server: server,
                })
            })
            .as_ref()
    }

    /// `key`'s value as PyTorch's own client reads it.
    fn read(&self, key: &str) -> String {
        let mut ask = self.ask.lock().unwrap();
        writeln!(ask.0, "{key}").unwrap();
        let mut value = String::new();
        ask.1.read_line(&mut value).unwrap();
        match value.trim_end() {
            "<unset>" => "<unset>".to_string(),
            hex => {
                let bytes: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                String::from_utf8(bytes).unwrap()
            }
        }
    }

    /// Rank `rank`'s configuration, its keys under `prefix`.
    fn config(&self, prefix: &str, rank: usize, world: usize) -> CommConfig {
        CommConfig::new(rank, world, "127.0.0.1", self.port)
            .with_timeout(Duration::from_secs(30))
            .with_store(StoreHost::Agent {
                prefix: prefix.to_string(),
            })
    }
}

#[test]
fn ranks_form_an_authenticated_ring_through_pytorchs_store_and_pytorch_reads_their_keys() {
    let Some(torch) = TorchStore::get() else {
        return;
    };
    let token = AuthToken::generate().unwrap();
    let prefix = "trainer/ring/attempt_0/";
    let sums = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let config = torch
                    .config(prefix, rank, 3)
                    .with_auth(comm::Auth::Token(token.clone()));
                s.spawn(move || {
                    let mut comm = TcpCommunicator::connect(&config).unwrap();
                    let mut values = vec![rank as f32 + 1.0; 5];
                    comm.all_reduce(&mut values, ReduceOp::Sum).unwrap();
                    values
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(sums.iter().all(|v| v == &[6.0; 5]), "{sums:?}");
    assert_eq!(torch.read(&format!("{prefix}comm/world_size")), "3");
    assert_eq!(torch.read(&format!("{prefix}comm/rank/2")), "1");
    assert!(
        torch
            .read(&format!("{prefix}comm/tcp/addr/1"))
            .contains("127.0.0.1:")
    );
    assert_eq!(
        torch.read("trainer/ring/attempt_1/comm/world_size"),
        "<unset>"
    );
}

#[test]
fn a_rank_of_another_world_size_is_refused_and_a_waiting_rank_hears_why() {
    let Some(torch) = TorchStore::get() else {
        return;
    };
    let prefix = "trainer/sizes/attempt_0/";
    let mut first = Store::connect(&torch.config(prefix, 0, 2)).unwrap();
    let err = Store::connect(&torch.config(prefix, 1, 3)).unwrap_err();
    let mismatch = Rejection::WorldSizeMismatch {
        rank: 1,
        rank_world_size: 3,
        master_world_size: 2,
    };
    assert!(
        matches!(&err, CommError::Rejected(r) if *r == mismatch),
        "{err}"
    );
    // Rank 0 waits for a key that never comes: the refusal ends its wait
    // (a timeout would be `Ok(None)`).
    let heard = first
        .wait_for("never", Duration::from_secs(600))
        .unwrap_err();
    assert!(
        matches!(&heard, CommError::Rejected(r) if *r == mismatch),
        "{heard}"
    );
}

#[test]
fn a_second_process_as_the_same_rank_is_refused() {
    let Some(torch) = TorchStore::get() else {
        return;
    };
    let config = torch.config("trainer/twice/attempt_0/", 1, 2);
    let _first = Store::connect(&config).unwrap();
    let err = Store::connect(&config).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::Rejected(Rejection::DuplicateRank { rank: 1 })
        ),
        "{err}"
    );
}

#[test]
fn a_wait_that_runs_out_is_none_and_the_connection_goes_on_serving() {
    let Some(torch) = TorchStore::get() else {
        return;
    };
    let mut store = Store::connect(&torch.config("trainer/wait/attempt_0/", 0, 1)).unwrap();
    let waited = store.wait_for("late", Duration::from_millis(500)).unwrap();
    assert_eq!(waited, None);
    store.set("late", b"here").unwrap();
    assert_eq!(store.get("late").unwrap(), b"here");
    assert_eq!(torch.read("trainer/wait/attempt_0/late"), "here");
}

#[test]
fn a_port_where_no_tcpstore_answers_is_named_with_the_fix() {
    // Rank 0's own store speaks another protocol.
    let ours = StoreServer::bind("127.0.0.1", 0, 2, Duration::from_secs(30)).unwrap();
    let config = CommConfig::new(1, 2, "127.0.0.1", ours.port())
        .with_timeout(Duration::from_secs(30))
        .with_store(StoreHost::Agent {
            prefix: "p/".to_string(),
        });
    let err = Store::connect(&config).unwrap_err().to_string();
    assert!(
        err.contains("none answered") && err.contains("unset TORCHELASTIC_USE_AGENT_STORE"),
        "{err}"
    );
}
