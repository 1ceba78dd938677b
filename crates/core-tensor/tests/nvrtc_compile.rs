//! Every CUDA kernel compiles, checked without a GPU: NVRTC compiles each
//! module to PTX for sm_90 (the H100/H200 the trainer targets;
//! `CUDA_COMPUTE_CAP`, e.g. 80 or 8.0, picks another), each kernel the
//! backend launches must be in the PTX, and `ptxas -v` assembles it and
//! reports registers and spills per kernel (a spill fails); without ptxas,
//! NVRTC compiles each module to a CUBIN instead.
//!
//! Needs libnvrtc (e.g. `pip install nvidia-cuda-nvrtc-cu12`) and ptxas (e.g.
//! `pip install nvidia-cuda-nvcc-cu12`). NVRTC is found on LD_LIBRARY_PATH;
//! failing that, in `$NVRTC_LIB_DIR` or the pip wheel of `$PYTHON` (default
//! python3), and the test then re-runs itself with that folder on
//! LD_LIBRARY_PATH (the loader reads it only at process start). ptxas is
//! `$PTXAS`, else on PATH, else in the pip wheel, and must not be older than
//! NVRTC. Without them the test says what it skipped; with REQUIRE_NVRTC=1
//! it fails instead.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use core_tensor::backend::cuda::{
    Fp32Tile, GemmVariant, KernelModule, MatmulPrecision, compile_cubin, compile_ptx, nvrtc_version,
};
use core_tensor::ops::kernel_modules;
use cuda_emu::{nvrtc_lib_dir, wheel_dir};

/// Hopper, the H100 and H200: the architecture checked by default.
const DEFAULT_SM: u32 = 90;
/// Set in the re-run child, so that it cannot re-run itself again.
const RERUN: &str = "CORE_TENSOR_NVRTC_RERUN";
const TEST_NAME: &str = "every_kernel_compiles_with_nvrtc";

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let nvrtc = match nvrtc_version() {
        Ok(version) => version,
        Err(e) => return rerun_or_skip(&e.with_causes()),
    };
    println!("NVRTC {}.{}", nvrtc.0, nvrtc.1);
    let sm = target_sm();
    let (ptxas, release) = usable_ptxas(nvrtc).unzip();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvrtc-compile");
    std::fs::create_dir_all(&dir).expect("create the PTX folder");
    // The modules are independent programs: one worker per core takes the
    // next one (NVRTC's programs and ptxas processes run side by side), and
    // the table is put back in the modules' order.
    let modules = kernel_modules();
    let next = AtomicUsize::new(0);
    let workers = thread::available_parallelism().map_or(1, |n| n.get());
    let mut tables: Vec<(usize, Vec<Report>)> = thread::scope(|scope| {
        let running: Vec<_> = (0..workers.min(modules.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(module) = modules.get(i) else {
                            return done;
                        };
                        done.push((i, check_module(module, sm, ptxas.as_deref(), &dir)));
                    }
                })
            })
            .collect();
        running
            .into_iter()
            .flat_map(|worker| worker.join().expect("a module's check panicked"))
            .collect()
    });
    tables.sort_by_key(|(i, _)| *i);
    if let Some(release) = release {
        let table: Vec<Report> = tables.into_iter().flat_map(|(_, t)| t).collect();
        report(&table, sm, (nvrtc, release));
    }
}

/// Compiles `module` to PTX, checks every kernel the backend launches is in
/// it, and proves it assembles for `sm`: by `ptxas`, whose per-kernel report
/// it returns, or else by NVRTC's own CUBIN (what `Cuda::new` compiles on a
/// GPU; the emulated suites load that path's images too). Not both: ptxas
/// is the assembler NVRTC runs inside, so the second would compile the
/// module a third time for nothing.
fn check_module(module: &KernelModule, sm: u32, ptxas: Option<&Path>, dir: &Path) -> Vec<Report> {
    let ptx = compile_ptx(module, sm).unwrap_or_else(|e| panic!("{}", e.with_causes()));
    for f in module.functions {
        assert!(
            ptx.contains(&format!(".entry {f}(")),
            "{}: kernel `{f}` is not in the PTX",
            module.name
        );
    }
    if let Some(ptxas) = ptxas {
        let file = dir.join(format!("{}.ptx", module.name));
        std::fs::write(&file, &ptx).expect("write the PTX");
        return assemble(ptxas, &file, sm);
    }
    let cubin = compile_cubin(module, sm).unwrap_or_else(|e| panic!("{}", e.with_causes()));
    assert!(
        cubin.starts_with(b"\x7fELF"),
        "{}: not a CUBIN",
        module.name
    );
    Vec::new()
}

