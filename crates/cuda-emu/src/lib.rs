//! A CPU stand-in for the CUDA driver and NCCL, so that the CUDA backend —
//! its launch code, its kernels, the NCCL communicator and everything above
//! them — runs and is tested on a machine without a GPU.
//!
//! [`Emulator::build`] compiles the backend's kernel sources
//! (`core_tensor::ops::kernel_modules`) as ordinary C++ (with
//! `cpp/emu_kernel.h` supplying `threadIdx`, `__syncthreads`, the atomics
//! and intrinsics) together with the runtime (`cpp/fibers.cpp` runs kernels,
//! `cpp/driver.cpp` and `cpp/devices.cpp` implement the driver API calls cudarc makes over the
//! guarded device memory of `cpp/memory.cpp`, `cpp/nccl.cpp` and
//! `cpp/nccl_p2p.cpp` the NCCL calls of `comm::nccl`) into a `libcuda.so`,
//! also linked as `libnccl.so`. A
//! process started with that folder first on `LD_LIBRARY_PATH`
//! ([`Emulator::library_path`], or a test's [`rerun_on_emulator`]) loads it
//! instead of the NVIDIA driver and sees `$CUDA_EMU_DEVICES` GPUs (default:
//! one) named "cuda-emu", of compute capability 9.0, or
//! `$CUDA_EMU_COMPUTE_CAP` (e.g. 7.5, to meet what the backend refuses on
//! older GPUs), each with `$CUDA_EMU_MEMORY_MIB` of memory (default: 80 GiB;
//! `cuMemGetInfo` reports that less what the process holds on them all,
//! and an allocation past it fails with `CUDA_ERROR_OUT_OF_MEMORY`).
//!
//! What it checks and what it cannot:
//! * Kernel arithmetic and indexing run as written, every block and thread,
//!   barriers included (threads are fibers; a block's threads interleave at
//!   each `__syncthreads`). Results match the GPU's up to the rounding of
//!   libm's `expf`/`logf` against CUDA's.
//! * NaNs: the `_rn` intrinsics, the math functions the kernels call and
//!   `mma.sync` return CUDA's one NaN, 0x7fffffff, where x86 keeps an
//!   operand's payload or makes 0xffc00000 (`gpu_result` in
//!   `cpp/emu_kernel.h`); copies keep a NaN's bits, as on a GPU. Not:
//!   float arithmetic written as C++ operators (`a * b`), which stays x86's.
//! * Argument lists: each kernel is called through its own C signature with
//!   the launch's `kernelParams`, so a wrong count or order of arguments
//!   gives wrong numbers, a bad launch configuration the driver's error.
//! * Module images: the kernels are this library's own, but only a CUBIN
//!   (an ELF image) or PTX text loads, as on the driver, so damaged bytes
//!   (a bad kernel-cache entry) fail here too.
//! * Memory: every allocation ends at an unmapped page, so a kernel that
//!   runs past the end of a buffer faults, and the process ends naming the
//!   kernel, block and thread. Copies and memsets must stay inside one
//!   allocation; zero-byte allocations are refused, as by the driver.
//! * Streams and events: collectives run on their stream's own thread, and
//!   work that does not wait for them (a missing event wait) reads stale
//!   data, as on a GPU. Kernels and copies run when queued.
//! * NCCL: ranks in one process or several meet through shared memory;
//!   non-blocking initialisation, all-reduce (float32 and 16-bit floats:
//!   sum, average; int64: wrapping sum, maximum), broadcast,
//!   asynchronous errors, and abort, which releases the collectives of this
//!   rank and fails those of its peers.
//! * Tensor cores: `mma.sync` m16n8k8 TF32 (mma.cuh) and m16n8k16 bf16
//!   (gemm_bf16.cuh, with `cvt.rn.bf16.f32`'s rounding) as a block-wide
//!   exchange of the fragments in the PTX ISA's layouts, so a fragment
//!   mapped to the wrong element gives wrong numbers; its sums round in k
//!   order, where the hardware's order is unspecified.
//! * cp.async (`cpp/emu_kernel.h`): each thread's copies are held per
//!   commit group and performed at the `cp.async.wait_group` that lets them
//!   finish, zero fill included, so a kernel that reads a staged tile
//!   before its wait reads stale data.
//! * Not: timing (its bandwidths mean nothing), races between kernels on
//!   different streams (they run one at a time), other warp-level
//!   behaviour.

use std::collections::hash_map::DefaultHasher;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs, thread};

use core_tensor::backend::cuda::KernelModule;
use core_tensor::ops::kernel_modules;

mod rerun;
mod wheels;

pub use rerun::{
    in_emulator, rerun_on_emulator, rerun_side_by_side_on_emulator, shared_kernel_cache,
};
pub use wheels::{nvrtc_lib_dir, wheel_dir};

