//! Where a pipeline cuts its model: the contiguous runs of segments its
//! stages run, chosen from each segment's time measured on the ranks'
//! devices, so that the slowest stage (which paces the pipeline) is as
//! fast as the cuts allow. Every rank measures every segment (forward and
//! backward of one micro-batch, the best of a few runs) and the ranks
//! average their figures over the job's communicator, so all choose the
//! same cut. The cut changes no bit of training: each stage runs the same
//! kernels on the same values whichever stage holds a segment.

use std::ops::Range;

use core_tensor::Ops;

use crate::model::layered::{Chain, Io, Layered};
use crate::model::{DropoutSeed, Mode};

/// Timed runs of each segment; the fastest counts (the first warms up).
const RUNS: usize = 3;

/// Each segment's seconds for a micro-batch of `n` on `b`: forward and
/// backward, the fastest of [`RUNS`].
pub(super) fn measure<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut chain = Chain::new(model, b, n, true)?;
    let params = b.upload(&model.init_params(0))?;
    let mut grads = b.zeros(model.layout().len())?;
    let mode = Mode::Train {
        dropout_seed: DropoutSeed::default(),
    };
    let mut best = vec![f64::INFINITY; model.segments()];
    for _ in 0..RUNS {
        for (s, best) in best.iter_mut().enumerate() {
            let began = b.mark()?;
            let (before, after) = chain.cuts.split_at_mut(s + 1);
            let acts = &mut chain.acts[s];
            model.forward_segment(b, (s, n), &before[s], &mut after[0], acts, &params, mode)?;
            let dcuts = chain.dcuts.as_mut().expect("made for training");
            let (below, at) = dcuts.split_at_mut(s);
            let io = Io {
                x: &chain.cuts[s],
                y: &chain.cuts[s + 1],
                dy: &mut at[0],
                dx: below.last_mut(),
            };
            model.backward_segment(
                b,
                (s, n),
                io,
                acts,
                &params,
                &mut grads,
                DropoutSeed::default(),
            )?;
            let ended = b.mark()?;
            b.synchronize()?;
            *best = best.min(b.seconds_between(&began, &ended)?);
        }
    }
    Ok(best)
}

/// The cut of segments with `times` into `stages` contiguous runs whose
/// slowest is fastest (the first such cut in order); each run non-empty.
pub(super) fn balanced(times: &[f64], stages: usize) -> Vec<Range<usize>> {
    let n = times.len();
    let mut best: Option<(f64, Vec<usize>)> = None;
    // Every choice of stages - 1 cut points among the n - 1 between
    // segments: few (the CNN has 4 segments).
    let mut cuts: Vec<usize> = (1..stages).collect();
    loop {
        let bounds: Vec<usize> = std::iter::once(0)
            .chain(cuts.iter().copied())
            .chain(std::iter::once(n))
            .collect();
        let slowest = (bounds.windows(2))
            .map(|w| times[w[0]..w[1]].iter().sum::<f64>())
            .fold(0.0, f64::max);
        if best.as_ref().is_none_or(|(t, _)| slowest < *t) {
            best = Some((slowest, bounds));
        }
        if !next_combination(&mut cuts, n) {
            break;
        }
    }
    let bounds = best.map_or_else(Vec::new, |(_, b)| b);
    bounds.windows(2).map(|w| w[0]..w[1]).collect()
}

/// `runs`, a pinned cut, if it cuts `segments` into `stages` contiguous,
/// non-empty runs in order.
pub(super) fn check(
    runs: &[Range<usize>],
    stages: usize,
    segments: usize,
) -> anyhow::Result<Vec<Range<usize>>> {
    let ends = runs.iter().map(|r| r.end);
    let contiguous = std::iter::once(0)
        .chain(ends)
        .zip(runs)
        .all(|(e, r)| r.start == e && r.end > r.start);
    if runs.len() != stages || !contiguous || runs.last().map(|r| r.end) != Some(segments) {
        anyhow::bail!(
            "a pipeline cut of {segments} segments into {stages} stages must be contiguous non-empty runs in order, not {runs:?}"
        );
    }
    Ok(runs.to_vec())
}

/// The next increasing choice of `cuts.len()` points among `1..n` after
/// `cuts`, in lexicographic order; `false` after the last.
fn next_combination(cuts: &mut [usize], n: usize) -> bool {
    let k = cuts.len();
    for i in (0..k).rev() {
        if cuts[i] < n - k + i {
            cuts[i] += 1;
            for j in i + 1..k {
                cuts[j] = cuts[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// The segments' names, from their parameters' names (`conv1.weight`:
/// `conv1`), for the start-up line.
pub(super) fn names<B: Ops, M: Layered<B>>(model: &M) -> Vec<String> {
    let views = model.layout().views();
    (0..model.segments())
        .map(|s| {
            let params = model.segment_params(s);
            let mut names: Vec<&str> = (views.iter())
                .filter(|v| params.contains(&v.range.start))
                .map(|v| v.spec.name.split('.').next().unwrap_or(&v.spec.name))
                .collect();
            names.dedup();
            names.join("+")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_balances_the_slowest_stage() {
        // conv1, conv2, fc1, fc2 as a CPU measured them (ms).
        let times = [2.0, 9.0, 0.6, 0.05];
        assert_eq!(balanced(&times, 2), vec![0..1, 1..4]);
        assert_eq!(balanced(&times, 3), vec![0..1, 1..2, 2..4]);
        assert_eq!(balanced(&times, 4), vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(balanced(&times, 1), vec![0..4]);
        // Ties go to the first cut in order.
        assert_eq!(balanced(&[1.0, 1.0, 1.0, 1.0], 2), vec![0..2, 2..4]);
        assert_eq!(balanced(&[1.0, 1.0, 1.0, 1.0], 3), vec![0..1, 1..2, 2..4]);
    }
}
