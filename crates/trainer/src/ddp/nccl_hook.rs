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
//!
//! With `--comm-hook bf16|fp16` (PyTorch's `bf16_compress_hook`,
//! `fp16_compress_hook`) each bucket is cast to 16 bits on the compute
//! stream into a copy of the gradients, NCCL reduces that copy in its type
//! (half the bytes), and after the last bucket the compute stream casts the
//! averages back.
//!
//! With `--reproducible` the buckets stay idle (the units' gradients are
//! summed apart, `crate::train::exact`), and the hook lends its
//! communicator for that exact sum: [`IntegerReduce`] over `ncclInt64`.

use std::ops::Range;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use comm::flight::Label;
use comm::nccl::NcclCommunicator;
use comm::{HalfFormat, IntReduce, ReduceOp};
use core_tensor::ops::{Half, HalfCastKernel};
use core_tensor::{Backend, Cuda};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use super::{CommHook, GradBucket, IntegerReduce, ring_bytes};

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
    /// `--comm-hook bf16|fp16`: the format, and the gradients' 16-bit copy
    /// (made at the first launch) the all-reduces work in.
    half: Option<(HalfFormat, Option<CudaSlice<u16>>)>,
    /// Bytes sent since the last look.
    sent: u64,
}

impl NcclHook {
    /// Averages gradient buckets over `nccl`, whose stream must be a side
    /// stream of `gpu`, carried as `half` (`None`: float32).
    pub fn new(
        nccl: NcclCommunicator,
        gpu: &Cuda,
        half: Option<HalfFormat>,
    ) -> anyhow::Result<Self> {
        let compute = gpu.stream().clone();
        let ctx = compute.context();
        Ok(Self {
            written: ctx.new_event(None).context("creating a CUDA event")?,
            reduced: ctx.new_event(None).context("creating a CUDA event")?,
            nccl,
            compute,
            names: Vec::new(),
            half: half.map(|f| (f, None)),
            sent: 0,
        })
    }
}

impl CommHook<Cuda> for NcclHook {
    fn launch(
        &mut self,
        gpu: &Cuda,
        grads: &mut CudaSlice<f32>,
        bucket: &GradBucket,
    ) -> anyhow::Result<()> {
        let range = bucket.range.clone();
        if let Some((format, copy)) = &mut self.half {
            let copy = match copy {
                Some(copy) => copy,
                None => copy.insert(gpu.zeros(grads.len())?),
            };
            gpu.to_half(half(*format), grads, copy, range.clone())?;
        }
        self.written.record(&self.compute)?;
        self.nccl.stream().wait(&self.written)?;
        if self.names.len() <= bucket.index {
            let size = if self.half.is_some() { 2 } else { 4 };
            let mb = (bucket.range.len() * size) as f64 / 1e6;
            let name = format!(
                "all-reduce of gradient bucket {} ({mb:.2} MB)",
                bucket.index
            );
            self.names.resize(bucket.index + 1, String::new());
            self.names[bucket.index] = name;
        }
        let len = grads.len();
        let outside = || anyhow!("gradient bucket {range:?} lies outside the {len}-element buffer");
        let world = self.nccl.world_size();
        let what = Label::bucket(&self.names[bucket.index], bucket.index);
        if let Some((format, Some(copy))) = &mut self.half {
            let mut view = copy.try_slice_mut(range.clone()).ok_or_else(outside)?;
            // SAFETY: as below, for the hook's own 16-bit copy, which it
            // frees after the compute stream has waited for the
            // communication stream (`Drop`).
            unsafe {
                self.nccl
                    .all_reduce_in_place(&mut view, (ReduceOp::Avg, *format), what)?;
            }
            self.sent += ring_bytes(range.len(), 2, world);
            return Ok(());
        }
        let mut view = grads.try_slice_mut(range.clone()).ok_or_else(outside)?;
        // SAFETY: the gradient buffer is freed in compute-stream order, and
        // the compute stream waits for the communication stream before it
        // writes the gradients again or frees them (`finish`, and `Drop`
        // after a step that failed half-way).
        unsafe {
            self.nccl
                .all_reduce_in_place(&mut view, ReduceOp::Avg, what)?;
        }
        self.sent += ring_bytes(range.len(), 4, world);
        Ok(())
    }

    fn finish(
        &mut self,
        gpu: &Cuda,
        grads: &mut CudaSlice<f32>,
        buckets: &[Range<usize>],
    ) -> anyhow::Result<()> {
        self.reduced.record(self.nccl.stream())?;
        self.compute.wait(&self.reduced)?;
        if let Some((format, Some(copy))) = &self.half {
            for range in buckets {
                gpu.widen_half(half(*format), copy, grads, range.clone())?;
            }
        }
        // Reports what the watchdog found since the last step.
        CommHook::<Cuda>::check(self)
    }

    fn check(&self) -> anyhow::Result<()> {
        Ok(self.nccl.check()?)
    }

    fn take_sent_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.sent)
    }

    fn integers(&mut self) -> Option<&mut dyn IntegerReduce> {
        Some(self)
    }
}

impl IntegerReduce for NcclHook {
    fn world_size(&self) -> usize {
        self.nccl.world_size()
    }

    /// Through a device copy of `values` on the communication stream,
    /// reduced in place by NCCL and copied back once it is done.
    fn reduce_i64(&mut self, values: Vec<i64>, op: IntReduce) -> anyhow::Result<Vec<i64>> {
        let stream = self.nccl.stream().clone();
        let what = match op {
            IntReduce::Max => "all-reduce of the gradient's block maxima (--reproducible)",
            IntReduce::Sum => "all-reduce of the gradient's exact sum (--reproducible)",
        };
        let context = || format!("{what}: copying {} integers", values.len());
        let mut buf = stream.clone_htod(&values).with_context(context)?;
        // SAFETY: `buf` is this call's own, allocated on the communication
        // stream, so its free is queued on that stream behind the
        // collective even where `wait` fails; nothing else touches it.
        unsafe { self.nccl.all_reduce_in_place(&mut buf, op, what)? };
        self.nccl.wait()?;
        stream.clone_dtoh(&buf).with_context(context)
    }
}

/// The kernels' name for a wire format.
fn half(format: HalfFormat) -> Half {
    match format {
        HalfFormat::Bf16 => Half::Bf16,
        HalfFormat::Fp16 => Half::Fp16,
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
