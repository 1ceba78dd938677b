//! Finding the directory that holds the data set.

use crate::error::{DataError, SearchedDir, Shortfall};
use crate::files::FILES;
use std::path::{Path, PathBuf};

/// Project-local directory, relative to the working directory; where
/// `cargo xtask fetch-data` puts the files and where they take precedence
/// over a system-wide copy.
pub const LOCAL_DIR: &str = "data/fashion-mnist";

/// Where Debian's `dataset-fashion-mnist` package installs the files.
pub const SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Returns the directory to load the data set from.
///
/// If `explicit` is given, only that directory is considered: a user who
/// names a directory wants an error, not a silent fallback to another copy.
/// Otherwise [`LOCAL_DIR`] (under the working directory), then
/// [`SYSTEM_DIR`]. A directory qualifies when all four files are in it; their
/// content is checked later by [`crate::FashionMnist::load`]. The error lists
/// every place looked at and what each lacked.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, DataError> {
    match explicit {
        Some(dir) => search(&[dir.to_path_buf()], true),
        None => search(
            &[absolute(Path::new(LOCAL_DIR)), PathBuf::from(SYSTEM_DIR)],
            false,
        ),
    }
}

/// The first of `candidates` that holds all four files.
fn search(candidates: &[PathBuf], explicit: bool) -> Result<PathBuf, DataError> {
    let mut searched = Vec::with_capacity(candidates.len());
    for dir in candidates {
        match shortfall(dir) {
            None => return Ok(dir.clone()),
            Some(shortfall) => searched.push(SearchedDir {
                dir: dir.clone(),
                shortfall,
            }),
        }
    }
    Err(DataError::NotFound { searched, explicit })
}

fn shortfall(dir: &Path) -> Option<Shortfall> {
    if !dir.is_dir() {
        return Some(Shortfall::NoDirectory);
    }
    let missing: Vec<&'static str> = FILES
        .iter()
        .map(|file| file.name)
        .filter(|name| !dir.join(name).is_file())
        .collect();
    (!missing.is_empty()).then_some(Shortfall::MissingFiles(missing))
}

/// Makes a relative path absolute so that messages say where it really was;
/// keeps it relative if the working directory cannot be determined.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::search;
    use crate::error::{DataError, SearchedDir, Shortfall};
    use crate::files::{FILES, TRAIN_IMAGES};
    use std::fs;

    fn fill(dir: &std::path::Path, skip: Option<&str>) {
        for file in FILES.iter().filter(|file| Some(file.name) != skip) {
            fs::write(dir.join(file.name), b"content is checked later").expect("write");
        }
    }

    #[test]
    fn takes_the_first_complete_directory() {
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fill(first.path(), None);
        fill(second.path(), None);
        let found = search(
            &[first.path().to_path_buf(), second.path().to_path_buf()],
            false,
        )
        .unwrap();
        assert_eq!(found, first.path());
    }

    #[test]
    fn falls_back_past_missing_and_incomplete_directories() {
        let (partial, complete) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fill(partial.path(), Some(TRAIN_IMAGES));
        fill(complete.path(), None);
        let absent = partial.path().join("absent");
        let candidates = [
            absent,
            partial.path().to_path_buf(),
            complete.path().to_path_buf(),
        ];
        assert_eq!(search(&candidates, false).unwrap(), complete.path());
    }

    #[test]
    fn error_names_every_place_and_what_it_lacked() {
        let partial = tempfile::tempdir().unwrap();
        fill(partial.path(), Some(TRAIN_IMAGES));
        let absent = partial.path().join("absent");
        let err = search(&[absent.clone(), partial.path().to_path_buf()], false).unwrap_err();
        let DataError::NotFound { searched, explicit } = &err else {
            panic!("expected NotFound, got {err:?}");
        };
        assert!(!explicit);
        assert_eq!(
            searched,
            &[
                SearchedDir {
                    dir: absent.clone(),
                    shortfall: Shortfall::NoDirectory
                },
                SearchedDir {
                    dir: partial.path().to_path_buf(),
                    shortfall: Shortfall::MissingFiles(vec![TRAIN_IMAGES])
                },
            ]
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!("{} (no such directory)", absent.display())),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "{} (missing {TRAIN_IMAGES})",
                partial.path().display()
            )),
            "{message}"
        );
        assert!(
            message.contains("sudo apt-get install dataset-fashion-mnist"),
            "{message}"
        );
        assert!(message.contains("cargo xtask fetch-data"), "{message}");
        assert!(!message.contains("--data-dir"), "{message}");
    }
}
