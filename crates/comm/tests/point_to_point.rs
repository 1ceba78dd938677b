//! Point-to-point messages and sub-groups: what pipeline parallelism needs
//! (activations forward, their gradients backward, each stage's replicas
//! averaging among themselves).

mod common;

use comm::{CommError, Communicator, ReduceOp};
use common::{TRANSPORTS, noisy_values, run_job, run_job_over};

/// More than any socket buffer, so a blocking send would deadlock.
const BIG: usize = 3 << 20;

#[test]
fn two_ranks_exchange_big_messages_both_ways_at_once() {
    for transport in TRANSPORTS {
        let results = run_job_over(transport, 2, |mut comm| {
            let (me, peer) = (comm.rank(), 1 - comm.rank());
            let mut got = Vec::new();
            for len in [0, 1, 4099, BIG] {
                let mine = noisy_values(me, len);
                let mut theirs = vec![0.0_f32; len];
                comm.send_recv(Some((&mine, peer)), Some((&mut theirs, peer)))
                    .unwrap();
                got.push(theirs);
            }
            got
        });
        for (rank, got) in results.iter().enumerate() {
            for (buf, len) in got.iter().zip([0, 1, 4099, BIG]) {
                assert!(
                    *buf == noisy_values(1 - rank, len),
                    "{transport:?}: rank {rank} got a wrong message of {len}"
                );
            }
        }
    }
}

/// Four stages: values go forward rank by rank, then back, as in a
/// pipeline's forward and backward passes.
#[test]
fn messages_travel_forward_and_backward_along_a_chain() {
    let world = 4;
    let results = run_job(world, |mut comm| {
        let rank = comm.rank();
        let mut forward = vec![0.0_f32; 1000];
        if rank > 0 {
            comm.send_recv(None, Some((&mut forward, rank - 1)))
                .unwrap();
        }
        forward.iter_mut().for_each(|v| *v += 1.0);
        if rank + 1 < world {
            comm.send_recv(Some((&forward, rank + 1)), None).unwrap();
        }
        let mut backward = vec![0.0_f32; BIG];
        if rank + 1 < world {
            comm.send_recv(None, Some((&mut backward, rank + 1)))
                .unwrap();
        }
        backward[0] += 10.0;
        if rank > 0 {
            comm.send_recv(Some((&backward, rank - 1)), None).unwrap();
        }
        (forward[999], backward[0])
    });
    for (rank, (forward, backward)) in results.into_iter().enumerate() {
        assert_eq!(forward, (rank + 1) as f32, "rank {rank}");
        assert_eq!(backward, (10 * (world - rank)) as f32, "rank {rank}");
    }
}

#[test]
fn bad_peers_and_lengths_are_errors_not_hangs() {
    let results = run_job(3, |mut comm| {
        let rank = comm.rank();
        // Rank 0 and 2 are neighbours in the ring of 3; nobody is its own.
        let errors = vec![
            comm.send_recv(Some((&[1.0], rank)), None).unwrap_err(),
            comm.send_recv(Some((&[1.0], 3)), None).unwrap_err(),
        ];
        // The communicator is still usable after refused calls.
        let mut sum = [1.0_f32];
        comm.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
        // Rank 0 sends 2 values, rank 1 expects 3.
        let mismatch = match rank {
            0 => comm.send_recv(Some((&[1.0, 2.0], 1)), None).err(),
            1 => comm.send_recv(None, Some((&mut [0.0; 3], 0))).err(),
            _ => None,
        };
        (errors, sum[0], mismatch)
    });
    for (rank, (errors, sum, mismatch)) in results.into_iter().enumerate() {
        assert_eq!(sum, 3.0);
        for e in errors {
            assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
        }
        if rank == 1 {
            let e = mismatch.expect("a length mismatch must be reported");
            assert!(e.to_string().contains("send(f32 x 2)"), "{e}");
        }
    }
}

#[test]
fn a_chain_of_four_needs_neighbours() {
    let results = run_job(4, |mut comm| {
        let to = (comm.rank() + 2) % 4;
        comm.send_recv(Some((&[1.0], to)), None).unwrap_err()
    });
    for e in results {
        assert!(e.to_string().contains("not a neighbour"), "{e}");
    }
}

/// A 2 × 2 layout: pipelines {0, 1} and {2, 3}, data-parallel groups
/// {0, 2} and {1, 3}; each group reduces and messages on its own.
#[test]
fn sub_groups_reduce_and_message_among_their_members_only() {
    for transport in TRANSPORTS {
        let results = run_job_over(transport, 4, |mut comm| {
            let rank = comm.rank();
            let pipeline: Vec<usize> = if rank < 2 { vec![0, 1] } else { vec![2, 3] };
            let data: Vec<usize> = if rank % 2 == 0 {
                vec![0, 2]
            } else {
                vec![1, 3]
            };
            let mut pipe = comm.subgroup(&pipeline).unwrap();
            let mut dp = comm.subgroup(&data).unwrap();
            assert_eq!((pipe.rank(), pipe.world_size()), (rank % 2, 2));
            assert_eq!((dp.rank(), dp.world_size()), (rank / 2, 2));
            let mut sum = [rank as f32];
            dp.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
            let mut got = [0.0_f32; 2];
            let peer = 1 - pipe.rank();
            pipe.send_recv(Some((&[rank as f32; 2], peer)), Some((&mut got, peer)))
                .unwrap();
            let mut total = [1.0_f32];
            comm.all_reduce(&mut total, ReduceOp::Sum).unwrap();
            (sum[0], got[0], total[0])
        });
        for (rank, (sum, got, total)) in results.into_iter().enumerate() {
            let partner = if rank % 2 == 0 { rank + 1 } else { rank - 1 };
            assert_eq!(
                sum,
                (rank % 2 + rank % 2 + 2) as f32,
                "{transport:?} {rank}"
            );
            assert_eq!(got, partner as f32, "{transport:?} rank {rank}");
            assert_eq!(total, 4.0);
        }
    }
}

#[test]
fn sub_groups_of_one_and_bad_member_lists() {
    let results = run_job(2, |mut comm| {
        let rank = comm.rank();
        let mut alone = comm.subgroup(&[rank]).unwrap();
        let mut buf = [5.0_f32];
        alone.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let outsider = comm.subgroup(&[1 - rank]).err().map(|e| e.to_string());
        (buf[0], alone.world_size(), outsider)
    });
    for (buf, world, outsider) in results {
        assert_eq!((buf, world), (5.0, 1));
        assert!(outsider.unwrap().contains("do not include it"));
    }
}
