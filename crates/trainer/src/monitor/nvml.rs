//! GPU utilisation, memory, power and temperature from NVML, opened at run
//! time: a machine without `libnvidia-ml.so.1` gets a reason, not a panic.

use std::ffi::{CString, c_char, c_int, c_uint, c_ulonglong, c_void};

use libloading::Library;

/// `nvmlReturn_t`; 0 is `NVML_SUCCESS`.
type NvmlReturn = c_int;
/// `nvmlDevice_t`, an opaque handle.
type Handle = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `NVML_TEMPERATURE_GPU`: the die.
const TEMPERATURE_GPU: c_int = 0;

/// One reading of a GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuReading {
    pub utilization_percent: f64,
    pub memory_used_mib: f64,
    pub power_watts: f64,
    pub temperature_c: f64,
}

/// The GPU a rank trains on, as NVML sees it.
pub struct NvmlGpu {
    handle: Handle,
    utilization: unsafe extern "C" fn(Handle, *mut Utilization) -> NvmlReturn,
    memory: unsafe extern "C" fn(Handle, *mut Memory) -> NvmlReturn,
    power: unsafe extern "C" fn(Handle, *mut c_uint) -> NvmlReturn,
    temperature: unsafe extern "C" fn(Handle, c_int, *mut c_uint) -> NvmlReturn,
    shutdown: unsafe extern "C" fn() -> NvmlReturn,
    /// Last, so the functions above are never used after it is unloaded.
    _library: Library,
}

// SAFETY: NVML's API is thread-safe (NVML reference, "Thread safety"); the
// handle is an opaque token NVML resolves on every call, and one thread at
// a time (the sampler) owns this value.
unsafe impl Send for NvmlGpu {}

impl NvmlGpu {
    /// The GPU with CUDA UUID `uuid`, or why it cannot be watched.
    pub fn open(uuid: &[u8; 16]) -> Result<Self, String> {
        // SAFETY: loading NVML runs its (driver-provided) initialisers,
        // which have no preconditions on our side.
        let library = unsafe { Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("cannot load libnvidia-ml.so.1 ({e})"))?;
        // SAFETY: each symbol is looked up with NVML's documented C
        // signature (nvml.h) and copied out as a plain function pointer,
        // used only while `library` (moved into the result) stays loaded.
        let gpu = unsafe {
            let init = *library
                .get::<unsafe extern "C" fn() -> NvmlReturn>(b"nvmlInit_v2\0")
                .map_err(|e| e.to_string())?;
            let by_uuid = *library
                .get::<unsafe extern "C" fn(*const c_char, *mut Handle) -> NvmlReturn>(
                    b"nvmlDeviceGetHandleByUUID\0",
                )
                .map_err(|e| e.to_string())?;
            let utilization = *library
                .get(b"nvmlDeviceGetUtilizationRates\0")
                .map_err(|e| e.to_string())?;
            let memory = *library
                .get(b"nvmlDeviceGetMemoryInfo\0")
                .map_err(|e| e.to_string())?;
            let power = *library
                .get(b"nvmlDeviceGetPowerUsage\0")
                .map_err(|e| e.to_string())?;
            let temperature = *library
                .get(b"nvmlDeviceGetTemperature\0")
                .map_err(|e| e.to_string())?;
            let shutdown = *library
                .get::<unsafe extern "C" fn() -> NvmlReturn>(b"nvmlShutdown\0")
                .map_err(|e| e.to_string())?;
            check(init(), "nvmlInit_v2")?;
            let name = CString::new(nvml_uuid(uuid)).expect("hex digits and dashes only");
            let mut handle: Handle = std::ptr::null_mut();
            if let Err(e) = check(
                by_uuid(name.as_ptr(), &mut handle),
                "nvmlDeviceGetHandleByUUID",
            ) {
                shutdown();
                return Err(e);
            }
            NvmlGpu {
                handle,
                utilization,
                memory,
                power,
                temperature,
                shutdown,
                _library: library,
            }
        };
        Ok(gpu)
    }

    /// The GPU now; `None` when NVML refuses any of the four readings.
    pub fn read(&self) -> Option<GpuReading> {
        let (mut util, mut mem) = (Utilization::default(), Memory::default());
        let (mut milliwatts, mut celsius): (c_uint, c_uint) = (0, 0);
        // SAFETY: the handle came from NVML and NVML is initialised (until
        // drop); every out-pointer is a live local of the type nvml.h names.
        let ok = unsafe {
            (self.utilization)(self.handle, &mut util) == 0
                && (self.memory)(self.handle, &mut mem) == 0
                && (self.power)(self.handle, &mut milliwatts) == 0
                && (self.temperature)(self.handle, TEMPERATURE_GPU, &mut celsius) == 0
        };
        ok.then(|| GpuReading {
            utilization_percent: f64::from(util.gpu),
            memory_used_mib: mem.used as f64 / (1024.0 * 1024.0),
            power_watts: f64::from(milliwatts) / 1000.0,
            temperature_c: f64::from(celsius),
        })
    }
}

impl Drop for NvmlGpu {
    fn drop(&mut self) {
        // SAFETY: balances the successful nvmlInit_v2 of `open`.
        unsafe {
            (self.shutdown)();
        }
    }
}

fn check(code: NvmlReturn, call: &str) -> Result<(), String> {
    match code {
        0 => Ok(()),
        code => Err(format!("{call} returned NVML error {code}")),
    }
}

/// NVML's spelling of a CUDA device UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn nvml_uuid(bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let group = |r: std::ops::Range<usize>| hex[r].concat();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        group(0..4),
        group(4..6),
        group(6..8),
        group(8..10),
        group(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_as_nvml_does() {
        let bytes: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(
            nvml_uuid(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn a_missing_or_foreign_gpu_is_a_reason_not_a_panic() {
        // No NVML here: the library is missing; with NVML: no GPU has this UUID.
        assert!(NvmlGpu::open(&[0; 16]).is_err());
    }
}
