//! Fuzz target for the gzip and IDX reader, run as an ordinary test with a
//! bounded number of cases. Each case takes the valid three-example split in
//! `tests/corpus/` and damages either its compressed bytes (the gzip layer)
//! or its decompressed content, re-gzipped (the IDX layer): bytes
//! overwritten, a run of bytes inserted, the tail cut. Whatever the bytes,
//! reading ends in a typed error or in a split of exactly the right shape,
//! never in a panic.

use fashion_mnist::{CLASSES, FILES, PIXELS, Split, TEST_LABELS};
use flate2::read::GzDecoder;
use proptest::prelude::*;
use proptest::sample::Index;
use std::io::Read;

const IMAGES_GZ: &[u8] = include_bytes!("corpus/images-3.idx.gz");
const LABELS_GZ: &[u8] = include_bytes!("corpus/labels-3.idx.gz");
const EXAMPLES: usize = 3;

/// Each case writes two small files and reads them back: a few seconds in all.
const CASES: u32 = 512;

/// Which layer of one file a case damages.
#[derive(Debug, Clone, Copy)]
enum Layer {
    Compressed,
    Content,
}

#[derive(Debug, Clone)]
struct Mutation {
    layer: Layer,
    overwrite: Vec<(Index, u8)>,
    insert: Option<(Index, Vec<u8>)>,
    cut: Option<Index>,
}

impl Mutation {
    fn apply(&self, gz: &[u8]) -> Vec<u8> {
        match self.layer {
            Layer::Compressed => self.damage(gz.to_vec()),
            Layer::Content => {
                let mut content = Vec::new();
                GzDecoder::new(gz)
                    .read_to_end(&mut content)
                    .expect("the corpus is valid gzip");
                gzip(&self.damage(content))
            }
        }
    }

    fn damage(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        let len = bytes.len();
        if len > 0 {
            for (at, byte) in &self.overwrite {
                bytes[at.index(len)] = *byte;
            }
        }
        if let Some((at, run)) = &self.insert {
            let at = at.index(bytes.len() + 1);
            bytes.splice(at..at, run.iter().copied());
        }
        if let Some(cut) = self.cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        bytes
    }
}

fn gzip(content: &[u8]) -> Vec<u8> {
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(content).expect("write to Vec");
    encoder.finish().expect("finish to Vec")
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        prop_oneof![Just(Layer::Compressed), Just(Layer::Content)],
        proptest::collection::vec((any::<Index>(), any::<u8>()), 0..4),
        proptest::option::of((
            any::<Index>(),
            proptest::collection::vec(any::<u8>(), 1..2000),
        )),
        proptest::option::weighted(0.2, any::<Index>()),
    )
        .prop_map(|(layer, overwrite, insert, cut)| Mutation {
            layer,
            overwrite,
            insert,
            cut,
        })
}

/// Reads the pair after damaging the images (`damage_images`) or the labels.
fn read_damaged(mutation: &Mutation, damage_images: bool) -> Result<Split, String> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (images, labels) = (dir.path().join("images.gz"), dir.path().join("labels.gz"));
    let (images_gz, labels_gz) = if damage_images {
        (mutation.apply(IMAGES_GZ), LABELS_GZ.to_vec())
    } else {
        (IMAGES_GZ.to_vec(), mutation.apply(LABELS_GZ))
    };
    std::fs::write(&images, images_gz).expect("write images");
    std::fs::write(&labels, labels_gz).expect("write labels");
    Split::read(&images, &labels, EXAMPLES).map_err(|err| err.to_string())
}

#[test]
fn corpus_reads_as_a_valid_split() {
    let untouched = Mutation {
        layer: Layer::Compressed,
        overwrite: Vec::new(),
        insert: None,
        cut: None,
    };
    let split = read_damaged(&untouched, true).expect("the corpus is valid");
    assert_eq!(
        (split.len, split.images.len()),
        (EXAMPLES, EXAMPLES * PIXELS)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn damaged_files_read_as_an_error_or_a_whole_split(
        mutation in mutation(),
        damage_images: bool,
    ) {
        match read_damaged(&mutation, damage_images) {
            Ok(split) => {
                prop_assert_eq!(split.len, EXAMPLES);
                prop_assert_eq!(split.images.len(), EXAMPLES * PIXELS);
                prop_assert_eq!(split.labels.len(), EXAMPLES);
                prop_assert!(split.labels.iter().all(|&l| usize::from(l) < CLASSES));
            }
            Err(message) => prop_assert!(!message.contains('\n'), "{}", message),
        }
    }

    #[test]
    fn download_verification_refuses_damaged_files_without_panicking(mutation in mutation()) {
        let test_labels = FILES.iter().find(|f| f.name == TEST_LABELS).expect("listed");
        let damaged = mutation.apply(LABELS_GZ);
        prop_assert!(test_labels.verify_gz(&damaged).is_err());
    }
}
