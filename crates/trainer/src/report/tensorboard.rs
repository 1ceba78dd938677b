//! TensorBoard event files, written without TensorFlow: TFRecord framing
//! around hand-encoded `Event` protobufs holding scalar summaries.
//!
//! A record is `u64 length, masked crc32c(length), data, masked
//! crc32c(data)` (little-endian); an `Event` is `wall_time = 1` (double),
//! `step = 2` (int64), `file_version = 3` (string) or `summary = 5`, whose
//! `value = 1` entries hold `tag = 1` (string) and `simple_value = 2` (float).

use std::fs::File;
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::model::Metric;
use crate::phases::Phase;
use crate::train::EpochReport;

/// The counter of the next event file's name, per process (TensorFlow's
/// `global_uid`).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// An open event file in a TensorBoard log directory.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// A new event file in `dir` (created if missing), named as TensorFlow
    /// names them (`events.out.tfevents.{seconds}.{host}.{pid}.{counter}`)
    /// so that TensorBoard finds it. Two runs started in the same second
    /// (or one run reopening) must never share a file: the pid and a
    /// counter tell them apart, and the file is created new, never
    /// truncated; a name already taken (a pid reused) moves the counter on.
    pub fn create(dir: &Path, host: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let seconds = now().floor();
        let pid = std::process::id();
        let (path, file) = loop {
            let counter = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(
                "events.out.tfevents.{seconds}.{host}.{pid}.{counter}"
            ));
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && counter < 1000 => continue,
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        };
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        let mut event = event_header(0);
        put_bytes(&mut event, 3, b"brain.Event:2");
        writer.record(&event)?;
        writer.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An epoch's numbers at its last step: the epoch's loss, the model's
    /// metric train and test (`accuracy`, `rmse`, or none), img/s, and
    /// every rank's monitoring and phase times (`monitor/rankR/...`,
    /// `time/rankR/...`); then flushes.
    pub fn epoch(&mut self, r: &EpochReport) -> anyhow::Result<()> {
        let mut values = vec![("epoch/train_loss".to_string(), r.loss)];
        let metric = match r.metric {
            Metric::Accuracy => Some("accuracy"),
            Metric::Rmse => Some("rmse"),
            Metric::None => None,
        };
        if let Some(name) = metric {
            // A metric with nothing to measure it on (no test ratings) is
            // left out, as the metrics file's `null`, not drawn as NaN.
            let measured = [
                (format!("epoch/train_{name}"), r.accuracy),
                (format!("test/{name}"), r.test_accuracy),
            ];
            values.extend(measured.into_iter().filter(|(_, v)| v.is_finite()));
        }
        values.push(("epoch/img_per_s".into(), r.images_per_second()));
        for (rank, stats) in r.ranks.iter().enumerate() {
            let usage = &stats.usage;
            let gpu = usage.gpu.as_ref();
            let monitored = [
                ("rss_mib_max", usage.rss_mib.map(|s| s.max)),
                ("cpu_percent_mean", usage.cpu_percent.map(|s| s.mean)),
                ("gpu_util_percent_mean", gpu.map(|g| g.util_percent.mean)),
                ("gpu_memory_mib_max", gpu.map(|g| g.memory_mib.max)),
                ("gpu_power_w_mean", gpu.map(|g| g.power_w.mean)),
                ("gpu_temperature_c_max", gpu.map(|g| g.temperature_c.max)),
            ];
            for (name, value) in monitored {
                if let Some(v) = value {
                    values.push((format!("monitor/rank{rank}/{name}"), v));
                }
            }
            for phase in Phase::ALL {
                let tag = format!("time/rank{rank}/{}_s", phase.name());
                values.push((tag, stats.phases.get(phase)));
            }
            values.push((format!("time/rank{rank}/eval_s"), stats.eval_seconds));
        }
        self.scalars(r.global_step, &values)?;
        self.flush()
    }

    /// Several scalars at `step`, in one event.
    pub fn scalars(&mut self, step: u64, values: &[(impl AsRef<str>, f64)]) -> anyhow::Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in values {
            let mut entry = Vec::new();
            put_bytes(&mut entry, 1, tag.as_ref().as_bytes());
            entry.push(tag_byte(2, WIRE_FIXED32));
            entry.extend_from_slice(&(*value as f32).to_le_bytes());
            put_bytes(&mut summary, 1, &entry);
        }
        let mut event = event_header(step);
        put_bytes(&mut event, 5, &summary);
        self.record(&event)
    }

    /// Makes what was written visible to a reader (once per epoch).
    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    fn record(&mut self, data: &[u8]) -> anyhow::Result<()> {
        let length = (data.len() as u64).to_le_bytes();
        let mut framed = Vec::with_capacity(data.len() + 16);
        framed.extend_from_slice(&length);
        framed.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
        framed.extend_from_slice(data);
        framed.extend_from_slice(&masked_crc32c(data).to_le_bytes());
        self.out
            .write_all(&framed)
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_BYTES: u8 = 2;
const WIRE_FIXED32: u8 = 5;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An `Event`'s `wall_time` (now) and `step`.
fn event_header(step: u64) -> Vec<u8> {
    let mut event = vec![tag_byte(1, WIRE_FIXED64)];
    event.extend_from_slice(&now().to_le_bytes());
    event.push(tag_byte(2, WIRE_VARINT));
    put_varint(&mut event, step);
    event
}

fn tag_byte(field: u8, wire: u8) -> u8 {
    (field << 3) | wire
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push(tag_byte(field, WIRE_BYTES));
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// CRC-32C (Castagnoli), bit by bit: records are small and few.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82f6_3b78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// TFRecord's masking, so that a CRC of CRCs is not trivially a CRC.
fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }

    #[test]
    fn records_are_framed_with_their_length_and_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(dir.path(), "host").unwrap();
        writer.scalars(7, &[("train/loss", 0.5)]).unwrap();
        writer.flush().unwrap();
        let bytes = std::fs::read(writer.path()).unwrap();
        let mut records = Vec::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            assert_eq!(rest[8..12], masked_crc32c(&rest[..8]).to_le_bytes());
            let data = &rest[12..12 + len];
            assert_eq!(rest[12 + len..16 + len], masked_crc32c(data).to_le_bytes());
            records.push(data.to_vec());
            rest = &rest[16 + len..];
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].ends_with(b"brain.Event:2"));
        let scalar = &records[1];
        assert!(scalar.windows(10).any(|w| w == b"train/loss"));
        assert!(scalar.ends_with(&0.5f32.to_le_bytes()));
    }

    #[test]
    fn writers_opened_in_the_same_second_get_files_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = EventWriter::create(dir.path(), "host").unwrap();
        first.scalars(1, &[("first", 1.0)]).unwrap();
        first.flush().unwrap();
        let second = EventWriter::create(dir.path(), "host").unwrap();
        assert_ne!(first.path(), second.path());
        let name = second.path().file_name().unwrap().to_str().unwrap();
        let pid = std::process::id().to_string();
        assert!(name.split('.').any(|part| part == pid), "{name}");
        let kept = std::fs::read(first.path()).unwrap();
        assert!(kept.windows(5).any(|w| w == b"first"), "truncated");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
