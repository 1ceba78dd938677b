//! Broadcast from every root and the barrier's ordering guarantee.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use comm::Communicator;
use common::{TRANSPORTS, run_job, run_job_over};

#[test]
fn broadcast_copies_the_root_buffer_to_every_rank() {
    for (transport, world) in TRANSPORTS
        .into_iter()
        .flat_map(|t| [2, 3, 4].map(|w| (t, w)))
    {
        for len in [0, 1, 5, 4099, 200_003] {
            let results = run_job_over(transport, world, |mut comm| {
                (0..world)
                    .map(|root| {
                        let mut buf: Vec<f32> = (0..len)
                            .map(|i| (comm.rank() * 1_000_000 + i) as f32)
                            .collect();
                        comm.broadcast(&mut buf, root).unwrap();
                        buf
                    })
                    .collect::<Vec<_>>()
            });
            for (rank, per_root) in results.iter().enumerate() {
                for (root, buf) in per_root.iter().enumerate() {
                    let expected: Vec<f32> =
                        (0..len).map(|i| (root * 1_000_000 + i) as f32).collect();
                    assert!(
                        *buf == expected,
                        "{transport:?}, world {world}, len {len}: rank {rank} got a wrong copy of root {root}"
                    );
                }
            }
        }
    }
}

#[test]
fn broadcast_to_a_root_outside_the_world_is_an_error_not_a_hang() {
    let results = run_job(2, |mut comm| {
        let err = comm.broadcast(&mut [1.0], 2).unwrap_err();
        // The communicator stays usable: the bad call sent nothing.
        let mut buf = [comm.rank() as f32];
        comm.all_reduce(&mut buf, comm::ReduceOp::Sum).unwrap();
        (err.to_string(), buf[0])
    });
    for (err, sum) in results {
        assert!(err.contains("root 2"), "{err}");
        assert_eq!(sum, 1.0);
    }
}

#[test]
fn nobody_leaves_the_barrier_before_everyone_entered() {
    let world = 4;
    let entered = AtomicUsize::new(0);
    let seen_on_exit = run_job(world, |mut comm| {
        // The last rank dawdles; without a real barrier the others would
        // leave before it arrives.
        if comm.rank() == world - 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        entered.fetch_add(1, Ordering::SeqCst);
        comm.barrier().unwrap();
        entered.load(Ordering::SeqCst)
    });
    assert_eq!(seen_on_exit, vec![world; world]);
}
