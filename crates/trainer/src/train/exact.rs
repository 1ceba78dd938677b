//! `--reproducible`: a step's gradient as a function of its global batch
//! alone, not of the layout that trains it.
//!
//! A step's `B` samples (`--global-batch`: positions `s·B .. (s+1)·B` of the
//! epoch's one global permutation, padded at its end by its first samples,
//! as PyTorch's sampler pads) are cut into units of `m` samples
//! (`--unit`); each replica trains a run of whole units ([`UnitPlan`]),
//! each unit alone, at batch `m` (the whole model a unit a pass; a
//! pipeline's stages a unit a micro-batch, the replica's units of a step
//! in one 1F1B schedule), by kernels whose bits depend on neither
//! the CPU nor the thread count (`core_tensor::Reductions::Fixed`, the
//! GEMM's fixed blocks), with dropout masks keyed by the sample's row in
//! the global batch (`crate::model::DropoutSeed`). Then the units'
//! gradients are summed by an operation that ignores order and grouping
//! ([`ExactSum`]): integers, over the replicas (a pipeline stage: over
//! the same stage of every replica, each its part of the parameters,
//! whose tensors' blocks are the whole model's).
//!
//! The sum, per block of up to [`BLOCK`] elements of one parameter tensor:
//! the largest magnitude `M` over every unit of every rank (an exact
//! integer maximum of the f32 bit patterns, which also carries a NaN or an
//! infinity), then each unit's values as integers at the scale `2^e`
//! that puts `M` just below `2^51`, rounded to nearest even, summed in i64 on
//! the rank and over the ranks (`IntReduce::Sum`; exact: at most
//! [`MAX_UNITS`] terms of at most `2^51` cannot overflow), and the sum times
//! `2^-e / U` (`U` units in the step) rounded to f32: the mean over the
//! global batch, each sample weighted `1 / B`. A block whose maximum is not
//! finite becomes NaN, which the finiteness guard then sees.
//!
//! Its error: each unit's value moves by at most `2^-e-1 ≤ M · 2^-52`, so
//! the mean by at most that before its rounding to f32: an element within
//! `2^-28` of its block's largest comes out as the correctly rounded mean
//! (or one ulp from it, by the double rounding through f64), closer than a
//! float32 sum of `U` terms, whose error grows with `U` (`tests::`, on
//! real gradients). Elements far below their block's largest lose relative
//! precision, never more than `M · 2^-52` absolutely.

use std::ops::Range;

use anyhow::{Context, anyhow};
use comm::IntReduce;
use core_tensor::{FlatLayout, Ops};
use launcher::contract::Misconfigured;

use crate::ddp::{IntegerReduce, ring_bytes};
use crate::model::GradsReady;

/// Elements per block of a tensor that share one scale.
pub const BLOCK: usize = 4096;

/// The most units a step may have: their sum of terms below `2^51` stays
/// below `2^63`.
pub const MAX_UNITS: usize = 4095;

/// What `--reproducible` asked for, before the layout is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactRequest {
    /// `--global-batch`, if given.
    pub global_batch: Option<usize>,
    /// `--unit`: samples per unit.
    pub unit: usize,
}

/// Refuses what `--reproducible` cannot keep exact: a gradient compression
/// that loses precision by design (`hook`, as `--comm-hook` prints it:
/// anything but `none`), a model with row tables (their sparse rows travel
/// another way).
pub fn refuse_unsupported(hook: &str, row_tables: Option<&str>) -> anyhow::Result<()> {
    let why = if hook != "none" {
        format!(
            "--comm-hook {hook} rounds the gradients on the wire by design, and --reproducible sums them exactly: leave one of the two out"
        )
    } else if let Some(model) = row_tables {
        format!(
            "--model {model}'s embedding rows are averaged by the rows each batch looked up, not in units: it trains without --reproducible"
        )
    } else {
        return Ok(());
    };
    Err(anyhow!(Misconfigured(why)))
}

/// The units of every step, and the run of them this replica trains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitPlan {
    pub global_batch: usize,
    pub unit: usize,
    /// The units (of `global_batch / unit`) this replica trains each step.
    pub share: Range<usize>,
}

