//! The Debian mirror this machine's apt uses, read from its sources
//! (`sources.list`, `sources.list.d/*.list` one-line entries and
//! `*.sources` deb822 stanzas), so that the image comes from where the
//! machine's own packages do.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The first `deb` URI of `apt_dir`'s sources that serves `suite`.
pub fn debian_mirror(apt_dir: &Path, suite: &str) -> Result<String> {
    for file in source_files(apt_dir) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let found = match file.extension().and_then(|e| e.to_str()) {
            Some("sources") => deb822_mirror(&text, suite),
            _ => one_line_mirror(&text, suite),
        };
        if let Some(uri) = found {
            return Ok(uri);
        }
    }
    bail!(
        "no apt source in {}/sources.list* serves {suite}; name a Debian mirror with --mirror URI",
        apt_dir.display()
    )
}

/// `sources.list` first, then `sources.list.d/` in name order, as apt reads them.
fn source_files(apt_dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![apt_dir.join("sources.list")];
    if let Ok(entries) = std::fs::read_dir(apt_dir.join("sources.list.d")) {
        let mut parts: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources"))
            .collect();
        parts.sort();
        files.extend(parts);
    }
    files
}

/// `deb [options] URI SUITE COMPONENT...`
fn one_line_mirror(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            return None;
        }
        let mut rest: Vec<&str> = words.collect();
        // An option list, which may hold spaces: `[ arch=amd64 ]`.
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']'))?;
            rest.drain(..=end);
        }
        match rest.as_slice() {
            [uri, named, ..] if *named == suite => Some((*uri).to_owned()),
            _ => None,
        }
    })
}

/// Stanzas of `Types:`, `URIs:`, `Suites:` fields, blank-line separated.
fn deb822_mirror(text: &str, suite: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim().eq_ignore_ascii_case(name).then(|| {
                    value
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
            })
        };
        let enabled = field("Enabled").is_none_or(|v| v.first().is_none_or(|v| v != "no"));
        let deb = field("Types")?.iter().any(|t| t == "deb");
        let serves = field("Suites")?.iter().any(|s| s == suite);
        (enabled && deb && serves)
            .then(|| field("URIs")?.into_iter().next())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_suite_in_one_line_entries() {
        let text = "# deb http://old/ bookworm main\n\
                    deb-src http://src/ bookworm main\n\
                    deb [ arch=amd64 signed-by=/k.gpg ] http://other/ nodistro main\n\
                    deb [arch=amd64] http://mirror.example/debian bookworm main contrib\n";
        assert_eq!(
            one_line_mirror(text, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(one_line_mirror(text, "trixie"), None);
    }

    #[test]
    fn finds_the_suite_in_deb822_stanzas() {
        let text = "Types: deb\nURIs: https://nodes.example/x\nSuites: nodistro\n\n\
                    Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n\
                    Types: deb deb-src\n# a comment\nURIs: http://mirror.example/debian\n\
                    Suites: bookworm bookworm-updates\nComponents: main\n";
        assert_eq!(
            deb822_mirror(text, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(deb822_mirror(text, "bookworm-security"), None);
    }

    #[test]
    fn says_how_to_name_a_mirror_when_none_serves_the_suite() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("sources.list"),
            "deb http://x/ trixie main\n",
        )
        .unwrap();
        let err = debian_mirror(dir.path(), "bookworm")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("serves bookworm") && err.contains("--mirror"),
            "{err}"
        );
    }
}
