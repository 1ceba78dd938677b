//! Watching one attempt's workers to its end: signals passed on, the first
//! failure here or on another node, and what to say about it.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT};
use signal_hook::iterator::Signals;

mod replacements;
mod watch;

use crate::attempt::{Failure, Graces, Outcome, POLL};
use crate::contract::{
    DUMP_SIGNAL, MISCONFIGURED_EXIT_CODE, PEER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE, RunEnd,
    describe,
};
use crate::flight::Flight;
use crate::group::{Elsewhere, NodeGroup};
use crate::workers::{Worker, forward, stop};
pub(super) use replacements::Replacements;
use watch::Watch;

/// How long the other workers get to end on their own once one failed for
/// a reason of its own (the error that names the cause is already in).
const OWN_CAUSE_GRACE: Duration = Duration::from_secs(3);

/// How long a launcher whose rank exited with an error (often its reaction
/// to losing a peer elsewhere) waits for another node to report the cause.
const CAUSE_WAIT: Duration = Duration::from_secs(1);

/// Whether a worker stopped as SIGINT or SIGHUP stops one: its own exit
/// after the signal (130, or 128 + the signal when it took too long), or
/// killed by it.
fn interrupted(status: ExitStatus) -> bool {
    let by = |signal: i32| status.code() == Some(128 + signal) || status.signal() == Some(signal);
    by(SIGINT) || by(SIGHUP)
}

