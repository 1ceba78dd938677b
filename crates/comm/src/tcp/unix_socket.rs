//! Unix domain sockets between ranks on the same machine (Linux only).
//!
//! Listeners live in the abstract namespace: nothing is created on disk, so
//! a killed rank leaves no file behind, and the name is only reachable from
//! the same network namespace. Whether two ranks share a machine is judged
//! by the kernel boot id (see `peer_address::machine_id`); a false "same" (e.g. containers of one host in
//! different network namespaces) only makes the connect fail, and the ring
//! then uses TCP.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Listeners bound by this process so far: ranks that run as threads of
/// one process, and the sub-groups of one rank, bind several.
static BOUND: AtomicU64 = AtomicU64::new(0);

/// A non-blocking listener under a fresh abstract name; `None` if binding
/// fails (the ring then offers TCP only).
pub(crate) fn bind(rank: usize) -> Option<(UnixListener, String)> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .subsec_nanos();
    let nth = BOUND.fetch_add(1, Ordering::Relaxed);
    let name = format!("comm-ring/{}/{rank}/{nth}/{nanos}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    let listener = UnixListener::bind_addr(&addr).ok()?;
    listener.set_nonblocking(true).ok()?;
    Some((listener, name))
}

pub(crate) fn connect(name: &str) -> io::Result<UnixStream> {
    UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)
}
