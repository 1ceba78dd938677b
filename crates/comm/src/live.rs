//! A member of a job whose membership changes while it trains (live
//! recovery): it keeps one connection to the store that node 0's launcher
//! hosts, under its slot (the rank its launcher gave it), and trains in
//! generations. Each generation is a ring of its own, formed under its
//! own prefix in the store, of the members the store counted in it
//! (`store_server/generations.rs`); on GPUs it has an NCCL communicator of
//! its own too, whose unique id the store carries ([`LiveMember::store`]).
//! When a ring or that communicator fails, or a newcomer waits, the
//! members enlist for the next one.

use std::time::{Duration, Instant};

use crate::config::{CommConfig, StoreHost};
use crate::error::CommError;
use crate::rendezvous::Rendezvous;
use crate::store::Store;
use crate::store_protocol::Response;
use crate::store_server::{OVER_KEY, WAITING_KEY};
use crate::tcp::TcpCommunicator;

/// One generation of the job: who trains in it, in rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// Counted from 1, the job's first.
    pub number: u64,
    /// This member's rank in it.
    pub rank: usize,
    /// The members' slots in rank order, each with the optimizer steps its
    /// state held when it enlisted (`None`: a newcomer). Rank 0 holds the
    /// most: it heals the others.
    pub members: Vec<(usize, Option<u64>)>,
}

impl Generation {
    pub fn world(&self) -> usize {
        self.members.len()
    }

    /// The slot of the member at `rank`.
    pub fn slot(&self, rank: usize) -> Option<usize> {
        self.members.get(rank).map(|&(slot, _)| slot)
    }

    /// The steps rank 0's state holds: where the generation starts from
    /// (`None`: the job's start).
    pub fn start_step(&self) -> Option<u64> {
        self.members.first().and_then(|&(_, step)| step)
    }
}

/// What enlisting came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Enlisted {
    /// A member of this generation.
    Member(Generation),
    /// Left out of generation `generation` (it did not enlist in time: it
    /// hung or was stopped); it is no member any more.
    Evicted { generation: u64 },
    /// The job's training is over: nothing left to join.
    JobOver,
}

/// This process as a member of a live job.
#[derive(Debug)]
pub struct LiveMember {
    rendezvous: Rendezvous,
    slot: usize,
    /// The generation this member trains in.
    current: Option<Generation>,
}

impl LiveMember {
    /// Registers with the launcher's store as slot `config.rank` (a slot
    /// whose member left may be taken again: a replacement), within the
    /// join timeout.
    pub fn join(config: &CommConfig) -> Result<Self, CommError> {
        if config.store != StoreHost::Launcher {
            return Err(CommError::InvalidConfig(format!(
                "a job whose membership changes needs a store that outlives every rank, node 0's launcher's; this one is {}",
                config.store.owner()
            )));
        }
        Ok(LiveMember {
            rendezvous: Rendezvous::join(config)?,
            slot: config.rank,
            current: None,
        })
    }

    /// The rank the launcher gave this process: its seat at the store.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Enlists for the next generation, this member's state holding `step`
    /// optimizer steps (`None`: none, a newcomer), `suspect` (a rank of the
    /// current generation) the peer it timed out waiting for; waits up to
    /// the join timeout for the generation to form.
    pub fn enlist(
        &mut self,
        step: Option<u64>,
        suspect: Option<usize>,
    ) -> Result<Enlisted, CommError> {
        let config = self.rendezvous.config().clone();
        let suspect = suspect.and_then(|r| self.current.as_ref()?.slot(r));
        let wait = config.rdzv_timeout;
        let master = config.master_endpoint();
        match self.rendezvous.store().enlist((step, suspect), wait)? {
            Response::Generation { number, members } => {
                let rank =
                    (members.iter().position(|&(slot, _)| slot == self.slot)).ok_or_else(|| {
                        CommError::Store {
                            master: master.clone(),
                            detail: format!(
                                "generation {number} does not hold slot {}, which enlisted in it",
                                self.slot
                            ),
                        }
                    })?;
                let generation = Generation {
                    number,
                    rank,
                    members,
                };
                self.current = Some(generation.clone());
                Ok(Enlisted::Member(generation))
            }
            Response::Evicted { generation } => Ok(Enlisted::Evicted { generation }),
            Response::JobOver => Ok(Enlisted::JobOver),
            Response::Lost => Err(CommError::JobLost { master }),
            _ => Err(CommError::StoreTimeout {
                master,
                key: "the job's next generation".to_string(),
                timeout: wait,
            }),
        }
    }

    /// The ring of `generation`, formed through the store within the
    /// collective timeout (its members are alive: they just enlisted) and
    /// proven by a first barrier.
    pub fn ring(&mut self, generation: &Generation) -> Result<TcpCommunicator, CommError> {
        let deadline = Instant::now() + self.rendezvous.config().timeout;
        TcpCommunicator::of_generation(&mut self.rendezvous, generation, deadline)
    }

    /// The store, for values a generation's other transports share (the
    /// unique id of its NCCL communicator): keyed by the generation's
    /// number, as its ring's addresses are, since the store outlives every
    /// generation. Keys under `comm/` are used by this crate.
    pub fn store(&mut self) -> &mut Store {
        self.rendezvous.store()
    }

    /// Whether a newcomer waits to join (rank 0 looks between steps).
    pub fn newcomers_waiting(&mut self) -> Result<bool, CommError> {
        let store = self.rendezvous.store();
        let waiting = store.wait_for(WAITING_KEY, Duration::ZERO)?;
        Ok(waiting.is_some_and(|w| w != b"0"))
    }

    /// Tells the store the job's training is done: a newcomer still
    /// waiting, and any later, hears [`Enlisted::JobOver`].
    pub fn finish(&mut self) -> Result<(), CommError> {
        self.rendezvous.store().set(OVER_KEY, b"1")
    }
}
