//! Helpers shared by the integration tests: whole jobs of ranks run as
//! threads of the test process, talking over 127.0.0.1.

// Each test binary uses a different subset of the helpers.
#![allow(dead_code)]

use std::net::TcpListener;
use std::time::Duration;

use comm::{CommConfig, CommError, SameHostTransport, TcpCommunicator};

/// Long enough never to fire on a loaded machine, short enough that a hang
/// fails the suite quickly.
pub const HANG_TIMEOUT: Duration = Duration::from_secs(20);

/// A port that was free a moment ago (the OS picks it; tests run in
/// parallel, so fixed ports would collide).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port on loopback")
}

/// Rank `rank` of a job on loopback whose joining and collectives are
/// bounded by `timeout` alike.
pub fn config(rank: usize, world_size: usize, port: u16, timeout: Duration) -> CommConfig {
    CommConfig::new(rank, world_size, "127.0.0.1", port)
        .with_timeout(timeout)
        .with_rdzv_timeout(timeout)
}

/// Both ways ranks on one machine can be linked; tests of the data path
/// run over each.
pub const TRANSPORTS: [SameHostTransport; 2] =
    [SameHostTransport::UnixSocket, SameHostTransport::Tcp];

/// Runs `body` on every rank of a fresh `world_size`-rank job, each rank on
/// its own thread, and returns the results in rank order.
pub fn run_job<T, F>(world_size: usize, body: F) -> Vec<T>
where
    T: Send,
    F: Fn(TcpCommunicator) -> T + Sync,
{
    run_job_over(SameHostTransport::default(), world_size, body)
}

/// [`run_job`] with the given link between ranks.
pub fn run_job_over<T, F>(transport: SameHostTransport, world_size: usize, body: F) -> Vec<T>
where
    T: Send,
    F: Fn(TcpCommunicator) -> T + Sync,
{
    let body = &body;
    let bodies = (0..world_size)
        .map(|_| Box::new(body) as Body<'_, T>)
        .collect();
    run_ranks_over(transport, HANG_TIMEOUT, bodies)
}

/// One rank's part of a job.
pub type Body<'a, T> = Box<dyn FnOnce(TcpCommunicator) -> T + Send + 'a>;

/// Runs a job whose rank `r` runs `bodies[r]`, each on its own thread, with
/// the given link and timeout; returns the results in rank order.
pub fn run_ranks_over<T: Send>(
    transport: SameHostTransport,
    timeout: Duration,
    bodies: Vec<Body<'_, T>>,
) -> Vec<T> {
    let port = free_port();
    let world = bodies.len();
    std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .into_iter()
            .enumerate()
            .map(|(rank, body)| {
                scope.spawn(move || {
                    let config = config(rank, world, port, timeout).with_same_host(transport);
                    let comm = TcpCommunicator::connect(&config)
                        .unwrap_or_else(|e| panic!("rank {rank} failed to connect: {e}"));
                    body(comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Runs `connect` for each rank of a job concurrently and returns the
/// outcomes in rank order, for tests of failing rendezvous.
pub fn connect_all(configs: Vec<CommConfig>) -> Vec<Result<TcpCommunicator, CommError>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = configs
            .into_iter()
            .map(|c| scope.spawn(move || TcpCommunicator::connect(&c)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Deterministic pseudo-random values spanning many magnitudes, so that a
/// different summation order would change the low bits.
pub fn noisy_values(rank: usize, len: usize) -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (rank as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = (state >> 40) as f32 / (1 << 24) as f32 - 0.5;
            let exponent = ((state >> 8) % 16) as i32 - 8;
            mantissa * 2_f32.powi(exponent)
        })
        .collect()
}
