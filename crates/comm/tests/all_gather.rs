//! The variable-length all-gather: every rank gets every rank's data, in
//! rank order, bit for bit, over sockets and over threads.

mod common;

use std::time::Duration;

use comm::{Communicator, LocalCommunicator};
use common::{TRANSPORTS, noisy_values, run_job_over};

/// What rank `rank` sends in a world of `world`: lengths differ, one rank
/// sends nothing, and the values include a negative zero and a NaN payload.
fn sent(rank: usize, world: usize) -> Vec<f32> {
    let len = if rank == world - 1 {
        0
    } else {
        3 + 1000 * rank
    };
    let mut values = noisy_values(rank, len);
    if len > 2 {
        values[0] = -0.0;
        values[1] = f32::from_bits(0x7fc0_1234);
    }
    values
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(what: &str, world: usize, results: &[Vec<Vec<f32>>]) {
    assert_eq!(results.len(), world);
    for (rank, gathered) in results.iter().enumerate() {
        assert_eq!(gathered.len(), world, "{what}: rank {rank}");
        for (from, data) in gathered.iter().enumerate() {
            assert_eq!(
                bits(data),
                bits(&sent(from, world)),
                "{what}, world {world}: rank {rank}'s copy of rank {from}'s data"
            );
        }
    }
}

#[test]
fn every_rank_gets_every_ranks_data_in_rank_order() {
    for transport in TRANSPORTS {
        for world in [1, 2, 3] {
            let results = run_job_over(transport, world, |mut comm| {
                let send = sent(comm.rank(), world);
                comm.all_gather_v(&send).unwrap()
            });
            check(&format!("{transport:?}"), world, &results);
        }
    }
}

#[test]
fn threads_gather_the_same_as_sockets() {
    for world in [1, 2, 4] {
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = LocalCommunicator::job(world, Duration::from_secs(20))
                .into_iter()
                .map(|mut comm| {
                    s.spawn(move || {
                        let send = sent(comm.rank(), world);
                        let first = comm.all_gather_v(&send).unwrap();
                        // A second round right after: rounds do not mix.
                        let again = comm.all_gather_v(&send).unwrap();
                        (first, again)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let (first, again): (Vec<_>, Vec<_>) = results.into_iter().unzip();
        check("threads", world, &first);
        check("threads, second round", world, &again);
    }
}
