//! Fuzz target for the checkpoint reader (`trainer::checkpoint::load`), run
//! as an ordinary test with a bounded number of cases. The seed is a real
//! checkpoint written by `CheckpointDir::save` (megabytes, so it is written
//! at the start of the run rather than kept in the repository). Two ways in:
//!
//! * raw damage to `model.safetensors` or `state.safetensors`, mostly in the
//!   length prefix and JSON header, where the parser (not the checksum) has
//!   to cope: refused, or read as exactly the seed, never a panic;
//! * `state.safetensors` with one metadata value replaced by arbitrary text
//!   and the checksum recomputed, so the damage gets past the checksum to
//!   the code that interprets the metadata: a one-line error or a state,
//!   never a panic.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use core_tensor::FlatLayout;
use proptest::prelude::*;
use proptest::sample::Index;
use safetensors::SafeTensors;
use trainer::checkpoint::digest::{self, TensorBytes};
use trainer::checkpoint::{
    CheckpointDir, MODEL_FILE, Position, STATE_FILE, Settings, TrainingState, load,
};
use trainer::data::DataFingerprint;
use trainer::model::DropoutRates;
use trainer::models::cnn::{CnnMnist, cnn_layout};

/// Each case writes and checks a few megabytes: about two seconds in all.
const CASES: u32 = 48;

fn layout() -> FlatLayout {
    cnn_layout().clone()
}

/// The bytes of a valid checkpoint's (model, state) files.
fn seed() -> &'static (Vec<u8>, Vec<u8>) {
    static SEED: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    SEED.get_or_init(|| {
        let params = CnnMnist::new(DropoutRates::REFERENCE).init_params(3);
        let state = TrainingState {
            hook: None,
            position: Position { epoch: 2, step: 5 },
            optimizer_step: 45,
            exp_avg: params.iter().map(|p| p * 0.5).collect(),
            exp_avg_sq: params.iter().map(|p| p * p).collect(),
            params,
            epoch_loss_sum: vec![17.25, 18.5],
            epoch_correct: vec![20.0, 23.0],
            epoch_train_seconds: 12.5,
            epoch_visited: None,
            settings: Settings {
                seed: 4,
                world_size: 2,
                batch_size: 32,
                data: Some(DataFingerprint {
                    samples: 60_000,
                    hash: 0x0123_4567_89ab_cdef,
                }),
                ..Settings::default()
            },
        };
        let dir = tempfile::tempdir().unwrap();
        let path = CheckpointDir::new(dir.path(), 1)
            .save(&state, &layout())
            .unwrap();
        let read = |name| std::fs::read(path.join(name)).unwrap();
        (read(MODEL_FILE), read(STATE_FILE))
    })
}

/// Loads a checkpoint made of these two files; the error as one line.
fn load_files(model: &[u8], state: &[u8]) -> Result<TrainingState, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(MODEL_FILE), model).unwrap();
    std::fs::write(dir.path().join(STATE_FILE), state).unwrap();
    load(dir.path(), &layout()).map_err(|err| format!("{err:#}"))
}

/// The file's header: its 8-byte length prefix and JSON.
fn header_len(file: &[u8]) -> usize {
    8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize
}

/// `file` with bytes overwritten (mostly in the header), then cut.
fn damaged(file: &[u8], writes: &[(bool, Index, u8)], cut: Option<Index>) -> Vec<u8> {
    let mut bytes = file.to_vec();
    let header = header_len(file);
    for &(in_header, at, byte) in writes {
        let slot = if in_header {
            at.index(header)
        } else {
            at.index(bytes.len())
        };
        bytes[slot] = byte;
    }
    if let Some(cut) = cut {
        bytes.truncate(cut.index(bytes.len()));
    }
    bytes
}