/// Prints the per-kernel table and fails on spills, on a GEMM kernel above
/// its ceiling (with the architecture, NVRTC and ptxas they were recorded
/// with), and on a register-staged kernel holding cp.async buffers.
fn report(table: &[Report], sm: u32, tools: Toolchain) {
    println!("ptxas -v for sm_{sm}:");
    println!(
        "{:<34} {:>5} {:>5} {:>8} {:>12} {:>11}",
        "kernel", "regs", "ceil", "smem B", "spill st B", "spill ld B"
    );
    for k in table {
        let ceiling = register_ceiling(&k.name).map_or(String::new(), |c| c.to_string());
        println!(
            "{:<34} {:>5} {:>5} {:>8} {:>12} {:>11}",
            k.name, k.registers, ceiling, k.smem, k.spill_stores, k.spill_loads
        );
    }
    let launched: usize = kernel_modules().iter().map(|m| m.functions.len()).sum();
    assert_eq!(
        table.len(),
        launched,
        "ptxas reported a different kernel count"
    );
    let spilling: Vec<_> = table
        .iter()
        .filter(|k| k.spill_stores + k.spill_loads > 0)
        .collect();
    assert!(spilling.is_empty(), "kernels spill registers: {spilling:?}");
    if (sm, tools) == CEILINGS_FOR {
        gemm_registers_stay_under_their_ceilings(table);
    } else {
        let (ceil_sm, ceil_tools) = CEILINGS_FOR;
        println!(
            "register ceilings not checked: recorded for sm_{ceil_sm} with {}, not sm_{sm} with {}",
            describe(ceil_tools),
            describe(tools)
        );
    }
    register_staging_reserves_one_buffer(table);
}

/// The most registers each GEMM family's kernels may take, per kind:
/// float32 and TF32 in the square tiles (each with its `_cp` twin), bf16,
/// and the wide tiles (`_f32w`, `_tf32w` and their `_cp` twins). They are
/// what ptxas 12.9 gave each family's kernels for sm_90 when one kernel
/// held both stagings (and the wide one both precisions: 646d205, before
/// the families were stamped per kind); sgemm.cuh's bounds
/// (`GEMM_ENTRY_BOUNDS`) keep every kind at or below them.
const REGISTER_CEILINGS: [(&str, [u32; 4]); 15] = [
    ("conv2d_fwd", [64, 64, 73, 166]),
    ("conv2d_fwd_partial", [64, 64, 73, 166]),
    ("conv2d_bwd_input", [64, 64, 80, 172]),
    ("conv2d_bwd_input_partial", [64, 64, 79, 172]),
    ("conv2d_bwd_weight", [80, 80, 87, 217]),
    ("conv2d_bwd_weight_partial", [80, 80, 87, 217]),
    ("conv2d_pool_fwd", [64, 60, 71, 0]),
    ("conv2d_relu_fwd", [64, 64, 77, 166]),
    ("linear_fwd", [77, 72, 73, 147]),
    ("linear_fwd_partial", [77, 72, 73, 147]),
    ("linear_bwd_weight", [63, 64, 72, 127]),
    ("linear_bwd_weight_partial", [64, 64, 72, 127]),
    ("linear_bwd_input", [64, 66, 74, 139]),
    ("linear_bwd_input_partial", [63, 66, 74, 139]),
    ("linear_relu_fwd", [77, 64, 73, 147]),
];

/// NVRTC's and ptxas's releases, `(major, minor)` each.
type Toolchain = ((i32, i32), (i32, i32));

/// The architecture and compilers `REGISTER_CEILINGS` hold for (others
/// allocate otherwise: the table is printed, the ceilings not asserted).
const CEILINGS_FOR: (u32, Toolchain) = (DEFAULT_SM, ((12, 9), (12, 9)));

fn describe(((nvrtc_major, nvrtc_minor), (ptxas_major, ptxas_minor)): Toolchain) -> String {
    format!("NVRTC {nvrtc_major}.{nvrtc_minor} and ptxas {ptxas_major}.{ptxas_minor}")
}

/// The column of `REGISTER_CEILINGS` that holds `variant`'s kernels: the
/// wide tiles share one, whatever their precision and staging; the square
/// tiles have one per precision, shared by both stagings.
fn ceiling_column(variant: GemmVariant) -> usize {
    match variant.runs() {
        (_, Fp32Tile::Wide, _) => 3,
        (MatmulPrecision::Fp32, ..) => 0,
        (MatmulPrecision::Tf32, ..) => 1,
        (MatmulPrecision::Bf16, ..) => 2,
    }
}