/// Waits for all workers; on the first failure (here, or reported by
/// another node of `group`) waits `graces.failure` for the rest, kills
/// what is left (asking it first for its `flight` record), and describes
/// the failures. A signal to the launcher goes on to the workers, which get
/// `graces.signal` to stop; a second one stops them at once. SIGUSR2 stops
/// nothing: the workers write their flight records.
pub(super) fn supervise(
    workers: &mut [Worker],
    (graces, mut replacements): (Graces, Option<Replacements<'_>>),
    signals: &mut Signals,
    mut group: Option<(&mut NodeGroup, u32)>,
    flight: Option<&Flight>,
) -> Outcome {
    let mut watch = Watch {
        node: group
            .as_ref()
            .map_or(String::new(), |(g, _)| format!("node {}: ", g.node_rank)),
        graces,
        deadline: None,
        received: None,
        first_failure: None,
        failed_alone: Vec::new(),
        elsewhere: None,
        restartable: true,
        given_up: Vec::new(),
        over: false,
    };
    loop {
        for signal in signals.pending() {
            forward(workers, signal);
            if signal == DUMP_SIGNAL {
                tell!(
                    "launcher: {}: passed on to the workers, which write their flight records",
                    describe(signal)
                );
                if let Some(flight) = flight {
                    flight.on_dump_signal(workers);
                }
                continue;
            }
            if watch.received.is_none()
                && let Some((g, attempt)) = group.as_mut()
            {
                g.report_signal(*attempt, signal);
            }
            if watch.received.is_some() {
                tell!(
                    "launcher: {} again: stopping the workers now",
                    describe(signal)
                );
                watch.signalled(signal, Duration::ZERO);
            } else {
                tell!(
                    "launcher: {}: passed on to the workers, which get {:?} to stop",
                    describe(signal),
                    graces.signal
                );
                watch.signalled(signal, graces.signal);
            }
        }
        let mut failed_now = Vec::new();
        let mut gone = Vec::new();
        let mut interrupt = false;
        for (i, w) in workers.iter_mut().enumerate() {
            if w.status.is_none()
                && let Ok(Some(status)) = w.child.try_wait()
            {
                w.status = Some(status);
                if interrupted(status) && watch.received.is_none() {
                    // Someone stopped a worker as they would the job: stop
                    // the job so, not as a failure to restart.
                    tell!(
                        "launcher: rank {} was interrupted ({status}); passing SIGINT to the other workers",
                        w.rank
                    );
                    watch.signalled(SIGINT, graces.signal);
                    interrupt = true;
                    if let Some((g, attempt)) = group.as_mut() {
                        g.report_signal(*attempt, SIGINT);
                    }
                } else if !status.success() && status.code() != Some(PREEMPTED_EXIT_CODE) {
                    match replacements {
                        // A live job goes on without it (unless stopping).
                        Some(_) if watch.undecided() && Replacements::go_on_without(status) => {
                            gone.push(i);
                        }
                        _ => {
                            failed_now.push((i, status));
                            watch.failed_alone.push(i);
                        }
                    }
                }
            }
        }
        if let Some(r) = replacements.as_mut() {
            for i in gone {
                if !r.replace(workers, i, &watch.node) {
                    watch.given_up.push(i);
                }
            }
        }
        if interrupt {
            forward(workers, SIGINT);
        }
        // After a signal, workers ending badly are its doing, not a failure.
        if watch.undecided()
            && let Some((i, status)) = root_cause(&failed_now)
        {
            // A rank that only lost a peer leaves the cause to the others,
            // who get --timeout to report it; one with a cause of its own
            // is the answer, and the others (often waiting for it at the
            // rendezvous) need not wait out their timeout.
            let grace = if status.code() == Some(PEER_LOST_EXIT_CODE) {
                graces.failure
            } else {
                graces.failure.min(OWN_CAUSE_GRACE)
            };
            workers[i].settle();
            let ours = format!("{}{}", watch.node, workers[i].describe_failure());
            let is_final = status.code() == Some(MISCONFIGURED_EXIT_CODE);
            // A worker here that failed because another node's launcher got
            // a signal, failed or vanished is that node's doing.
            let news = group.as_mut().and_then(|(g, attempt)| {
                let wait = if status.signal().is_some() {
                    Duration::ZERO
                } else {
                    CAUSE_WAIT
                };
                g.report_failure(*attempt, (&ours, is_final), wait)
            });
            // A signal gives the workers its own grace (to save, on a
            // preemption); anything else, the failure's.
            if !matches!(news, Some(Elsewhere::Signalled(_))) {
                watch.stop_within(grace);
            }
            match news {
                Some(news) => watch.adopt(workers, news),
                None => {
                    tell!(
                        "launcher: {}rank {} exited with {status}; stopping the other ranks",
                        watch.node,
                        workers[i].rank
                    );
                    watch.first_failure = Some(i);
                }
            }
        } else if watch.undecided()
            && let Some((g, attempt)) = group.as_mut()
            && let Some(news) = g.news_elsewhere(*attempt)
        {
            watch.adopt(workers, news);
        } else if watch.received.is_some()
            && watch.elsewhere.is_none()
            && let Some((g, attempt)) = group.as_mut()
            && let Some(cause) = g.vanished_node(*attempt)
        {
            // The workers' stop may wait on that node's ranks: say why.
            tell!("launcher: {cause}; this node's ranks stop without them");
            watch.elsewhere = Some(cause);
        }
        let running = workers.iter().filter(|w| w.status.is_none()).count();
        if running == 0 || watch.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        std::thread::sleep(POLL);
    }
    conclude(workers, watch, flight)
}

/// Stops what still runs and says how the attempt ended.
fn conclude(workers: &mut [Worker], watch: Watch, flight: Option<&Flight>) -> Outcome {
    let node = &watch.node;
    // Still running when the others had failed and the grace ran out:
    // hung (or stopped), the likely cause of the peers' timeouts.
    let unresponsive: Vec<usize> = (0..workers.len())
        .filter(|&i| workers[i].status.is_none())
        .collect();
    let silent = match (flight, watch.received) {
        (Some(flight), None) => flight.ask(workers, &unresponsive),
        _ => Vec::new(),
    };
    stop(workers);
    if watch.over {
        return Outcome::Ended(RunEnd::Finished);
    }
    let preempted = |w: &Worker| w.status.and_then(|s| s.code()) == Some(PREEMPTED_EXIT_CODE);
    if let Some(signal) = watch.received {
        return Outcome::Ended(if workers.iter().all(preempted) {
            RunEnd::Preempted
        } else {
            RunEnd::Signalled(signal)
        });
    }
    // A rank seen first that only lost its peer points at the peer's own
    // error, when the peer failed too.
    let first_failure = watch
        .first_failure
        .map(|i| blame(workers, i, &watch.failed_alone, &unresponsive));
    let first = match (first_failure, watch.elsewhere) {
        (Some(i), _) if unresponsive.contains(&i) => format!(
            "{node}rank {} did not respond (hung, or stopped) while the others failed waiting for it, and was killed after the grace",
            workers[i].rank
        ),
        (Some(i), _) => format!("{node}{}", workers[i].describe_failure()),
        (None, Some(cause)) => cause,
        // A live job's workers given up on: the job went on without them,
        // and ended well if any other did.
        (None, None) => match watch.given_up.first() {
            Some(&i)
                if !workers
                    .iter()
                    .any(|w| w.status.is_some_and(|s| s.success()) || preempted(w)) =>
            {
                format!(
                    "{node}{} (and no other rank finished)",
                    workers[i].describe_failure()
                )
            }
            _ => {
                return Outcome::Ended(if workers.iter().any(preempted) {
                    RunEnd::Preempted
                } else {
                    RunEnd::Finished
                });
            }
        },
    };
    // Those killed here after the grace have no failure of their own.
    let others: Vec<String> = workers
        .iter()
        .enumerate()
        .filter(|(j, w)| Some(*j) != first_failure && !w.status.is_some_and(|s| s.success()))
        .map(|(j, w)| {
            if unresponsive.contains(&j) {
                format!(
                    "{node}rank {} was still running after the grace (hung, stopped, or still waiting for its peers) and was killed",
                    w.rank
                )
            } else {
                format!("{node}{}", w.describe_failure())
            }
        })
        .collect();
    let mut message = first.clone();
    if !others.is_empty() {
        message.push_str(&format!("; then {}", others.join("; ")));
    }
    // The job's own configuration as the cause: a restart meets it again.
    let misconfigured = first_failure
        .is_some_and(|i| workers[i].status.and_then(|s| s.code()) == Some(MISCONFIGURED_EXIT_CODE));
    Outcome::Failed(Failure {
        first,
        message,
        restartable: watch.restartable && !misconfigured,
        silent,
    })
}

/// Of the ranks found failed in one look, the one to blame: a rank killed by
/// a signal (the OOM killer, `kill -9`) before one that exited with an
/// error, which is usually its peers' reaction to losing it.
fn root_cause(failed: &[(usize, ExitStatus)]) -> Option<(usize, ExitStatus)> {
    failed
        .iter()
        .find(|(_, status)| status.signal().is_some())
        .or(failed.first())
        .copied()
}

/// The rank to name first: `first`, unless it only lost a peer (it exited
/// with [`PEER_LOST_EXIT_CODE`]) and another rank in `failed_alone` failed
/// for a reason of its own (killed by a signal, or any other error), which
/// is then the cause; failing that, a rank that never ended on its own
/// (`unresponsive`: the peer the others waited for in vain).
fn blame(
    workers: &[Worker],
    first: usize,
    failed_alone: &[usize],
    unresponsive: &[usize],
) -> usize {
    let reaction = |i: usize| workers[i].status.and_then(|s| s.code()) == Some(PEER_LOST_EXIT_CODE);
    if !reaction(first) {
        return first;
    }
    failed_alone
        .iter()
        .copied()
        .find(|&i| !reaction(i))
        .or(unresponsive.first().copied())
        .unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker that printed `error: {said}` and exited with `code`.
    fn failed_with(rank: usize, said: &str, code: i32) -> Worker {
        let child = std::process::Command::new("sh")
            .args(["-c", &format!("echo 'error: {said}' >&2; exit {code}")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut worker = Worker::attach(rank, child);
        worker.status = Some(worker.child.wait().unwrap());
        worker.settle();
        worker
    }

    #[test]
    fn a_rank_that_only_lost_its_peer_points_at_the_peers_own_error() {
        let lost = "rank 0 of 3: lost connection to rank 2 (127.0.0.1:1) during all_reduce: eof";
        let workers = [
            failed_with(0, lost, PEER_LOST_EXIT_CODE),
            failed_with(1, lost, PEER_LOST_EXIT_CODE),
            failed_with(
                2,
                "rank 2: epoch 1, step 2: non-finite gradient in fc1.weight",
                1,
            ),
        ];
        assert_eq!(blame(&workers, 0, &[0, 1, 2], &[]), 2);
        assert_eq!(blame(&workers, 2, &[0, 1, 2], &[]), 2);
        // The cause must have failed on its own, not been stopped later.
        assert_eq!(blame(&workers, 0, &[0, 1], &[]), 0);
        // With no own cause among them, the rank the others waited for in
        // vain (killed by the launcher at the end) is the cause.
        assert_eq!(blame(&workers, 0, &[0, 1], &[2]), 2);
        // A first failure with a cause of its own keeps the blame.
        let workers = [
            failed_with(0, "out of memory", 1),
            failed_with(1, "disk full", 1),
        ];
        assert_eq!(blame(&workers, 1, &[1, 0], &[]), 1);
        // The exit code decides, not the words: an own error that mentions
        // a lost connection is still its own.
        let workers = [failed_with(0, lost, 1), failed_with(1, "disk full", 1)];
        assert_eq!(blame(&workers, 0, &[0, 1], &[]), 0);
    }

    #[test]
    fn a_rank_killed_by_a_signal_is_blamed_before_its_peers_reaction() {
        // Raw wait statuses: exit code 1 is 1 << 8, SIGKILL is 9.
        let exited = ExitStatus::from_raw(1 << 8);
        let killed = ExitStatus::from_raw(9);
        assert_eq!(root_cause(&[]), None);
        assert_eq!(root_cause(&[(0, exited)]), Some((0, exited)));
        assert_eq!(root_cause(&[(0, exited), (1, killed)]), Some((1, killed)));
        assert_eq!(root_cause(&[(0, exited), (2, exited)]), Some((0, exited)));
    }
}
