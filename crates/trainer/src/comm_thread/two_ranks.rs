//! Tests' two ranks on one machine, over a TCP ring of their own.

use std::time::Duration;

use comm::{CommConfig, TcpCommunicator};

use super::CommThread;

/// `body` on ranks 0 and 1 of a TCP ring, each with its communicator's
/// thread; their results in rank order.
pub(crate) fn on_two_ranks<T: Send>(body: impl Fn(usize, CommThread) -> T + Sync) -> Vec<T> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    std::thread::scope(|s| {
        let body = &body;
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let config = CommConfig::new(rank, 2, "127.0.0.1", port)
                        .with_timeout(Duration::from_secs(20));
                    let comm = TcpCommunicator::connect(&config).unwrap();
                    body(rank, CommThread::spawn(Box::new(comm)).unwrap())
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}
