//! What a pipeline stage is, beside what it learns: layouts that do not
//! fit are refused by name; every rank holds its stage's part only, and
//! the parts the ranks hold make the same whole model, bit for bit, in a
//! checkpoint (a preemption of one stage stops them all) and in the test
//! accuracy.

mod common;

use common::pipeline::{
    Layout, STEPS, config, data, local_job, on_ranks, stage_trainer, two_stages,
};
use core_tensor::{Backend, Cpu};
use trainer::checkpoint::origin::Origin;
use trainer::checkpoint::{CheckpointDir, Checkpoints, Position};
use trainer::comm_thread::CommThread;
use trainer::models::cnn::{StageSpec, cnn_layout};
use trainer::pipeline::HostLink;
use trainer::stop::{StopKind, StopRequest};
use trainer::topology::Topology;
use trainer::train::{EpochReport, JobLinks, RunOutcome, Setup, Silent, Trainer};

#[test]
fn layouts_that_do_not_fit_are_errors() {
    let err = Topology::new((0, 3), (0, 3), 2).unwrap_err().to_string();
    assert!(err.contains("not a multiple"), "{err}");
    let err = Topology::new((0, 1), (0, 1), 2).unwrap_err().to_string();
    assert!(err.contains("needs at least 2 ranks"), "{err}");
    let t = Topology::new((5, 6), (1, 2), 2).unwrap();
    assert_eq!(
        (t.stage(), t.replica(), t.pipeline_members()),
        (1, 2, vec![4, 5])
    );
    // The CNN has four segments: five stages cannot cut it, nor can a cut
    // that skips a segment.
    let data = data();
    for (layout, needle) in [
        (
            Layout {
                stages: 5,
                micro_batches: 1,
                cut: None,
            },
            "at most 4 stages",
        ),
        (
            Layout {
                stages: 2,
                micro_batches: 1,
                cut: Some(vec![0..1, 2..4]),
            },
            "contiguous non-empty runs",
        ),
    ] {
        let errors = on_ranks(local_job(layout.stages), |mut comm| {
            let (rank, world) = (comm.rank(), comm.world_size());
            let topology = Topology::new((rank, world), (rank, world), layout.stages).unwrap();
            let link = Box::new(HostLink::new(
                comm.subgroup(&topology.pipeline_members()).unwrap(),
            ));
            let comm = CommThread::spawn(comm).unwrap();
            let setup = Setup {
                topology,
                ..Setup::linked(JobLinks::Job {
                    comm,
                    averaging: None,
                })
            };
            let stage = StageSpec {
                micro_batches: layout.micro_batches,
                link,
                cut: layout.cut.clone(),
            };
            let made =
                Trainer::pipeline_stage(Cpu::new(1).unwrap(), &data, (config(), setup), stage);
            format!("{:#}", made.err().expect("refused"))
        });
        for err in errors {
            assert!(err.contains(needle), "{err}");
        }
    }
}

/// A preemption asked of one stage's rank alone reaches every rank (its
/// vote cannot ride the stage group's all-reduce): all stop after the same
/// step, and rank 0 saves the whole model there, each stage's parameters
/// and moments from that stage's rank.
#[test]
fn a_preemption_of_one_stage_stops_every_rank_with_a_whole_checkpoint() {
    let data = data();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ends = on_ranks(local_job(4), |comm| {
        let rank = comm.rank();
        let stop = StopRequest::new();
        if rank == 3 {
            stop.request(StopKind::Preempt);
        }
        let checkpoints = Some(Checkpoints {
            dir: CheckpointDir::new(dir, 2),
            every: None,
            record: None,
        });
        let layout = two_stages();
        let (mut trainer, ..) =
            stage_trainer(&data, Cpu::new(1).unwrap(), comm, layout, |s| Setup {
                stop,
                checkpoints,
                ..s
            });
        let end = trainer.run(&mut Silent, &mut |_| Ok(())).unwrap();
        (
            end,
            trainer.params().unwrap(),
            trainer.part().unwrap().range(),
        )
    });
    let at = Position { epoch: 1, step: 1 };
    for (rank, (end, ..)) in ends.iter().enumerate() {
        let saved = (rank == 0).then(|| dir.join(at.dir_name()));
        assert_eq!(end, &RunOutcome::Preempted { at, saved }, "rank {rank}");
    }
    let state = trainer::checkpoint::load(&dir.join(at.dir_name()), cnn_layout()).unwrap();
    assert_eq!(state.optimizer_step, 1);
    // Stage s's part as rank s (its first replica) trained it.
    for (stage, (_, trained, range)) in ends.iter().take(2).enumerate() {
        assert!(state.params[range.clone()] == trained[..], "stage {stage}");
        assert!(
            state.exp_avg[range.clone()].iter().any(|&m| m != 0.0),
            "stage {stage}"
        );
    }
}