/// The headers: what kernel sources see, and what the runtime files share.
const HEADERS: [(&str, &str); 4] = [
    ("emu_kernel.h", include_str!("../cpp/emu_kernel.h")),
    ("emu.h", include_str!("../cpp/emu.h")),
    ("nccl_abi.h", include_str!("../cpp/nccl_abi.h")),
    ("nccl_comm.h", include_str!("../cpp/nccl_comm.h")),
];
/// The runtime: the block scheduler, the driver API, device memory, NCCL.
const RUNTIME: [(&str, &str); 6] = [
    ("fibers.cpp", include_str!("../cpp/fibers.cpp")),
    ("driver.cpp", include_str!("../cpp/driver.cpp")),
    ("devices.cpp", include_str!("../cpp/devices.cpp")),
    ("memory.cpp", include_str!("../cpp/memory.cpp")),
    ("nccl.cpp", include_str!("../cpp/nccl.cpp")),
    ("nccl_p2p.cpp", include_str!("../cpp/nccl_p2p.cpp")),
];
/// Compiler flags: C++20 for the kernels' templates; this machine's
/// instructions (the emulator runs where it is built), so that `fmaf` is one
/// instruction rather than a libm call; no fused multiply-add the source did
/// not ask for (the `_rn` intrinsics must round each step); no strict
/// aliasing, which the kernels' `float4` reads break; and every typed access
/// checked for its alignment, fatally: an x86 core reads a `float4` at any
/// address, a GPU stops the kernel with "misaligned address", so without
/// the check such a kernel would pass here and fail there (it costs the
/// emulated trainings about a third more time).
const CXX_FLAGS: &[&str] = &[
    "-std=c++20",
    "-O2",
    "-march=native",
    "-fPIC",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    SANITIZE,
    "-fno-sanitize-recover=alignment",
    "-Wall",
    "-Wno-unknown-pragmas",
    "-Wno-unused-function",
    "-Wno-unused-variable",
];

/// The alignment checks, at compile and at link time (their runtime).
const SANITIZE: &str = "-fsanitize=alignment";

/// Why the emulator could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "no C++ compiler: running `{compiler}` failed ({source}); install g++ (Debian: \
         apt-get install g++) or name one in CXX"
    )]
    NoCompiler {
        compiler: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed:\n{log}")]
    Compile { command: String, log: String },
}

/// A built emulator: a folder holding `libcuda.so`.
#[derive(Clone, Debug)]
pub struct Emulator {
    dir: PathBuf,
}

impl Emulator {
    /// Builds the emulator with every kernel module of core-tensor's CUDA
    /// backend into `out` (created if needed), or reuses the one already
    /// there when nothing it is made of changed. Uses `$CXX`, else `c++`.
    pub fn build(out: &Path) -> Result<Self, BuildError> {
        // One build at a time, across threads and processes alike (test
        // binaries run side by side): `flock` locks an open file, and each
        // call opens its own, so a second builder waits, then finds it
        // built. Replacing `libcuda.so` under a process that has loaded it
        // would make its next dlopen (NCCL's, through the `libnccl.so`
        // link, is lazy) load the new file as a second library, with a
        // device memory of its own: "a buffer is not inside one device
        // allocation". The kernel frees the lock when the file closes, also
        // when a process dies.
        let _turn = build_lock(out)?;
        let compiler = env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
        let units = translation_units(kernel_modules());
        let fingerprint = fingerprint(&compiler, &units);
        let stamp = out.join("fingerprint");
        let emulator = Self {
            dir: std::path::absolute(out).map_err(|source| BuildError::Io {
                path: out.to_path_buf(),
                source,
            })?,
        };
        if fs::read_to_string(&stamp).is_ok_and(|s| s == fingerprint)
            && emulator.library().is_file()
        {
            return Ok(emulator);
        }
        // Built in a folder of its own, then moved into place with one
        // rename: a build that dies half way leaves no library behind.
        let work = out.join(format!("build-{}", std::process::id()));
        create_dir(&work)?;
        let result = build_in(&compiler, &work, &units, &emulator.library());
        let _ = fs::remove_dir_all(&work);
        result?;
        // The names cudarc loads the driver and NCCL by.
        for alias in ["libcuda.so.1", "libnccl.so"] {
            let link = out.join(alias);
            match std::os::unix::fs::symlink("libcuda.so", &link) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(BuildError::Io {
                        path: link,
                        source: e,
                    });
                }
                _ => {}
            }
        }
        write(&stamp, &fingerprint)?;
        Ok(emulator)
    }

    /// The folder holding `libcuda.so` and its `libcuda.so.1` and
    /// `libnccl.so` links.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `LD_LIBRARY_PATH` for a process that should load the emulator: its
    /// folder, then NVRTC's wheel when there is one ([`nvrtc_lib_dir`]),
    /// then the current value.
    pub fn library_path(&self) -> OsString {
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(nvrtc_lib_dir());
        if let Some(old) = env::var_os("LD_LIBRARY_PATH") {
            dirs.extend(env::split_paths(&old));
        }
        env::join_paths(dirs).unwrap_or_default()
    }

    fn library(&self) -> PathBuf {
        self.dir.join("libcuda.so")
    }
}

