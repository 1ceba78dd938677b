//! A checkpoint reads back exactly what was written; anything else (a
//! truncated file, a flipped bit, another model's shapes, the files of two
//! checkpoints mixed, settings that would change the run) is refused with
//! a message that says what is wrong.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use core_tensor::FlatLayout;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use trainer::checkpoint::digest::{self, TensorBytes};
use trainer::checkpoint::resume::compatibility;
use trainer::checkpoint::{
    CheckpointDir, MODEL_FILE, Position, STATE_FILE, Settings, TrainingState, load, load_weights,
};
use trainer::data::DataFingerprint;
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, cnn_layout};

fn layout() -> FlatLayout {
    cnn_layout().clone()
}

fn settings() -> Settings {
    Settings {
        seed: 4,
        world_size: 2,
        batch_size: 32,
        data: Some(DATA),
        // As a job records its shared flags (round-tripped as they are).
        shared: Some(serde_json::from_str(r#"{"epochs":3,"lr":0.001,"max_steps":null}"#).unwrap()),
        ..Settings::default()
    }
}

const DATA: DataFingerprint = DataFingerprint {
    samples: 512,
    hash: 0x00c0_ffee_0000_0001,
};

/// Where `compatibility` is told the checkpoint lies.
const CKPT: &str = "ckpt/ckpt-e0002-s000005";

fn state(position: Position) -> TrainingState {
    let params = CnnMnist::new(DropoutRates::REFERENCE).init_params(position.step);
    TrainingState {
        hook: None,
        position,
        optimizer_step: 40 + position.step,
        exp_avg: params.iter().map(|p| p * 0.5).collect(),
        exp_avg_sq: params.iter().map(|p| p * p).collect(),
        params,
        epoch_loss_sum: vec![17.25, 18.5],
        epoch_correct: vec![20.0, 23.0],
        epoch_train_seconds: 12.5,
        epoch_visited: None,
        settings: settings(),
    }
}

/// A checkpoint written into a fresh directory.
fn saved(position: Position) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = CheckpointDir::new(dir.path(), 3)
        .save(&state(position), &layout())
        .unwrap();
    (dir, path)
}

fn load_error(path: &Path) -> String {
    format!(
        "{:#}",
        load(path, &layout()).expect_err("a damaged checkpoint loaded")
    )
}

fn assert_mentions(err: &str, needles: &[&str]) {
    for needle in needles {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    assert!(!err.contains('\n'), "not one line: {err}");
}

/// The byte offset where a safetensors file's tensor data starts.
fn data_start(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

/// A safetensors file of f32 tensors, with our checksum when `checksum`.
fn write_file(path: &Path, tensors: &[(&str, Vec<usize>)], dtype: Dtype, checksum: bool) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape)| vec![0u8; shape.iter().product::<usize>() * dtype.bitsize() / 8])
        .collect();
    let mut metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    if checksum {
        let covered: BTreeMap<&str, TensorBytes<'_>> = tensors
            .iter()
            .zip(&bytes)
            .map(|((n, shape), data)| (*n, TensorBytes { shape, data }))
            .collect();
        let sum = digest::compute(&BTreeMap::from([("format", "pt")]), &covered);
        metadata.insert(digest::KEY.to_string(), sum);
    }
    let views: Vec<_> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, shape), data)| (*n, TensorView::new(dtype, shape.clone(), data).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, Some(metadata)).unwrap()).unwrap();
}

/// The model's tensors, with `name` given `shape` instead.
fn model_tensors_with(name: &str, shape: &[usize]) -> Vec<(&'static str, Vec<usize>)> {
    const NAMES: [&str; 8] = [
        "conv1.weight",
        "conv1.bias",
        "conv2.weight",
        "conv2.bias",
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ];
    let layout = layout();
    NAMES
        .iter()
        .map(|&n| {
            (
                n,
                if n == name {
                    shape.to_vec()
                } else {
                    layout.get(n).unwrap().spec.shape.clone()
                },
            )
        })
        .collect()
}

#[test]
fn a_checkpoint_reads_back_exactly_what_was_written_under_state_dict_names() {
    let position = Position { epoch: 2, step: 7 };
    let (_dir, path) = saved(position);
    assert!(path.ends_with("ckpt-e0002-s000007"), "{}", path.display());
    assert!(load(&path, &layout()).unwrap() == state(position));
    let bytes = std::fs::read(path.join(MODEL_FILE)).unwrap();
    let model = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<(String, Vec<usize>)> = model
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec()))
        .collect();
    names.sort();
    let mut want: Vec<_> = layout()
        .views()
        .iter()
        .map(|v| (v.spec.name.clone(), v.spec.shape.clone()))
        .collect();
    want.sort();
    assert_eq!(names, want);
    assert!(model.tensors().iter().all(|(_, v)| v.dtype() == Dtype::F32));
}

