//! Finding `libnccl`. cudarc asks the dynamic loader for `libnccl.so`
//! (never the `libnccl.so.2` that NCCL's packages and Python wheels ship
//! under their soname), so a machine can have NCCL and still fail to load it.
//! When loading fails, [`search`] looks where NCCL usually lives and the
//! error says what it found and the one command that makes it loadable.
//!
//! A module beside `nccl/`, not in it: the crate's error names this report
//! ([`crate::CommError::NcclMissing`]), and `nccl/` itself sits above the
//! error type (it returns it).

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where to look, read from the environment by [`SearchRoots::from_env`]
/// (a separate value so tests can point it at a fake tree).
#[derive(Debug, Clone, Default)]
pub struct SearchRoots {
    /// `LD_LIBRARY_PATH`.
    pub ld_library_path: Option<OsString>,
    /// The system's library directories.
    pub system: Vec<PathBuf>,
    /// CUDA toolkit and NCCL install roots (`CUDA_HOME`, `NCCL_HOME`, ...),
    /// searched in `lib64/` and `lib/`.
    pub toolkits: Vec<PathBuf>,
    /// Python installation prefixes (virtual environments, conda, user
    /// site, every `python3` on `PATH`), searched in `lib/python3*/{site,dist}-packages/nvidia/nccl/lib`.
    pub python_prefixes: Vec<PathBuf>,
}

impl SearchRoots {
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
        let system = [
            format!("/usr/lib/{triple}"),
            format!("/lib/{triple}"),
            "/usr/lib64".into(),
            "/usr/lib".into(),
            "/usr/local/lib".into(),
        ];
        let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "NCCL_HOME", "NCCL_ROOT"]
            .iter()
            .filter_map(|v| var(v).map(PathBuf::from))
            .collect();
        toolkits.push("/usr/local/cuda".into());
        let mut python_prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|v| var(v).map(PathBuf::from))
            .collect();
        if let Some(home) = var("HOME") {
            python_prefixes.push(PathBuf::from(home).join(".local"));
        }
        // The installation of every `python3` on PATH (a venv's bin/ too).
        if let Some(path) = var("PATH") {
            python_prefixes.extend(
                std::env::split_paths(&path)
                    .filter(|dir| dir.join("python3").exists())
                    .filter_map(|dir| dir.parent().map(Path::to_path_buf)),
            );
        }
        python_prefixes.extend(["/usr/local".into(), "/usr".into()]);
        SearchRoots {
            ld_library_path: var("LD_LIBRARY_PATH"),
            system: system.into_iter().map(PathBuf::from).collect(),
            toolkits,
            python_prefixes,
        }
    }
}

/// One directory that was searched, and the NCCL library found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchedDir {
    /// Which kind of place: "LD_LIBRARY_PATH", "system", "CUDA/NCCL
    /// install", "Python wheel".
    pub kind: &'static str,
    pub dir: PathBuf,
    /// `libnccl.so` or `libnccl.so.<N>` in `dir`, if any.
    pub found: Option<PathBuf>,
}

/// The result of looking for NCCL after `libnccl.so` failed to load; its
/// `Display` is the whole user-facing explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclSearch {
    pub searched: Vec<SearchedDir>,
}

impl NcclSearch {
    /// The first library found under a versioned name only (the usual case:
    /// a wheel's `libnccl.so.2`).
    pub fn found(&self) -> Option<&Path> {
        self.searched.iter().find_map(|s| s.found.as_deref())
    }
}

/// Looks for NCCL in every place `roots` names, in that order.
pub fn search(roots: &SearchRoots) -> NcclSearch {
    let mut searched = Vec::new();
    let mut visit = |kind: &'static str, dir: PathBuf| {
        if !searched.iter().any(|s: &SearchedDir| s.dir == dir) {
            let found = nccl_in(&dir);
            searched.push(SearchedDir { kind, dir, found });
        }
    };
    if let Some(paths) = &roots.ld_library_path {
        for dir in std::env::split_paths(paths).filter(|d| !d.as_os_str().is_empty()) {
            visit("LD_LIBRARY_PATH", dir);
        }
    }
    for dir in &roots.system {
        visit("system", dir.clone());
    }
    for root in &roots.toolkits {
        for lib in ["lib64", "lib"] {
            visit("CUDA/NCCL install", root.join(lib));
        }
    }
    for prefix in &roots.python_prefixes {
        for dir in wheel_dirs(prefix) {
            visit("Python wheel", dir);
        }
    }
    NcclSearch { searched }
}

/// `<prefix>/lib/python3*/{site,dist}-packages/nvidia/nccl/lib`, and
/// Debian's unversioned `<prefix>/lib/python3/dist-packages/...`.
fn wheel_dirs(prefix: &Path) -> Vec<PathBuf> {
    let lib = prefix.join("lib");
    let Ok(entries) = std::fs::read_dir(&lib) else {
        return Vec::new();
    };
    let mut pythons: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path())
        .collect();
    pythons.sort();
    pythons
        .iter()
        .flat_map(|py| ["site-packages", "dist-packages"].map(|p| py.join(p)))
        .map(|packages| packages.join("nvidia/nccl/lib"))
        .filter(|dir| dir.is_dir())
        .collect()
}

/// `dir/libnccl.so`, else the highest-sorting `dir/libnccl.so.*`.
fn nccl_in(dir: &Path) -> Option<PathBuf> {
    let plain = dir.join("libnccl.so");
    if plain.exists() {
        return Some(plain);
    }
    let mut versioned: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("libnccl.so."))
                .is_some_and(|v| !v.is_empty() && v.split('.').all(|d| d.parse::<u32>().is_ok()))
        })
        .collect();
    versioned.sort();
    versioned.pop()
}

impl fmt::Display for NcclSearch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "the NCCL library could not be loaded: the dynamic loader found no `libnccl.so`"
        )?;
        writeln!(f, "  searched:")?;
        for s in &self.searched {
            match &s.found {
                Some(lib) => writeln!(
                    f,
                    "    {} {}: found {}",
                    s.kind,
                    s.dir.display(),
                    lib.display()
                )?,
                None => writeln!(f, "    {} {}: nothing", s.kind, s.dir.display())?,
            }
        }
        match self.found() {
            Some(lib) if lib.file_name().is_some_and(|n| n == "libnccl.so") => write!(
                f,
                "  fix: {} has `libnccl.so` but is not on the loader's path: \
                 export LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH",
                lib.display(),
                lib.parent().unwrap_or(Path::new(".")).display()
            ),
            Some(lib) => write!(
                f,
                "  fix: NCCL is installed under its versioned name only; give it the plain name \
                 in a folder of its own and put that on the loader's path:\n    \
                 mkdir -p ~/.local/lib/nccl && ln -sf {} ~/.local/lib/nccl/libnccl.so && \
                 export LD_LIBRARY_PATH=~/.local/lib/nccl:$LD_LIBRARY_PATH",
                lib.display()
            ),
            None => write!(
                f,
                "  fix: install NCCL (the `nvidia-nccl-cu12` or `nvidia-nccl-cu13` Python wheel, \
                 or the distribution's libnccl2 and libnccl-dev packages) and rerun; \
                 or use --backend tcp"
            ),
        }
    }
}
