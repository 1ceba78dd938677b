//! Turning the embedded kernel modules into loaded functions, and the
//! process-wide cache of what NVRTC compiled.
//!
//! Per module, the PTX that nvcc embedded at build time is tried first. PTX
//! from a toolkit newer than the driver does not load, so when it fails, or
//! when there is none, NVRTC compiles the source to a CUBIN for the GPU's
//! exact `sm_XY`: machine code needs no JIT, and a CUBIN from a newer NVRTC
//! of the same major version loads on an older driver. CUBINs are cached per
//! (module, architecture), so each is compiled once per process, and on
//! disk ([`KernelCache`]), so that the next process does not compile it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::thread;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::kernel_cache::{CacheKey, KERNEL_CACHE_VAR, KernelCache};
use super::kernels::{KernelModule, PTX_ARCH};
use super::nvrtc::{self, Output};
use crate::{Error, Result};

/// CUBINs by module name and `sm` number.
type CubinCache = HashMap<(&'static str, u32), Arc<[u8]>>;

/// The CUBINs compiled in this process.
static CUBINS: LazyLock<Mutex<CubinCache>> = LazyLock::new(Default::default);

/// The loaded NVRTC's `(major, minor)` version, or an error naming the
/// library when it is missing.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc::version()
}

/// `module` compiled by NVRTC to PTX for `compute_<compute_cap>` (e.g. 90),
/// with the options the runtime uses. For tools: assembling the PTX with
/// `ptxas` reports registers and spills.
pub fn compile_ptx(module: &KernelModule, compute_cap: u32) -> Result<String> {
    let arch = format!("--gpu-architecture=compute_{compute_cap}");
    let ptx = nvrtc::compile(module.name, module.source, &[arch], Output::Ptx)?;
    Ok(String::from_utf8_lossy(&ptx).into_owned())
}

/// `module` compiled by NVRTC to a CUBIN for `sm_<compute_cap>`, exactly as
/// [`super::Cuda::new`] does when it has no loadable PTX.
pub fn compile_cubin(module: &KernelModule, compute_cap: u32) -> Result<Vec<u8>> {
    let options = cubin_options(compute_cap);
    nvrtc::compile(module.name, module.source, &options, Output::Cubin)
}

fn cubin_options(compute_cap: u32) -> Vec<String> {
    vec![format!("--gpu-architecture=sm_{compute_cap}")]
}

/// Every kernel loaded on one GPU.
pub(super) struct Loaded {
    pub functions: HashMap<&'static str, CudaFunction>,
    /// Where the code came from, for `describe`.
    pub origin: String,
}

/// Loads `modules` on `ctx` (a GPU of compute capability `cap`). The
/// embedded PTX is used only when it targets `min_arch` (e.g. 80) or later:
/// code for an older architecture leaves out what needs a newer one (the
/// TF32 and bf16 products), so NVRTC compiles for this GPU instead.
pub(super) fn load_all(
    ctx: &Arc<CudaContext>,
    modules: &'static [KernelModule],
    (major, minor): (i32, i32),
    min_arch: u32,
) -> Result<Loaded> {
    let sm = u32::try_from(major * 10 + minor).unwrap_or(0);
    let ptx_arch: u32 = PTX_ARCH
        .and_then(|a| a.strip_prefix("compute_")?.parse().ok())
        .unwrap_or(0);
    let mut loaded = Vec::new();
    let mut need_nvrtc = Vec::new();
    let mut ptx_failures = Vec::new();
    for module in modules {
        let ptx = module.ptx.filter(|_| ptx_arch >= min_arch);
        match ptx.map(|ptx| ctx.load_module(Ptx::from_src(ptx))) {
            Some(Ok(m)) => loaded.push((module, m)),
            Some(Err(e)) => {
                ptx_failures.push(format!("{}: {e}", module.name));
                need_nvrtc.push(module);
            }
            None => need_nvrtc.push(module),
        }
    }
    let mut origin = Vec::new();
    if !loaded.is_empty() {
        origin.push(format!("PTX for {} from nvcc", PTX_ARCH.unwrap_or("?")));
    }
    if !need_nvrtc.is_empty() {
        let disk = KernelCache::from_env();
        let found = nvrtc::version().and_then(|version| {
            let found = cubins(&need_nvrtc, sm, version, disk.as_ref())?;
            Ok((version, found))
        });
        let ((nv_major, nv_minor), found) = found.map_err(|e| {
            if ptx_failures.is_empty() {
                e
            } else {
                Error::KernelBuild {
                    module: need_nvrtc[0].name,
                    reason: format!(
                        "the embedded PTX did not load ({}), and NVRTC could not stand in: {}",
                        ptx_failures.join("; "),
                        e.with_causes()
                    ),
                }
            }
        })?;
        let (cubins, sources): (Vec<_>, Vec<_>) = found.into_iter().unzip();
        for ((module, cubin), source) in need_nvrtc.into_iter().zip(cubins).zip(&sources) {
            let cuda_module = ctx.load_module(Ptx::from_binary(cubin.to_vec()));
            let cuda_module = match (cuda_module, source, &disk) {
                (Err(e), Source::Disk, Some(disk)) => {
                    return Err(Error::KernelBuild {
                        module: module.name,
                        reason: format!(
                            "the driver refused its CUBIN from the kernel cache {} ({e}): \
                             remove that directory, or set {}=off",
                            disk.dir().display(),
                            KERNEL_CACHE_VAR
                        ),
                    });
                }
                (loaded, _, _) => loaded?,
            };
            loaded.push((module, cuda_module));
        }
        let nvrtc = format!("NVRTC {nv_major}.{nv_minor} for sm_{sm}");
        origin.push(match disk {
            Some(disk) => format!("{nvrtc}{}", Source::describe(&sources, &disk)),
            None => nvrtc,
        });
    }
    let mut functions = HashMap::new();
    for (module, cuda_module) in &loaded {
        for &name in module.functions {
            let function = load_function(module, cuda_module, name)?;
            functions.insert(name, function);
        }
    }
    Ok(Loaded {
        functions,
        origin: origin.join(" + "),
    })
}

