//! [`TcpCommunicator`]: the [`Communicator`] over a ring of sockets.

use std::time::Instant;

use half::{bf16, f16};

use crate::communicator::{Communicator, HalfFormat, IntReduce, ReduceOp, check_peers, check_root};
use crate::config::CommConfig;
use crate::error::CommError;
use crate::rendezvous::Rendezvous;
use crate::store::Store;
use crate::tcp::element::{Dtype, Element, Largest, Scratch, WrappingSum, through};
use crate::tcp::group::Group;
use crate::tcp::header::{Header, Kind};
use crate::tcp::links::{Fault, RingLinks};
use crate::tcp::p2p::{self, Incoming, Outgoing};
use crate::tcp::ring_all_reduce::ring_all_reduce;
use crate::tcp::ring_broadcast::ring_broadcast;
use crate::tcp::ring_setup::connect_ring;

/// Collectives over a ring of socket connections between the ranks, formed
/// through the store on rank 0: TCP between machines, Unix domain sockets
/// between ranks on the same machine (see [`crate::SameHostTransport`]).
///
/// After any failure the communicator closes its connections (so its
/// neighbours fail promptly instead of waiting for their timeout) and
/// answers every later call with [`CommError::Broken`].
#[derive(Debug)]
pub struct TcpCommunicator {
    rank: usize,
    world_size: usize,
    /// `None` at world size 1, where every collective is the identity.
    ring: Option<Ring>,
    /// Sub-groups made from this communicator so far.
    groups_made: u64,
}

#[derive(Debug)]
struct Ring {
    // Also keeps the store of rank 0 alive as long as the communicator;
    // `None` in a sub-group, which needs the store only to form.
    rendezvous: Option<Rendezvous>,
    links: Result<RingLinks, String>,
    scratch: Scratch,
    seq: u64,
    /// Per peer: messages sent to it, and received from it, so far.
    messages: Vec<(u64, u64)>,
}

impl Ring {
    fn new(rendezvous: Option<Rendezvous>, links: RingLinks) -> Ring {
        Ring {
            messages: vec![(0, 0); links.world_size],
            rendezvous,
            links: Ok(links),
            scratch: Scratch::default(),
            seq: 0,
        }
    }
}

impl TcpCommunicator {
    /// Joins the job described by `config`: rank 0 starts the store, all
    /// ranks form the ring, and a first barrier proves it works. Joining
    /// must happen within `config.rdzv_timeout`, the barrier within
    /// `config.timeout`; ranks that do not show up are named in the error.
    pub fn connect(config: &CommConfig) -> Result<Self, CommError> {
        let deadline = Instant::now() + config.rdzv_timeout;
        config.validate()?;
        if config.world_size == 1 {
            return Ok(Self::alone());
        }
        let mut rendezvous = Rendezvous::join(config)?;
        let group = Group::whole(config.rank, config.world_size);
        let links = connect_ring(&mut rendezvous, &group, deadline)?;
        let mut comm = TcpCommunicator {
            rank: config.rank,
            world_size: config.world_size,
            ring: Some(Ring::new(Some(rendezvous), links)),
            groups_made: 0,
        };
        // Until every rank is through here, some may still read addresses
        // from the store, so rank 0 must not return (and maybe drop it) yet.
        comm.barrier()?;
        Ok(comm)
    }

    /// The ring of `generation` (see [`crate::LiveMember`]), formed through
    /// `rendezvous`'s store by `deadline` and proven by a first barrier.
    pub(crate) fn of_generation(
        rendezvous: &mut Rendezvous,
        generation: &crate::Generation,
        deadline: Instant,
    ) -> Result<Self, CommError> {
        let (rank, world) = (generation.rank, generation.world());
        if world == 1 {
            return Ok(Self::alone());
        }
        let group = Group::generation(generation.number, rank, world);
        let links = connect_ring(rendezvous, &group, deadline)?;
        let mut comm = TcpCommunicator {
            rank,
            world_size: world,
            ring: Some(Ring::new(None, links)),
            groups_made: 0,
        };
        comm.barrier()?;
        Ok(comm)
    }

