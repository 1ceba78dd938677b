//! Pipeline parallelism changes where layers run, not what is learned:
//! with dropout off and one micro-batch a batch, any number of stages cut
//! anywhere gives a data-parallel rank's bits; with several micro-batches
//! (which sum gradients in another order) 2 stages follow 1 rank, and 2
//! stages x 2 replicas follow 2 data-parallel ranks, within 1e-4 after 30
//! steps, whatever the cut. A stage's gradients travel within its
//! data-parallel group only, and only the stage's own.

mod common;

use std::ops::Range;

use common::pipeline::{
    Layout, STEPS, all_identical, config, data, local_job, on_ranks, relative, tcp_job, train,
    two_stages,
};
use trainer::model::DropoutRates;
use trainer::models::cnn::CnnMnist;

#[test]
fn two_stages_follow_one_rank() {
    let data = data();
    let single = train(&data, None, None).params;
    let stages = on_ranks(tcp_job(2), |comm| {
        train(&data, Some(comm), Some(two_stages()))
    });
    all_identical(&stages);
    // One replica per stage: no gradient is averaged anywhere (the whole
    // model is assembled by broadcasts at the epoch's end).
    for (rank, t) in stages.iter().enumerate() {
        assert_eq!((t.job_f32s, t.group_f32s), (0, 0), "rank {rank}");
    }
    let diff = relative(&stages[0].params, &single);
    println!("2 stages vs 1 rank: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
    let init = CnnMnist::new(DropoutRates::OFF).init_params(config().seed);
    assert!(
        relative(&single, &init) > 1e-3,
        "training must move the parameters"
    );
}

/// With one micro-batch a batch a stage computes what the whole model
/// computes, in the same order, so every cut of every number of stages
/// gives the bits of one rank; and the cut never changes a bit, so the
/// cuts of 4 micro-batches (3 of them, and 3 micro-batches of uneven
/// sizes) agree with each other to the bit.
#[test]
fn one_micro_batch_is_data_parallelism_whatever_the_cut() {
    let data = data();
    let single = train(&data, None, None).params;
    let cuts: [&[Range<usize>]; 7] = [
        &[0..1, 1..4],
        &[0..2, 2..4],
        &[0..3, 3..4],
        &[0..1, 1..2, 2..4],
        &[0..1, 1..3, 3..4],
        &[0..2, 2..3, 3..4],
        &[0..1, 1..2, 2..3, 3..4],
    ];
    for cut in cuts {
        let layout = Layout {
            stages: cut.len(),
            micro_batches: 1,
            cut: Some(cut.to_vec()),
        };
        let ranks = on_ranks(local_job(cut.len()), |comm| {
            train(&data, Some(comm), Some(layout.clone()))
        });
        all_identical(&ranks);
        assert!(ranks[0].params == single, "cut {cut:?}");
    }
    for micro_batches in [4, 3] {
        let at = |cut: &[Range<usize>]| {
            let layout = Layout {
                stages: 2,
                micro_batches,
                cut: Some(cut.to_vec()),
            };
            on_ranks(local_job(2), |comm| {
                train(&data, Some(comm), Some(layout.clone()))
            })
        };
        let first = at(cuts[0]);
        for cut in &cuts[1..3] {
            let other = at(cut);
            assert!(
                other[0].params == first[0].params,
                "M {micro_batches}, cut {cut:?}"
            );
        }
        let diff = relative(&first[0].params, &single);
        assert!(
            diff <= 1e-4,
            "M {micro_batches}: relative difference {diff:e}"
        );
    }
}

/// Ranks as threads (the in-process transport) this time: stages 0 and 1
/// of replica 0 are ranks 0 and 1, of replica 1 ranks 2 and 3.
#[test]
fn two_stages_by_two_replicas_follow_two_data_parallel_ranks() {
    let data = data();
    let ddp = on_ranks(local_job(2), |comm| train(&data, Some(comm), None));
    let grid = on_ranks(local_job(4), |comm| {
        train(&data, Some(comm), Some(two_stages()))
    });
    all_identical(&grid);
    // Each stage's gradients, and only those, travel within its group;
    // none over the whole job.
    for (rank, t) in grid.iter().enumerate() {
        assert_eq!(t.job_f32s, 0, "rank {rank} averaged over the whole job");
        assert_eq!(t.group_f32s, STEPS * t.part, "rank {rank}");
    }
    let diff = relative(&grid[0].params, &ddp[0].params);
    println!("2 x 2 vs 2 data-parallel ranks: relative difference {diff:e}");
    assert!(
        diff <= 1e-4,
        "relative difference {diff:e} after {STEPS} steps"
    );
}
