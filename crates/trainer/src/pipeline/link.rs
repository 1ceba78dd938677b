//! How a stage's activations and their gradients reach the neighbouring
//! stage: through host memory over any [`Communicator`] (the pipeline's
//! TCP or in-process sub-group), or GPU to GPU with NCCL's point-to-point
//! calls ([`NcclLink`]).

use std::sync::Arc;

use anyhow::Context;
use comm::Communicator;
use comm::nccl::NcclCommunicator;
use core_tensor::{Cuda, Ops};
use cudarc::driver::CudaStream;

/// A stage's end of its pipeline: one exchange with a neighbouring stage
/// at a time, both directions at once.
pub trait StageLink<B: Ops> {
    /// This stage's rank in the pipeline, and the number of stages.
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;

    /// Sends `send` to pipeline rank `peer` and receives `recv` from it
    /// (either may be `None`); returns when both are done and `recv` may
    /// be read on the device.
    fn exchange(
        &mut self,
        b: &B,
        peer: usize,
        send: Option<&B::Storage<f32>>,
        recv: Option<&mut B::Storage<f32>>,
    ) -> anyhow::Result<()>;
}

/// Through host memory, over the pipeline's [`Communicator`].
pub struct HostLink {
    comm: Box<dyn Communicator>,
    out: Vec<f32>,
    inc: Vec<f32>,
}

impl HostLink {
    pub fn new(comm: Box<dyn Communicator>) -> Self {
        Self {
            comm,
            out: Vec::new(),
            inc: Vec::new(),
        }
    }
}

impl<B: Ops> StageLink<B> for HostLink {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn exchange(
        &mut self,
        b: &B,
        peer: usize,
        send: Option<&B::Storage<f32>>,
        recv: Option<&mut B::Storage<f32>>,
    ) -> anyhow::Result<()> {
        if let Some(send) = send {
            self.out.resize(B::len(send), 0.0);
            b.read_range(send, 0..self.out.len(), &mut self.out)?;
        }
        if let Some(recv) = &recv {
            self.inc.resize(B::len(*recv), 0.0);
        }
        let (out, inc) = (&self.out[..], &mut self.inc[..]);
        self.comm.send_recv(
            send.map(|_| (out, peer)),
            recv.is_some().then_some((inc, peer)),
        )?;
        if let Some(recv) = recv {
            b.write_range(&self.inc, recv, 0)?;
        }
        Ok(())
    }
}

/// GPU to GPU: a grouped `ncclSend`/`ncclRecv` on the pipeline's own NCCL
/// communicator, ordered after the compute stream's work.
pub struct NcclLink {
    nccl: NcclCommunicator,
    compute: Arc<CudaStream>,
}

impl NcclLink {
    /// `nccl` is the pipeline's communicator (stage `s` its rank `s`);
    /// `gpu` the stage's device, whose stream produces what is sent.
    pub fn new(nccl: NcclCommunicator, gpu: &Cuda) -> Self {
        Self {
            nccl,
            compute: gpu.stream().clone(),
        }
    }
}

impl StageLink<Cuda> for NcclLink {
    fn rank(&self) -> usize {
        self.nccl.rank()
    }

    fn world_size(&self) -> usize {
        self.nccl.world_size()
    }

    fn exchange(
        &mut self,
        _: &Cuda,
        peer: usize,
        send: Option<&<Cuda as core_tensor::Backend>::Storage<f32>>,
        recv: Option<&mut <Cuda as core_tensor::Backend>::Storage<f32>>,
    ) -> anyhow::Result<()> {
        // What is sent was written by work queued on the compute stream.
        self.nccl
            .stream()
            .join(&self.compute)
            .context("ordering the pipeline exchange after the compute stream")?;
        // SAFETY: both buffers are borrowed until this function returns,
        // and it returns only after `wait` saw the exchange complete; the
        // compute stream queues nothing meanwhile (this thread is its only
        // user, and it is here), so no other stream touches them.
        unsafe {
            self.nccl.send_recv(
                send.map(|s| (s, peer)),
                recv.map(|r| (r, peer)),
                "pipeline exchange",
            )?
        };
        self.nccl.wait()?;
        Ok(())
    }
}
