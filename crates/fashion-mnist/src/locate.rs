//! Finding the directory that holds the data set.

use crate::error::{DataError, Found, SearchedDir, Shortfall};
use crate::files::FILES;
use std::io::ErrorKind;
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
/// [`SYSTEM_DIR`]. A directory qualifies when all four files are in it
/// (regular files, or symbolic links to them); their content is checked
/// later by [`crate::FashionMnist::load`]. The error lists every place looked
/// at and what each lacked, saying what stands where a file or the directory
/// should be when it is not simply absent (a directory, a FIFO, a dangling
/// link, a directory that cannot be looked into).
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
    match examine(dir) {
        Found::Directory => {}
        Found::Nothing => return Some(Shortfall::NoDirectory),
        Found::Unexaminable(why) => return Some(Shortfall::Inaccessible(why)),
        other => return Some(Shortfall::NotADirectory(other)),
    }
    let mut unusable = Vec::new();
    for file in FILES {
        match examine(&dir.join(file.name)) {
            Found::File => {}
            // Looking up a name fails this way for the directory's sake:
            // every file in it would, so it is the directory that is named.
            Found::Unexaminable(why) => return Some(Shortfall::Inaccessible(why)),
            found => unusable.push((file.name, found)),
        }
    }
    if unusable.is_empty() {
        None
    } else if unusable.iter().all(|(_, found)| *found == Found::Nothing) {
        Some(Shortfall::MissingFiles(
            unusable.into_iter().map(|(name, _)| name).collect(),
        ))
    } else {
        Some(Shortfall::NotFiles(unusable))
    }
}

/// What is at `path`, following symbolic links. [`Found::Unexaminable`] only
/// where the path itself cannot be looked up (no search permission on a
/// directory above it, an I/O error), not for a link that goes nowhere.
fn examine(path: &Path) -> Found {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Found::File,
        Ok(meta) if meta.is_dir() => Found::Directory,
        Ok(meta) => Found::Special(special_kind(&meta.file_type())),
        Err(err) => {
            let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            match (is_link, err.kind()) {
                (false, ErrorKind::NotFound | ErrorKind::NotADirectory) => Found::Nothing,
                (true, ErrorKind::NotFound) => Found::DanglingSymlink,
                (true, _) => Found::BrokenSymlink(err.to_string()),
                (false, _) => Found::Unexaminable(err.to_string()),
            }
        }
    }
}

#[cfg(unix)]
fn special_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// Makes a relative path absolute so that messages say where it really was;
/// keeps it relative if the working directory cannot be determined.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::search;
    use crate::error::{DataError, Found, SearchedDir, Shortfall};
    use crate::files::{FILES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS};
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn fill(dir: &Path, skip: Option<&str>) {
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

    /// The shortfall of `dir` alone, and the message that reports it.
    fn shortfall_of(dir: &Path) -> (Shortfall, String) {
        let err = search(&[dir.to_path_buf()], true).unwrap_err();
        let message = err.to_string();
        match err {
            DataError::NotFound { mut searched, .. } => (searched.remove(0).shortfall, message),
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[test]
    fn says_what_stands_in_place_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), Some(TRAIN_IMAGES));
        fs::remove_file(dir.path().join(TRAIN_LABELS)).unwrap();
        fs::remove_file(dir.path().join(TEST_LABELS)).unwrap();
        fs::create_dir(dir.path().join(TRAIN_IMAGES)).unwrap();
        symlink(dir.path().join("nowhere"), dir.path().join(TEST_LABELS)).unwrap();
        let (shortfall, message) = shortfall_of(dir.path());
        assert_eq!(
            shortfall,
            Shortfall::NotFiles(vec![
                (TEST_LABELS, Found::DanglingSymlink),
                (TRAIN_LABELS, Found::Nothing),
                (TRAIN_IMAGES, Found::Directory),
            ])
        );
        for clause in [
            format!("{TRAIN_IMAGES} is a directory, not a file"),
            format!("missing {TRAIN_LABELS}"),
            format!("{TEST_LABELS} is a symbolic link to a path that does not exist"),
        ] {
            assert!(message.contains(&clause), "{clause:?} in {message}");
        }
    }

    #[test]
    fn names_fifos_and_symlink_loops() {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), None);
        let fifo = dir.path().join(TRAIN_LABELS);
        fs::remove_file(&fifo).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
        let looped = dir.path().join(TEST_LABELS);
        fs::remove_file(&looped).unwrap();
        symlink(&looped, &looped).unwrap();
        let (shortfall, message) = shortfall_of(dir.path());
        let Shortfall::NotFiles(files) = shortfall else {
            panic!("{shortfall:?}");
        };
        // In the order of `FILES`.
        assert!(
            matches!(&files[0], (TEST_LABELS, Found::BrokenSymlink(_))),
            "{files:?}"
        );
        assert_eq!(files[1], (TRAIN_LABELS, Found::Special("a FIFO")));
        assert!(
            message.contains(&format!("{TRAIN_LABELS} is a FIFO, not a file")),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "{TEST_LABELS} is a symbolic link that cannot be followed"
            )),
            "{message}"
        );
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        fs::write(&file, b"").unwrap();
        let (shortfall, message) = shortfall_of(&file);
        assert_eq!(shortfall, Shortfall::NotADirectory(Found::File));
        assert!(
            message.contains(&format!("{} (is a file, not a directory)", file.display())),
            "{message}"
        );
        // A path through a file is simply not there.
        assert_eq!(shortfall_of(&file.join("sub")).0, Shortfall::NoDirectory);
    }

    #[test]
    fn a_directory_that_cannot_be_searched_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), None);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o000)).unwrap();
        let bypassed = fs::metadata(dir.path().join(TRAIN_IMAGES)).is_ok();
        let result = search(&[dir.path().to_path_buf()], true);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        if bypassed {
            eprintln!("skipped: permissions do not bind this user (root?)");
            return;
        }
        let err = result.unwrap_err();
        let message = err.to_string();
        let DataError::NotFound { searched, .. } = err else {
            unreachable!()
        };
        assert!(
            matches!(&searched[0].shortfall, Shortfall::Inaccessible(why) if why.contains("ermission")),
            "{searched:?}"
        );
        assert!(message.contains("(cannot look inside: "), "{message}");
        assert!(!message.contains("missing"), "{message}");
    }

    #[test]
    fn an_unusable_directory_is_passed_over_like_an_incomplete_one() {
        let (odd, complete) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fill(odd.path(), Some(TRAIN_IMAGES));
        fs::create_dir(odd.path().join(TRAIN_IMAGES)).unwrap();
        fill(complete.path(), None);
        let candidates = [odd.path().to_path_buf(), complete.path().to_path_buf()];
        assert_eq!(search(&candidates, false).unwrap(), complete.path());
        // A symbolic link to a complete directory, or to the files, qualifies.
        let linked = tempfile::tempdir().unwrap();
        for file in FILES {
            symlink(
                complete.path().join(file.name),
                linked.path().join(file.name),
            )
            .unwrap();
        }
        let link = odd.path().join("link");
        symlink(linked.path(), &link).unwrap();
        assert_eq!(search(std::slice::from_ref(&link), true).unwrap(), link);
    }
}
