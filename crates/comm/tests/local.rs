//! The in-process transport: ranks as threads give the TCP ring's bits.

mod common;

use std::time::{Duration, Instant};

use comm::{CommError, Communicator, LocalCommunicator, ReduceOp};
use common::{noisy_values, run_job};

/// Runs `body` on every rank of an in-process job, one thread each.
fn run_local<T: Send>(world: usize, body: impl Fn(LocalCommunicator) -> T + Sync) -> Vec<T> {
    let body = &body;
    std::thread::scope(|s| {
        let handles: Vec<_> = LocalCommunicator::job(world, Duration::from_secs(20))
            .into_iter()
            .map(|comm| s.spawn(move || body(comm)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn reduce_all(mut comm: impl Communicator, lens: &[usize]) -> Vec<(Vec<f32>, Vec<f32>, Vec<f64>)> {
    let rank = comm.rank();
    lens.iter()
        .map(|&len| {
            let mut sum = noisy_values(rank, len);
            comm.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
            let mut avg = noisy_values(rank + 7, len);
            comm.all_reduce(&mut avg, ReduceOp::Avg).unwrap();
            let mut wide: Vec<f64> = noisy_values(rank + 3, len)
                .iter()
                .map(|&v| f64::from(v) * 1.1)
                .collect();
            comm.all_reduce_f64(&mut wide, ReduceOp::Sum).unwrap();
            (sum, avg, wide)
        })
        .collect()
}

#[test]
fn threads_reduce_to_the_tcp_rings_bits() {
    for world in [2, 3, 4] {
        let lens = [0, 1, world + 1, 100_003, 3 * 65_536 * world + 7];
        let tcp = run_job(world, |comm| reduce_all(comm, &lens));
        let local = run_local(world, |comm| reduce_all(comm, &lens));
        for (rank, (t, l)) in tcp.iter().zip(&local).enumerate() {
            for ((ts, ta, tw), (ls, la, lw)) in t.iter().zip(l) {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(ts), bits(ls), "world {world} rank {rank}: sum");
                assert_eq!(bits(ta), bits(la), "world {world} rank {rank}: avg");
                let wide = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(wide(tw), wide(lw), "world {world} rank {rank}: f64");
            }
        }
    }
}

#[test]
fn broadcast_barrier_messages_and_sub_groups() {
    let results = run_local(4, |mut comm| {
        let rank = comm.rank();
        let mut buf = vec![rank as f32; 5];
        comm.broadcast(&mut buf, 2).unwrap();
        comm.barrier().unwrap();
        let next = (rank + 1) % 4;
        let prev = (rank + 3) % 4;
        let mut got = [0.0_f32; 3];
        comm.send_recv(Some((&[rank as f32; 3], next)), Some((&mut got, prev)))
            .unwrap();
        let members: Vec<usize> = if rank % 2 == 0 {
            vec![0, 2]
        } else {
            vec![1, 3]
        };
        let mut dp = comm.subgroup(&members).unwrap();
        let mut sum = [rank as f32];
        dp.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
        (buf[0], got[0], sum[0], dp.rank())
    });
    for (rank, (b, got, sum, dp_rank)) in results.into_iter().enumerate() {
        assert_eq!(b, 2.0);
        assert_eq!(got, ((rank + 3) % 4) as f32);
        assert_eq!(sum, if rank % 2 == 0 { 2.0 } else { 4.0 });
        assert_eq!(dp_rank, rank / 2);
    }
}

#[test]
fn mismatches_and_lost_ranks_are_errors_not_hangs() {
    let results = run_local(2, |mut comm| {
        let len = 1 + comm.rank();
        let mismatch = comm
            .all_reduce(&mut vec![0.0; len], ReduceOp::Sum)
            .unwrap_err();
        let short = comm.send_recv(
            Some((&[1.0; 2], 1 - comm.rank())),
            Some((&mut [0.0; 3], 1 - comm.rank())),
        );
        (mismatch, short.unwrap_err())
    });
    for (mismatch, short) in results {
        assert!(
            matches!(mismatch, CommError::CollectiveMismatch { .. }),
            "{mismatch}"
        );
        assert!(
            matches!(short, CommError::CollectiveMismatch { .. }),
            "{short}"
        );
    }
    let started = Instant::now();
    let lost = run_local(2, |mut comm| {
        if comm.rank() == 1 {
            return None;
        }
        comm.all_reduce(&mut [1.0], ReduceOp::Sum).err()
    });
    let err = lost[0].as_ref().expect("rank 0 must notice rank 1 is gone");
    assert!(matches!(err, CommError::PeerLost { peer: 1, .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Integers reduce to the sockets' results: the exact wrapping sum and the
/// maximum.
#[test]
fn threads_reduce_integers_as_sockets_do() {
    let reduce = |mut comm: Box<dyn Communicator>| {
        let rank = comm.rank() as i64;
        let mut sum: Vec<i64> = (0..1000).map(|i| (i64::MAX / 3) * (rank + 1) - i).collect();
        comm.all_reduce_i64(&mut sum, comm::IntReduce::Sum).unwrap();
        let mut max: Vec<i64> = (0..1000).map(|i| (i * 7 % 13) - 4 * rank).collect();
        comm.all_reduce_i64(&mut max, comm::IntReduce::Max).unwrap();
        (sum, max)
    };
    let threads = run_local(3, |c| reduce(Box::new(c)));
    let sockets = run_job(3, |c| reduce(Box::new(c)));
    assert_eq!(threads, sockets);
    let want = (0..1000i64)
        .map(|i| (0..3).fold(0i64, |a, r| a.wrapping_add((i64::MAX / 3) * (r + 1) - i)))
        .collect::<Vec<_>>();
    assert_eq!(threads[0].0, want);
}