/// The GEMM family of `kernel` and the rest of its name: the longest
/// family of `REGISTER_CEILINGS` it starts with (a split family's name
/// extends its whole-tile family's).
fn gemm_family(kernel: &str) -> Option<(&'static str, &str, &'static [u32; 4])> {
    let (family, ceilings) = REGISTER_CEILINGS
        .iter()
        .filter(|(family, _)| kernel.starts_with(&format!("{family}_")))
        .max_by_key(|(family, _)| family.len())?;
    Some((family, &kernel[family.len() + 1..], ceilings))
}

/// `kernel`'s register ceiling, if it is a GEMM kernel of a listed kind
/// (not, e.g., `<family>_reduce_f32`, which sums the splits).
fn register_ceiling(kernel: &str) -> Option<u32> {
    let (_, kind, ceilings) = gemm_family(kernel)?;
    let variant = GemmVariant::ALL.iter().find(|v| v.suffix() == kind)?;
    Some(ceilings[ceiling_column(*variant)])
}

/// Every GEMM kernel takes no more registers than its ceiling: each
/// family (what has a `_bf16` kernel) is listed in `REGISTER_CEILINGS`,
/// and each of its kernels but the reduction is of a listed kind, every
/// kind with a ceiling there (0: none, `conv2d_pool_fwd`'s wide tiles).
fn gemm_registers_stay_under_their_ceilings(table: &[Report]) {
    let mut found: Vec<&str> = (table.iter())
        .filter_map(|k| k.name.strip_suffix("_bf16"))
        .collect();
    let mut listed: Vec<&str> = REGISTER_CEILINGS.iter().map(|(f, _)| *f).collect();
    found.sort_unstable();
    listed.sort_unstable();
    assert_eq!(found, listed, "the GEMM families and their ceilings differ");
    let products: Vec<&Report> = (table.iter())
        .filter(|k| gemm_family(&k.name).is_some_and(|(_, rest, _)| rest != "reduce_f32"))
        .collect();
    let unlisted: Vec<&str> = (products.iter())
        .filter(|k| register_ceiling(&k.name).is_none())
        .map(|k| k.name.as_str())
        .collect();
    assert!(
        unlisted.is_empty(),
        "GEMM kernels of no listed kind: {unlisted:?}"
    );
    let kinds: usize = (REGISTER_CEILINGS.iter())
        .map(|(_, ceilings)| {
            (GemmVariant::ALL.iter())
                .filter(|v| ceilings[ceiling_column(**v)] > 0)
                .count()
        })
        .sum();
    assert_eq!(products.len(), kinds, "a GEMM family lacks a kind");
    let over: Vec<String> = (products.iter())
        .filter_map(|k| {
            let ceiling = register_ceiling(&k.name)?;
            (k.registers > ceiling).then(|| format!("{} {} > {ceiling}", k.name, k.registers))
        })
        .collect();
    assert!(
        over.is_empty(),
        "GEMM kernels above their register ceilings: {over:?}"
    );
}

/// Each GEMM kernel's register staging (`<family>_<kind>`) reserves one
/// shared buffer of its largest tile, its cp.async twin (`…_cp`) two: the
/// staging is chosen at compile time, so no register-staged kernel holds
/// the cp.async buffers.
fn register_staging_reserves_one_buffer(table: &[Report]) {
    // One k tile (GEMM_BK = 16) of sgemm.cuh's largest shape of a kind, A
    // and B rows padded (`TileShape`): 32 + 128 in the square tiles, 64 +
    // 256 in the wide ones, padded by 8 for TF32 there, else by 4.
    let stage = |twin: &str| {
        let rows = if twin.ends_with("tf32w") {
            64 + 8 + 256 + 8
        } else if twin.ends_with("f32w") {
            64 + 4 + 256 + 4
        } else {
            32 + 4 + 128 + 4
        };
        16 * rows * 4
    };
    let mut twins = 0;
    for cp in table.iter().filter(|k| k.name.ends_with("_cp")) {
        let name = cp.name.strip_suffix("_cp").unwrap_or_default();
        let twin = (table.iter().find(|k| k.name == name))
            .unwrap_or_else(|| panic!("{}: no register-staged twin", cp.name));
        assert_eq!(
            cp.smem - twin.smem,
            stage(name),
            "{name} reserves {} B of shared memory and {} {} B: one buffer apart",
            twin.smem,
            cp.name,
            cp.smem
        );
        twins += 1;
    }
    assert!(twins > 0, "no cp.async kernel in the table");
}