#[test]
fn truncated_files_are_refused_with_the_file_named() {
    for file in [MODEL_FILE, STATE_FILE] {
        for keep in [0.5, 0.999_999] {
            let (_dir, path) = saved(Position { epoch: 1, step: 3 });
            let bytes = std::fs::read(path.join(file)).unwrap();
            std::fs::write(
                path.join(file),
                &bytes[..(bytes.len() as f64 * keep) as usize],
            )
            .unwrap();
            assert_mentions(&load_error(&path), &[file, "truncated"]);
        }
    }
}

#[test]
fn a_flipped_bit_in_data_or_metadata_is_caught_by_the_checksum() {
    for file in [MODEL_FILE, STATE_FILE] {
        let (_dir, path) = saved(Position { epoch: 1, step: 3 });
        let mut bytes = std::fs::read(path.join(file)).unwrap();
        let at = data_start(&bytes) + (bytes.len() - data_start(&bytes)) / 3;
        bytes[at] ^= 0x10;
        std::fs::write(path.join(file), &bytes).unwrap();
        assert_mentions(&load_error(&path), &[file, "checksum mismatch"]);
    }
    // A metadata value changed in place, the JSON still valid: the optimizer
    // step 43 becomes 23.
    let (_dir, path) = saved(Position { epoch: 1, step: 3 });
    let mut bytes = std::fs::read(path.join(STATE_FILE)).unwrap();
    let needle = b"\"optimizer_step\":\"43\"";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the step in the metadata");
    bytes[at + needle.len() - 3] ^= 0x06; // '4' (0x34) -> '2' (0x32)
    std::fs::write(path.join(STATE_FILE), &bytes).unwrap();
    assert_mentions(&load_error(&path), &[STATE_FILE, "checksum mismatch"]);
}

#[test]
fn a_checkpoint_of_another_shape_is_refused_with_both_shapes() {
    let (_dir, path) = saved(Position { epoch: 1, step: 3 });
    // A valid file in every other respect, checksum included.
    write_file(
        &path.join(MODEL_FILE),
        &model_tensors_with("fc1.weight", &[128, 784]),
        Dtype::F32,
        true,
    );
    assert_mentions(
        &load_error(&path),
        &[
            MODEL_FILE,
            "`fc1.weight` has shape [128, 784]; this model needs [128, 9216]",
        ],
    );
}

#[test]
fn weights_from_pytorch_are_checked_for_names_shapes_and_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("weights.safetensors");
    let mut missing = model_tensors_with("", &[]);
    missing.retain(|(n, _)| *n != "fc2.bias");
    let mut extra = model_tensors_with("", &[]);
    extra.push(("bn.running_mean", vec![32]));
    for (tensors, dtype, needle) in [
        (
            model_tensors_with("conv2.weight", &[64, 32, 5, 5]),
            Dtype::F32,
            "`conv2.weight` has shape [64, 32, 5, 5]; this model needs [64, 32, 3, 3]",
        ),
        (
            model_tensors_with("", &[]),
            Dtype::F16,
            "is F16; expected F32",
        ),
        (missing, Dtype::F32, "tensor `fc2.bias` is missing"),
        (extra, Dtype::F32, "unexpected tensor `bn.running_mean`"),
    ] {
        write_file(&file, &tensors, dtype, false);
        let err = format!("{:#}", load_weights(&file, &layout()).unwrap_err());
        assert_mentions(&err, &["weights.safetensors", needle]);
    }
    write_file(&file, &model_tensors_with("", &[]), Dtype::F32, false);
    assert_eq!(
        load_weights(&file, &layout()).unwrap(),
        vec![0.0; layout().len()]
    );
}

#[test]
fn the_files_of_two_checkpoints_do_not_mix() {
    let (_a, older) = saved(Position { epoch: 1, step: 3 });
    let (_b, newer) = saved(Position { epoch: 1, step: 6 });
    std::fs::copy(older.join(MODEL_FILE), newer.join(MODEL_FILE)).unwrap();
    assert_mentions(
        &load_error(&newer),
        &["model.safetensors is not the one state.safetensors was written with"],
    );
    // A directory renamed to another position.
    let renamed = older.with_file_name("ckpt-e0004-s000000");
    std::fs::rename(&older, &renamed).unwrap();
    assert_mentions(
        &load_error(&renamed),
        &["name says start of epoch 4", "epoch 1, step 3"],
    );
}

