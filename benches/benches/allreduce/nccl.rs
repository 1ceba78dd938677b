//! NCCL's side of the benchmark: device buffers on this rank's GPU, every
//! collective queued on the backend's stream, timed from the host around a
//! wait for all of them (as nccl-tests times).

use anyhow::{Context, Result, bail};
use comm::nccl::NcclCommunicator;
use comm::{Communicator, ReduceOp, TcpCommunicator};
use core_tensor::{Backend, Cuda};
use cudarc::driver::CudaSlice;

use crate::{Collective, fill_value};

pub struct NcclRank {
    /// Host-side collectives (statistics, barriers): the TCP ring (the
    /// identity, with no sockets, for one rank).
    control: TcpCommunicator,
    nccl: NcclCommunicator,
    gpu: Cuda,
    /// The current size's buffers, from [`Collective::prepare`].
    buffers: Option<Buffers>,
}

struct Buffers {
    input: CudaSlice<f32>,
    output: CudaSlice<f32>,
    work: CudaSlice<f32>,
}

impl NcclRank {
    /// Opens GPU `rank % GPUs` and joins the NCCL communicator, passing the
    /// unique id through `control`'s store (none for one rank).
    pub fn connect(
        rank: usize,
        ranks: usize,
        mut control: TcpCommunicator,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        let gpus = core_tensor::cuda_available().context("--transport nccl")?;
        if gpus == 0 {
            bail!("--transport nccl needs a GPU; none is visible");
        }
        let gpu =
            Cuda::new(rank % gpus).with_context(|| format!("rank {rank}: opening its GPU"))?;
        let store = control.store();
        let nccl = NcclCommunicator::connect(gpu.stream().clone(), rank, ranks, store, timeout)
            .with_context(|| format!("rank {rank}: creating the NCCL communicator"))?;
        Ok(Self {
            buffers: None,
            control,
            nccl,
            gpu,
        })
    }

    /// A line for the table's title.
    pub fn describe(&self) -> String {
        self.gpu.describe()
    }

    fn buffers(&mut self) -> Result<&mut Buffers> {
        self.buffers
            .as_mut()
            .context("the benchmark runs a size before preparing it")
    }
}

impl Collective for NcclRank {
    fn prepare(&mut self, count: usize) -> Result<()> {
        let rank = self.nccl.rank();
        let host: Vec<f32> = (0..count).map(|i| fill_value(rank, i)).collect();
        // Drop the previous size's buffers first: the largest are 256 MiB.
        self.buffers = None;
        self.buffers = Some(Buffers {
            input: self.gpu.upload(&host)?,
            output: self.gpu.zeros(count)?,
            work: self.gpu.zeros(count)?,
        });
        Ok(())
    }

    fn run(&mut self, in_place: bool) -> Result<()> {
        let nccl = &self.nccl;
        let b = self
            .buffers
            .as_mut()
            .context("the benchmark runs a size before preparing it")?;
        // SAFETY: the buffers live in `self.buffers` until `prepare` or
        // `reset_work` replaces them, which the benchmark does only after
        // `wait` has seen every queued all-reduce complete; and NCCL runs on
        // the GPU's own stream, the one their frees are queued on.
        unsafe {
            if in_place {
                nccl.all_reduce_in_place(&mut b.work, ReduceOp::Sum, "in-place all-reduce")?;
            } else {
                nccl.all_reduce(
                    &b.input,
                    &mut b.output,
                    ReduceOp::Sum,
                    "out-of-place all-reduce",
                )?;
            }
        }
        Ok(())
    }

    fn wait(&mut self) -> Result<()> {
        Ok(self.nccl.wait()?)
    }

    fn reset_work(&mut self) -> Result<()> {
        let gpu = self.gpu.clone();
        let b = self.buffers()?;
        b.work = gpu.upload(&gpu.download(&b.input)?)?;
        Ok(())
    }

    fn result(&mut self, in_place: bool) -> Result<Vec<f32>> {
        let gpu = self.gpu.clone();
        let b = self.buffers()?;
        Ok(gpu.download(if in_place { &b.work } else { &b.output })?)
    }

    fn control(&mut self) -> &mut dyn Communicator {
        &mut self.control
    }
}
