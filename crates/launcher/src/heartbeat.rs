//! Heartbeats between the launchers of a job of several machines, in the
//! spirit of torchrun's rendezvous keep-alive: a launcher that is stopped
//! (SIGSTOP, a debugger, a suspended VM) or cut off by the network keeps
//! its store connection open, so only its silence can tell.
//!
//! Every other node's launcher beats into the group store from a thread of
//! its own ([`Beater`]): a counter under [`key`], so that no phase of its
//! main loop (waiting for node 0, starting or restarting workers,
//! finishing) stops the beats, while a stopped process or a cut network
//! does. Node 0 judges them by its own clock ([`Pulse`]: how long a beat
//! has not changed), never by another machine's. Node 0 hosts the store
//! and beats to no one: the others hear its silence as store requests
//! that get no answer within the same limit.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use comm::{CommError, Store};

use crate::error::{Doing, LaunchError};

/// Beats per `--heartbeat-timeout`: a node is declared silent after this
/// many missed beats.
const BEATS_PER_LIMIT: u32 = 10;

/// Missed beats after which a node is late: its silence may be the cause
/// of a failure node 0 sees.
const LATE_BEATS: u32 = 3;

/// How often a launcher beats for a limit of `limit`.
pub(super) fn interval(limit: Duration) -> Duration {
    limit / BEATS_PER_LIMIT
}

/// Where node `node`'s launcher beats.
pub(super) fn key(node: usize) -> String {
    format!("heartbeat/{node}")
}

/// Where node 0 records, before it ends `attempt` on node `node`'s
/// silence, how long that was: the node, should it come back while node 0
/// is still up, reads the verdict as its own.
pub(super) fn verdict_key(attempt: u32, node: usize) -> String {
    format!("attempt/{attempt}/silent/{node}")
}

/// The group store's connection, shared by a launcher's main loop and its
/// [`Beater`]: each request holds it for itself alone, so neither waits
/// for the other longer than one request (which are all quick: the main
/// loop polls, it does not wait in the store). It keeps when the store
/// last answered: a launcher that went unanswered past the limit (it was
/// stopped itself, or starved) learns that the others may have given up on
/// it.
#[derive(Clone)]
pub(super) struct SharedStore(Arc<Mutex<(Store, Instant)>>);

impl SharedStore {
    pub fn new(store: Store) -> Self {
        SharedStore(Arc::new(Mutex::new((store, Instant::now()))))
    }

    /// One request; a request never leaves the store half-changed, so a
    /// panic elsewhere while holding it is no reason to stop.
    fn ask<T>(
        &self,
        request: impl FnOnce(&mut Store) -> Result<T, CommError>,
    ) -> Result<T, CommError> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let answer = request(&mut held.0);
        if answer.is_ok() {
            held.1 = Instant::now();
        }
        answer
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), CommError> {
        self.ask(|s| s.set(key, value))
    }

    pub fn get(&self, key: &str) -> Result<Vec<u8>, CommError> {
        self.ask(|s| s.get(key))
    }

    /// The value of `key` now, if set (no wait in the store).
    pub fn look(&self, key: &str) -> Result<Option<Vec<u8>>, CommError> {
        self.ask(|s| s.wait_for(key, Duration::ZERO))
    }

    /// The values of `keys` at one instant, in one request (no wait).
    pub fn look_all(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, CommError> {
        self.ask(|s| s.look_all(keys))
    }

    /// How long the store has given this launcher no answer.
    pub fn unanswered(&self) -> Duration {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.1.elapsed()
    }
}