#[test]
fn non_finite_state_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = state(Position { epoch: 1, step: 3 });
    bad.exp_avg[5] = f32::NAN;
    let err = format!(
        "{:#}",
        CheckpointDir::new(dir.path(), 3)
            .save(&bad, &layout())
            .unwrap_err()
    );
    assert_mentions(&err, &["non-finite", "exp_avg.conv1.weight"]);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "something was written"
    );
}

#[test]
fn the_newest_valid_checkpoint_wins_and_only_the_last_k_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointDir::new(dir.path(), 2);
    let positions = [
        Position { epoch: 1, step: 2 },
        Position { epoch: 1, step: 4 },
        Position { epoch: 2, step: 0 },
    ];
    for p in positions {
        store.save(&state(p), &layout()).unwrap();
    }
    let listed: Vec<Position> = store.list().unwrap().into_iter().map(|(p, _)| p).collect();
    assert_eq!(listed, positions[1..]);
    // The newest is damaged: the one before it is the newest valid one.
    let newest = dir.path().join(positions[2].dir_name()).join(STATE_FILE);
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() - 4]).unwrap();
    // What an interrupted save leaves is not a checkpoint, and goes.
    std::fs::create_dir(dir.path().join(".tmp-ckpt-e0002-s000002")).unwrap();
    let found = store.newest_valid(&layout()).unwrap();
    assert_eq!(found.found.map(|(_, s)| s.position), Some(positions[1]));
    assert_eq!(found.skipped.len(), 1);
    assert!(format!("{:#}", found.skipped[0].1).contains("truncated"));
    assert_eq!(
        store.prepare().unwrap(),
        vec![dir.path().join(".tmp-ckpt-e0002-s000002")]
    );
}

#[test]
fn settings_that_would_change_the_run_are_refused_with_the_rule_and_a_new_layout_noted() {
    let saved = settings();
    let mid = Position { epoch: 2, step: 5 };
    let boundary = Position { epoch: 3, step: 0 };
    let refused = |now: Settings, at: Position| {
        compatibility(&saved, &now, at, Path::new(CKPT))
            .unwrap_err()
            .to_string()
    };
    assert!(
        refused(
            Settings {
                batch_size: 64,
                ..settings()
            },
            boundary
        )
        .contains("--batch-size 32 per rank, this run has 64")
    );
    assert!(
        refused(
            Settings {
                seed: 5,
                ..settings()
            },
            boundary
        )
        .contains("--seed 4, this run has --seed 5")
    );
    // Mid-epoch a new layout shares out the rest of the epoch, with a note.
    let noted = |now: Settings| compatibility(&saved, &now, mid, Path::new(CKPT)).unwrap();
    let notes = noted(Settings {
        world_size: 4,
        ..settings()
    });
    assert!(
        notes.len() == 1
            && notes[0].contains("from world size 2 to world size 4 mid-epoch")
            && notes[0].contains("shared out over 4 replicas"),
        "{notes:?}"
    );
    // The same world size in pipelines: one replica, one shard.
    let notes = noted(Settings {
        pipeline_stages: 2,
        ..settings()
    });
    assert!(
        notes[0].contains("to world size 2 (1 pipeline(s) of 2 stages) mid-epoch")
            && notes[0].contains("over 1 replicas"),
        "{notes:?}"
    );
    // At an epoch boundary the world size may change, and lr too, with notes.
    let notes = compatibility(
        &saved,
        &Settings {
            world_size: 4,
            lr: 5e-4,
            ..settings()
        },
        boundary,
        Path::new(CKPT),
    )
    .unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].contains("global batch becomes 128") && notes[1].contains("--lr 0.0005"),
        "{notes:?}"
    );
    assert!(
        compatibility(&saved, &settings(), mid, Path::new(CKPT))
            .unwrap()
            .is_empty()
    );
}

/// A checkpoint from before data fingerprints (no `data_fingerprint` in
/// its metadata) loads, its data unknown.
#[test]
fn a_checkpoint_without_a_data_fingerprint_loads_with_its_data_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let position = Position { epoch: 1, step: 3 };
    let mut old = state(position);
    old.settings.data = None;
    let path = CheckpointDir::new(dir.path(), 3)
        .save(&old, &layout())
        .unwrap();
    let bytes = std::fs::read(path.join(STATE_FILE)).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    assert!(
        !header
            .metadata()
            .as_ref()
            .unwrap()
            .contains_key("data_fingerprint")
    );
    assert_eq!(load(&path, &layout()).unwrap().settings.data, None);
    let (_dir, recorded) = saved(position);
    assert_eq!(
        load(&recorded, &layout()).unwrap().settings.data,
        Some(DATA)
    );
}