/// Compiles `units` in `work` and moves the linked library to `library`.
fn build_in(
    compiler: &str,
    work: &Path,
    units: &[(String, String)],
    library: &Path,
) -> Result<(), BuildError> {
    for (name, text) in HEADERS {
        write(&work.join(name), text)?;
    }
    let objects = compile_all(compiler, work, units)?;
    let built = work.join("libcuda.so");
    run(Command::new(compiler)
        .args(["-shared", "-o"])
        .arg(&built)
        .args(&objects)
        .args([SANITIZE, "-lpthread"]))
    .map_err(|e| e.for_compiler(compiler))?;
    rename(&built, library)
}

/// `(file name, C++ text)` of every translation unit: the runtime files, and one
/// per kernel module that wraps its source in a namespace of its own (the
/// modules repeat helper names), where `CUDA_EMU_DEVICE_MATH` puts the
/// GPU's math functions in front of libm's, and registers its kernels.
fn translation_units(modules: &[KernelModule]) -> Vec<(String, String)> {
    let mut units: Vec<(String, String)> = RUNTIME
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect();
    for module in modules {
        let ns = format!("emu_{}", module.name);
        let mut text = format!(
            "#include \"emu_kernel.h\"\nnamespace {ns} {{\nCUDA_EMU_DEVICE_MATH\n#line 1 \"{}.cu\"\n{}\n}}\n",
            module.name, module.source
        );
        text.push_str("static const cuda_emu::Kernel kernels[] = {\n");
        for f in module.functions {
            writeln!(text, "    {{\"{f}\", cuda_emu::entry<&{ns}::{f}>}},").expect("to a String");
        }
        text.push_str(
            "};\nstatic cuda_emu::Registrar registrar(kernels, sizeof kernels / sizeof kernels[0]);\n",
        );
        units.push((format!("{}.cpp", module.name), text));
    }
    units
}

fn fingerprint(compiler: &str, units: &[(String, String)]) -> String {
    let mut hasher = DefaultHasher::new();
    (compiler, CXX_FLAGS, HEADERS, units).hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Compiles every unit at once, one compiler process each; the objects.
fn compile_all(
    compiler: &str,
    src: &Path,
    units: &[(String, String)],
) -> Result<Vec<PathBuf>, BuildError> {
    let mut jobs = Vec::new();
    for (name, text) in units {
        let cpp = src.join(name);
        write(&cpp, text)?;
        jobs.push((cpp.with_extension("o"), cpp));
    }
    thread::scope(|scope| {
        let running: Vec<_> = jobs
            .iter()
            .map(|(object, cpp)| {
                scope.spawn(move || {
                    run(Command::new(compiler)
                        .args(CXX_FLAGS)
                        .arg("-c")
                        .arg(cpp)
                        .arg("-o")
                        .arg(object))
                })
            })
            .collect();
        for job in running {
            job.join()
                .expect("a compiler thread panicked")
                .map_err(|e| e.for_compiler(compiler))?;
        }
        Ok(())
    })?;
    Ok(jobs.into_iter().map(|(object, _)| object).collect())
}

/// Runs `command`; `Err(Spawn)` when it could not start, `Err(Failed)` with
/// its output when it failed.
fn run(command: &mut Command) -> Result<(), RunError> {
    let out = command.output().map_err(RunError::Spawn)?;
    if out.status.success() {
        return Ok(());
    }
    Err(RunError::Failed {
        command: format!("{command:?}"),
        log: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

enum RunError {
    Spawn(io::Error),
    Failed { command: String, log: String },
}

impl RunError {
    fn for_compiler(self, compiler: &str) -> BuildError {
        match self {
            Self::Spawn(source) => BuildError::NoCompiler {
                compiler: compiler.to_owned(),
                source,
            },
            Self::Failed { command, log } => BuildError::Compile { command, log },
        }
    }
}

/// `out/build.lock`, created if needed and held until the result is dropped.
fn build_lock(out: &Path) -> Result<fs::File, BuildError> {
    create_dir(out)?;
    let path = out.join("build.lock");
    let io_error = |source| BuildError::Io {
        path: path.clone(),
        source,
    };
    let file = fs::File::create(&path).map_err(io_error)?;
    file.lock().map_err(io_error)?;
    Ok(file)
}

fn create_dir(path: &Path) -> Result<(), BuildError> {
    fs::create_dir_all(path).map_err(|source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, text: &str) -> Result<(), BuildError> {
    fs::write(path, text).map_err(|source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn rename(from: &Path, to: &Path) -> Result<(), BuildError> {
    fs::rename(from, to).map_err(|source| BuildError::Io {
        path: to.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_builder_waits_until_the_first_is_done() {
        let out = env::temp_dir().join(format!("cuda-emu-lock-{}", std::process::id()));
        let held = build_lock(&out).unwrap();
        // Another open file: another builder (flock locks an open file).
        let other = fs::File::open(out.join("build.lock")).unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(fs::TryLockError::WouldBlock)
        ));
        drop(held);
        other.try_lock().unwrap();
        drop(other);
        fs::remove_dir_all(&out).unwrap();
    }
}
