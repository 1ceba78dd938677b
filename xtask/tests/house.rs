//! The house rules, checked as tests (ARCHITECTURE.md states them): the
//! modules of the trainer, the launcher, core-tensor and comm stand in
//! layers and import only from layers below their own; no crate of the workspace has a circle of
//! files (files that import each other in a loop); no struct in the
//! workspace holds more than 12 fields; the model kinds are named in the
//! model registry's folder alone; ARCHITECTURE.md stays a map.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each crate's top-level modules, layer by layer from the ground up:
/// a module may use (`crate::…`) only modules of lower layers. The same
/// table is ARCHITECTURE.md's "Layers" (change both together).
const LAYERS: [(&str, &[&[&str]]); 4] = [
    (
        "crates/core-tensor/src",
        &[
            &["error", "flat", "gemm", "rng", "simd"],
            &["backend"],
            &["ops"],
            &["testing"],
            &["lib"],
        ],
    ),
    (
        "crates/comm/src",
        &[
            &["auth", "deadline", "flight", "hostlist", "nccl_library"],
            &["error", "job_auth", "launch_env"],
            &["communicator", "config", "store_protocol"],
            &["store_server"],
            &["store"],
            &["nccl", "rendezvous"],
            &["tcp"],
            &["fuzz", "live", "local"],
            &["lib"],
        ],
    ),
    (
        "crates/trainer/src",
        &[
            &[
                "bounded_read",
                "comm_thread",
                "data",
                "error_file",
                "model",
                "output_paths",
                "phases",
                "stop",
                "topology",
            ],
            &["checkpoint", "ddp", "monitor"],
            &["train"],
            &["pipeline", "report"],
            &["rank"],
            &["models"],
            &["run"],
            &["cli"],
            &["lib", "main"],
        ],
    ),
    (
        "crates/launcher/src",
        &[
            &["say", "error", "contract", "flags", "verdict"],
            &["args", "attempt", "heartbeat", "plan", "workers"],
            &["flight", "group", "spec"],
            &["supervise"],
            &["agent"],
            &["lib"],
        ],
    ),
];

/// The folders whose files make one crate each, with `lib.rs` or
/// `main.rs` at their root: every crate of the workspace that has modules
/// (the benches' other targets are one file each).
fn crate_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .collect();
    roots.push(root().join("xtask/src"));
    roots.push(root().join("benches/benches/allreduce"));
    roots.sort();
    for dir in &roots {
        let has_root = ["lib.rs", "main.rs"].iter().any(|f| dir.join(f).is_file());
        assert!(has_root, "{} holds no lib.rs or main.rs", dir.display());
    }
    roots
}

/// Fields a struct may hold at the most.
const MAX_FIELDS: usize = 12;
/// The one place outside the registry that names a model kind, and why.
const LEGACY_KIND: (&str, &str) = (
    "crates/trainer/src/checkpoint/state.rs",
    "a checkpoint from before checkpoints named their model is the CNN's",
);

/// ARCHITECTURE.md's length at the most: a map, not a manual.
const MAX_MAP_LINES: usize = 250;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lies in the workspace")
        .to_owned()
}

/// Every `.rs` file under `dir` (relative to the workspace root), but
/// test files (`tests.rs`, `*_tests.rs`, `tests/`).
fn sources(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() && name != "tests" {
                walk(&path, out);
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(dir), &mut out);
    out.sort();
    out
}

/// Every `.rs` file of the workspace's packages, tests included.
fn every_rust_file() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.ends_with("target") {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for dir in ["crates", "xtask", "benches"] {
        walk(&root().join(dir), &mut out);
    }
    out.sort();
    out
}

