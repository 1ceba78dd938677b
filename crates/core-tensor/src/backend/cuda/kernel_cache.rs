//! The CUBINs NVRTC compiled, kept on disk so that the next process skips
//! the compiler: NVRTC takes about 20 s of CPU time for every module on
//! every start, and each rank of a job compiles for itself.
//!
//! Like the driver's own compute cache (`~/.nv/ComputeCache`) it is per
//! user and best effort: a miss, a corrupt entry or a directory that cannot
//! be written costs a compilation, never a wrong kernel or a failed start.
//! An entry's name is a SHA-256 of everything that decides the code (the
//! module's name and source, NVRTC's options and version), so an edited
//! kernel or another NVRTC never hits an old entry; its bytes end with a
//! SHA-256 of the CUBIN, checked on every read.
//!
//! Processes that start together (the ranks of a job, test binaries run
//! side by side) compile each module once: whoever misses an entry first
//! holds its lock file while it compiles ([`KernelCache::compiling`]), and
//! the others wait for it, then read the CUBIN it stored, instead of
//! spending the same CPU time on the same code.
//!
//! Where: `$CORE_TENSOR_KERNEL_CACHE` (`off` for none), else
//! `$XDG_CACHE_HOME/core-tensor/kernels`, else
//! `$HOME/.cache/core-tensor/kernels`, created readable by its owner only.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// The variable naming the cache's directory, or `off`.
pub const KERNEL_CACHE_VAR: &str = "CORE_TENSOR_KERNEL_CACHE";

/// Bumped when the layout of an entry changes, so old entries miss.
const FORMAT: &str = "core-tensor kernel cache 1";

/// The trailer: a SHA-256 of the CUBIN before it.
const CHECKSUM_LEN: usize = 32;

/// An entry larger than this is not ours (the largest CUBIN is under
/// 1 MiB): it is not read.
const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// How long a process waits for another's compilation of the same entry
/// before it compiles the module itself (NVRTC takes about 20 s of CPU a
/// module; a holder that is stopped, not dead, must not stall a start).
const COMPILE_WAIT: Duration = Duration::from_secs(300);

/// A directory of CUBINs.
#[derive(Debug)]
pub(super) struct KernelCache {
    dir: PathBuf,
}

/// What decides a module's CUBIN.
pub(super) struct CacheKey<'a> {
    pub module: &'a str,
    pub source: &'a str,
    pub options: &'a [String],
    pub nvrtc: (i32, i32),
}

impl KernelCache {
    /// The cache this process's environment names, or `None` (turned off,
    /// or no home directory to keep it in).
    pub fn from_env() -> Option<Self> {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        Self::resolve(var(KERNEL_CACHE_VAR), var("XDG_CACHE_HOME"), var("HOME"))
    }

    /// [`KernelCache::from_env`] from the three variables' values.
    fn resolve(
        explicit: Option<OsString>,
        xdg_cache_home: Option<OsString>,
        home: Option<OsString>,
    ) -> Option<Self> {
        let dir = match explicit {
            Some(v) if v == "off" => return None,
            Some(v) => PathBuf::from(v),
            None => xdg_cache_home
                .map(PathBuf::from)
                .or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))?
                .join("core-tensor")
                .join("kernels"),
        };
        Some(Self { dir })
    }

    #[cfg(test)]
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CUBIN stored for `key`, if an intact one is there.
    pub fn get(&self, key: &CacheKey) -> Option<Vec<u8>> {
        let file = fs::File::open(self.path(key)).ok()?;
        let mut bytes = Vec::new();
        file.take(MAX_ENTRY_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        if bytes.len() as u64 > MAX_ENTRY_BYTES {
            return None;
        }
        let body_len = bytes.len().checked_sub(CHECKSUM_LEN)?;
        let intact = Sha256::digest(&bytes[..body_len]).as_slice() == &bytes[body_len..];
        (intact && body_len > 0).then(|| {
            bytes.truncate(body_len);
            bytes
        })
    }

    /// Stores `cubin` for `key`. Written beside its place and renamed into
    /// it, so a reader (another rank) sees a whole entry or none.
    pub fn put(&self, key: &CacheKey, cubin: &[u8]) -> io::Result<()> {
        self.make_dir()?;
        let path = self.path(key);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let partial = path.with_extension(format!("{}-{nanos}.partial", std::process::id()));
        let written = fs::File::create(&partial)
            .and_then(|mut f| {
                f.write_all(cubin)?;
                f.write_all(&Sha256::digest(cubin))
            })
            .and_then(|()| fs::rename(&partial, &path));
        if written.is_err() {
            let _ = fs::remove_file(&partial);
        }
        written
    }

    /// The lock on `key`'s entry, held while this process compiles it and
    /// released when dropped (also by the kernel, when a holder dies). Once
    /// it returns, an entry that appeared meanwhile is another process's
    /// compilation: read it before compiling. `None` (a directory that
    /// cannot be written, a lock that stays held for [`COMPILE_WAIT`])
    /// only means compiling without it.
    pub fn compiling(&self, key: &CacheKey) -> Option<fs::File> {
        self.make_dir().ok()?;
        let file = fs::File::create(self.path(key).with_extension("lock")).ok()?;
        let deadline = Instant::now() + COMPILE_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => return Some(file),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(_) => return None,
            }
        }
    }

    /// Creates the cache's directory (and its parents), readable by its
    /// owner only, unless it is there.
    fn make_dir(&self) -> io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
    }

    fn path(&self, key: &CacheKey) -> PathBuf {
        let mut hash = Sha256::new();
        for part in [FORMAT, key.module, key.source] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        for option in key.options {
            hash.update(option.as_bytes());
            hash.update([0]);
        }
        hash.update(format!("nvrtc {}.{}", key.nvrtc.0, key.nvrtc.1).as_bytes());
        let hex: String = hash.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        self.dir.join(format!("{}-{hex}.cubin", key.module))
    }
}

#[cfg(test)]
#[path = "kernel_cache_tests.rs"]
mod tests;
