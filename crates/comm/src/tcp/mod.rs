//! The TCP transport: ring collectives between host buffers, over TCP
//! between machines and Unix domain sockets within one.

pub(crate) mod element;
mod exchange;
pub(crate) mod group;
pub(crate) mod header;
mod links;
mod p2p;
mod pace;
mod peer_address;
pub(crate) mod ring_all_reduce;
mod ring_broadcast;
mod ring_setup;
mod stream;
mod tcp_communicator;
#[cfg(target_os = "linux")]
mod unix_socket;

pub use tcp_communicator::TcpCommunicator;
