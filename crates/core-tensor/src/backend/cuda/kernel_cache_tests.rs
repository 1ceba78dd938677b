use std::ffi::OsString;
use std::fs;

use super::{CacheKey, KernelCache};

fn key<'a>(source: &'a str, options: &'a [String]) -> CacheKey<'a> {
    CacheKey {
        module: "relu",
        source,
        options,
        nvrtc: (12, 9),
    }
}

fn sm90() -> Vec<String> {
    vec!["--gpu-architecture=sm_90".to_owned()]
}

/// The one entry file in `dir`.
fn entry(dir: &std::path::Path) -> std::path::PathBuf {
    let files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn an_entry_comes_back_as_it_was_stored_and_nothing_else_hits_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(&dir.path().join("a/b"));
    let options = sm90();
    assert_eq!(cache.get(&key("src", &options)), None);
    cache.put(&key("src", &options), b"cubin bytes").unwrap();
    assert_eq!(
        cache.get(&key("src", &options)).as_deref(),
        Some(&b"cubin bytes"[..])
    );
    // Whatever decides the code is in the key.
    let sm80 = vec!["--gpu-architecture=sm_80".to_owned()];
    assert_eq!(cache.get(&key("edited src", &options)), None);
    assert_eq!(cache.get(&key("src", &sm80)), None);
    let newer = CacheKey {
        nvrtc: (13, 0),
        ..key("src", &options)
    };
    assert_eq!(cache.get(&newer), None);
    let other = CacheKey {
        module: "conv2d",
        ..key("src", &options)
    };
    assert_eq!(cache.get(&other), None);
    // No partial file is left beside the entry, and only its owner may
    // read the directory it made.
    let file = entry(cache.dir());
    assert!(file.to_string_lossy().ends_with(".cubin"), "{file:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(cache.dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn a_damaged_entry_is_a_miss_and_the_next_put_mends_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let options = sm90();
    let key = key("src", &options);
    cache.put(&key, b"cubin bytes").unwrap();
    let file = entry(dir.path());
    let whole = fs::read(&file).unwrap();
    let mut flipped = whole.clone();
    flipped[3] ^= 1;
    for damaged in [
        &whole[..whole.len() - 1],
        &whole[..10],
        &[][..],
        &flipped[..],
        &whole[whole.len() - 32..],
    ] {
        fs::write(&file, damaged).unwrap();
        assert_eq!(cache.get(&key), None, "{} bytes", damaged.len());
    }
    cache.put(&key, b"cubin bytes").unwrap();
    assert_eq!(cache.get(&key).as_deref(), Some(&b"cubin bytes"[..]));
}

#[test]
fn a_second_compiler_waits_for_the_first_and_then_finds_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let options = sm90();
    let (taken, wait_for_it) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let cache = KernelCache::at(dir.path());
            let turn = cache.compiling(&key("src", &options)).expect("the lock");
            taken.send(()).unwrap();
            // "Compiling": the other side must not get past its lock yet.
            std::thread::sleep(std::time::Duration::from_millis(300));
            cache.put(&key("src", &options), b"cubin").unwrap();
            drop(turn);
        });
        wait_for_it.recv().unwrap();
        let cache = KernelCache::at(dir.path());
        assert_eq!(cache.get(&key("src", &options)), None);
        let _turn = cache.compiling(&key("src", &options)).expect("the lock");
        assert_eq!(
            cache.get(&key("src", &options)).as_deref(),
            Some(&b"cubin"[..]),
            "the lock was taken before the first compiler stored its entry"
        );
    });
    // Another module's entry has a lock of its own: it is not held.
    let cache = KernelCache::at(dir.path());
    let other = CacheKey {
        module: "linear",
        ..key("src", &options)
    };
    let _mine = cache.compiling(&key("src", &options)).unwrap();
    assert!(cache.compiling(&other).is_some());
}

#[test]
fn a_directory_that_cannot_be_made_is_an_error_for_the_caller_to_report() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    fs::write(&blocker, b"").unwrap();
    let cache = KernelCache::at(&blocker.join("kernels"));
    let options = sm90();
    assert!(cache.put(&key("src", &options), b"cubin").is_err());
    assert_eq!(cache.get(&key("src", &options)), None);
}

#[test]
fn the_environment_names_the_directory_or_turns_it_off() {
    let some = |s: &str| Some(OsString::from(s));
    let dir = |explicit, xdg, home| KernelCache::resolve(explicit, xdg, home).map(|c| c.dir);
    assert_eq!(
        dir(some("/x/k"), some("/xdg"), some("/home/u")),
        Some("/x/k".into())
    );
    assert_eq!(dir(some("off"), some("/xdg"), some("/home/u")), None);
    assert_eq!(
        dir(None, some("/xdg"), some("/home/u")),
        Some("/xdg/core-tensor/kernels".into())
    );
    assert_eq!(
        dir(None, None, some("/home/u")),
        Some("/home/u/.cache/core-tensor/kernels".into())
    );
    assert_eq!(dir(None, None, None), None);
}
