//! NCCL's side of the benchmark: device buffers on this rank's GPU, every
//! collective queued on the backend's stream, timed from the host around a
//! wait for all of them (as nccl-tests times).

use anyhow::{Context, Result, bail};
use comm::nccl::NcclCommunicator;
use comm::{Communicator, ReduceOp, SingleProcess, TcpCommunicator};
use core_tensor::{Backend, Cuda};
use cudarc::driver::CudaSlice;

use crate::{Collective, fill_value};

pub struct NcclRank {
    /// Host-side collectives (statistics, barriers): the TCP ring, or the
    /// identity for one rank.
    control: Box<dyn Communicator>,
    nccl: NcclCommunicator,
    gpu: Cuda,
    input: CudaSlice<f32>,
    output: CudaSlice<f32>,
    work: CudaSlice<f32>,
}

impl NcclRank {
    /// Opens GPU `rank % GPUs` and joins the NCCL communicator, passing the
    /// unique id through `tcp`'s store (none for one rank).
    pub fn connect(
        rank: usize,
        ranks: usize,
        mut tcp: Option<TcpCommunicator>,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        let gpus = core_tensor::cuda_available().context("--transport nccl")?;
        if gpus == 0 {
            bail!("--transport nccl needs a GPU; none is visible");
        }
        let gpu =
            Cuda::new(rank % gpus).with_context(|| format!("rank {rank}: opening its GPU"))?;
        let store = tcp.as_mut().and_then(TcpCommunicator::store);
        let nccl = NcclCommunicator::connect(gpu.stream().clone(), rank, ranks, store, timeout)
            .with_context(|| format!("rank {rank}: creating the NCCL communicator"))?;
        let control: Box<dyn Communicator> = match tcp {
            Some(tcp) => Box::new(tcp),
            None => Box::new(SingleProcess::new()),
        };
        Ok(Self {
            input: gpu.zeros(0)?,
            output: gpu.zeros(0)?,
            work: gpu.zeros(0)?,
            control,
            nccl,
            gpu,
        })
    }

    /// A line for the table's title.
    pub fn describe(&self) -> String {
        self.gpu.describe()
    }
}

impl Collective for NcclRank {
    fn prepare(&mut self, count: usize) -> Result<()> {
        let rank = self.nccl.rank();
        let host: Vec<f32> = (0..count).map(|i| fill_value(rank, i)).collect();
        self.input = self.gpu.upload(&host)?;
        self.output = self.gpu.zeros(count)?;
        self.work = self.gpu.zeros(count)?;
        Ok(())
    }

    fn run(&mut self, in_place: bool) -> Result<()> {
        if in_place {
            self.nccl
                .all_reduce_in_place(&mut self.work, ReduceOp::Sum, "in-place all-reduce")?;
        } else {
            self.nccl.all_reduce(
                &self.input,
                &mut self.output,
                ReduceOp::Sum,
                "out-of-place all-reduce",
            )?;
        }
        Ok(())
    }

    fn wait(&mut self) -> Result<()> {
        Ok(self.nccl.wait()?)
    }

    fn reset_work(&mut self) -> Result<()> {
        self.work = self.gpu.upload(&self.gpu.download(&self.input)?)?;
        Ok(())
    }

    fn result(&mut self, in_place: bool) -> Result<Vec<f32>> {
        Ok(self
            .gpu
            .download(if in_place { &self.work } else { &self.output })?)
    }

    fn control(&mut self) -> &mut dyn Communicator {
        self.control.as_mut()
    }
}
