//! NCCL collectives on device buffers (through `cudarc::nccl`), for one
//! process per GPU.
//!
//! * [`NcclCommunicator`]: rank 0 makes the unique id and passes it through
//!   the rendezvous [`Store`](crate::Store); every rank creates its
//!   communicator on its own GPU. All-reduce and broadcast are queued on
//!   the communication stream the caller provides and return at once, so
//!   they are `unsafe fn`: the caller keeps the buffers alive until that
//!   stream has completed them. A watchdog aborts the communicator
//!   (`ncclCommAbort`) when a collective outlives the timeout or NCCL
//!   reports an asynchronous error. `send_recv` queues a grouped
//!   `ncclSend`/`ncclRecv` (pipeline stages); `connect_named` makes one
//!   communicator per group (its unique id keyed by the group's name).
//! * [`require_nccl`]: `libnccl.so` is loaded at first use; when it is
//!   missing the error is a [`NcclSearch`] report of where NCCL was looked
//!   for and how to make what was found loadable, never cudarc's panic.
//! * `ffi.rs` holds every call into NCCL and every other `unsafe` of the
//!   crate; `communicator.rs` only calls its `unsafe fn`s, under the
//!   contract its own collectives pass on to their callers.
//!
//! NCCL's own environment variables (`NCCL_DEBUG`, `NCCL_SOCKET_IFNAME`,
//! `NCCL_IB_HCA`, ...) are read by the library itself and pass through
//! untouched.

mod communicator;
mod ffi;
mod unique_id;
mod watchdog;

pub use crate::nccl_library::{NcclSearch, SearchRoots, SearchedDir, search};
pub use communicator::{NcclCommunicator, Reduction, require_nccl};
pub use unique_id::{UNIQUE_ID_BYTES, exchange_unique_id};