fn load_function(
    module: &KernelModule,
    cuda_module: &Arc<CudaModule>,
    name: &str,
) -> Result<CudaFunction> {
    cuda_module
        .load_function(name)
        .map_err(|e| Error::KernelBuild {
            module: module.name,
            reason: format!("kernel `{name}`: {e}"),
        })
}

/// Where a module's CUBIN came from.
enum Source {
    /// An earlier load in this process.
    Process,
    /// The disk cache.
    Disk,
    /// NVRTC, just now; then stored on disk, or why not.
    Compiled(std::io::Result<()>),
}

impl Source {
    /// What the disk cache did, for the origin line: `, read from DIR`,
    /// `, saved in DIR`, both with counts, or why it could not be saved.
    fn describe(sources: &[Self], disk: &KernelCache) -> String {
        let dir = disk.dir().display();
        let read = sources.iter().filter(|s| matches!(s, Self::Disk)).count();
        let compiled = sources
            .iter()
            .filter(|s| matches!(s, Self::Compiled(_)))
            .count();
        let unsaved = sources.iter().find_map(|s| match s {
            Self::Compiled(Err(e)) => Some(e),
            _ => None,
        });
        match (compiled, read, unsaved) {
            (_, _, Some(e)) => format!(
                ", not saved in the kernel cache {dir} ({e}; set {} to a writable \
                 directory, or to `off`)",
                KERNEL_CACHE_VAR
            ),
            (0, 0, None) => String::new(),
            (0, _, None) => format!(", read from the kernel cache {dir}"),
            (_, 0, None) => format!(", saved in the kernel cache {dir}"),
            (c, r, None) => format!(", {c} compiled and {r} read from the kernel cache {dir}"),
        }
    }
}

/// The CUBINs of `modules` for `sm` by NVRTC version `nvrtc`: from this
/// process's cache, from `disk`, or compiled now (in parallel: NVRTC
/// programs are independent) and stored there.
fn cubins(
    modules: &[&'static KernelModule],
    sm: u32,
    nvrtc: (i32, i32),
    disk: Option<&KernelCache>,
) -> Result<Vec<(Arc<[u8]>, Source)>> {
    let in_process = |module: &KernelModule| {
        let cache = CUBINS.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(&(module.name, sm)).cloned()
    };
    let options = cubin_options(sm);
    let find_or_compile = |module: &'static KernelModule| -> Result<(Arc<[u8]>, Source)> {
        if let Some(cubin) = in_process(module) {
            return Ok((cubin, Source::Process));
        }
        let key = CacheKey {
            module: module.name,
            source: module.source,
            options: &options,
            nvrtc,
        };
        if let Some(cubin) = disk.and_then(|disk| disk.get(&key)) {
            return Ok((Arc::from(cubin), Source::Disk));
        }
        // Another process may be compiling it: wait for its entry.
        let _turn = disk.and_then(|disk| disk.compiling(&key));
        if let Some(cubin) = disk.and_then(|disk| disk.get(&key)) {
            return Ok((Arc::from(cubin), Source::Disk));
        }
        // The options of the key, so what is stored is what it names.
        let cubin = nvrtc::compile(module.name, module.source, &options, Output::Cubin)?;
        let saved = disk.map_or(Ok(()), |disk| disk.put(&key, &cubin));
        Ok((Arc::from(cubin), Source::Compiled(saved)))
    };
    let found: Vec<Result<(Arc<[u8]>, Source)>> = thread::scope(|scope| {
        let jobs: Vec<_> = modules
            .iter()
            .map(|&module| scope.spawn(move || find_or_compile(module)))
            .collect();
        jobs.into_iter()
            .map(|job| {
                job.join().unwrap_or_else(|_| {
                    Err(Error::KernelBuild {
                        module: "nvrtc",
                        reason: "a compiler thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let found = found.into_iter().collect::<Result<Vec<_>>>()?;
    let mut cache = CUBINS.lock().unwrap_or_else(PoisonError::into_inner);
    for (module, (cubin, _)) in modules.iter().zip(&found) {
        cache.insert((module.name, sm), Arc::clone(cubin));
    }
    Ok(found)
}
