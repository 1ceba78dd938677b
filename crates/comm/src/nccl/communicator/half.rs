//! The 16-bit all-reduce (`--comm-hook bf16|fp16` over NCCL): NCCL
//! reduces the buffer in its own type, half the bytes of float32.

use cudarc::driver::DevicePtrMut;
use cudarc::nccl::sys::ncclDataType_t;

use super::{NcclCommunicator, nccl_op};
use crate::communicator::{HalfFormat, ReduceOp};
use crate::error::CommError;
use crate::flight::{Kind, Label};

impl NcclCommunicator {
    /// [`NcclCommunicator::all_reduce_in_place`] of 16-bit floats (`buf`
    /// holds their bits): NCCL reduces in that type.
    ///
    /// # Safety
    /// As for [`NcclCommunicator::all_reduce_in_place`].
    pub unsafe fn all_reduce_half_in_place<'a>(
        &self,
        buf: &mut impl DevicePtrMut<u16>,
        (op, format): (ReduceOp, HalfFormat),
        what: impl Into<Label<'a>>,
    ) -> Result<(), CommError> {
        let count = buf.len();
        let (ptr, _record) = buf.device_ptr_mut(&self.stream);
        let dtype = match format {
            HalfFormat::Bf16 => ncclDataType_t::ncclBfloat16,
            HalfFormat::Fp16 => ncclDataType_t::ncclFloat16,
        };
        self.enqueue((what.into(), Kind::AllReduce, 2 * count), |comm| {
            // SAFETY: `ptr` addresses `count` 16-bit elements of a live
            // device buffer on this stream's GPU, kept alive and unshared by
            // the caller until the collective completes (this function's
            // contract).
            unsafe { comm.all_reduce((ptr, ptr, count), dtype, nccl_op(op), &self.stream) }
        })
    }
}
