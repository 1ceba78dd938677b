//! The real data set, when the machine has it (CI installs Debian's
//! `dataset-fashion-mnist`; elsewhere these tests say they skipped).

use fashion_mnist::{CLASSES, FILES, FashionMnist, PIXELS, SYSTEM_DIR};
use std::path::Path;
use std::time::Instant;

fn system_dir() -> Option<&'static Path> {
    let dir = Path::new(SYSTEM_DIR);
    if FILES.iter().all(|file| dir.join(file.name).is_file()) {
        Some(dir)
    } else {
        println!(
            "skipped: FashionMNIST is not installed in {SYSTEM_DIR} (apt-get install dataset-fashion-mnist)"
        );
        None
    }
}

#[test]
fn loads_the_installed_data_set() {
    let Some(dir) = system_dir() else { return };
    let start = Instant::now();
    let data = FashionMnist::load(dir).expect("the installed data set is valid");
    println!("loaded in {:?}", start.elapsed());

    assert_eq!(data.train.len, 60_000);
    assert_eq!(data.test.len, 10_000);
    assert_eq!(data.train.images.len(), 60_000 * PIXELS);
    assert_eq!(data.test.images.len(), 10_000 * PIXELS);
    // FashionMNIST is balanced: 6,000 / 1,000 examples per class.
    for (split, per_class) in [(&data.train, 6_000), (&data.test, 1_000)] {
        let mut counts = [0usize; CLASSES];
        for &label in &split.labels {
            counts[usize::from(label)] += 1;
        }
        assert_eq!(counts, [per_class; CLASSES]);
    }
    // First training example is an ankle boot (label 9), as published.
    assert_eq!(data.train.labels[0], 9);
}

#[test]
fn installed_files_match_the_published_checksums() {
    let Some(dir) = system_dir() else { return };
    for file in &FILES {
        let gz = std::fs::read(dir.join(file.name)).expect("readable");
        file.verify_gz(&gz)
            .unwrap_or_else(|err| panic!("{}: {err}", file.name));
    }
}
