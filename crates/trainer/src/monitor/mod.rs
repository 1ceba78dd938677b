//! What a rank uses while it trains: resident memory, CPU and (through
//! NVML) its GPU, sampled by a background thread every
//! [`SAMPLE_EVERY`] and summarised per epoch as min, mean and max.
//! `ranks.rs` carries every rank's summary and step phases to rank 0.

mod nvml;
pub mod procfs;
mod ranks;

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use nvml::GpuReading;
pub use ranks::{RankStats, Straggler};

use nvml::NvmlGpu;

/// How often the background thread samples.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Min, mean and max of an epoch's samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// Running min, sum and max of one quantity.
#[derive(Clone, Copy, Debug, Default)]
struct Stat {
    min: f64,
    max: f64,
    sum: f64,
    count: u32,
}

impl Stat {
    fn add(&mut self, v: f64) {
        (self.min, self.max) = match self.count {
            0 => (v, v),
            _ => (self.min.min(v), self.max.max(v)),
        };
        self.sum += v;
        self.count += 1;
    }

    fn summary(&self) -> Option<Summary> {
        (self.count > 0).then(|| Summary {
            min: self.min,
            mean: self.sum / f64::from(self.count),
            max: self.max,
        })
    }
}

/// One rank's use of its machine over an epoch; `None`: not measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Usage {
    pub rss_mib: Option<Summary>,
    /// Percent of one core (200: two cores busy).
    pub cpu_percent: Option<Summary>,
    pub gpu: Option<GpuUsage>,
}

/// A GPU's side of [`Usage`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct GpuUsage {
    pub util_percent: Summary,
    pub memory_mib: Summary,
    pub power_w: Summary,
    pub temperature_c: Summary,
}

impl GpuUsage {
    /// All four summaries (in field order), or none.
    fn from_parts(parts: [Option<Summary>; 4]) -> Option<Self> {
        let [Some(util), Some(memory), Some(power), Some(temperature)] = parts else {
            return None;
        };
        Some(GpuUsage {
            util_percent: util,
            memory_mib: memory,
            power_w: power,
            temperature_c: temperature,
        })
    }
}

/// The sampler's state, shared with the training thread.
struct Sampler {
    rss: Stat,
    cpu: Stat,
    gpu: [Stat; 4],
    /// The previous CPU reading, for the next utilisation figure.
    cpu_before: Option<(Instant, f64)>,
    nvml: Option<NvmlGpu>,
}

impl Sampler {
    fn sample(&mut self) {
        if let Some(mib) = procfs::resident_mib() {
            self.rss.add(mib);
        }
        if let Some(seconds) = procfs::cpu_seconds() {
            let now = Instant::now();
            if let Some((then, before)) = self.cpu_before {
                let wall = (now - then).as_secs_f64();
                if wall > 0.0 {
                    self.cpu.add(100.0 * (seconds - before) / wall);
                }
            }
            self.cpu_before = Some((now, seconds));
        }
        if let Some(r) = self.nvml.as_ref().and_then(NvmlGpu::read) {
            let values = [
                r.utilization_percent,
                r.memory_used_mib,
                r.power_watts,
                r.temperature_c,
            ];
            for (stat, v) in self.gpu.iter_mut().zip(values) {
                stat.add(v);
            }
        }
    }

    fn take(&mut self) -> Usage {
        let gpu = GpuUsage::from_parts(std::mem::take(&mut self.gpu).map(|s| s.summary()));
        Usage {
            rss_mib: std::mem::take(&mut self.rss).summary(),
            cpu_percent: std::mem::take(&mut self.cpu).summary(),
            gpu,
        }
    }
}

/// Samples this process in the background until dropped; [`Monitor::off`]
/// measures nothing.
pub struct Monitor {
    sampler: Option<Arc<Mutex<Sampler>>>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Measures nothing: every [`Usage`] field is `None`.
    pub fn off() -> Self {
        Self {
            sampler: None,
            stop: None,
            thread: None,
        }
    }

    /// Starts sampling this process, and the GPU with CUDA UUID `gpu`
    /// through NVML. The second value says why that GPU goes unwatched.
    pub fn start(gpu: Option<[u8; 16]>) -> std::io::Result<(Self, Option<String>)> {
        let (nvml, why_not) = match gpu.map(|uuid| NvmlGpu::open(&uuid)) {
            Some(Ok(nvml)) => (Some(nvml), None),
            Some(Err(why)) => (None, Some(why)),
            None => (None, None),
        };
        let sampler = Arc::new(Mutex::new(Sampler {
            rss: Stat::default(),
            cpu: Stat::default(),
            gpu: Default::default(),
            cpu_before: None,
            nvml,
        }));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&sampler);
        let thread = std::thread::Builder::new()
            .name("monitor".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(SAMPLE_EVERY) {
                    lock(&shared).sample();
                }
            })?;
        lock(&sampler).sample();
        let monitor = Self {
            sampler: Some(sampler),
            stop: Some(stop),
            thread: Some(thread),
        };
        Ok((monitor, why_not))
    }

    /// The epoch's summary (one last sample included, so a short epoch has
    /// one too), and a fresh start for the next.
    pub fn take(&mut self) -> Usage {
        self.sampler.as_ref().map_or_else(Usage::default, |s| {
            let mut sampler = lock(s);
            sampler.sample();
            sampler.take()
        })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A sampler whose holder panicked still holds valid numbers.
fn lock(sampler: &Mutex<Sampler>) -> std::sync::MutexGuard<'_, Sampler> {
    sampler.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_monitor_summarises_memory_and_cpu_per_epoch() {
        let (mut monitor, why_not) = Monitor::start(None).unwrap();
        assert_eq!(why_not, None, "no GPU asked for, no note");
        let spin = Instant::now();
        while spin.elapsed() < 3 * SAMPLE_EVERY {
            std::hint::black_box(spin.elapsed());
        }
        let usage = monitor.take();
        let rss = usage.rss_mib.unwrap();
        assert!(
            rss.min > 1.0 && rss.min <= rss.mean && rss.mean <= rss.max,
            "{rss:?}"
        );
        let cpu = usage.cpu_percent.unwrap();
        assert!(cpu.max > 0.0, "a spinning thread uses CPU: {cpu:?}");
        assert_eq!(usage.gpu, None);
        assert!(
            monitor.take().rss_mib.is_some(),
            "the next epoch starts afresh"
        );
    }

    #[test]
    fn an_unwatched_gpu_is_null_with_a_reason() {
        let (mut monitor, why_not) = Monitor::start(Some([7; 16])).unwrap();
        assert!(why_not.is_some());
        assert_eq!(monitor.take().gpu, None);
        assert_eq!(Monitor::off().take(), Usage::default());
    }
}