impl UnitPlan {
    /// The plan of replica `replica` of `replicas`: `request`'s global
    /// batch, or `per_replica` samples on each replica (`--batch-size` ×
    /// `--accumulate-steps`) when none was given.
    pub fn new(
        request: ExactRequest,
        per_replica: usize,
        (replica, replicas): (usize, usize),
    ) -> anyhow::Result<Self> {
        let ExactRequest { global_batch, unit } = request;
        let b = global_batch.unwrap_or(per_replica * replicas);
        let named = match global_batch {
            Some(b) => format!("--global-batch {b}"),
            None => format!("the global batch ({per_replica} samples x {replicas} replicas = {b})"),
        };
        if !b.is_multiple_of(unit) {
            return Err(anyhow!(Misconfigured(format!(
                "--reproducible: {named} is not a multiple of --unit {unit}: give a --global-batch that is (e.g. {}), or another --unit",
                b.div_ceil(unit) * unit
            ))));
        }
        let units = b / unit;
        if units > MAX_UNITS {
            return Err(anyhow!(Misconfigured(format!(
                "--reproducible: {named} makes {units} units of --unit {unit}, more than the {MAX_UNITS} an exact sum holds: give a larger --unit"
            ))));
        }
        if units < replicas {
            return Err(anyhow!(Misconfigured(format!(
                "--reproducible: {named} makes {units} units of --unit {unit} for {replicas} data-parallel replicas, and each needs at least one: give --global-batch {} or more, or a smaller --unit",
                replicas * unit
            ))));
        }
        let (base, extra) = (units / replicas, units % replicas);
        let start = replica * base + replica.min(extra);
        let len = base + usize::from(replica < extra);
        Ok(Self {
            global_batch: b,
            unit,
            share: start..start + len,
        })
    }

    /// Units in a step, over all replicas.
    pub fn units(&self) -> usize {
        self.global_batch / self.unit
    }
}

/// The units' gradients of one step on this rank, and their exact sum over
/// every rank (see the module docs).
pub struct ExactSum {
    plan: UnitPlan,
    /// The units one batch of the schedule holds: 1 (a pass a unit), or a
    /// pipeline's micro-batches, all of the replica's units of a step.
    per_batch: usize,
    /// Each block of the gradient buffer one scale covers.
    blocks: Vec<Range<usize>>,
    /// The gradients of this step's units so far, one buffer each.
    units: Vec<Vec<f32>>,
    /// The units stashed this step.
    stashed: usize,
    /// Bytes this rank sent in its collectives since the last look.
    sent: u64,
}

impl ExactSum {
    /// For the gradients of the parameters `trained` of `layout` (whole
    /// tensors: all of them, or a pipeline stage's), summing `plan`'s
    /// units, `per_batch` of them a batch of the schedule.
    pub fn new(
        layout: &FlatLayout,
        trained: Range<usize>,
        plan: UnitPlan,
        per_batch: usize,
    ) -> Self {
        let base = trained.start;
        let blocks = (layout.views().iter())
            .filter(|v| trained.start <= v.range.start && v.range.end <= trained.end)
            .flat_map(|v| {
                let r = v.range.start - base..v.range.end - base;
                (r.start..r.end)
                    .step_by(BLOCK)
                    .map(move |at| at..(at + BLOCK).min(r.end))
            })
            .collect();
        Self {
            plan,
            per_batch: per_batch.max(1),
            blocks,
            units: Vec::new(),
            stashed: 0,
            sent: 0,
        }
    }

    pub fn plan(&self) -> &UnitPlan {
        &self.plan
    }

    /// This replica's batches of a step: how many, of how many samples.
    pub fn batches(&self) -> (usize, usize) {
        let units = self.plan.share.len();
        (units / self.per_batch, self.per_batch * self.plan.unit)
    }

    /// The row in the step's global batch of batch `j`'s first sample.
    pub fn first_row(&self, j: usize) -> u64 {
        ((self.plan.share.start + j * self.per_batch) * self.plan.unit) as u64
    }

    /// What a batch's backward tells: each unit's gradients, once they
    /// are all final, are stashed.
    pub fn stashing(&mut self) -> Stashing<'_> {
        Stashing(self)
    }

    /// Keeps a copy of `grads`, one unit's gradients.
    pub fn stash<B: Ops>(&mut self, b: &B, grads: &B::Storage<f32>) -> anyhow::Result<()> {
        let len = B::len(grads);
        if self.units.len() == self.stashed {
            self.units.push(vec![0.0; len]);
        }
        b.read_range(grads, 0..len, &mut self.units[self.stashed])?;
        self.stashed += 1;
        Ok(())
    }

    /// Writes the mean of every rank's stashed units over the step's units
    /// into `grads` (`comm`: the replicas' integer all-reduce, the host's or
    /// NCCL's; `None` alone).
    pub fn finish<B: Ops>(
        &mut self,
        b: &B,
        grads: &mut B::Storage<f32>,
        comm: Option<&mut dyn IntegerReduce>,
    ) -> anyhow::Result<()> {
        let stashed = std::mem::take(&mut self.stashed);
        if stashed != self.plan.share.len() {
            return Err(anyhow!(
                "--reproducible: {stashed} units' gradients came whole out of backward, not the {} of this replica's share",
                self.plan.share.len()
            ));
        }
        let units = &self.units[..stashed];
        if let Some(comm) = comm.as_deref() {
            let (world, len) = (comm.world_size(), B::len(grads));
            self.sent += ring_bytes(self.blocks.len(), 8, world) + ring_bytes(len, 8, world);
        }
        let mean = exact_mean(units, &self.blocks, self.plan.units(), comm)?;
        b.write_range(&mean, grads, 0)?;
        Ok(())
    }

    /// Bytes this rank sent in its collectives since the last call (as
    /// [`ring_bytes`] counts them: the scales' maxima and the i64 sums).
    pub fn take_sent_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.sent)
    }
}

