//! The exact integer all-reduce (`--reproducible`'s sums and scales over
//! NCCL): two's complement i64, summed wrapping or maximised, which no
//! order or grouping of the ranks changes (`ncclInt64`).

use cudarc::driver::DevicePtrMut;
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};

use super::NcclCommunicator;
use crate::communicator::IntReduce;
use crate::error::CommError;
use crate::flight::{Kind, Label};

impl NcclCommunicator {
    /// [`NcclCommunicator::all_reduce_in_place`] of i64, reduced as `op`
    /// says, exactly (see [`IntReduce`]).
    ///
    /// # Safety
    /// As for [`NcclCommunicator::all_reduce_in_place`].
    pub unsafe fn all_reduce_i64_in_place<'a>(
        &self,
        buf: &mut impl DevicePtrMut<i64>,
        op: IntReduce,
        what: impl Into<Label<'a>>,
    ) -> Result<(), CommError> {
        let count = buf.len();
        let (ptr, _record) = buf.device_ptr_mut(&self.stream);
        let op = match op {
            IntReduce::Sum => ncclRedOp_t::ncclSum,
            IntReduce::Max => ncclRedOp_t::ncclMax,
        };
        self.enqueue((what.into(), Kind::AllReduce, 8 * count), |comm| {
            // SAFETY: `ptr` addresses `count` i64 of a live device buffer on
            // this stream's GPU, kept alive and unshared by the caller until
            // the collective completes (this function's contract).
            unsafe {
                comm.all_reduce(
                    (ptr, ptr, count),
                    ncclDataType_t::ncclInt64,
                    op,
                    &self.stream,
                )
            }
        })
    }
}
