//! Errors of locating and reading the data set.
//!
//! [`DataError`] says *which* file or directory; [`Corruption`] says *what*
//! is wrong with a file's content, so the same problem descriptions serve the
//! loader here and the download verifier in `cargo xtask fetch-data`.

use std::fmt;
use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// Why the data set could not be loaded.
#[derive(Debug, Error)]
pub enum DataError {
    /// No searched directory holds all four files.
    #[error("{}", not_found_message(searched, *explicit))]
    NotFound {
        /// Every directory looked at, in search order, with what it lacked.
        searched: Vec<SearchedDir>,
        /// Whether the caller named the directory (then nothing else is tried).
        explicit: bool,
    },
    /// The operating system refused to read a file. The message leaves out
    /// the cause: it is the error's [`source`](std::error::Error::source), which
    /// `anyhow`'s `{:#}` (how the trainer prints errors) appends after a colon.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// What the operating system reported.
        #[source]
        source: io::Error,
    },
    /// A file was read but its content is not what the data set contains.
    #[error("corrupt data file {}: {problem}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        problem: Corruption,
    },
    /// The image file and the label file of one split disagree on the count.
    #[error(
        "{} holds {images} images but {} holds {labels} labels; the two files must come from the same split",
        images_path.display(),
        labels_path.display()
    )]
    CountMismatch {
        /// The image file.
        images_path: PathBuf,
        /// Number of images it declares.
        images: usize,
        /// The label file.
        labels_path: PathBuf,
        /// Number of labels it declares.
        labels: usize,
    },
}

/// One directory searched by [`crate::locate`] and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchedDir {
    /// The directory, absolute where the working directory was known.
    pub dir: PathBuf,
    /// What it lacked.
    pub shortfall: Shortfall,
}

/// Why a searched directory did not qualify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// There is nothing at that path.
    NoDirectory,
    /// Something other than a directory is at that path.
    NotADirectory(Found),
    /// The directory cannot be looked into (no search permission); the
    /// operating system's words.
    Inaccessible(String),
    /// The directory exists but these of the four files are absent.
    MissingFiles(Vec<&'static str>),
    /// Something other than a file stands in place of at least one of the
    /// four files: each unusable file with what is there ([`Found::Nothing`]
    /// for one that is absent).
    NotFiles(Vec<(&'static str, Found)>),
}

/// What stands at a path where a file or a directory was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing: the path does not exist.
    Nothing,
    /// A regular file (or a symbolic link to one).
    File,
    /// A directory (or a symbolic link to one).
    Directory,
    /// A FIFO, socket or device, named in words ("a FIFO").
    Special(&'static str),
    /// A symbolic link to a path that does not exist.
    DanglingSymlink,
    /// A symbolic link that cannot be followed (a loop, say); the operating
    /// system's words.
    BrokenSymlink(String),
    /// The path cannot be examined; the operating system's words.
    Unexaminable(String),
}

impl Found {
    /// What is at the path, as a clause after its name, for a place where
    /// `wanted` ("file", "directory") was expected.
    fn describe(&self, wanted: &str) -> String {
        match self {
            Found::Nothing => "does not exist".to_string(),
            Found::File => format!("is a file, not a {wanted}"),
            Found::Directory => format!("is a directory, not a {wanted}"),
            Found::Special(what) => format!("is {what}, not a {wanted}"),
            Found::DanglingSymlink => "is a symbolic link to a path that does not exist".into(),
            Found::BrokenSymlink(why) => {
                format!("is a symbolic link that cannot be followed ({why})")
            }
            Found::Unexaminable(why) => format!("cannot be examined ({why})"),
        }
    }
}

impl fmt::Display for SearchedDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = self.dir.display();
        match &self.shortfall {
            Shortfall::NoDirectory => write!(f, "{dir} (no such directory)"),
            Shortfall::NotADirectory(found) => write!(f, "{dir} ({})", found.describe("directory")),
            Shortfall::Inaccessible(why) => write!(f, "{dir} (cannot look inside: {why})"),
            Shortfall::MissingFiles(names) => write!(f, "{dir} (missing {})", names.join(", ")),
            Shortfall::NotFiles(files) => {
                let each: Vec<String> = files
                    .iter()
                    .map(|(name, found)| match found {
                        Found::Nothing => format!("missing {name}"),
                        other => format!("{name} {}", other.describe("file")),
                    })
                    .collect();
                write!(f, "{dir} ({})", each.join("; "))
            }
        }
    }
}

