//! `--pipeline-stages 2` end to end: the split is printed, each stage says
//! how idle it was, rank 0 saves a whole model, and that checkpoint
//! resumes in another layout (one rank) as any other does, whose
//! checkpoint a pipeline of 2 stages x 2 replicas resumes in turn; a
//! pipeline resumes mid-epoch as if never stopped.

mod common;

use std::path::Path;

use common::{data_arg, dataset, final_state, run, stderr, trainer};

fn train(dir: &Path, args: &[&str]) -> String {
    let out = run(trainer()
        .args(["--max-steps", "4", "--threads", "1", "--device", "cpu"])
        .args(["--no-dropout", "--checkpoint-dir"])
        .arg(dir)
        .args(args)
        .args(data_arg(dataset())));
    let err = stderr(&out);
    assert!(out.status.success(), "{args:?}: {err}");
    err
}

#[test]
fn a_pipeline_trains_saves_a_whole_model_and_resumes_on_one_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    let layout = [
        "--world-size",
        "2",
        "--pipeline-stages",
        "2",
        "--micro-batches",
        "2",
    ];
    let log = train(&dir, &[&layout[..], &["--epochs", "1"]].concat());
    for needle in [
        "pipeline: 2 stages x 1 data-parallel replicas, 2 micro-batches",
        "cut at the measured times",
        "stage 0: conv1",
        "pipeline stage 0 (rank 0): idle",
        "pipeline stage 1 (rank 1): idle",
    ] {
        assert!(log.contains(needle), "{needle:?} missing from:\n{log}");
    }
    let saved = final_state(&dir);
    assert_eq!(saved.optimizer_step, 4);
    // The same checkpoint, continued by a single rank for a second epoch.
    let log = train(&dir, &["--resume", "auto", "--epochs", "2"]);
    assert!(log.contains("resuming from"), "{log}");
    let end = dir.join(trainer::checkpoint::Position { epoch: 3, step: 0 }.dir_name());
    let resumed = trainer::checkpoint::load(&end, trainer::models::cnn::cnn_layout()).unwrap();
    assert_eq!(resumed.optimizer_step, 8);
    // And on, as 2 stages x 2 replicas (each stage's Adam moments come
    // from the whole ones): rank 0 gathers both stages' parameters and
    // moments into a whole checkpoint again.
    let grid = [&layout[..1], &["4"], &layout[2..]].concat();
    train(
        &dir,
        &[&grid[..], &["--resume", "auto", "--epochs", "3"]].concat(),
    );
    let end = dir.join(trainer::checkpoint::Position { epoch: 4, step: 0 }.dir_name());
    let last = trainer::checkpoint::load(&end, trainer::models::cnn::cnn_layout()).unwrap();
    assert_eq!(last.optimizer_step, 12);
    // Whichever stage trained a layer, it trained it.
    for view in trainer::models::cnn::cnn_layout().views() {
        let (name, range) = (&view.spec.name, view.range.clone());
        let moved = |a: &[f32], b: &[f32]| a[range.clone()] != b[range.clone()];
        assert!(moved(&last.params, &resumed.params), "{name} did not train");
        assert!(moved(&last.exp_avg, &resumed.exp_avg), "{name}'s moments");
        assert!(
            moved(&last.exp_avg_sq, &resumed.exp_avg_sq),
            "{name}'s moments"
        );
    }
}

/// A stage's schedule marks its own phases in the step: its backward
/// passes count as backward, and its waits for the other stages as a
/// phase of their own (which the straggler rule leaves out).
#[test]
fn a_stages_phase_times_split_its_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    let metrics = tmp.path().join("m.jsonl");
    let layout = ["--world-size", "2", "--pipeline-stages", "2"];
    let flags = ["--epochs", "1", "--micro-batches", "4", "--metrics"];
    let path = metrics.to_str().unwrap();
    train(
        &tmp.path().join("ck"),
        &[&layout[..], &flags, &[path]].concat(),
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    let row: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for rank in row["ranks"].as_array().unwrap() {
        let phase = |name: &str| rank["phase_s"][name].as_f64().unwrap_or(-1.0);
        let (forward, backward) = (phase("forward"), phase("backward"));
        assert!(forward > 0.0, "{rank}");
        // Backward work costs about as much as forward work.
        assert!(backward > 0.1 * forward, "{rank}");
        assert!(phase("pipeline_wait") > 0.0, "{rank}");
    }
}