    /// The job's rendezvous store, for values other transports must share
    /// (e.g. a NCCL unique id published by rank 0). `None` at world size 1,
    /// where there is no store. Keys under `comm/` are used by this crate.
    pub fn store(&mut self) -> Option<&mut Store> {
        let rendezvous = self.ring.as_mut()?.rendezvous.as_mut()?;
        Some(rendezvous.store())
    }

    /// The communicator of a world of one rank: no store, no sockets.
    fn alone() -> Self {
        TcpCommunicator {
            rank: 0,
            world_size: 1,
            ring: None,
            groups_made: 0,
        }
    }

    /// A ring over `members` (see [`Communicator::subgroup`]), formed
    /// through this communicator's store within its join timeout, and proven
    /// by a first barrier. Only the job's communicator (the one
    /// [`TcpCommunicator::connect`] returns) has a store to form them.
    pub fn subgroup(&mut self, members: &[usize]) -> Result<TcpCommunicator, CommError> {
        self.groups_made += 1;
        let group = Group::sub(self.groups_made, members, self.rank, self.world_size)?;
        if group.world() == 1 {
            return Ok(Self::alone());
        }
        let Some(rendezvous) = self.ring.as_mut().and_then(|r| r.rendezvous.as_mut()) else {
            return Err(CommError::InvalidArgument {
                op: "subgroup",
                reason: "sub-groups are made from the job's communicator, not from a sub-group"
                    .to_string(),
            });
        };
        let deadline = Instant::now() + rendezvous.config().rdzv_timeout;
        let links = connect_ring(rendezvous, &group, deadline)?;
        let mut comm = TcpCommunicator {
            rank: group.rank,
            world_size: group.world(),
            ring: Some(Ring::new(None, links)),
            groups_made: 0,
        };
        comm.barrier()?;
        Ok(comm)
    }

    /// Runs one collective on the ring, turning failures into errors that
    /// name the neighbour and leave the communicator closed.
    fn run(
        &mut self,
        op: &'static str,
        (kind, dtype, count): (Kind, Dtype, usize),
        collective: impl FnOnce(&RingLinks, &mut Scratch, &Header) -> Result<(), Fault>,
    ) -> Result<(), CommError> {
        let Some(ring) = &mut self.ring else {
            return Ok(());
        };
        let links = match &ring.links {
            Ok(links) => links,
            Err(reason) => return Err(CommError::Broken(reason.clone())),
        };
        ring.seq += 1;
        let header = Header {
            kind,
            dtype,
            count,
            seq: ring.seq,
        };
        match collective(links, &mut ring.scratch, &header) {
            Ok(()) => Ok(()),
            Err(fault) => {
                let err = links.error(fault, op);
                // Dropping the links closes both sockets now.
                ring.links = Err(err.to_string());
                Err(err)
            }
        }
    }

    fn all_reduce_elements<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        kind: Kind,
    ) -> Result<(), CommError> {
        let name = match kind {
            Kind::Barrier => "barrier",
            _ => "all_reduce",
        };
        let count = buf.len();
        self.run(name, (kind, T::DTYPE, count), |links, scratch, header| {
            ring_all_reduce(links, scratch, buf, op, header)
        })
    }
}