/// A ptxas that can assemble this NVRTC's PTX (its release is not older:
/// PTX from a newer toolkit is refused), else `None` after saying why.
fn usable_ptxas(nvrtc: (i32, i32)) -> Option<(PathBuf, (i32, i32))> {
    let Some((ptxas, release)) = find_ptxas() else {
        skip(
            "ptxas not found (set PTXAS or pip install nvidia-cuda-nvcc-cu12): no register report",
        );
        return None;
    };
    if release < nvrtc {
        skip(&format!(
            "{} is release {}.{}, older than NVRTC {}.{}: no register report",
            ptxas.display(),
            release.0,
            release.1,
            nvrtc.0,
            nvrtc.1
        ));
        return None;
    }
    Some((ptxas, release))
}

/// `CUDA_COMPUTE_CAP` (as `nvidia-smi` prints it, 9.0, or as 90), else sm_90.
fn target_sm() -> u32 {
    let raw = env::var("CUDA_COMPUTE_CAP").unwrap_or_default();
    if raw.trim().is_empty() {
        return DEFAULT_SM;
    }
    raw.trim()
        .replace('.', "")
        .parse()
        .unwrap_or_else(|_| panic!("CUDA_COMPUTE_CAP={raw:?} is not a compute capability"))
}

/// What `ptxas -v` says about one kernel.
#[derive(Debug, Default)]
struct Report {
    name: String,
    registers: u32,
    smem: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// Assembles `ptx` for `sm` and parses the per-kernel report.
fn assemble(ptxas: &Path, ptx: &Path, sm: u32) -> Vec<Report> {
    let out = Command::new(ptxas)
        .args([format!("-arch=sm_{sm}").as_str(), "-v", "-o"])
        .arg(ptx.with_extension("cubin"))
        .arg(ptx)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ptxas failed on {}:\n{log}",
        ptx.display()
    );
    let mut reports: Vec<Report> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_owned();
            reports.push(Report {
                name,
                ..Report::default()
            });
        } else if let Some(r) = reports.last_mut() {
            if line.contains("spill stores") {
                r.spill_stores = number_before(line, "bytes spill stores");
                r.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("Used") {
                r.registers = number_before(line, "registers");
                r.smem = number_before(line, "bytes smem");
            }
        }
    }
    reports
}

/// The integer right before `label` in `line` (0 when absent).
fn number_before(line: &str, label: &str) -> u32 {
    line.split(label)
        .next()
        .and_then(|head| head.split([' ', ',']).rfind(|w| !w.is_empty()))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Without NVRTC on the loader path: re-runs this test with the wheel's lib
/// folder on LD_LIBRARY_PATH when there is one, else skips (or fails).
fn rerun_or_skip(why: &str) {
    if env::var_os(RERUN).is_none()
        && let Some(lib) = nvrtc_lib_dir()
    {
        let mut path = OsString::from(&lib);
        if let Some(old) = env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        println!("re-running with LD_LIBRARY_PATH={}", lib.display());
        let out = Command::new(env::current_exe().expect("test binary path"))
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env("LD_LIBRARY_PATH", path)
            .env(RERUN, "1")
            .output()
            .expect("re-run the test binary");
        println!("{}", String::from_utf8_lossy(&out.stdout));
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the re-run with NVRTC failed");
        return;
    }
    skip(why);
}

fn skip(why: &str) {
    if env::var("REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("REQUIRE_NVRTC=1, but: {why}");
    }
    println!("skipped: {why}");
}

/// `$PTXAS`, else `ptxas` on PATH, else the `nvidia-cuda-nvcc-cu12` wheel's,
/// with its release (`ptxas --version`: "... release 12.9, V12.9.86").
fn find_ptxas() -> Option<(PathBuf, (i32, i32))> {
    let release = |p: &PathBuf| {
        let out = Command::new(p).arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.split("release ").nth(1)?.split(',').next()?;
        let (major, minor) = version.split_once('.')?;
        Some((major.trim().parse().ok()?, minor.trim().parse().ok()?))
    };
    env::var_os("PTXAS")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("ptxas")])
        .chain(wheel_dir("cuda_nvcc").map(|d| d.join("bin/ptxas")))
        .find_map(|p| release(&p).map(|r| (p, r)))
}
