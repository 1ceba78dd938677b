//! Repository rules, checked as ordinary tests (as rust-analyzer's `tidy`):
//! the dependency rules of ARCHITECTURE.md, a length limit on source files
//! (and a report of the long ones), ARCHITECTURE.md's list of the files
//! that hold `unsafe`, and shellcheck on every shell script.
//!
//! Files are those git knows or would add (tracked, or untracked and not
//! ignored), so build outputs and downloaded data never count.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The dependency rules, as ARCHITECTURE.md states them (its paragraph
/// "Dependencies point one way"; change both together): each workspace crate
/// and the workspace crates it may name in `[dependencies]` (or
/// `[build-dependencies]`). Its tests may use those and, whatever the crate,
/// `cuda-emu` (`TEST_TOOL`), so no library and not the trainer may name
/// `cuda-emu` outside `[dev-dependencies]`.
const RULES: [(&str, &[&str]); 9] = [
    ("core-tensor", &[]),
    ("comm", &[]),
    ("sampler", &[]),
    ("fashion-mnist", &[]),
    // torchrun's agent: it knows the store, and no training code.
    ("launcher", &["comm"]),
    (
        "trainer",
        &[
            "core-tensor",
            "comm",
            "sampler",
            "fashion-mnist",
            "launcher",
        ],
    ),
    ("cuda-emu", &["core-tensor"]),
    (
        "benches",
        &["core-tensor", "comm", "fashion-mnist", "trainer"],
    ),
    // `cargo xtask fetch-data` checks the files fashion-mnist pins;
    // `cargo xtask cuda-emu` builds the emulator.
    ("xtask", &["fashion-mnist", TEST_TOOL]),
];

/// The CPU stand-in for the CUDA driver: a dev-dependency wherever tests need it.
const TEST_TOOL: &str = "cuda-emu";

/// No source file is longer (lines).
const MAX_LINES: usize = 900;
/// Source files longer than this are named in a report (lines): a file
/// that holds several concepts is worth cutting by them, one that holds
/// one long concept is not worth cutting by its length.
const LONG_LINES: usize = 450;
/// Where source files live, and which extensions make one.
const SOURCE_DIRS: [&str; 4] = ["crates", "xtask", "benches", "slurm"];
const SOURCE_EXTENSIONS: [&str; 8] = ["rs", "cu", "cuh", "cpp", "h", "py", "sh", "sbatch"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lies in the workspace")
        .to_owned()
}