/// A stage's device holds its part of the model only: its parameters,
/// gradients and two Adam moments take 16 bytes per parameter of the
/// stage's, where a data-parallel rank's take 16 per parameter of the
/// model (everything else a trainer allocates at its start is alike).
#[test]
fn a_stage_allocates_its_part_of_the_model_only() {
    let data = data();
    let bytes = |cpu: &Cpu| cpu.allocated_host_bytes().unwrap();
    let cpu = Cpu::new(1).unwrap();
    let whole = Trainer::new(cpu.clone(), &data, config(), None).unwrap();
    let (whole_bytes, _) = (bytes(&cpu), whole);
    let stages = on_ranks(local_job(2), |comm| {
        let cpu = Cpu::new(1).unwrap();
        let (stage, ..) = stage_trainer(&data, cpu.clone(), comm, two_stages(), |s| s);
        (bytes(&cpu), stage.part().unwrap().range().len())
    });
    for (stage, (held, part)) in stages.into_iter().enumerate() {
        let missing = cnn_layout().len() - part;
        assert_eq!(whole_bytes - held, 16 * missing as u64, "stage {stage}");
    }
}

/// A pipeline evaluates through its stages, and finds what the whole model
/// finds: the test accuracy of a 2-stage run is, bit for bit, that of 2
/// data-parallel ranks evaluating the checkpoint it saved (more than one
/// test batch per rank; test labels changed for an accuracy off 0 and 1,
/// which any change of a logit's argmax moves).
#[test]
fn a_pipelines_test_accuracy_is_the_whole_models() {
    let mut data = common::small_data(2 * 32 * STEPS, 1100);
    for (i, label) in data.test.labels.iter_mut().enumerate() {
        *label = (*label + (i * i % 3) as u8) % 10;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let piped = on_ranks(local_job(2), |comm| {
        let checkpoints = Some(Checkpoints {
            dir: CheckpointDir::new(dir, 2),
            every: None,
            record: None,
        });
        let layout = two_stages();
        let (mut trainer, ..) = stage_trainer(&data, Cpu::new(1).unwrap(), comm, layout, |s| {
            Setup { checkpoints, ..s }
        });
        let mut accuracy = f64::NAN;
        let mut keep = |r: &EpochReport| {
            accuracy = r.test_accuracy;
            Ok(())
        };
        trainer.run(&mut Silent, &mut keep).unwrap();
        accuracy
    });
    let at = Position { epoch: 2, step: 0 };
    let state = trainer::checkpoint::load(&dir.join(at.dir_name()), cnn_layout()).unwrap();
    let whole = on_ranks(local_job(2), |comm| {
        let setup = Setup {
            origin: Origin::Resume(Box::new(state.clone())),
            ..Setup::fresh(Some(CommThread::spawn(comm).unwrap()))
        };
        let mut trainer = Trainer::start(Cpu::new(1).unwrap(), &data, config(), setup).unwrap();
        trainer.evaluate().unwrap()
    });
    assert!(piped[0] > 0.1 && piped[0] < 0.9, "{piped:?}");
    for (rank, accuracy) in piped.iter().chain(&whole).enumerate() {
        assert_eq!(
            accuracy.to_bits(),
            whole[0].to_bits(),
            "rank {rank}: {piped:?} {whole:?}"
        );
    }
}