/// A source file's code: before its unit tests (`#[cfg(test)]`), without
/// its comments (a doc link is no import).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let code = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => &text,
    };
    (code.lines())
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file of `base` belongs to (`lib` for lib.rs).
fn module_of(base: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(base).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules `text` names as `crate::<module>` (in `use`
/// lists too: `crate::{a, b::c}`).
fn crate_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let end = list.find('}').unwrap_or(list.len());
            for item in list[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.push(name);
            }
        } else {
            found.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    found.retain(|m| !m.is_empty() && m.chars().next().is_some_and(|c| c.is_lowercase()));
    found
}

#[test]
fn modules_import_only_from_the_layers_below() {
    let mut broken = Vec::new();
    for (dir, layers) in LAYERS {
        let layer_of: BTreeMap<&str, usize> = (layers.iter().enumerate())
            .flat_map(|(i, mods)| mods.iter().map(move |m| (*m, i)))
            .collect();
        let base = root().join(dir);
        for path in sources(dir) {
            let module = module_of(&base, &path);
            let Some(&mine) = layer_of.get(module.as_str()) else {
                broken.push(format!("{dir}: module {module} is in no layer of LAYERS"));
                continue;
            };
            for used in crate_paths(&code(&path)) {
                let Some(&theirs) = layer_of.get(used.as_str()) else {
                    continue;
                };
                if used != module && theirs >= mine {
                    broken.push(format!(
                        "{}: {module} (layer {mine}) uses crate::{used} (layer {theirs})",
                        path.strip_prefix(root()).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the layers:\n  {}",
        broken.join("\n  ")
    );
    // The reader reads: use lists, paths, and nothing but `crate::`.
    let read = crate_paths("use crate::{a, b::c};\nlet x = crate::d::E;\nsuper::f();");
    assert_eq!(read, ["a", "b", "d"]);
}

/// The named fields of each struct of `text` (`pub`, `pub(crate)` or
/// none), by the struct's name.
fn struct_fields(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let after_pub = trimmed
            .strip_prefix("pub(crate) ")
            .or_else(|| trimmed.strip_prefix("pub(super) "))
            .or_else(|| trimmed.strip_prefix("pub "))
            .unwrap_or(trimmed);
        let Some(decl) = after_pub.strip_prefix("struct ") else {
            continue;
        };
        if !line.trim_end().ends_with('{') {
            continue;
        }
        let name: String = decl
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let indent = line.len() - trimmed.len();
        let mut fields = 0;
        for inner in &lines[i + 1..] {
            let t = inner.trim_start();
            let depth = inner.len() - t.len();
            if t.starts_with('}') && depth == indent {
                break;
            }
            let field = t
                .strip_prefix("pub(crate) ")
                .or_else(|| t.strip_prefix("pub(super) "))
                .or_else(|| t.strip_prefix("pub "))
                .unwrap_or(t);
            let is_field = depth == indent + 4
                && !field.starts_with("//")
                && !field.starts_with('#')
                && field.split_once(':').is_some_and(|(n, _)| {
                    !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_')
                });
            fields += usize::from(is_field);
        }
        found.push((name, fields));
    }
    found
}

/// Every crate and xtask (its `Args` too), their tests included.
#[test]
fn no_struct_holds_more_than_twelve_fields() {
    let mut wide = Vec::new();
    let files = every_rust_file();
    let xtask_args = root().join("xtask/src/main.rs");
    assert!(files.contains(&xtask_args), "xtask's Args are read");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (name, fields) in struct_fields(&text) {
            if fields > MAX_FIELDS {
                let at = path.strip_prefix(root()).unwrap().display();
                wide.push(format!("{at}: struct {name} has {fields} fields"));
            }
        }
    }
    assert!(
        wide.is_empty(),
        "structs over {MAX_FIELDS} fields (split them by what they hold):\n  {}",
        wide.join("\n  ")
    );
    // The counter counts: a struct of 13 fields is caught.
    let thirteen: String = (0..13).map(|i| format!("    pub f{i}: u8,\n")).collect();
    let text = format!("pub struct Wide {{\n{thirteen}}}\n");
    assert_eq!(struct_fields(&text), [("Wide".to_string(), 13)]);
}

/// The module path of a file of the crate whose root folder is `base`:
/// `a/b.rs` and `a/b/mod.rs` are `a::b`, `lib.rs` and `main.rs` the root.
fn module_path(base: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(base).unwrap().with_extension("");
    let mut segments: Vec<String> = (rel.components())
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    let last = segments.last().map(String::as_str);
    if matches!(last, Some("mod" | "lib" | "main")) && (segments.len() > 1 || last != Some("mod")) {
        segments.pop();
    }
    segments
}

/// The paths `text` names from inside module `at` (`crate::…`,
/// `super::…`, `self::…`, in `use` lists too), made absolute: the
/// segments after `crate`.
fn named_paths(at: &[String], text: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> &str {
        let end = s
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        &s[..end]
    }
    /// The paths of a `use` tree starting at `s` below `prefix`.
    fn tree(prefix: Vec<String>, s: &str, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        let mut rest = s.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut start = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            tree(path.clone(), &group[start..i], out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            tree(path.clone(), &group[start..i], out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let name = ident(rest);
            if name.is_empty() {
                break;
            }
            path.push(name.to_string());
            match rest[name.len()..].trim_start().strip_prefix("::") {
                Some(after) => rest = after.trim_start(),
                None => break,
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices("::") {
        let start = text[..i]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let head = &text[start..i];
        let glued = start > 0 && matches!(bytes[start - 1], b':');
        if glued || !matches!(head, "crate" | "super" | "self") {
            continue;
        }
        let mut named = Vec::new();
        tree(Vec::new(), &text[i + 2..], &mut named);
        for path in named {
            let mut base: Vec<String> = match head {
                "crate" => Vec::new(),
                "super" => at[..at.len().saturating_sub(1)].to_vec(),
                _ => at.to_vec(),
            };
            let mut rest = path.into_iter().peekable();
            while rest.next_if(|s| s == "super").is_some() {
                base.pop();
            }
            base.extend(rest);
            out.push(base);
        }
    }
    out
}

/// The circles among `files` (module path, what it names), each as its
/// files' module paths: files that reach each other through what they
/// name. A file naming its own module's ancestors or descendants is no
/// arrow: a parent and its children are one concept, spoken of through
/// `super`.
fn circles(files: &[(Vec<String>, Vec<Vec<String>>)]) -> Vec<Vec<String>> {
    let index: BTreeMap<&[String], usize> = (files.iter().enumerate())
        .map(|(i, (module, _))| (module.as_slice(), i))
        .collect();
    let nested = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let arrows: Vec<Vec<usize>> = (files.iter())
        .map(|(module, named)| {
            let mut to: Vec<usize> = (named.iter())
                .filter_map(|path| {
                    let longest = (0..=path.len())
                        .rev()
                        .find(|&n| index.contains_key(&path[..n]))?;
                    let target = &path[..longest];
                    (!nested(module, target)).then(|| index[target])
                })
                .collect();
            to.sort_unstable();
            to.dedup();
            to
        })
        .collect();
    let reach = |from: usize| {
        let mut seen = vec![false; files.len()];
        let mut stack = arrows[from].clone();
        while let Some(at) = stack.pop() {
            if !std::mem::replace(&mut seen[at], true) {
                stack.extend(&arrows[at]);
            }
        }
        seen
    };
    let reaches: Vec<Vec<bool>> = (0..files.len()).map(reach).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    let mut placed = vec![false; files.len()];
    for i in 0..files.len() {
        if placed[i] || !reaches[i][i] {
            continue;
        }
        let circle: Vec<String> = (0..files.len())
            .filter(|&j| reaches[i][j] && reaches[j][i])
            .inspect(|&j| placed[j] = true)
            .map(|j| files[j].0.join("::"))
            .collect();
        found.push(circle);
    }
    found
}

#[test]
fn no_crate_has_a_circle_of_files() {
    let mut found = Vec::new();
    for base in crate_roots() {
        let mut files = Vec::new();
        let mut dirs = vec![base.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                if path.is_dir() {
                    dirs.push(path);
                } else if name.ends_with(".rs")
                    && name != "tests.rs"
                    && !name.ends_with("_tests.rs")
                {
                    let module = module_path(&base, &path);
                    let named = named_paths(&module, &code(&path));
                    files.push((module, named));
                }
            }
        }
        files.sort();
        for circle in circles(&files) {
            let at = base.strip_prefix(root()).unwrap().display();
            found.push(format!("{at}: {}", circle.join(" <-> ")));
        }
    }
    assert!(
        found.is_empty(),
        "circles of files (move what each needs of the other to where its concept lives):\n  {}",
        found.join("\n  ")
    );
    // The reader reads: two siblings naming each other are a circle, a
    // child naming its parent is not; paths in lists, through super.
    let at = |m: &str| m.split("::").map(String::from).collect::<Vec<_>>();
    let a = at("train::memory");
    let named = named_paths(
        &a,
        "use super::{schedule::X, y::{Z, w}};\nlet v = crate::train::V;",
    );
    assert_eq!(
        named,
        [
            at("train::schedule::X"),
            at("train::y::Z"),
            at("train::y::w"),
            at("train::V")
        ]
    );
    let b = at("train::schedule");
    assert_eq!(named_paths(&b, "super::super::run::f()"), [at("run::f")]);
    let files = [
        (at("train"), vec![at("train::memory::M")]),
        (a.clone(), vec![at("train::schedule::X"), at("train::T")]),
        (b.clone(), vec![at("train::memory::M")]),
    ];
    assert_eq!(circles(&files), [vec!["train::memory", "train::schedule"]]);
    assert!(circles(&files[..2]).is_empty());
}

#[test]
fn model_kinds_are_named_in_the_registry_alone() {
    let models = root().join("crates/trainer/src/models");
    let names: Vec<String> = std::fs::read_dir(&models)
        .unwrap()
        .filter_map(|e| {
            let entry = e.unwrap().path().join("entry.rs");
            let text = std::fs::read_to_string(entry).ok()?;
            let line = text
                .lines()
                .find(|l| l.starts_with("pub const NAME: &str = "))?;
            Some(line.split('"').nth(1)?.to_string())
        })
        .collect();
    assert!(names.len() >= 3, "found the models {names:?}");
    let mut named = Vec::new();
    for path in sources("crates/trainer/src") {
        if path.starts_with(&models) || path == root().join(LEGACY_KIND.0) {
            continue;
        }
        let text = code(&path);
        for name in &names {
            if text.contains(&format!("\"{name}\"")) {
                let at = path.strip_prefix(root()).unwrap().display();
                named.push(format!("{at} names the model \"{name}\""));
            }
        }
        if text.contains("ModelChoice") {
            named.push(format!("{}: a match on model kinds", path.display()));
        }
    }
    assert!(
        named.is_empty(),
        "model kinds outside crates/trainer/src/models (ask the registry, `models::MODELS`, or a model's entry instead):\n  {}",
        named.join("\n  ")
    );
}

#[test]
fn architecture_md_is_a_short_map_naming_every_crate() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= MAX_MAP_LINES,
        "ARCHITECTURE.md has {lines} lines, over {MAX_MAP_LINES}: move explanations to module docs or docs/"
    );
    let crates = std::fs::read_dir(root().join("crates")).unwrap();
    for krate in crates.map(|e| e.unwrap().file_name().to_string_lossy().to_string()) {
        assert!(
            text.contains(&format!("## {krate}")),
            "ARCHITECTURE.md has no section ## {krate}"
        );
    }
    for (dir, layers) in LAYERS {
        for module in layers.iter().flat_map(|l| l.iter()) {
            assert!(
                text.contains(&format!("`{module}`")),
                "ARCHITECTURE.md does not name {dir}'s module `{module}`"
            );
        }
    }
}
