//! One `--recovery live` job of the trainer, its workers SIGKILLed as a
//! plan says, and what it reported of each recovery.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// A kill: the rank (as the launcher started it) and the committed step
/// after which it falls.
#[derive(Clone, Copy, Debug)]
pub struct Kill {
    pub rank: usize,
    pub after_step: usize,
}

/// One recovery as rank 0 reported it: its metrics row, and when its line
/// reached the bench.
#[derive(Clone)]
pub struct Recovery {
    pub row: serde_json::Value,
    pub line_at: Instant,
}

impl Recovery {
    pub fn seconds(&self) -> f64 {
        self.row["seconds"].as_f64().unwrap_or(f64::NAN)
    }

    pub fn heal_bytes(&self) -> Option<u64> {
        self.row["heal_bytes"].as_u64()
    }
}

/// What a kill cost: the survivors' recovery and the replacement's join
/// (one and the same where the replacement was in time for the first).
pub struct Cost {
    pub kill: Kill,
    /// From the SIGKILL to rank 0's line of the survivors' recovery,
    /// less that recovery's seconds: the loss's detection (and the line's
    /// way through the launcher's pipe).
    pub detection: f64,
    pub lost: Recovery,
    pub join: Recovery,
}

/// The finished job: each kill's cost, and the model it ended on.
pub struct Ran {
    pub costs: Vec<Cost>,
    pub model: Vec<u8>,
    pub seconds: f64,
}

/// The SHA-256 of `bytes`, its first 16 hex digits.
pub fn short_hash(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))[..16].to_string()
}

/// The final model a one-epoch job checkpointing into `dir` writes.
pub fn final_model(dir: &Path) -> Result<Vec<u8>> {
    let path = dir.join("ckpt-e0002-s000000/model.safetensors");
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

/// Runs `cmd` (a live job of `world` ranks checkpointing into `dir`, its
/// ledger at `ledger`, its metrics at `metrics`) and kills as `plan` says,
/// each once the step it names is in the ledger and the kill before it has
/// been healed (the replacement joined): so that every kill finds a full
/// ring and its two recoveries are told apart.
pub fn run(
    mut cmd: Command,
    world: usize,
    (dir, ledger, metrics): (&Path, PathBuf, PathBuf),
    plan: &[Kill],
) -> Result<Ran> {
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the trainer")?;
    let mut job = Watched::new(&mut child, world);
    // Per kill: when it was sent, and the first of its recoveries.
    let mut sent = Vec::new();
    for kill in plan {
        job.until(|_| committed(&ledger) >= kill.after_step)?;
        let pid = job.pids.get(&kill.rank).context("no pid for the rank")?;
        let status = Command::new("kill").args(["-KILL", pid]).status()?;
        if !status.success() {
            bail!("kill -KILL {pid} (rank {}) failed", kill.rank);
        }
        let first = job.recoveries.len();
        sent.push((Instant::now(), first));
        job.until(|job| job.recoveries[first..].iter().any(|&(_, join)| join))?;
    }
    let status = child.wait()?;
    job.drain();
    if !status.success() {
        bail!("the job failed ({status}):\n{}", job.log.join("\n"));
    }
    let rows = recovery_rows(&metrics)?;
    if rows.len() != job.recoveries.len() {
        bail!(
            "{} recovery rows in {} but {} lines",
            rows.len(),
            metrics.display(),
            job.recoveries.len()
        );
    }
    let recoveries: Vec<(Recovery, bool)> = (rows.into_iter().zip(&job.recoveries))
        .map(|(row, &(line_at, join))| (Recovery { row, line_at }, join))
        .collect();
    let costs = (plan.iter().zip(sent))
        .map(|(&kill, (at, first))| {
            let after = &recoveries[first..];
            let lost = after[0].0.clone();
            let join = (after.iter().find(|(_, join)| *join))
                .context("a kill without its join")?
                .0
                .clone();
            let detection = lost.line_at.duration_since(at).as_secs_f64() - lost.seconds();
            Ok(Cost {
                kill,
                detection,
                lost,
                join,
            })
        })
        .collect::<Result<_>>()?;
    Ok(Ran {
        costs,
        model: final_model(dir)?,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Lines of a ledger written so far.
fn committed(ledger: &Path) -> usize {
    std::fs::read_to_string(ledger).map_or(0, |t| t.lines().count())
}

fn recovery_rows(metrics: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(metrics)
        .with_context(|| format!("reading {}", metrics.display()))?;
    let rows: Vec<serde_json::Value> = (text.lines())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    Ok(rows
        .into_iter()
        .filter(|row| row["event"] == "live_recovery")
        .collect())
}

/// The launcher's stderr as it comes: the workers' pids, and when each
/// recovery's line arrived (and whether a replacement joined in it).
struct Watched {
    lines: Receiver<String>,
    world: usize,
    log: Vec<String>,
    pids: BTreeMap<usize, String>,
    recoveries: Vec<(Instant, bool)>,
}

/// Longest wait for one thing the job should do.
const PATIENCE: Duration = Duration::from_secs(300);

impl Watched {
    fn new(child: &mut Child, world: usize) -> Watched {
        let (tx, lines) = channel();
        let reader = BufReader::new(child.stderr.take().expect("stderr is piped"));
        std::thread::spawn(move || {
            (reader.lines().map_while(Result::ok)).for_each(|l| drop(tx.send(l)))
        });
        Watched {
            lines,
            world,
            log: Vec::new(),
            pids: BTreeMap::new(),
            recoveries: Vec::new(),
        }
    }

    fn take(&mut self, line: String) {
        if line.contains("live recovery: ") {
            self.recoveries
                .push((Instant::now(), line.contains("joined:")));
        }
        if let Some((rank, pid)) = started(&line).filter(|(rank, _)| *rank < self.world) {
            self.pids.insert(rank, pid);
        }
        self.log.push(line);
    }

    /// Reads the job's lines until `done` holds, asking it every 5 ms.
    fn until(&mut self, done: impl Fn(&Watched) -> bool) -> Result<()> {
        let since = Instant::now();
        while !done(self) {
            match self.lines.recv_timeout(Duration::from_millis(5)) {
                Ok(line) => self.take(line),
                Err(RecvTimeoutError::Timeout) if since.elapsed() < PATIENCE => {}
                Err(e) => bail!(
                    "the job ended or stalled ({e:?}) before the plan's next kill:\n{}",
                    self.log.join("\n")
                ),
            }
        }
        Ok(())
    }

    fn drain(&mut self) {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.take(line);
        }
    }
}

/// The rank and pid of a `launcher: started rank R (pid P)` line.
fn started(line: &str) -> Option<(usize, String)> {
    let rest = line.strip_prefix("launcher: started rank ")?;
    let (rank, rest) = rest.split_once(" (pid ")?;
    let pid = rest.split(')').next()?;
    Some((rank.parse().ok()?, pid.to_string()))
}
