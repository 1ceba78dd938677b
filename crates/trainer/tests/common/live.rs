//! A `--recovery live` job as the tests drive it: started with its sample
//! ledger beside its checkpoints, its workers signalled when the ledger
//! holds a step, and what it ends on (the model's hash, the ledger, the
//! metrics file's recovery rows).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{launcher_pid, stderr_lines};

/// The sample ledger of the job checkpointing into `dir`.
pub fn ledger(dir: &Path) -> PathBuf {
    dir.with_extension("ledger.jsonl")
}

/// The final model's hash, and the ledger.
pub fn result(dir: &Path) -> (String, String) {
    let model = dir.join("ckpt-e0002-s000000/model.safetensors");
    let bytes = std::fs::read(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let ledger = std::fs::read_to_string(ledger(dir)).unwrap();
    (format!("{:x}", Sha256::digest(bytes)), ledger)
}

/// Lines of a ledger written so far.
pub fn committed(dir: &Path) -> usize {
    std::fs::read_to_string(ledger(dir)).map_or(0, |t| t.lines().count())
}

/// The `live_recovery` rows of a metrics file.
pub fn recovery_rows(metrics: &Path) -> Vec<serde_json::Value> {
    (std::fs::read_to_string(metrics).unwrap().lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|row: &serde_json::Value| row["event"] == "live_recovery")
        .collect()
}

/// The ranks (as launched) that `rows` name as lost.
pub fn lost_ranks(rows: &[serde_json::Value]) -> Vec<usize> {
    (rows.iter())
        .flat_map(|row| row["lost"].as_array().unwrap().iter())
        .map(|s| s.as_u64().unwrap() as usize)
        .collect()
}

/// A running live job of `world` ranks: its launcher, and what it said so
/// far.
pub struct Running {
    launcher: Child,
    world: usize,
    lines: Receiver<String>,
    pub log: Vec<String>,
    /// The newest pid the launcher announced for each rank it started.
    pub pids: BTreeMap<usize, String>,
}

impl Running {
    pub fn start(mut cmd: Command, world: usize) -> Running {
        let mut launcher = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (lines, _relay) = stderr_lines(&mut launcher);
        Running {
            launcher,
            world,
            lines,
            log: Vec::new(),
            pids: BTreeMap::new(),
        }
    }

    pub fn read(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            for rank in 0..self.world {
                if let Some(pid) = launcher_pid(&line, rank) {
                    self.pids.insert(rank, pid);
                }
            }
            self.log.push(line);
        }
    }

    /// Waits until `dir`'s ledger holds `steps` lines, failing the test
    /// after a minute.
    pub fn until_committed(&mut self, dir: &Path, steps: usize) {
        let since = Instant::now();
        while committed(dir) < steps {
            self.read();
            let ended = self.launcher.try_wait().unwrap();
            assert!(
                ended.is_none() && since.elapsed() < Duration::from_secs(60),
                "no step {steps} in the ledger ({ended:?}):\n{}",
                self.log.join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.read();
    }

    /// Sends `signal` to the worker now at `rank`: its pid.
    pub fn signal(&mut self, rank: usize, signal: &str) -> String {
        let pid = self.pids[&rank].clone();
        let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(sent.success(), "kill {signal} {pid}");
        pid
    }

    pub fn finish(mut self) -> (ExitStatus, String) {
        let status = self.launcher.wait().unwrap();
        // The relay ends with the stream.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.log.push(line);
        }
        (status, self.log.join("\n"))
    }
}