/// What `program args` prints, run in the workspace root; it must succeed.
fn stdout_of(program: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("running {program} (the tidy checks need it): {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Every file git knows or would add, relative to the workspace root.
fn repository_files() -> Vec<PathBuf> {
    let listed = stdout_of(
        "git",
        &[
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
    );
    let mut files: Vec<PathBuf> = String::from_utf8(listed)
        .expect("file names are UTF-8")
        .split('\0')
        .filter(|name| !name.is_empty())
        .map(PathBuf::from)
        // Tracked files deleted in the work tree are not there to check.
        .filter(|path| root().join(path).is_file())
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Each workspace member and the workspace crates it names, by kind of
/// dependency: `normal` (`[dependencies]`, `[build-dependencies]`) and `dev`.
#[derive(Default)]
struct Uses {
    normal: BTreeSet<String>,
    dev: BTreeSet<String>,
}

fn workspace_dependencies() -> BTreeMap<String, Uses> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let listed = stdout_of(
        &cargo,
        &[
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ],
    );
    let metadata: serde_json::Value = serde_json::from_slice(&listed).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let members: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let mut found = BTreeMap::new();
    for package in packages {
        let mut uses = Uses::default();
        for dep in package["dependencies"].as_array().unwrap() {
            let name = dep["name"].as_str().unwrap();
            if !members.contains(name) {
                continue;
            }
            let set = match dep["kind"].as_str() {
                Some("dev") => &mut uses.dev,
                _ => &mut uses.normal,
            };
            set.insert(name.to_owned());
        }
        found.insert(package["name"].as_str().unwrap().to_owned(), uses);
    }
    found
}

#[test]
fn crates_depend_as_architecture_md_says() {
    let found = workspace_dependencies();
    let mut broken = Vec::new();
    for (krate, uses) in &found {
        let Some((_, allowed)) = RULES.iter().find(|(name, _)| name == krate) else {
            broken.push(format!(
                "{krate}: no rule; add one to RULES and to ARCHITECTURE.md"
            ));
            continue;
        };
        for dep in &uses.normal {
            if !allowed.contains(&dep.as_str()) {
                broken.push(format!("{krate} may not depend on {dep}"));
            }
        }
        for dep in &uses.dev {
            if !allowed.contains(&dep.as_str()) && dep != TEST_TOOL {
                broken.push(format!("{krate}'s tests may not depend on {dep}"));
            }
        }
    }
    for (krate, _) in &RULES {
        if !found.contains_key(*krate) {
            broken.push(format!("a rule for {krate}, which is no workspace member"));
        }
    }
    assert!(
        broken.is_empty(),
        "dependency rules (ARCHITECTURE.md) broken:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn source_files_are_short() {
    let mut long = Vec::new();
    for path in repository_files() {
        let in_sources = SOURCE_DIRS.iter().any(|dir| path.starts_with(dir));
        let is_source = path
            .extension()
            .and_then(|ext| ext.to_str())
            .is_some_and(|ext| SOURCE_EXTENSIONS.contains(&ext));
        if !(in_sources && is_source) {
            continue;
        }
        let text = std::fs::read_to_string(root().join(&path))
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let lines = text.lines().count();
        if lines > LONG_LINES {
            long.push((lines, path));
        }
    }
    long.sort_by(|a, b| b.cmp(a));
    let named: Vec<String> = long
        .iter()
        .map(|(lines, path)| format!("{} ({lines} lines)", path.display()))
        .collect();
    if !named.is_empty() {
        // Past the test harness's capture, so that the report is seen.
        let _ = writeln!(
            std::io::stderr(),
            "source files over {LONG_LINES} lines (cut one by the concepts it holds, if several):\n  {}",
            named.join("\n  ")
        );
    }
    let too_long: Vec<&String> = long
        .iter()
        .zip(&named)
        .filter(|((lines, _), _)| *lines > MAX_LINES)
        .map(|(_, name)| name)
        .collect();
    assert!(
        too_long.is_empty(),
        "source files over {MAX_LINES} lines (split them by what they hold):\n  {}",
        too_long
            .iter()
            .map(|name| name.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

/// ARCHITECTURE.md's section of the files that hold `unsafe`.
const UNSAFE_SECTION: &str = "## `unsafe`";

/// The files ARCHITECTURE.md's `unsafe` section names, as path patterns
/// from the workspace root: each list line holds groups `crate: `path`,
/// `path` ...` split by `; `, each path relative to the crate's folder
/// (`crates/NAME`, or `NAME` for `xtask` and `benches`), `*` any part of
/// one folder or file name, `{a,b}` either.
fn unsafe_list(architecture: &str) -> Vec<String> {
    let start = architecture
        .find(UNSAFE_SECTION)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {UNSAFE_SECTION}"));
    let section = &architecture[start + UNSAFE_SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut patterns = Vec::new();
    for line in section.lines().filter_map(|l| l.strip_prefix("- ")) {
        for group in line.split("; ") {
            let (name, paths) = group.split_once(": ").unwrap_or_else(|| {
                panic!("ARCHITECTURE.md's `unsafe` list: no `crate: ` in {group:?}")
            });
            let dir = match root().join("crates").join(name).is_dir() {
                true => format!("crates/{name}"),
                false => name.to_string(),
            };
            for path in paths.split('`').skip(1).step_by(2) {
                patterns.extend(expand_braces(&format!("{dir}/{path}")));
            }
        }
    }
    patterns
}

/// `a/{b,c}.rs` as `a/b.rs` and `a/c.rs` (one pair of braces).
fn expand_braces(pattern: &str) -> Vec<String> {
    let Some((head, rest)) = pattern.split_once('{') else {
        return vec![pattern.to_string()];
    };
    let (choices, tail) = rest.split_once('}').expect("a `{` is closed");
    choices
        .split(',')
        .map(|choice| format!("{head}{choice}{tail}"))
        .collect()
}

/// Whether `path` matches `pattern`, part by part, `*` any run of
/// characters within one part.
fn path_matches(pattern: &str, path: &str) -> bool {
    fn part(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|skip| part(rest, &text[skip..])),
            Some((c, rest)) => text.first() == Some(c) && part(rest, &text[1..]),
        }
    }
    let (pattern, path): (Vec<&str>, Vec<&str>) =
        (pattern.split('/').collect(), path.split('/').collect());
    pattern.len() == path.len()
        && pattern
            .iter()
            .zip(&path)
            .all(|(p, t)| part(p.as_bytes(), t.as_bytes()))
}

/// Whether Rust source `text` uses the `unsafe` keyword outside comments.
fn holds_unsafe(text: &str) -> bool {
    text.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        code.match_indices("unsafe").any(|(at, word)| {
            let ident = |c: char| c.is_alphanumeric() || c == '_';
            !code[..at].ends_with(ident) && !code[at + word.len()..].starts_with(ident)
        })
    })
}

#[test]
fn unsafe_lives_where_architecture_md_says() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let patterns = unsafe_list(&architecture);
    // Tests (a `tests/` folder) may call what they test unsafely; the
    // list is of the code that ships.
    let holding: Vec<String> = repository_files()
        .into_iter()
        .filter(|path| {
            SOURCE_DIRS.iter().any(|dir| path.starts_with(dir))
                && path.extension().is_some_and(|ext| ext == "rs")
                && !path.components().any(|c| c.as_os_str() == "tests")
        })
        .filter(|path| holds_unsafe(&std::fs::read_to_string(root().join(path)).unwrap()))
        .map(|path| path.to_string_lossy().into_owned())
        .collect();
    let unnamed: Vec<&String> = holding
        .iter()
        .filter(|path| !patterns.iter().any(|p| path_matches(p, path)))
        .collect();
    let stale: Vec<&String> = patterns
        .iter()
        .filter(|p| !holding.iter().any(|path| path_matches(p, path)))
        .collect();
    assert!(
        unnamed.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md's {UNSAFE_SECTION} list and the sources disagree:\n  \
         holding `unsafe`, not named: {unnamed:?}\n  named, holding none: {stale:?}"
    );
}

#[test]
fn the_unsafe_list_reads_groups_braces_and_stars() {
    let list = unsafe_list(
        "## `unsafe`: only here\n\n- comm: `src/nccl/{ffi,mod}.rs`; xtask: `src/*.rs`\n\n## next\n- sampler: `src/lib.rs`\n",
    );
    assert_eq!(
        list,
        [
            "crates/comm/src/nccl/ffi.rs",
            "crates/comm/src/nccl/mod.rs",
            "xtask/src/*.rs"
        ]
    );
    assert!(path_matches("xtask/src/*.rs", "xtask/src/image.rs"));
    assert!(!path_matches("xtask/src/*.rs", "xtask/src/image/tar.rs"));
    assert!(holds_unsafe("    let x = unsafe { f() };"));
    assert!(!holds_unsafe(
        "    // unsafe here\n    let not_unsafe_at_all = 1;"
    ));
}

/// Whether `path` is a shell script: `.sh`, `.sbatch`, or no extension and a
/// shell on its `#!` line (`.ci/run`). The slurm-submit template
/// (`job.sbatch.in`) is not one until rendered; its renderings in
/// `tests/golden/` are.
fn is_shell_script(path: &Path) -> bool {
    match path.extension().and_then(|ext| ext.to_str()) {
        Some("sh" | "sbatch") => true,
        Some(_) => false,
        None => std::fs::read_to_string(root().join(path)).is_ok_and(|text| {
            let Some(shebang) = text.lines().next().and_then(|l| l.strip_prefix("#!")) else {
                return false;
            };
            let mut words = shebang.split_whitespace();
            let mut program = words.next().unwrap_or("");
            if program.ends_with("/env") {
                program = words.next().unwrap_or("");
            }
            matches!(program.rsplit('/').next(), Some("sh" | "bash"))
        }),
    }
}

#[test]
fn shell_scripts_pass_shellcheck() {
    let scripts: Vec<PathBuf> = repository_files()
        .into_iter()
        .filter(|path| is_shell_script(path))
        .collect();
    assert!(
        scripts.iter().any(|p| p.ends_with(".ci/run")),
        "found no shell scripts: {scripts:?}"
    );
    let checked = Command::new("shellcheck")
        .args(&scripts)
        .current_dir(root())
        .output();
    let out = match checked {
        Ok(out) => out,
        Err(err) => {
            assert!(
                std::env::var_os("REQUIRE_SHELLCHECK").is_none_or(|v| v != "1"),
                "REQUIRE_SHELLCHECK=1 but shellcheck cannot run: {err}"
            );
            // Past the test harness's capture, so that the skip is seen.
            let _ = writeln!(
                std::io::stderr(),
                "skipped shellcheck of {} scripts: {err}; `apt-get install shellcheck`",
                scripts.len()
            );
            return;
        }
    };
    assert!(
        out.status.success(),
        "shellcheck {}:\n{}{}",
        scripts
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
