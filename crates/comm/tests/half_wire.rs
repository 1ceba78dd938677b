//! All-reduces carried as bfloat16 or binary16 (`all_reduce_half`): half
//! the bytes, results bitwise identical on every rank and over every
//! transport (sockets or threads), within 16-bit rounding of the exact
//! average; a rank that sends another element type is caught by the
//! header.

mod common;

use std::time::Duration;

use comm::{Communicator, HalfFormat, LocalCommunicator, ReduceOp};
use common::{TRANSPORTS, noisy_values, run_job, run_job_over};

const LEN: usize = 100_003;

/// Every rank's result over the in-process transport.
fn over_threads(world: usize, format: HalfFormat) -> Vec<Vec<f32>> {
    let comms = LocalCommunicator::job(world, Duration::from_secs(20));
    std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let mut buf = noisy_values(comm.rank(), LEN);
                    comm.all_reduce_half(&mut buf, ReduceOp::Avg, format)
                        .unwrap();
                    buf
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn sixteen_bit_averages_agree_everywhere_within_their_rounding() {
    for format in [HalfFormat::Bf16, HalfFormat::Fp16] {
        // Bits of precision: each hop rounds once.
        let unit = match format {
            HalfFormat::Bf16 => 2f64.powi(-8),
            HalfFormat::Fp16 => 2f64.powi(-11),
        };
        for world in [2, 3, 4] {
            let threads = over_threads(world, format);
            for transport in TRANSPORTS {
                let sockets = run_job_over(transport, world, |mut comm| {
                    let mut buf = noisy_values(comm.rank(), LEN);
                    comm.all_reduce_half(&mut buf, ReduceOp::Avg, format)
                        .unwrap();
                    buf
                });
                for (rank, buf) in sockets.iter().chain(&threads).enumerate() {
                    let same = buf
                        .iter()
                        .zip(&threads[0])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{format} world {world} {transport:?}: result {rank} differs"
                    );
                }
            }
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| noisy_values(r, LEN)).collect();
            for (i, &got) in threads[0].iter().enumerate() {
                let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum::<f64>() / world as f64;
                let magnitude: f64 = inputs.iter().map(|v| f64::from(v[i].abs())).sum();
                // The inputs' rounding, one per hop, the average's: at most
                // world + 1 roundings of partial sums below `magnitude`,
                // and binary16's subnormal spacing for tiny values.
                let bound = (world + 1) as f64 * unit * magnitude + 2f64.powi(-24);
                let err = (f64::from(got) - exact).abs();
                assert!(
                    err <= bound,
                    "{format} world {world}, element {i}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn a_rank_sending_another_element_type_is_a_mismatch() {
    let results = run_job(2, |mut comm| {
        let mut buf = vec![1.0f32; 64];
        match comm.rank() {
            0 => comm.all_reduce_half(&mut buf, ReduceOp::Sum, HalfFormat::Bf16),
            _ => comm.all_reduce(&mut buf, ReduceOp::Sum),
        }
    });
    // The rank that reads the other's header names both types; its
    // neighbour may only see the connection close.
    let errors: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("bf16") && e.contains("f32")),
        "{errors:?}"
    );
}
