//! The seam between the trainer and a transport.
//!
//! The trait speaks host (`&mut [f32]`) slices. Collectives on device
//! buffers are [`crate::nccl::NcclCommunicator`]'s: asynchronous, queued on
//! a CUDA stream, which a blocking host-slice trait cannot express.

use crate::error::CommError;

/// How values from all ranks are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum over ranks.
    Sum,
    /// Element-wise sum over ranks, then multiplied by `1 / world_size`
    /// (the same multiplication on every rank, so results stay bitwise
    /// identical).
    Avg,
}

/// Collective operations among the ranks of one job.
///
/// Every rank must call the same collectives in the same order with the same
/// lengths (and the same `root`). All results are bitwise identical on every
/// rank: the trainer relies on that to keep replicas in lockstep.
///
/// Object safe, so the trainer can hold a `Box<dyn Communicator>` and pick
/// the transport at run time.
pub trait Communicator: Send {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the job.
    fn world_size(&self) -> usize;

    /// Reduces `buf` across all ranks, in place.
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError>;

    /// Reduces `buf` across all ranks in f64, in place. Meant for small
    /// metric vectors (loss sums, correct counts) that must add up exactly.
    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError>;

    /// Overwrites `buf` on every rank with `buf` of rank `root`.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), CommError>;

    // ---- Point to point and sub-groups (pipeline parallelism) ----

    /// Sends `send.0` to rank `send.1` and receives `recv.0` from rank
    /// `recv.1`, both at once (either may be `None`), so neighbours that
    /// exchange in both directions cannot deadlock. The peers must be
    /// neighbours (rank ± 1, wrapping) and the receiver must expect
    /// exactly the length sent; a mismatch is an error, not garbage.
    fn send_recv(
        &mut self,
        send: Option<(&[f32], usize)>,
        recv: Option<(&mut [f32], usize)>,
    ) -> Result<(), CommError>;

    /// A communicator over `members` (ranks of this communicator, distinct
    /// and ascending; this rank among them), numbered by their position
    /// in `members`. Every member calls it, for the same list, after the
    /// same number of earlier `subgroup` calls on this communicator.
    fn subgroup(&mut self, members: &[usize]) -> Result<Box<dyn Communicator>, CommError>;

    // ---- End of point to point and sub-groups ----
}

/// Refuses a broadcast `root` outside a world of `world_size` before
/// anything is sent: every rank fails at once, instead of waiting on a root
/// that does not exist.
pub(crate) fn check_root(root: usize, world_size: usize) -> Result<(), CommError> {
    if root < world_size {
        Ok(())
    } else {
        Err(CommError::InvalidArgument {
            op: "broadcast",
            reason: format!("root {root} is not a rank of a world of size {world_size}"),
        })
    }
}