fn not_found_message(searched: &[SearchedDir], explicit: bool) -> String {
    let places: Vec<String> = searched.iter().map(ToString::to_string).collect();
    let scope = if explicit {
        "looked only in the directory given explicitly"
    } else {
        "looked in"
    };
    format!(
        "FashionMNIST data set not found; {scope}: {}. To fix: install it with \
         `sudo apt-get install dataset-fashion-mnist`, or put the four .gz files into \
         {} (`cargo xtask fetch-data` downloads and verifies them){}",
        places.join("; "),
        crate::LOCAL_DIR,
        if explicit {
            ", or point --data-dir at a directory that holds them"
        } else {
            ""
        }
    )
}

/// What is wrong with the content of one data file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Corruption {
    /// The file has no bytes at all.
    #[error("file is empty")]
    Empty,
    /// The file does not start with the gzip signature.
    #[error("not a gzip file (first bytes are {found:02x?}, a gzip file starts with [1f, 8b])")]
    NotGzip {
        /// Up to the first two bytes of the file.
        found: Vec<u8>,
    },
    /// The gzip stream ends before its end marker: an interrupted copy or download.
    #[error("truncated gzip stream (unexpected end of file)")]
    TruncatedGzip,
    /// Bytes follow the last gzip member, and do not start another one.
    #[error("{extra} bytes of trailing data after the gzip stream")]
    TrailingGzipData {
        /// How many bytes follow the stream.
        extra: usize,
    },
    /// The gzip stream is damaged (bad CRC, invalid deflate data).
    #[error("invalid gzip data: {detail}")]
    InvalidGzip {
        /// The decoder's description.
        detail: String,
    },
    /// The decompressed content ends before the IDX header or data does.
    #[error("truncated IDX content: {found} bytes, expected {expected}")]
    TruncatedIdx {
        /// Bytes the header promises.
        expected: usize,
        /// Bytes actually present.
        found: usize,
    },
    /// The IDX magic number is not that of the expected file kind.
    #[error("magic number {found}, expected {expected} ({kind})")]
    BadMagic {
        /// The magic number of the expected kind.
        expected: u32,
        /// The magic number in the file.
        found: u32,
        /// The expected kind, in words.
        kind: &'static str,
    },
    /// The images are not 28x28.
    #[error("images are {rows}x{cols}, expected 28x28")]
    BadDimensions {
        /// Declared rows.
        rows: u32,
        /// Declared columns.
        cols: u32,
    },
    /// The file holds a different number of items than the split must.
    #[error("holds {found} items, expected {expected}")]
    WrongCount {
        /// Items the split must have.
        expected: usize,
        /// Items the header declares.
        found: usize,
    },
    /// Bytes follow the last item the header declares. How many is not
    /// known: inflating stops at the first one, so a gzip bomb is refused
    /// without being inflated.
    #[error(
        "unexpected bytes after the last item: the content goes on past the {expected} bytes \
         its header announces (inflating stopped there)"
    )]
    TrailingBytes {
        /// The length the header announces, header included.
        expected: usize,
    },
    /// A label is not one of the ten classes.
    #[error("label {label} of item {index} is not a class (labels are 0..=9)")]
    LabelOutOfRange {
        /// Position of the first bad label.
        index: usize,
        /// Its value.
        label: u8,
    },
    /// The decompressed length differs from the published file's.
    #[error("decompressed length {found} bytes, expected {expected}")]
    WrongLength {
        /// Length of the published file.
        expected: u64,
        /// Length found.
        found: u64,
    },
    /// The SHA-256 of the decompressed content differs from the published file's.
    #[error("SHA-256 checksum mismatch: got {found}, expected {expected}")]
    ChecksumMismatch {
        /// Digest of the published file (hex).
        expected: &'static str,
        /// Digest of this file (hex).
        found: String,
    },
}

#[cfg(test)]
mod tests {
    use super::DataError;
    use std::io;

    /// `err` as the trainer prints it: its message and causes, `{:#}`.
    fn chain(err: impl std::error::Error + Send + Sync + 'static) -> String {
        format!("{:#}", anyhow::Error::new(err))
    }

    #[test]
    fn a_read_error_states_the_os_error_once() {
        let denied = || io::Error::from_raw_os_error(13);
        let err = DataError::Read {
            path: "/data/t10k-labels-idx1-ubyte.gz".into(),
            source: denied(),
        };
        assert_eq!(
            chain(err),
            format!("cannot read /data/t10k-labels-idx1-ubyte.gz: {}", denied())
        );
    }
}
