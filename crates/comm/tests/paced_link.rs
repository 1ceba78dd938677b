//! A ring capped to a slow link (`CommConfig::with_link_rate`, the token
//! bucket the measurements of docs/scaling.md use) delivers what an
//! uncapped ring delivers, bit for bit, over either same-host link: the
//! cap delays writes and splits them, and must never reorder or drop
//! bytes, even when every write waits for it.

mod common;

use comm::{Communicator, HalfFormat, ReduceOp, SameHostTransport};
use common::{HANG_TIMEOUT, TRANSPORTS, config, connect_all, free_port, noisy_values};

const WORLD: usize = 3;
/// Larger than a segment (256 KiB), so the ring pipelines.
const LEN: usize = 150_001;

/// Every rank's results of an f32 average, a bf16 sum and a broadcast.
fn collectives(transport: SameHostTransport, rate: Option<u64>) -> Vec<Vec<f32>> {
    let port = free_port();
    let configs = (0..WORLD)
        .map(|r| {
            config(r, WORLD, port, HANG_TIMEOUT)
                .with_same_host(transport)
                .with_link_rate(rate)
        })
        .collect();
    let comms = connect_all(configs);
    std::thread::scope(|s| {
        let ranks: Vec<_> = (comms.into_iter().enumerate())
            .map(|(rank, comm)| {
                let mut comm = comm.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                s.spawn(move || {
                    let mut avg = noisy_values(rank, LEN);
                    comm.all_reduce(&mut avg, ReduceOp::Avg).unwrap();
                    let mut half = noisy_values(rank + 7, LEN);
                    comm.all_reduce_half(&mut half, ReduceOp::Sum, HalfFormat::Bf16)
                        .unwrap();
                    let mut root = noisy_values(rank + 11, 1_000);
                    comm.broadcast(&mut root, 2).unwrap();
                    [avg, half, root].concat()
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn a_capped_ring_delivers_the_bits_of_an_uncapped_one() {
    let free = collectives(SameHostTransport::UnixSocket, None);
    // 40 MB/s: some 2 MB per rank take ~50 ms, every write paced.
    for transport in TRANSPORTS {
        let capped = collectives(transport, Some(40_000_000));
        for (rank, (a, b)) in capped.iter().zip(&free).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{transport:?}: rank {rank}'s results differ");
        }
    }
}