impl Communicator for TcpCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce_elements(buf, op, Kind::AllReduce(op))
    }

    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce_elements(buf, op, Kind::AllReduce(op))
    }

    fn all_reduce_i64(&mut self, buf: &mut [i64], op: IntReduce) -> Result<(), CommError> {
        let kind = Kind::AllReduce(ReduceOp::Sum);
        match op {
            IntReduce::Sum => {
                let buf: &mut [WrappingSum] = bytemuck::cast_slice_mut(buf);
                self.all_reduce_elements(buf, ReduceOp::Sum, kind)
            }
            IntReduce::Max => {
                let buf: &mut [Largest] = bytemuck::cast_slice_mut(buf);
                self.all_reduce_elements(buf, ReduceOp::Sum, kind)
            }
        }
    }

    fn all_reduce_half(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        format: HalfFormat,
    ) -> Result<(), CommError> {
        let kind = Kind::AllReduce(op);
        match format {
            HalfFormat::Bf16 => through::<bf16, _>(buf, |w| self.all_reduce_elements(w, op, kind)),
            HalfFormat::Fp16 => through::<f16, _>(buf, |w| self.all_reduce_elements(w, op, kind)),
        }
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root(root, self.world_size)?;
        let count = buf.len();
        self.run(
            "broadcast",
            (Kind::Broadcast { root }, Dtype::F32, count),
            |links, _, header| ring_broadcast(links, buf, root, header),
        )
    }

    /// A sum over one element per rank: no rank can finish the
    /// reduce-scatter before every rank has contributed.
    fn barrier(&mut self) -> Result<(), CommError> {
        let mut token = vec![0.0_f64; self.world_size];
        self.all_reduce_elements(&mut token, ReduceOp::Sum, Kind::Barrier)
    }

    fn send_recv(
        &mut self,
        send: Option<(&[f32], usize)>,
        recv: Option<(&mut [f32], usize)>,
    ) -> Result<(), CommError> {
        let (rank, world) = (self.rank, self.world_size);
        check_peers(
            rank,
            world,
            [send.as_ref().map(|s| s.1), recv.as_ref().map(|r| r.1)],
        )?;
        let Some(ring) = &mut self.ring else {
            return Ok(());
        };
        let links = match &ring.links {
            Ok(links) => links,
            Err(reason) => return Err(CommError::Broken(reason.clone())),
        };
        let header = |count: usize, from: usize, seq: u64| Header {
            kind: Kind::Send { from },
            dtype: Dtype::F32,
            count,
            seq,
        };
        let out = send.map(|(buf, to)| Outgoing {
            header: header(buf.len(), rank, ring.messages[to].0 + 1),
            data: bytemuck::cast_slice(buf),
            to,
        });
        let inc = recv.map(|(buf, from)| Incoming {
            expected: header(buf.len(), from, ring.messages[from].1 + 1),
            data: bytemuck::cast_slice_mut(buf),
            from,
        });
        let (to, from) = (out.as_ref().map(|o| o.to), inc.as_ref().map(|i| i.from));
        match p2p::send_recv(links, out, inc) {
            Ok(()) => {
                if let Some(to) = to {
                    ring.messages[to].0 += 1;
                }
                if let Some(from) = from {
                    ring.messages[from].1 += 1;
                }
                Ok(())
            }
            Err(e @ CommError::InvalidArgument { .. }) => Err(e),
            Err(e) => {
                // Dropping the links closes both sockets now.
                ring.links = Err(e.to_string());
                Err(e)
            }
        }
    }

    fn subgroup(&mut self, members: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        Ok(Box::new(TcpCommunicator::subgroup(self, members)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// World size 1 needs no store and no sockets, so any address works.
    fn alone() -> TcpCommunicator {
        TcpCommunicator::connect(&CommConfig::new(0, 1, "", 0)).unwrap()
    }

    #[test]
    fn at_world_size_one_collectives_leave_data_unchanged() {
        let mut comm: Box<dyn Communicator> = Box::new(alone());
        let mut buf = vec![1.5_f32, -2.0, 3.25];
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        comm.all_reduce(&mut buf, ReduceOp::Avg).unwrap();
        comm.broadcast(&mut buf, 0).unwrap();
        comm.barrier().unwrap();
        assert_eq!(buf, [1.5, -2.0, 3.25]);
        let mut metrics = [7.0_f64, 0.5];
        comm.all_reduce_f64(&mut metrics, ReduceOp::Sum).unwrap();
        assert_eq!(metrics, [7.0, 0.5]);
        assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    }

    #[test]
    fn at_world_size_one_broadcast_from_a_missing_root_is_an_error() {
        let err = alone().broadcast(&mut [1.0], 1).unwrap_err();
        assert!(err.to_string().contains("root 1"), "{err}");
    }
}
