use std::ops::Range;

use super::{AccumulateKernel, SumInto, check};
use crate::{Cpu, Result};

/// One element: the CUDA kernel mirrors this line.
#[inline]
fn sum(weight: f32, acc: f32, g: f32) -> f32 {
    acc + weight * g
}

impl AccumulateKernel for Cpu {
    fn accumulate(
        &self,
        weight: f32,
        grads: &mut Vec<f32>,
        acc: &mut Vec<f32>,
        range: Range<usize>,
        into: SumInto,
    ) -> Result<()> {
        check(grads.len(), acc.len(), &range)?;
        let (g, a) = (&mut grads[range.clone()], &mut acc[range]);
        // Element-wise: no thread count changes a bit, and the buffers are
        // at most a model's size, which one core adds in well under a
        // millisecond.
        match into {
            SumInto::Acc => a
                .iter_mut()
                .zip(g.iter())
                .for_each(|(a, &g)| *a = sum(weight, *a, g)),
            SumInto::Grads => g
                .iter_mut()
                .zip(a.iter())
                .for_each(|(g, &a)| *g = sum(weight, a, *g)),
        }
        Ok(())
    }
}
