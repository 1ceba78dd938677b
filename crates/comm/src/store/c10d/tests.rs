//! The queries byte for byte as PyTorch 2.15's own `TCPStore` client sends
//! them (recorded between it and its server), and the answers read as it
//! reads them. Against PyTorch's real server: the trainer's
//! `tests/torch_store.rs`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::*;

/// Runs `op` on a connection whose other end answers `reply` at once and
/// records what `op` sent; `op`'s result and those bytes.
fn talk<T>(reply: &[u8], op: impl FnOnce(&TcpStream) -> io::Result<T>) -> (io::Result<T>, Vec<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    server.write_all(reply).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let result = op(&client);
    drop(client);
    let mut sent = Vec::new();
    server.read_to_end(&mut sent).unwrap();
    (result, sent)
}

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    digits
        .chunks(2)
        .map(|d| u8::from_str_radix(&d.iter().collect::<String>(), 16).unwrap())
        .collect()
}

#[test]
fn set_get_add_and_compare_set_are_pytorchs_bytes() {
    let (done, sent) = talk(b"", |s| set(s, "/k", b"v"));
    done.unwrap();
    assert_eq!(sent, hex("01 0200000000000000 2f6b 0100000000000000 76"));

    let (value, sent) = talk(&hex("0100000000000000 76"), |s| get(s, "/k"));
    assert_eq!(value.unwrap(), b"v");
    assert_eq!(sent, hex("03 0200000000000000 2f6b"));

    let (sum, sent) = talk(&hex("0500000000000000"), |s| add(s, "/n", 5));
    assert_eq!(sum.unwrap(), 5);
    assert_eq!(sent, hex("04 0200000000000000 2f6e 0500000000000000"));

    let (now, sent) = talk(&hex("0100000000000000 78"), |s| {
        compare_set(s, "/c", b"", b"x")
    });
    assert_eq!(now.unwrap(), b"x");
    assert_eq!(
        sent,
        hex("02 0200000000000000 2f63 0000000000000000 0100000000000000 78")
    );
}

#[test]
fn check_and_wait_are_pytorchs_bytes() {
    let (ready, sent) = talk(&[1], |s| check(s, "/k"));
    assert!(!ready.unwrap(), "1 is NOT_READY");
    assert_eq!(sent, hex("05 0100000000000000 0200000000000000 2f6b"));

    let long = Duration::from_secs(20);
    let (set, sent) = talk(&[0], |s| wait_until_set(s, "/k", long, long));
    assert!(set.unwrap());
    assert_eq!(sent, hex("06 0100000000000000 0200000000000000 2f6b"));
}

#[test]
fn the_opening_is_validate_then_a_ping_whose_nonce_comes_back() {
    let nonce = std::process::id().to_le_bytes();
    let (opened, sent) = talk(&nonce, validate);
    opened.unwrap();
    let mut want = hex("00 cef7853c 0d");
    want.extend_from_slice(&nonce);
    assert_eq!(sent, want);

    let (refused, _) = talk(&[1, 2, 3, 4], validate);
    let err = refused.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("not c10d's TCPStore"), "{err}");
}

/// A store that answers a wait only once it is cancelled, with `answer`.
fn cancelled_wait(answer: &'static [u8]) -> io::Result<bool> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let store = std::thread::spawn(move || {
        let mut query = [0; 19];
        server.read_exact(&mut query).unwrap();
        let mut cancel = [0; 1];
        server.read_exact(&mut cancel).unwrap();
        server.write_all(answer).unwrap();
        cancel[0]
    });
    let short = Duration::from_millis(50);
    let set = wait_until_set(&client, "/k", short, Duration::from_secs(20));
    assert_eq!(store.join().unwrap(), CANCEL_WAIT);
    set
}

#[test]
fn a_wait_past_its_time_is_cancelled_and_a_key_set_meanwhile_still_counts() {
    assert!(!cancelled_wait(&[WAIT_CANCELED]).unwrap());
    // The key came between the timeout and the cancel: both answers.
    assert!(cancelled_wait(&[STOP_WAITING, WAIT_CANCELED]).unwrap());
    let err = cancelled_wait(&[7]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
}

#[test]
fn a_value_longer_than_a_frame_is_refused_before_it_is_allocated() {
    let (value, _) = talk(&u64::MAX.to_le_bytes(), |s| get(s, "/k"));
    let err = value.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("a value of"), "{err}");
}