/// `state` with metadata `key` set to `value` and the checksum recomputed.
fn resigned(state: &[u8], key: &str, value: &str) -> Vec<u8> {
    let (_, header) = SafeTensors::read_metadata(state).unwrap();
    let mut metadata: HashMap<String, String> = header.metadata().clone().unwrap();
    metadata.insert(key.to_string(), value.to_string());
    metadata.remove(digest::KEY);
    let file = SafeTensors::deserialize(state).unwrap();
    let tensors = file.tensors();
    let covered: BTreeMap<&str, TensorBytes<'_>> = tensors
        .iter()
        .map(|(name, view)| {
            let bytes = TensorBytes {
                shape: view.shape(),
                data: view.data(),
            };
            (name.as_str(), bytes)
        })
        .collect();
    let entries = metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let sum = digest::compute(&entries, &covered);
    metadata.insert(digest::KEY.to_string(), sum);
    safetensors::serialize(tensors, Some(metadata)).unwrap()
}

/// The metadata keys of the state file, so cases pick real ones.
fn state_keys() -> Vec<String> {
    let (_, header) = SafeTensors::read_metadata(&seed().1).unwrap();
    let mut keys: Vec<String> = header.metadata().clone().unwrap().into_keys().collect();
    keys.retain(|k| k != digest::KEY);
    keys.sort();
    keys
}

fn assert_one_line(result: &Result<TrainingState, String>) {
    if let Err(message) = result {
        assert!(!message.contains('\n'), "not one line: {message}");
    }
}

#[test]
fn seed_loads_and_resigning_alone_changes_nothing() {
    let (model, state) = seed();
    let loaded = load_files(model, state).expect("the seed is valid");
    let same = resigned(state, "seed", "4");
    assert_eq!(
        load_files(model, &same).map(|s| s.position),
        Ok(loaded.position)
    );
}

/// Metadata that parses but that no run writes is refused by name, not
/// trained from (a negative time gave negative images/s, a step count of
/// `u64::MAX` wrapped into an internal error).
#[test]
fn resigned_metadata_no_run_writes_is_refused() {
    let (model, state) = seed();
    for (key, value, needle) in [
        ("epoch_train_seconds", "NaN", "is not a time"),
        ("epoch_train_seconds", "-5", "is not a time"),
        ("epoch_train_seconds", "inf", "is not a time"),
        ("optimizer_step", "18446744073709551615", "`optimizer_step`"),
        ("dropout", "NaN,0.5", "dropout rates"),
        ("dropout", "0.25,-1", "dropout rates"),
        ("dropout", "0.25,1", "dropout rates"),
        ("data_fingerprint", "60000", "`data_fingerprint`"),
        (
            "data_fingerprint",
            "-1:0123456789abcdef",
            "`data_fingerprint`",
        ),
        (
            "data_fingerprint",
            "60000:0123456789abcdeg",
            "`data_fingerprint`",
        ),
        ("pipeline_stages", "0", "does not divide the world size"),
        ("pipeline_stages", "3", "does not divide the world size"),
        ("pipeline_stages", "two", "`pipeline_stages`"),
    ] {
        let err = load_files(model, &resigned(state, key, value)).unwrap_err();
        assert!(err.contains(needle), "{key} = {value}: {err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn raw_damage_is_refused_or_harmless(
        damage_state: bool,
        writes in proptest::collection::vec((proptest::bool::weighted(0.8), any::<Index>(), any::<u8>()), 1..6),
        cut in proptest::option::weighted(0.2, any::<Index>()),
    ) {
        let (model, state) = seed();
        let result = if damage_state {
            load_files(model, &damaged(state, &writes, cut))
        } else {
            load_files(&damaged(model, &writes, cut), state)
        };
        assert_one_line(&result);
        // Damage the reader lets through (a byte rewritten to itself, a
        // padding space turned into a tab) must mean nothing.
        if let Ok(loaded) = result {
            prop_assert_eq!(Ok(loaded), load_files(model, state));
        }
    }

    #[test]
    fn resigned_metadata_is_interpreted_without_panicking(
        key in any::<Index>(),
        value in prop_oneof![
            "[0-9]{0,25}",
            "-?[0-9]{1,3}(\\.[0-9]{0,3})?(e[+-]?[0-9]{1,3})?",
            "[0-9.]{1,4},[0-9.]{1,4}",
            ".{0,16}",
        ],
    ) {
        let (model, state) = seed();
        let keys = state_keys();
        let result = load_files(model, &resigned(state, &keys[key.index(keys.len())], &value));
        assert_one_line(&result);
    }
}
