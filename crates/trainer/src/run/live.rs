//! `--recovery live`: this process as a member of a job whose ranks may be
//! lost and replaced while it trains. It trains in generations
//! (`comm::LiveMember`): each a ring of the members node 0's launcher's
//! store counted in, rank 0 the member whose state holds the most steps.
//! When a peer is lost (it died, or hung past `--timeout`), or newcomers
//! wait at a step's end, the generation ends: every member keeps its state
//! at its last committed step in memory and enlists for the next, whose
//! rank 0 heals the others (and the newcomers) from its own, as a resume
//! from a checkpoint would, but from memory. With `--reproducible` the
//! global batch is the same on any number of ranks, so the model ends on
//! the bytes of a run where nothing failed. No process restarts, and none
//! reads a checkpoint after the job's start.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{Context, anyhow};
use comm::{CommConfig, Enlisted, Generation, LaunchEnv, LiveMember};
use launcher::contract::{Evicted, RunEnd};

use super::device::Device;
use super::wiring::JobComm;
use super::{Process, run_end};
use crate::checkpoint::TrainingState;
use crate::rank::Live;
use crate::stop::StopRequest;
use crate::topology::Topology;
use crate::train::{Membership, Regroup, RunOutcome};

/// Trains as the member in `env`'s slot of a live job until the job ends
/// or this member is evicted.
pub(super) fn run(
    process: &Process<'_>,
    (config, env): (&CommConfig, &LaunchEnv),
    (first, device): (Topology, Device),
    stop: StopRequest,
) -> anyhow::Result<RunEnd> {
    let slot = env.rank;
    let joined = LiveMember::join(config).with_context(|| {
        format!(
            "rank {slot}: joining the job at {}",
            config.master_endpoint()
        )
    })?;
    let member = Arc::new(Mutex::new(joined));
    let mut kept: Option<Box<TrainingState>> = None;
    // The generation trained in last, why it ended and when: for the
    // recovery's line.
    let mut last: Option<Generation> = None;
    let mut ended: Option<(Regroup, Instant)> = None;
    loop {
        let step = kept.as_ref().map(|s| s.optimizer_step);
        let silent = match &ended {
            Some((Regroup::PeerLost { silent, .. }, _)) => *silent,
            _ => None,
        };
        let enlisted = lock(&member).enlist(step, silent);
        let generation = match enlisted
            .with_context(|| format!("rank {slot}: re-forming the job"))?
        {
            Enlisted::Member(generation) => generation,
            Enlisted::Evicted { generation } => {
                return Err(anyhow!(Evicted(format!(
                    "this rank (launched as rank {slot}) was left out of the job's generation {generation}: it did not answer its peers within --timeout (hung or stopped), and they went on without it; it exits, writing nothing"
                ))));
            }
            Enlisted::JobOver => {
                tell!("rank {slot}: the job's training ended before this process could join it");
                return Ok(RunEnd::Finished);
            }
        };
        let ring = lock(&member).ring(&generation);
        let comm = match ring {
            Ok(comm) => comm,
            // A member lost while the ring formed: the next generation.
            Err(e) => {
                let e = anyhow!(e).context(format!(
                    "rank {slot}: forming generation {}",
                    generation.number
                ));
                let why = Regroup::after(&e).ok_or(e)?;
                ended = Some((why, Instant::now()));
                continue;
            }
        };
        // Rank 0 says how the recovery went once it healed the others.
        let before = last.replace(generation.clone());
        let healed = ended.take().map(|(why, since)| {
            let change = Change::between(before.as_ref(), &generation);
            Box::new(move || change.say(&why, since)) as Box<dyn FnOnce()>
        });
        let topology = Topology {
            rank: generation.rank,
            world: generation.world(),
            ..first
        };
        let left = Rc::new(RefCell::new(None));
        let live = Live {
            start: kept.take(),
            membership: Box::new(Newcomers(Arc::clone(&member))),
            kept: Rc::clone(&left),
            healed,
        };
        let comm = Some(JobComm::Tcp(Box::new(comm)));
        let outcome = process.run_rank(topology, device.clone(), comm, stop.clone(), Some(live))?;
        match outcome {
            RunOutcome::Regroup { why, .. } => {
                kept = left.take();
                ended = Some((why, Instant::now()));
            }
            RunOutcome::Completed => {
                if generation.rank == 0 {
                    // A newcomer still waiting has nothing left to join.
                    lock(&member).finish().context("rank 0: ending the job")?;
                }
                return Ok(RunEnd::Finished);
            }
            other => return Ok(run_end(&other)),
        }
    }
}

/// How one generation differs from the one before, for the recovery's
/// line (rank 0 of the new generation says it).
struct Change {
    number: u64,
    world: usize,
    /// The global step the new generation goes on after.
    step: u64,
    /// Slots (the ranks the launchers gave) lost, and joined.
    lost: Vec<usize>,
    joined: Vec<usize>,
}

impl Change {
    fn between(before: Option<&Generation>, now: &Generation) -> Change {
        let slots = |g: &Generation| -> Vec<usize> { g.members.iter().map(|&(s, _)| s).collect() };
        let (was, is) = (before.map_or_else(Vec::new, slots), slots(now));
        // A slot whose member died and whose replacement joined is both.
        let newcomer = |s: &usize| {
            now.members
                .iter()
                .any(|&(m, step)| m == *s && step.is_none())
        };
        Change {
            number: now.number,
            world: now.world(),
            step: now.start_step().unwrap_or(0),
            lost: (was.iter())
                .filter(|s| !is.contains(s) || newcomer(s))
                .copied()
                .collect(),
            joined: is.iter().filter(|s| newcomer(s)).copied().collect(),
        }
    }

    /// The line, `since` the generation before ended on this process.
    fn say(&self, why: &Regroup, since: Instant) {
        let list = |slots: &[usize]| {
            let named: Vec<String> = slots.iter().map(usize::to_string).collect();
            named.join(", ")
        };
        let what = match why {
            Regroup::PeerLost { error, .. } => {
                format!("lost rank(s) launched as {} ({error})", list(&self.lost))
            }
            Regroup::Newcomers => format!("joined: rank(s) launched as {}", list(&self.joined)),
        };
        tell!(
            "live recovery: {what}; generation {}: {} rank(s), going on after global step {}; {:.2} s from the end of the last generation to the ranks healed",
            self.number,
            self.world,
            self.step,
            since.elapsed().as_secs_f64()
        );
    }
}

/// Rank 0's look, between steps, at whether newcomers wait.
struct Newcomers(Arc<Mutex<LiveMember>>);

impl Membership for Newcomers {
    fn newcomers_waiting(&mut self) -> anyhow::Result<bool> {
        Ok(lock(&self.0).newcomers_waiting()?)
    }
}

/// The member, between generations or for rank 0's look: never held
/// across a panic that matters (a poisoned lock's member is as it was).
fn lock(member: &Mutex<LiveMember>) -> std::sync::MutexGuard<'_, LiveMember> {
    member.lock().unwrap_or_else(PoisonError::into_inner)
}
