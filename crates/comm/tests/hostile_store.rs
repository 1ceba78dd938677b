//! Peers that are not comm ranks, over real sockets: whatever they send,
//! the store drops their connection within its timeout and keeps serving
//! the job's ranks.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use comm::{Store, StoreServer};
use common::config;

/// The store's timeout in these tests: short, so a dropped connection shows
/// quickly, yet long enough for the ranks' own requests on a loaded machine.
const TIMEOUT: Duration = Duration::from_millis(500);

fn connect(server: &StoreServer) -> TcpStream {
    TcpStream::connect(("127.0.0.1", server.port())).unwrap()
}

/// Asserts that the store closes `peer` within a few of its timeouts.
fn assert_dropped(mut peer: TcpStream, what: &str) {
    let start = Instant::now();
    peer.set_read_timeout(Some(TIMEOUT * 6)).unwrap();
    let mut sink = [0_u8; 64];
    loop {
        match peer.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{what}: the store kept the connection ({e})"),
        }
    }
    assert!(
        start.elapsed() < TIMEOUT * 6,
        "{what}: dropped only after {:?}",
        start.elapsed()
    );
}

/// The ranks of a 2-rank job register and exchange a value.
fn job_still_works(server: &StoreServer) {
    let mut a = Store::connect(&config(0, 2, server.port(), TIMEOUT)).unwrap();
    let mut b = Store::connect(&config(1, 2, server.port(), TIMEOUT)).unwrap();
    a.set("addr/0", b"10.0.0.1:4000").unwrap();
    assert_eq!(b.get("addr/0").unwrap(), b"10.0.0.1:4000");
}

#[test]
fn garbage_is_dropped_and_the_job_goes_on() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, TIMEOUT).unwrap();
    let mut http = connect(&server);
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_dropped(http, "an HTTP request");
    let mut junk = connect(&server);
    // A frame of a plausible length whose payload is no message.
    junk.write_all(&[5, 0, 0, 0, 0xff, 1, 2, 3, 4]).unwrap();
    assert_dropped(junk, "an unknown tag");
    job_still_works(&server);
}

#[test]
fn a_half_frame_stall_costs_only_that_connection() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, TIMEOUT).unwrap();
    let mut stalled = connect(&server);
    // Announces 1 MiB, sends 10 bytes, then nothing.
    stalled.write_all(&(1_u32 << 20).to_le_bytes()).unwrap();
    stalled.write_all(&[1; 10]).unwrap();
    // The job registers and talks while the stalled peer is still connected.
    job_still_works(&server);
    assert_dropped(stalled, "a half frame");
}

#[test]
fn a_trickled_frame_is_cut_off_at_the_deadline() {
    let server = StoreServer::bind("127.0.0.1", 0, 1, TIMEOUT).unwrap();
    let mut slow = connect(&server);
    slow.write_all(&64_u32.to_le_bytes()).unwrap();
    let start = Instant::now();
    // One byte every fifth of the timeout: each read succeeds in time, the
    // frame as a whole does not.
    let dropped_after = loop {
        std::thread::sleep(TIMEOUT / 5);
        if slow.write_all(&[1]).is_err() || start.elapsed() > TIMEOUT * 6 {
            break start.elapsed();
        }
        let mut probe = [0_u8; 1];
        slow.set_nonblocking(true).unwrap();
        let closed = match slow.read(&mut probe) {
            Ok(read) => read == 0,
            Err(e) => e.kind() == ErrorKind::ConnectionReset,
        };
        slow.set_nonblocking(false).unwrap();
        if closed {
            break start.elapsed();
        }
    };
    assert!(dropped_after < TIMEOUT * 6, "kept for {dropped_after:?}");
}

#[test]
fn a_silent_peer_is_dropped_and_the_job_goes_on() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, TIMEOUT).unwrap();
    let silent = connect(&server);
    job_still_works(&server);
    assert_dropped(silent, "a peer that never speaks");
}

#[test]
fn an_oversized_length_is_dropped_without_allocating() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, TIMEOUT).unwrap();
    let mut greedy = connect(&server);
    greedy.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert_dropped(greedy, "a 4 GiB length prefix");
    job_still_works(&server);
}

#[test]
fn a_registered_rank_may_stay_quiet_between_requests() {
    let server = StoreServer::bind("127.0.0.1", 0, 1, TIMEOUT).unwrap();
    let mut rank = Store::connect(&config(0, 1, server.port(), TIMEOUT)).unwrap();
    std::thread::sleep(TIMEOUT * 3);
    rank.set("later", b"still here").unwrap();
    assert_eq!(rank.get("later").unwrap(), b"still here");
}
