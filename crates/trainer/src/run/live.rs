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
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, anyhow};
use comm::{CommConfig, Enlisted, Generation, LaunchEnv, LiveMember};
use launcher::contract::{Evicted, RunEnd};

use super::device::Device;
use super::wiring::{JobComm, lock};
use super::{Process, run_end};
use crate::rank::{Kept, Live};
use crate::report::recovery::RecoveryEvent;
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
    let mut kept: Option<Kept> = None;
    // The generation trained in last, why it ended and when: for the
    // recovery's line.
    let mut last: Option<Generation> = None;
    let mut ended: Option<(Regroup, Instant)> = None;
    loop {
        let step = kept.as_ref().map(|k| k.state.optimizer_step);
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
        // Rank 0 reports the recovery once it healed the others.
        let before = last.replace(generation.clone());
        let recovered = ended
            .take()
            .map(|(why, since)| (recovery(before.as_ref(), &generation, &why), since));
        let topology = Topology {
            rank: generation.rank,
            world: generation.world(),
            ..first
        };
        let left = Rc::new(RefCell::new(None));
        let (start, share) = kept.take().map(|k| (k.state, k.share)).unzip();
        // What this member holds again if the generation fails before it
        // trains (a peer lost while the NCCL communicators form, or while
        // it heals the newcomers): a copy of its state, once a generation.
        let retry = start.clone().zip(share);
        let live = Live {
            // Rank 0 heals the others from its state; each keeps its share.
            start,
            share,
            membership: Box::new(Newcomers(Arc::clone(&member))),
            min_world: process.job.join.min_world as usize,
            kept: Rc::clone(&left),
            recovered,
        };
        // On GPUs with NCCL the wiring builds the generation's own NCCL
        // communicator over its members; a lost peer aborts it (its
        // watchdog), and the next generation builds another.
        let comm = Some(JobComm::Generation {
            ring: Box::new(comm),
            member: Arc::clone(&member),
            number: generation.number,
        });
        let outcome = process.run_rank(topology, device.clone(), comm, stop.clone(), Some(live));
        let outcome = match outcome {
            Ok(outcome) => outcome,
            // A member lost before the generation trained: the next one,
            // from the state this member held.
            Err(e) => {
                let why = Regroup::after(&e).ok_or(e)?;
                let held = retry.map(|(state, share)| Kept { state, share });
                kept = left.take().or(held);
                ended = Some((why, Instant::now()));
                continue;
            }
        };
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

/// What rank 0 of `now` reports of the change from `before` (its
/// seconds still to be measured): who was lost and who joined, by slot.
fn recovery(before: Option<&Generation>, now: &Generation, why: &Regroup) -> RecoveryEvent {
    let slots = |g: &Generation| -> Vec<usize> { g.members.iter().map(|&(s, _)| s).collect() };
    let (was, is) = (before.map_or_else(Vec::new, slots), slots(now));
    // A slot whose member died and whose replacement joined is both; in a
    // job that never trained every member starts from its flags, none new.
    let trained = now.members.iter().any(|&(_, step)| step.is_some());
    let newcomer =
        |s: &usize| trained && (now.members.iter()).any(|&(m, step)| m == *s && step.is_none());
    RecoveryEvent {
        event: RecoveryEvent::KIND,
        generation: now.number,
        world_size: now.world(),
        after_global_step: now.start_step().unwrap_or(0),
        lost: (was.iter())
            .filter(|s| !is.contains(s) || newcomer(s))
            .copied()
            .collect(),
        joined: is.iter().filter(|s| newcomer(s)).copied().collect(),
        cause: match why {
            Regroup::PeerLost { error, .. } => error.clone(),
            Regroup::Newcomers => "newcomers waited".to_string(),
        },
        seconds: 0.0,
        heal_bytes: 0,
    }
}

/// Rank 0's look, between steps, at whether newcomers wait.
struct Newcomers(Arc<Mutex<LiveMember>>);

impl Membership for Newcomers {
    fn newcomers_waiting(&mut self) -> anyhow::Result<bool> {
        Ok(lock(&self.0).newcomers_waiting()?)
    }
}
