//! Gradient averaging with NCCL on the GPU, overlapped with backward.
//!
//! Gradients live in one flat device buffer. When backward has written a
//! bucket, an event recorded on the compute stream lets the communication
//! stream start that bucket's all-reduce while the compute stream goes on
//! with earlier layers; after the last bucket the compute stream waits for
//! the communication stream, so the optimizer (and nothing before it) waits
//! for the collectives. The host never waits: a failed or hung collective
//! reaches this rank through the communicator's watchdog and is reported at
//! the next step.

use std::ops::Range;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use comm::ReduceOp;
use comm::nccl::NcclCommunicator;
use core_tensor::Cuda;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use super::DeviceAverager;
use super::buckets::BucketQueue;
use crate::model::GradsReady;

pub struct NcclAverager {
    nccl: NcclCommunicator,
    compute: Arc<CudaStream>,
    queue: BucketQueue,
    /// What each bucket's collective is called in errors.
    names: Vec<String>,
    /// Recorded on the compute stream once a bucket's gradients are written.
    written: CudaEvent,
    /// Recorded on the communication stream after the last bucket.
    reduced: CudaEvent,
}

impl NcclAverager {
    /// Averages the buckets `buckets` of the gradient buffer over `nccl`,
    /// whose stream must be a side stream of `gpu`.
    pub fn new(
        nccl: NcclCommunicator,
        gpu: &Cuda,
        buckets: Vec<Range<usize>>,
    ) -> anyhow::Result<Self> {
        let compute = gpu.stream().clone();
        let ctx = compute.context();
        let names = buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                format!(
                    "all-reduce of gradient bucket {i} ({:.2} MB)",
                    (b.len() * 4) as f64 / 1e6
                )
            })
            .collect();
        Ok(Self {
            written: ctx.new_event(None).context("creating a CUDA event")?,
            reduced: ctx.new_event(None).context("creating a CUDA event")?,
            nccl,
            compute,
            queue: BucketQueue::new(buckets),
            names,
        })
    }
}

impl GradsReady<Cuda> for NcclAverager {
    fn ready(&mut self, _: &Cuda, grads: &mut CudaSlice<f32>, offset: usize) -> anyhow::Result<()> {
        let comm_stream = self.nccl.stream();
        while let Some((i, bucket)) = self.queue.next_ready(offset) {
            self.written.record(&self.compute)?;
            comm_stream.wait(&self.written)?;
            let len = grads.len();
            let mut view = grads.try_slice_mut(bucket.clone()).ok_or_else(|| {
                anyhow!("gradient bucket {bucket:?} lies outside the {len}-element buffer")
            })?;
            // SAFETY: the gradient buffer is freed in compute-stream order,
            // and the compute stream waits for the communication stream
            // before it writes the gradients again or frees them (`finish`,
            // and `Drop` after a step that failed half-way).
            unsafe {
                self.nccl
                    .all_reduce_in_place(&mut view, ReduceOp::Avg, &self.names[i])?;
            }
        }
        Ok(())
    }
}

impl DeviceAverager<Cuda> for NcclAverager {
    fn finish(&mut self, _: &Cuda) -> anyhow::Result<()> {
        self.queue.end_step()?;
        self.reduced.record(self.nccl.stream())?;
        self.compute.wait(&self.reduced)?;
        // Reports what the watchdog found since the last step.
        self.check()
    }

    fn check(&self) -> anyhow::Result<()> {
        Ok(self.nccl.check()?)
    }
}

impl Drop for NcclAverager {
    /// The gradient buffer is freed in compute-stream order: make that
    /// stream wait for collectives still queued (a step that failed
    /// half-way) so none writes into freed memory.
    fn drop(&mut self) {
        let _ = self.compute.join(self.nccl.stream());
    }
}
