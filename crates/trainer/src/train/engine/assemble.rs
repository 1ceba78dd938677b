//! The whole model made again on a host where it is needed (rank 0's, for
//! a checkpoint), from the parts a pipeline's stages hold on their
//! devices.

use anyhow::{Context, bail};
use core_tensor::Ops;

use super::StepEngine;
use crate::model::Model;
use crate::train::replica::Replica;

impl<B: Ops, M: Model<B>> StepEngine<B, M> {
    /// The whole parameters and Adam moments on rank 0's host, for a
    /// checkpoint (gathered from the parts' ranks for a partitioned model:
    /// every rank, `rank` this one, calls it); `None` on the other ranks.
    pub fn whole_state(&mut self, rank: usize) -> anyhow::Result<Option<[Vec<f32>; 3]>> {
        let params = self.assemble(rank, |r| &r.params, false)?;
        let m = self.assemble(rank, |r| &r.adam_m, false)?;
        let v = self.assemble(rank, |r| &r.adam_v, false)?;
        Ok(params.zip(m).zip(v).map(|((p, m), v)| [p, m, v]))
    }

    /// The parameters this replica holds (the whole model's, or its part's),
    /// on its host.
    pub fn host_params(&self) -> anyhow::Result<Vec<f32>> {
        Ok(self.backend.download(&self.replica.params)?)
    }

    /// The parameters and Adam moments this replica holds, on its host.
    pub fn host_state(&self) -> anyhow::Result<[Vec<f32>; 3]> {
        let r = &self.replica;
        let download = |s| self.backend.download(s);
        Ok([
            download(&r.params)?,
            download(&r.adam_m)?,
            download(&r.adam_v)?,
        ])
    }

    /// [`super::super::Trainer::whole_params`] on rank `rank`.
    pub fn whole_params(&mut self, rank: usize) -> anyhow::Result<Vec<f32>> {
        self.assemble(rank, |r| &r.params, true)?
            .context("every rank receives the whole model")
    }

    /// The whole of a vector the replica keeps (`pick`: its parameters or
    /// a moment), on the host of rank 0 (and of every rank if
    /// `everywhere`), `None` elsewhere; `rank` is this one. For a model
    /// split between ranks, part `p` is broadcast from rank `p`, its first
    /// replica: the other ranks hold one part at a time, and keep none of
    /// the others'.
    fn assemble(
        &mut self,
        rank: usize,
        pick: fn(&Replica<B>) -> &B::Storage<f32>,
        everywhere: bool,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let keep = everywhere || rank == 0;
        let Some(parts) = self.schedule.part() else {
            return Ok(match keep {
                true => Some(self.backend.download(pick(&self.replica))?),
                false => None,
            });
        };
        let len = parts.ranges.last().map_or(0, |r| r.end);
        let mut whole = keep.then(|| vec![0.0; len]);
        for (p, range) in parts.ranges.iter().enumerate() {
            let mut part = if p == rank {
                self.backend.download(pick(&self.replica))?
            } else {
                vec![0.0; range.len()]
            };
            let Some(comm) = self.comm.as_mut() else {
                bail!("a model split between ranks needs the job's communicator");
            };
            comm.broadcast(&mut part, p)
                .context("assembling the whole model")?;
            if let Some(whole) = whole.as_mut() {
                whole[range.clone()].copy_from_slice(&part);
            }
        }
        Ok(whole)
    }
}