/// The hook of a backward pass with `--reproducible`: told that every
/// gradient is final (offset 0), it stashes them, one unit's.
pub struct Stashing<'a>(&'a mut ExactSum);

impl<B: Ops> GradsReady<B> for Stashing<'_> {
    fn ready(&mut self, b: &B, grads: &mut B::Storage<f32>, offset: usize) -> anyhow::Result<()> {
        match offset {
            0 => self.0.stash(b, grads),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
impl ExactSum {
    /// The mean of `units` alone (one rank), for tests on real gradients.
    pub(crate) fn mean_of(&self, units: &[Vec<f32>]) -> Vec<f32> {
        exact_mean(units, &self.blocks, units.len(), None).expect("no communicator to fail")
    }

    /// Where the blocks of one scale lie.
    pub(crate) fn blocks(&self) -> &[Range<usize>] {
        &self.blocks
    }
}

/// The largest magnitude over `units` in each of `blocks`, as the bits of
/// an f32 (ordered as the magnitudes; a NaN above infinity).
fn largest(units: &[Vec<f32>], blocks: &[Range<usize>]) -> Vec<i64> {
    blocks
        .iter()
        .map(|block| {
            units
                .iter()
                .flat_map(|u| &u[block.clone()])
                .map(|v| i64::from(v.to_bits() & 0x7fff_ffff))
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// `2^e` exactly, for `e` within f64's normal exponents.
fn power_of_two(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// The scale exponent of a block whose largest magnitude has the bits
/// `max` (finite, non-zero): `M · 2^e < 2^51`.
fn scale_exponent(max: i64) -> i32 {
    let m = f64::from(f32::from_bits(max as u32));
    // ⌊log2 m⌋ + 1 bounds m from above by a power of two; f64 holds every
    // f32 (subnormals too) as a normal number.
    let above = ((m.to_bits() >> 52) & 0x7ff) as i32 - 1023 + 1;
    51 - above
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^51`:
/// `x + 1.5 · 2^52` lies in the binade where f64's ulp is 1, so the add
/// rounds `x` to an integer (in the default rounding mode, which Rust never
/// changes) and the sum's low mantissa bits are that integer, offset by the
/// constant's. Two instructions, no library call, no saturating
/// conversion, so the loops over a block vectorise.
#[inline]
fn round_to_integer(x: f64) -> i64 {
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    ((x + SHIFT).to_bits() as i64).wrapping_sub(SHIFT.to_bits() as i64)
}

/// The mean over `total` units of every rank's `units` (module docs).
fn exact_mean(
    units: &[Vec<f32>],
    blocks: &[Range<usize>],
    total: usize,
    mut comm: Option<&mut dyn IntegerReduce>,
) -> anyhow::Result<Vec<f32>> {
    let len = blocks.last().map_or(0, |b| b.end);
    let mut max = largest(units, blocks);
    if let Some(comm) = comm.as_deref_mut() {
        max = comm
            .reduce_i64(max, IntReduce::Max)
            .context("agreeing on the gradient's scales (--reproducible)")?;
    }
    let mut sum = vec![0i64; len];
    for (block, &max) in blocks.iter().zip(&max) {
        if !(1..0x7f80_0000).contains(&max) {
            continue;
        }
        let scale = power_of_two(scale_exponent(max));
        for unit in units {
            for (acc, &v) in sum[block.clone()].iter_mut().zip(&unit[block.clone()]) {
                *acc = acc.wrapping_add(round_to_integer(f64::from(v) * scale));
            }
        }
    }
    if let Some(comm) = comm {
        sum = comm
            .reduce_i64(sum, IntReduce::Sum)
            .context("summing the gradient exactly (--reproducible)")?;
    }
    let mut mean = vec![0.0f32; len];
    for (block, &max) in blocks.iter().zip(&max) {
        let out = &mut mean[block.clone()];
        match max {
            0 => out.fill(0.0),
            m if m >= 0x7f80_0000 => out.fill(f32::NAN),
            m => {
                let unscale = power_of_two(-scale_exponent(m));
                for (o, &s) in out.iter_mut().zip(&sum[block.clone()]) {
                    *o = ((s as f64 * unscale) / total as f64) as f32;
                }
            }
        }
    }
    Ok(mean)
}

#[cfg(test)]
#[path = "exact_tests.rs"]
mod tests;
