//! The house rules of the trainer and the launcher, checked as tests
//! (ARCHITECTURE.md states them): each crate's modules stand in layers and
//! import only from layers below their own (so no circle either); no
//! struct holds more than 12 fields; the model kinds are named in the
//! model registry's folder alone; ARCHITECTURE.md stays a map.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each crate's top-level modules, layer by layer from the ground up:
/// a module may use (`crate::…`) only modules of lower layers. The same
/// table is ARCHITECTURE.md's "Layers" (change both together).
const LAYERS: [(&str, &[&[&str]]); 2] = [
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

#[test]
fn no_struct_holds_more_than_twelve_fields() {
    let mut wide = Vec::new();
    for (dir, _) in LAYERS {
        for path in sources(dir) {
            for (name, fields) in struct_fields(&code(&path)) {
                if fields > MAX_FIELDS {
                    let at = path.strip_prefix(root()).unwrap().display();
                    wide.push(format!("{at}: struct {name} has {fields} fields"));
                }
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