/// A launcher's heartbeat: a thread that sets [`key`] to a growing count
/// every [`interval`] until dropped, or until the store fails (the main
/// loop then hears why at its next request).
pub(super) struct Beater {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Beater {
    pub fn start(store: SharedStore, node: usize, every: Duration) -> Result<Beater, LaunchError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let key = key(node);
        let thread = std::thread::Builder::new()
            .name("launcher-heartbeat".into())
            .spawn(move || {
                for beat in 1_u64.. {
                    if store.set(&key, &beat.to_le_bytes()).is_err() {
                        return;
                    }
                    if stopped.recv_timeout(every) != Err(RecvTimeoutError::Timeout) {
                        return;
                    }
                }
            })
            .doing(|| format!("node {node}: starting the launcher's heartbeat"))?;
        Ok(Beater {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Beater {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A request in flight ends within the store's reply timeout.
            let _ = thread.join();
        }
    }
}

/// Node 0's view of the other nodes' beats, on its own clock: for each
/// node, the last beat seen and when node 0 first saw it. A beat that has
/// not changed since `t` proves the node silent since `t` at least,
/// however long node 0 itself went without looking.
pub(super) struct Pulse {
    limit: Duration,
    seen: Vec<Option<(Option<Vec<u8>>, Instant)>>,
}

impl Pulse {
    pub fn new(nnodes: usize, limit: Duration) -> Self {
        Pulse {
            limit,
            seen: vec![None; nnodes],
        }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Records node `node`'s `beat` (`None`: none yet) as read at `now`;
    /// how long it has gone unchanged when that reaches the limit.
    pub fn silent_for(
        &mut self,
        node: usize,
        beat: Option<Vec<u8>>,
        now: Instant,
    ) -> Option<Duration> {
        match &mut self.seen[node] {
            Some((last, since)) if *last == beat => {
                let silent = now.saturating_duration_since(*since);
                (silent >= self.limit).then_some(silent)
            }
            slot => {
                *slot = Some((beat, now));
                None
            }
        }
    }

    /// Whether a node's beat is overdue (unchanged for [`LATE_BEATS`]
    /// beats) but not yet past the limit: a node that may be falling
    /// silent, as of `now`.
    pub fn late(&self, now: Instant) -> bool {
        let overdue = interval(self.limit) * LATE_BEATS;
        self.seen.iter().flatten().any(|(_, since)| {
            let quiet = now.saturating_duration_since(*since);
            quiet > overdue && quiet < self.limit
        })
    }
}

/// How a fixed job's node 0 ends what it says of a node lost (an elastic
/// job's goes on without it, and says so instead).
pub(super) const NO_GOING_ON: &str = ", and the job cannot go on without its ranks";

/// What node 0 says of node `node`, on `host`, silent for `silent`.
pub(super) fn silent_node(node: usize, host: &str, silent: Duration, limit: Duration) -> String {
    format!(
        "node {node}'s launcher ({host}) sent no heartbeat for {:.1} s (--heartbeat-timeout {}): it is stopped (SIGSTOP, a debugger, a suspended VM; resume it with kill -CONT) or its machine is cut off (check the network){NO_GOING_ON}",
        silent.as_secs_f64(),
        limit.as_secs_f64()
    )
}

/// What node `node` says of the failure `cause` that node 0 reported, with
/// `own` what node 0 recorded under [`verdict_key`] for this node: when it
/// ended the job on this very node's silence, that, from this node's side.
pub(super) fn verdict(node: usize, cause: &[u8], own: Option<Vec<u8>>, limit: Duration) -> String {
    let Some(millis) = own.and_then(|v| <[u8; 8]>::try_from(v).ok()) else {
        return String::from_utf8_lossy(cause).into_owned();
    };
    format!(
        "node {node}: node 0 heard no heartbeat from this launcher for {:.1} s (--heartbeat-timeout {}) and ended the job: this launcher was stopped (SIGSTOP, a debugger, a suspended VM) or starved, or this machine was cut off from node 0 (check the network), and its ranks cannot go on; keep every launcher running (a larger --heartbeat-timeout allows longer pauses)",
        Duration::from_millis(u64::from_le_bytes(millis)).as_secs_f64(),
        limit.as_secs_f64()
    )
}

/// What node `node` says of node 0, on `host`, whose store gave no answer
/// for `silent`.
pub(super) fn silent_master(node: usize, host: &str, silent: Duration) -> String {
    format!(
        "node {node}: node 0's launcher ({host}) stopped answering for {:.1} s (--heartbeat-timeout): it is stopped (SIGSTOP, a debugger, a suspended VM; resume it with kill -CONT) or this machine is cut off from it (check the network), and the job cannot go on without its ranks",
        silent.as_secs_f64()
    )
}

/// What node `node` says when, unanswered for `away` (it was stopped, or
/// starved) past `limit`, it finds that `meanwhile` happened.
pub(super) fn was_away(node: usize, away: Duration, limit: Duration, meanwhile: &str) -> String {
    format!(
        "node {node}: this launcher was itself stopped (SIGSTOP, a debugger, a suspended VM) or starved for {:.1} s, past --heartbeat-timeout {}, and meanwhile {meanwhile}: the other nodes most likely ended the job on its silence, and its ranks cannot go on; keep every launcher running (a larger --heartbeat-timeout allows longer pauses)",
        away.as_secs_f64(),
        limit.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_that_stops_changing_is_silent_once_past_the_limit_on_node_0s_clock() {
        let limit = Duration::from_secs(2);
        let mut pulse = Pulse::new(3, limit);
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let beat = |n: u64| Some(n.to_le_bytes().to_vec());
        // No beat yet counts from the first look, like any other value.
        assert_eq!(pulse.silent_for(1, None, at(0.0)), None);
        assert_eq!(pulse.silent_for(1, None, at(1.9)), None);
        assert_eq!(pulse.silent_for(1, beat(1), at(2.5)), None);
        assert_eq!(pulse.silent_for(1, beat(2), at(3.0)), None);
        // Unchanged: silent from when node 0 first saw it.
        assert_eq!(pulse.silent_for(1, beat(2), at(4.9)), None);
        assert_eq!(
            pulse.silent_for(1, beat(2), at(5.0)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            pulse.silent_for(1, beat(2), at(7.5)),
            Some(Duration::from_secs_f64(4.5))
        );
        // Late from three missed beats (0.6 s) until the limit.
        assert!(!pulse.late(at(3.5)) && pulse.late(at(3.7)) && pulse.late(at(4.9)));
        assert!(!pulse.late(at(5.0)));
        // A beat again (a resumed node) is fresh.
        assert_eq!(pulse.silent_for(1, beat(3), at(8.0)), None);
        assert!(!pulse.late(at(8.5)));
        // Nodes are judged apart; a node 0 that did not look for long
        // (busy, or stopped itself) finds moved beats fresh, not silent.
        assert_eq!(pulse.silent_for(2, beat(7), at(0.0)), None);
        assert_eq!(pulse.silent_for(2, beat(70), at(60.0)), None);
        assert_eq!(pulse.silent_for(2, beat(70), at(61.0)), None);
        assert_eq!(interval(limit), Duration::from_millis(200));
    }

    #[test]
    fn a_node_reads_node_0s_verdict_on_its_own_silence_as_its_own() {
        let limit = Duration::from_secs(2);
        let cause = silent_node(1, "host n1", Duration::from_millis(2345), limit);
        let own = Some(2345_u64.to_le_bytes().to_vec());
        let said = verdict(1, cause.as_bytes(), own, limit);
        assert!(
            said.starts_with(
                "node 1: node 0 heard no heartbeat from this launcher for 2.3 s (--heartbeat-timeout 2) and ended the job: this launcher was stopped"
            ) && !said.contains("node 1's launcher"),
            "{said}"
        );
        // Any other failure, or a record that is not one, reads as told.
        assert_eq!(verdict(1, cause.as_bytes(), None, limit), cause);
        assert_eq!(
            verdict(2, b"rank 3 failed", Some(vec![1]), limit),
            "rank 3 failed"
        );
        assert_eq!(verdict_key(4, 1), "attempt/4/silent/1");
    }

    #[test]
    fn the_messages_name_the_node_the_host_the_silence_and_the_fixes() {
        let said = silent_node(
            1,
            "host n1",
            Duration::from_secs_f64(2.34),
            Duration::from_secs(2),
        );
        for needle in [
            "node 1's launcher (host n1)",
            "2.3 s",
            "--heartbeat-timeout 2",
            "SIGSTOP",
            "kill -CONT",
            "network",
        ] {
            assert!(said.contains(needle), "{needle}: {said}");
        }
        let said = silent_master(1, "host n0", Duration::from_secs(2));
        for needle in [
            "node 1: node 0's launcher (host n0) stopped answering for 2.0 s",
            "kill -CONT",
            "network",
        ] {
            assert!(said.contains(needle), "{needle}: {said}");
        }
    }
}
