//! Ring all-reduce over real sockets: correctness for awkward sizes, the
//! average, f64 metrics, and bitwise agreement between ranks.

mod common;

use comm::{Communicator, ReduceOp};
use common::{TRANSPORTS, noisy_values, run_job, run_job_over};

/// Sizes around every boundary: empty, fewer elements than ranks, not
/// divisible by the world size, and large enough for several pipeline
/// segments per part.
const SIZES: [usize; 11] = [0, 1, 2, 3, 5, 7, 100, 1000, 4097, 65_537, 300_001];

/// Integer-valued inputs whose sums are exact in f32, so the expected
/// result is known exactly whatever the summation order.
fn exact_values(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 1001) as f32 - 500.0)
        .collect()
}

fn exact_sum(world: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            (0..world)
                .map(|r| ((i * 7 + r * 13) % 1001) as f32 - 500.0)
                .sum()
        })
        .collect()
}

#[test]
fn sum_is_exact_for_all_sizes_and_world_sizes_over_both_transports() {
    for (transport, world) in TRANSPORTS
        .into_iter()
        .flat_map(|t| [2, 3, 4].map(|w| (t, w)))
    {
        let results = run_job_over(transport, world, |mut comm| {
            SIZES
                .iter()
                .map(|&len| {
                    let mut buf = exact_values(comm.rank(), len);
                    comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                    buf
                })
                .collect::<Vec<_>>()
        });
        for (rank, per_size) in results.iter().enumerate() {
            for (buf, &len) in per_size.iter().zip(SIZES.iter()) {
                assert!(
                    *buf == exact_sum(world, len),
                    "{transport:?}, world {world}, rank {rank}, {len} elements: wrong sum"
                );
            }
        }
    }
}

#[test]
fn results_are_bitwise_identical_on_every_rank_and_deterministic() {
    for (transport, world) in TRANSPORTS
        .into_iter()
        .flat_map(|t| [2, 3, 4].map(|w| (t, w)))
    {
        let len = 100_003;
        let results = run_job_over(transport, world, |mut comm| {
            let run = |comm: &mut comm::TcpCommunicator| {
                let mut buf = noisy_values(comm.rank(), len);
                comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                buf.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
            };
            (run(&mut comm), run(&mut comm))
        });
        let reference = &results[0].0;
        for (rank, (first, second)) in results.iter().enumerate() {
            assert!(
                first == reference,
                "world {world}: rank {rank} differs from rank 0"
            );
            assert!(
                second == first,
                "world {world}: rank {rank} is not deterministic"
            );
        }
        // And the shared result is the sum, up to f32 rounding of each
        // partial sum (bounded by the magnitudes of the terms).
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| noisy_values(r, len)).collect();
        for (i, bits) in reference.iter().enumerate() {
            let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
            let magnitude: f64 = inputs.iter().map(|v| f64::from(v[i].abs())).sum();
            let got = f64::from(f32::from_bits(*bits));
            let bound = world as f64 * f64::from(f32::EPSILON) * magnitude;
            assert!(
                (got - exact).abs() <= bound,
                "element {i}: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn average_is_sum_times_reciprocal_of_world_size() {
    let world = 3;
    let len = 70_001;
    let results = run_job(world, |mut comm| {
        let mut buf = exact_values(comm.rank(), len);
        comm.all_reduce(&mut buf, ReduceOp::Avg).unwrap();
        buf
    });
    let expected: Vec<f32> = exact_sum(world, len)
        .iter()
        .map(|s| s * (1.0 / world as f32))
        .collect();
    for (rank, buf) in results.iter().enumerate() {
        assert!(*buf == expected, "rank {rank}: wrong average");
    }
}

#[test]
fn f64_metrics_sum_exactly() {
    let results = run_job(4, |mut comm| {
        let rank = comm.rank() as f64;
        // loss sum, correct count, sample count
        let mut metrics = [0.25 * (rank + 1.0), 1000.0 + rank, 1e15 + rank];
        comm.all_reduce_f64(&mut metrics, ReduceOp::Sum).unwrap();
        let mut mean = [rank];
        comm.all_reduce_f64(&mut mean, ReduceOp::Avg).unwrap();
        (metrics, mean)
    });
    for (metrics, mean) in results {
        assert_eq!(metrics, [2.5, 4006.0, 4e15 + 6.0]);
        assert_eq!(mean, [1.5]);
    }
}

#[test]
fn many_small_collectives_in_a_row_stay_in_step() {
    let results = run_job(3, |mut comm| {
        let mut total = 0.0_f64;
        for step in 0..200 {
            let mut buf = [comm.rank() as f32 + step as f32];
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            let mut metric = [f64::from(buf[0])];
            comm.all_reduce_f64(&mut metric, ReduceOp::Sum).unwrap();
            total += metric[0];
        }
        total
    });
    // step s: buf = 3s + 3 on every rank; metric = 3 * (3s + 3).
    let expected: f64 = (0..200).map(|s| 3.0 * (3.0 * f64::from(s) + 3.0)).sum();
    assert_eq!(results, vec![expected; 3]);
}

/// 64-bit integers sum exactly, wrapping past the ends of i64 on the way
/// (the terms here overflow any order of partial sums), and reduce to their
/// maximum, the same on every rank over either transport.
#[test]
fn integers_sum_exactly_in_any_order_and_reduce_to_their_maximum() {
    use comm::IntReduce;
    let term = |rank: usize, i: usize| -> i64 {
        let big = i64::MAX - (i as i64) * 3;
        match rank % 2 {
            0 => big,
            _ => -big + rank as i64 + i as i64,
        }
    };
    for (transport, world) in TRANSPORTS
        .into_iter()
        .flat_map(|t| [2, 3, 4].map(|w| (t, w)))
    {
        let len = 70_001;
        let results = run_job_over(transport, world, |mut comm| {
            let rank = comm.rank();
            let mut sum: Vec<i64> = (0..len).map(|i| term(rank, i)).collect();
            comm.all_reduce_i64(&mut sum, IntReduce::Sum).unwrap();
            let mut max: Vec<i64> = (0..len)
                .map(|i| (i * 31 % 97) as i64 - rank as i64 * 50)
                .collect();
            comm.all_reduce_i64(&mut max, IntReduce::Max).unwrap();
            (sum, max)
        });
        let want_sum: Vec<i64> = (0..len)
            .map(|i| (0..world).fold(0i64, |acc, r| acc.wrapping_add(term(r, i))))
            .collect();
        let want_max: Vec<i64> = (0..len).map(|i| (i * 31 % 97) as i64).collect();
        for (rank, (sum, max)) in results.iter().enumerate() {
            assert!(
                *sum == want_sum,
                "{transport:?}, world {world}, rank {rank}: wrong sum"
            );
            assert!(
                *max == want_max,
                "{transport:?}, world {world}, rank {rank}: wrong max"
            );
        }
    }
}
