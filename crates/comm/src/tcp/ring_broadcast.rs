//! Pipelined chain broadcast along the ring: the root streams segments to
//! its right neighbour, every other rank stores each segment and forwards it
//! to the right until the chain reaches the rank left of the root.
//! Forwarding overlaps receiving, so the time is about one buffer transfer
//! plus one segment per hop.

use crate::tcp::element::Element;
use crate::tcp::exchange::{Arrival, Plan, exchange};
use crate::tcp::header::Header;
use crate::tcp::links::{Fault, RingLinks};

pub(crate) fn ring_broadcast(
    links: &RingLinks,
    buf: &mut [f32],
    root: usize,
    header: &Header,
) -> Result<(), Fault> {
    let (rank, world) = (links.rank, links.world_size);
    let forwards = rank != root && (rank + 1) % world != root;
    let mut plan = Plan::default();
    for seg in plan.split(0, buf.len(), 1, f32::DTYPE.size()).remove(0) {
        if rank != root {
            plan.receive(seg, Arrival::Store);
        }
        if rank == root || forwards {
            plan.send_now(seg);
        }
    }
    // Broadcast never reduces, so it needs no scratch.
    exchange(links, buf, &mut [], header, &plan, None)
}
