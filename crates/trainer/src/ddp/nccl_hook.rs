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
use comm::flight::Label;
use comm::nccl::NcclCommunicator;
use core_tensor::Cuda;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use super::{CommHook, GradBucket};

pub struct NcclHook {
    nccl: NcclCommunicator,
    compute: Arc<CudaStream>,
    /// What each bucket's collective is called in errors, by bucket index
    /// (named at its first launch).
    names: Vec<String>,
    /// Recorded on the compute stream once a bucket's gradients are written.
    written: CudaEvent,
    /// Recorded on the communication stream after the last bucket.
    reduced: CudaEvent,
}

impl NcclHook {
    /// Averages gradient buckets over `nccl`, whose stream must be a side
    /// stream of `gpu`.
    pub fn new(nccl: NcclCommunicator, gpu: &Cuda) -> anyhow::Result<Self> {
        let compute = gpu.stream().clone();
        let ctx = compute.context();
        Ok(Self {
            written: ctx.new_event(None).context("creating a CUDA event")?,
            reduced: ctx.new_event(None).context("creating a CUDA event")?,
            nccl,
            compute,
            names: Vec::new(),
        })
    }
}

impl CommHook<Cuda> for NcclHook {
    fn launch(
        &mut self,
        _: &Cuda,
        grads: &mut CudaSlice<f32>,
        bucket: &GradBucket,
    ) -> anyhow::Result<()> {
        self.written.record(&self.compute)?;
        self.nccl.stream().wait(&self.written)?;
        if self.names.len() <= bucket.index {
            let mb = (bucket.range.len() * 4) as f64 / 1e6;
            let name = format!(
                "all-reduce of gradient bucket {} ({mb:.2} MB)",
                bucket.index
            );
            self.names.resize(bucket.index + 1, String::new());
            self.names[bucket.index] = name;
        }
        let len = grads.len();
        let range = bucket.range.clone();
        let mut view = grads.try_slice_mut(range.clone()).ok_or_else(|| {
            anyhow!("gradient bucket {range:?} lies outside the {len}-element buffer")
        })?;
        // SAFETY: the gradient buffer is freed in compute-stream order, and
        // the compute stream waits for the communication stream before it
        // writes the gradients again or frees them (`finish`, and `Drop`
        // after a step that failed half-way).
        unsafe {
            let what = Label::bucket(&self.names[bucket.index], bucket.index);
            self.nccl
                .all_reduce_in_place(&mut view, ReduceOp::Avg, what)?;
        }
        Ok(())
    }

    fn finish(
        &mut self,
        _: &Cuda,
        _: &mut CudaSlice<f32>,
        _: &[Range<usize>],
    ) -> anyhow::Result<()> {
        self.reduced.record(self.nccl.stream())?;
        self.compute.wait(&self.reduced)?;
        // Reports what the watchdog found since the last step.
        CommHook::<Cuda>::check(self)
    }

    fn check(&self) -> anyhow::Result<()> {
        Ok(self.nccl.check()?)
    }
}

impl Drop for NcclHook {
    /// The gradient buffer is freed in compute-stream order: make that
    /// stream wait for collectives still queued (a step that failed
    /// half-way) so none writes into freed memory.
    fn drop(&mut self) {
        let _ = self.compute.join(self.nccl.stream());
    }
}
