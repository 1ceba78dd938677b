//! Gradient averaging through the host communicator: each bucket is copied
//! to host memory as soon as backward has written it and averaged on the
//! communication thread while backward goes on, then copied back. The
//! bucket travels as `--comm-hook` says: float32, 16-bit floats
//! (`Communicator::all_reduce_half`: cast on the host, summed in f32 hop
//! by hop), or PowerSGD's factors (`powersgd/`).

use std::ops::Range;

use anyhow::anyhow;
use comm::HalfFormat;
use core_tensor::Ops;

use super::powersgd::{PowerSgd, PowerSgdState};
use super::{CommHook, GradBucket, ring_bytes};
use crate::comm_thread::{CommHandle, Op, Staged};

/// What a bucket becomes on the host's ring.
pub enum HostWire {
    F32,
    Half(HalfFormat),
    PowerSgd(Box<PowerSgd>),
}

/// The host staging buffers, reused every step, and the communication
/// thread they travel to.
pub struct HostHook {
    comm: CommHandle,
    /// One staging buffer per bucket (the backend's: page-locked on a GPU);
    /// `None` while it travels to the communication thread and back.
    staging: Vec<Option<Staged>>,
    wire: HostWire,
    /// Optimizer steps done before this one.
    step: u64,
    /// Bytes this rank has sent in gradient collectives since the last look.
    sent: u64,
}

impl HostHook {
    pub fn new<B: Ops>(
        backend: &B,
        buckets: &[Range<usize>],
        comm: CommHandle,
        wire: HostWire,
    ) -> anyhow::Result<Self> {
        let staging = buckets
            .iter()
            .map(|b| Ok(Some(Box::new(backend.staging(b.len())?) as Staged)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            comm,
            staging,
            wire,
            step: 0,
            sent: 0,
        })
    }
}

impl<B: Ops> CommHook<B> for HostHook {
    fn begin_step(&mut self, step: u64) {
        self.step = step;
    }

    fn launch(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        bucket: &GradBucket,
    ) -> anyhow::Result<()> {
        let i = bucket.index;
        let mut staging = self.staging[i]
            .take()
            .ok_or_else(|| anyhow!("gradient bucket {i} is still in flight"))?;
        let len = bucket.range.len();
        backend.read_range(grads, bucket.range.clone(), &mut staging[..len])?;
        let world = self.comm.world_size();
        let (op, bytes) = match &mut self.wire {
            HostWire::F32 => (Op::AverageF32(staging, Some(i)), ring_bytes(len, 4, world)),
            HostWire::Half(format) => (
                Op::AverageHalf(staging, *format, i),
                ring_bytes(len, 2, world),
            ),
            HostWire::PowerSgd(p) if self.step < p.start => {
                (Op::AverageF32(staging, Some(i)), ring_bytes(len, 4, world))
            }
            HostWire::PowerSgd(p) => {
                let bytes = ring_bytes(p.elements(i), 4, world);
                (Op::Reduce(staging, p.take(i)?, i), bytes)
            }
        };
        self.sent += bytes;
        self.comm.submit(op)
    }

    fn finish(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        buckets: &[Range<usize>],
    ) -> anyhow::Result<()> {
        for (i, bucket) in buckets.iter().enumerate() {
            let averaged = match &mut self.wire {
                HostWire::PowerSgd(p) if p.away(i) => {
                    let (averaged, codec) = self.comm.next_reduced()?;
                    let codec = codec.into_any().downcast().map_err(|_| {
                        anyhow!("internal error: bucket {i} came back with another state")
                    })?;
                    p.put(i, codec);
                    averaged
                }
                _ => self.comm.next_staged()?,
            };
            backend.write_range(&averaged[..bucket.len()], grads, bucket.start)?;
            self.staging[i] = Some(averaged);
        }
        Ok(())
    }

    fn take_sent_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.sent)
    }

    fn powersgd_state(&self) -> anyhow::Result<Option<PowerSgdState>> {
        match &self.wire {
            HostWire::PowerSgd(p) => p.state(),
            _ => Ok(None),
        }
    }

    fn restore_powersgd(&mut self, state: &PowerSgdState) -> anyhow::Result<()> {
        match &mut self.wire {
            HostWire::PowerSgd(p) => p.restore(state),
            _ => Ok(()),
        }
    }
}
