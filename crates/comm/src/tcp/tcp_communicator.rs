//! [`TcpCommunicator`]: the [`Communicator`] over a ring of sockets.

use std::time::Instant;

use crate::communicator::{Communicator, ReduceOp, check_root};
use crate::config::CommConfig;
use crate::error::CommError;
use crate::rendezvous::Rendezvous;
use crate::store::Store;
use crate::tcp::element::{Dtype, Element, Scratch};
use crate::tcp::header::{Header, Kind};
use crate::tcp::links::{Fault, RingLinks};
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
}

#[derive(Debug)]
struct Ring {
    // Also keeps the store of rank 0 alive as long as the communicator.
    rendezvous: Rendezvous,
    links: Result<RingLinks, String>,
    scratch: Scratch,
    seq: u64,
}

impl TcpCommunicator {
    /// Joins the job described by `config`: rank 0 starts the store, all
    /// ranks form the ring, and a first barrier proves it works. Everything
    /// must happen within `config.timeout`; ranks that do not show up are
    /// named in the error.
    pub fn connect(config: &CommConfig) -> Result<Self, CommError> {
        let deadline = Instant::now() + config.timeout;
        config.validate()?;
        if config.world_size == 1 {
            return Ok(TcpCommunicator {
                rank: 0,
                world_size: 1,
                ring: None,
            });
        }
        let mut rendezvous = Rendezvous::join(config)?;
        let links = connect_ring(&mut rendezvous, deadline)?;
        let mut comm = TcpCommunicator {
            rank: config.rank,
            world_size: config.world_size,
            ring: Some(Ring {
                rendezvous,
                links: Ok(links),
                scratch: Scratch::default(),
                seq: 0,
            }),
        };
        // Until every rank is through here, some may still read addresses
        // from the store, so rank 0 must not return (and maybe drop it) yet.
        comm.barrier()?;
        Ok(comm)
    }

    /// The job's rendezvous store, for values other transports must share
    /// (e.g. a NCCL unique id published by rank 0). `None` at world size 1,
    /// where there is no store. Keys under `comm/` are used by this crate.
    pub fn store(&mut self) -> Option<&mut Store> {
        self.ring.as_mut().map(|ring| ring.rendezvous.store())
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