#[test]
fn pipelines_as_threads_match_pipelines_as_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let args = |spawn| {
        let layout = ["--world-size", "4", "--pipeline-stages", "2"];
        [&layout[..], &["--epochs", "1", "--spawn", spawn]].concat()
    };
    train(&tmp.path().join("t"), &args("threads"));
    train(&tmp.path().join("p"), &args("processes"));
    let (t, p) = (
        final_state(&tmp.path().join("t")),
        final_state(&tmp.path().join("p")),
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&t.params), bits(&p.params));
}

#[test]
fn layouts_that_do_not_fit_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (
            &["--world-size", "3", "--pipeline-stages", "2"][..],
            "not a multiple",
        ),
        (&["--pipeline-stages", "2"][..], "needs at least 2 ranks"),
        (
            &["--world-size", "2", "--pipeline-stages", "3"][..],
            "needs at least 3 ranks",
        ),
        (
            &["--world-size", "5", "--pipeline-stages", "5"][..],
            "splits into at most 4 stages",
        ),
    ] {
        let out = run(trainer()
            .args([
                "--epochs",
                "1",
                "--max-steps",
                "1",
                "--device",
                "cpu",
                "--spawn",
                "threads",
            ])
            .args(args)
            .arg("--metrics")
            .arg(tmp.path().join("m.jsonl"))
            .args(data_arg(dataset())));
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    // The launcher says it once, before starting a worker that would.
    let out = run(trainer()
        .args(["--world-size", "3", "--pipeline-stages", "2"])
        .args(["--epochs", "1", "--max-steps", "1"])
        .args(data_arg(dataset())));
    let said = stderr(&out);
    assert!(!out.status.success());
    assert_eq!(said.matches("not a multiple").count(), 1, "{said}");
    assert!(!said.contains("started rank"), "{said}");
}

#[test]
fn a_stage_that_fails_alone_is_named_before_the_peer_that_lost_it() {
    // A huge learning rate overflows stage 1's gradients at step 2; stage 0
    // then only loses its connection to rank 1. The summary names rank 1's
    // own error first, whichever rank the launcher saw exit first.
    let out = run(trainer()
        .args([
            "--world-size",
            "2",
            "--pipeline-stages",
            "2",
            "--lr",
            "1e20",
        ])
        .args(["--epochs", "1", "--max-steps", "50", "--threads", "1"])
        .args(["--device", "cpu"])
        .args(data_arg(dataset())));
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let last = err.lines().last().unwrap();
    assert!(
        last.starts_with(
            "error: rank 1 failed (exit status: 1): rank 1: epoch 1, step 2: non-finite"
        ),
        "{err}"
    );
}

/// A pipeline stopped mid-epoch resumes where it stopped: each stage
/// uploads its part of the whole checkpoint, and the run ends with the
/// same checkpoint, byte for byte, as the one never stopped.
#[test]
fn a_pipeline_resumes_mid_epoch_as_if_never_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, resumed) = (tmp.path().join("whole"), tmp.path().join("resumed"));
    let layout = ["--world-size", "2", "--pipeline-stages", "2"];
    let args = [&layout[..], &["--epochs", "1", "--checkpoint-every", "2"]].concat();
    train(&whole, &args);
    let mid = trainer::checkpoint::Position { epoch: 1, step: 2 }.dir_name();
    let copy = |name: &str| {
        let (from, to) = (whole.join(&mid), resumed.join(&mid));
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    };
    copy(trainer::checkpoint::MODEL_FILE);
    copy(trainer::checkpoint::STATE_FILE);
    let log = train(&resumed, &[&args[..], &["--resume", "auto"]].concat());
    assert!(log.contains("resuming from"), "{log}");
    let end = trainer::checkpoint::Position { epoch: 2, step: 0 }.dir_name();
    for name in [
        trainer::checkpoint::MODEL_FILE,
        trainer::checkpoint::STATE_FILE,
    ] {
        let bytes = |dir: &Path| std::fs::read(dir.join(&end).join(name)).unwrap();
        assert!(bytes(&whole) == bytes(&resumed), "{name} differs");
    }
}
