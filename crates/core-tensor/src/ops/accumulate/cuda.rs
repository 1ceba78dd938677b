use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::{AccumulateKernel, SumInto, check};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::{Cuda, Result};

kernel_table! {
    accumulate (ACCUMULATE_SRC, ACCUMULATE_PTX) {
        accumulate_f32(
            grads: Out<f32>,
            acc: Out<f32>,
            weight: Val<f32>,
            into_grads: Val<u32>,
            start: Val<u64>,
            end: Val<u64>,
        );
    }
}

const THREADS: u32 = 256;

impl AccumulateKernel for Cuda {
    fn accumulate(
        &self,
        weight: f32,
        grads: &mut CudaSlice<f32>,
        acc: &mut CudaSlice<f32>,
        range: Range<usize>,
        into: SumInto,
    ) -> Result<()> {
        check(grads.len(), acc.len(), &range)?;
        if range.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("accumulate", range.len(), THREADS)?;
        let (start, end) = (range.start as u64, range.end as u64);
        let into_grads = u32::from(into == SumInto::Grads);
        // SAFETY: `check` ran: both buffers hold `start..end`; every thread
        // checks its index against `end`.
        unsafe { accumulate_f32(self, cfg, grads, acc, &weight, &into_grads, &start, &end) }
    }
}
