//! `trainer synth-ratings`: a generated ratings file that `--model recsys`
//! trains on, the same bytes for the same seed.

mod common;

use common::{run, stderr, trainer};

#[test]
fn synth_ratings_writes_a_file_recsys_trains_on() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, seed: &str| {
        let path = tmp.path().join(name);
        let out = run(trainer().arg("synth-ratings").arg(&path).args([
            "--rows", "600", "--users", "50", "--movies", "80", "--seed", seed,
        ]));
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::read_to_string(path).unwrap()
    };
    let (a, again, other) = (
        write("a.csv", "3"),
        write("b.csv", "3"),
        write("c.csv", "4"),
    );
    assert_eq!(a, again, "the same seed writes the same file");
    assert_ne!(a, other, "another seed another file");
    let lines: Vec<&str> = a.lines().collect();
    assert_eq!(lines[0], "userId,movieId,rating,timestamp");
    assert_eq!(lines.len(), 601);

    let out = run(trainer()
        .args([
            "--model",
            "recsys",
            "--epochs",
            "1",
            "--batch-size",
            "32",
            "--ratings",
        ])
        .arg(tmp.path().join("a.csv")));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("model recsys"), "{err}");
    assert!(common::stdout(&out).contains("test_rmse"), "{err}");
}

#[test]
fn synth_ratings_without_a_path_says_so() {
    let out = run(trainer().arg("synth-ratings"));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("<PATH>"), "{}", stderr(&out));
}

/// The file appears at its path only once complete (it is written beside
/// it and renamed), so a write that fails leaves nothing there; absurd row
/// counts are refused before anything is written.
#[test]
fn synth_ratings_leaves_no_partial_file_and_bounds_its_rows() {
    let tmp = tempfile::tempdir().unwrap();
    // A directory where the partial file would go makes the write fail.
    let path = tmp.path().join("r.csv");
    let synth = |rows: &str| {
        run(trainer()
            .arg("synth-ratings")
            .arg(&path)
            .args(["--rows", rows]))
    };
    std::fs::create_dir(tmp.path().join("r.csv.partial")).unwrap();
    let out = synth("10");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("r.csv.partial"), "{}", stderr(&out));
    assert!(!path.exists());
    std::fs::remove_dir(tmp.path().join("r.csv.partial")).unwrap();
    let out = synth("18446744073709551615");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--rows"), "{}", stderr(&out));
    assert!(!path.exists());
    let out = synth("10");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 11);
    assert!(!tmp.path().join("r.csv.partial").exists());
}

/// An existing path that is not a regular file is refused and left as it
/// was (renaming over it made a FIFO, or `/dev/full`, a regular file); a
/// symlink to a file is written through: the link stays, its target
/// changes.
#[test]
fn synth_ratings_refuses_what_is_not_a_file_and_writes_through_a_symlink() {
    use std::os::unix::fs::FileTypeExt;
    let tmp = tempfile::tempdir().unwrap();
    let synth = |path: &std::path::Path| {
        run(trainer()
            .arg("synth-ratings")
            .arg(path)
            .args(["--rows", "10"]))
    };
    let fifo = tmp.path().join("fifo.csv");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success());
    let out = synth(&fifo);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("fifo.csv: is not a regular file"), "{err}");
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced");
    let out = synth(tmp.path());
    assert!(stderr(&out).contains("is a directory"), "{}", stderr(&out));

    let (target, link) = (tmp.path().join("target.csv"), tmp.path().join("link.csv"));
    std::fs::write(&target, "old\n").unwrap();
    std::os::unix::fs::symlink("target.csv", &link).unwrap();
    let out = synth(&link);
    assert!(out.status.success(), "{}", stderr(&out));
    let kind = std::fs::symlink_metadata(&link).unwrap().file_type();
    assert!(kind.is_symlink(), "the symlink was replaced");
    assert_eq!(
        std::fs::read_to_string(&target).unwrap().lines().count(),
        11
    );
}

/// The summary counts the users and movies that have a rating, not the
/// ranges they were drawn from; the file ends with a newline.
#[test]
fn synth_ratings_counts_the_users_and_movies_it_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("one.csv");
    let out = run(trainer()
        .arg("synth-ratings")
        .arg(&path)
        .args(["--rows", "1"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let said = common::stdout(&out);
    assert!(said.contains("1 ratings by 1 users of 1 movies"), "{said}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.ends_with('\n') && text.lines().count() == 2,
        "{text:?}"
    );
}
