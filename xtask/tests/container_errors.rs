//! What a user meets without the container tools or with a wrong image:
//! one `error:` line naming the cause and the fix. Cheap: PATH holds
//! nothing, and no image is built.

mod common;

use std::process::{Command, Output};

use common::{text, workspace_root};

/// `cargo xtask ARGS` with PATH holding nothing at all.
fn without_tools(args: &[&str]) -> Output {
    let empty = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .current_dir(workspace_root())
        .env("PATH", empty.path())
        .output()
        .unwrap()
}

/// A failure saying one line, `error: ` and every piece of `needles`.
fn one_line_error(out: &Output, needles: &[&str]) {
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected:\n{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} missing in:\n{stderr}");
    }
}

#[test]
fn missing_tools_and_images_are_one_line_errors_with_the_fix() {
    let out = without_tools(&["image"]);
    one_line_error(
        &out,
        &["`mmdebstrap` is not on PATH", "apt-get install mmdebstrap"],
    );

    let none = [
        "slurm-submit",
        "--dry-run",
        "--container",
        "/nonexistent/image",
    ];
    one_line_error(
        &without_tools(&none),
        &["/nonexistent/image: no such directory", "cargo xtask image"],
    );

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let empty = ["slurm-submit", "--dry-run", "--container", dir];
    one_line_error(
        &without_tools(&empty),
        &["holds no /usr/local/bin/trainer", "cargo xtask image"],
    );

    // An image's shape, without ch-run to run it.
    std::fs::create_dir_all(tmp.path().join("usr/local/bin")).unwrap();
    std::fs::write(tmp.path().join("usr/local/bin/trainer"), "").unwrap();
    let submit = ["slurm-submit", "--container", dir];
    one_line_error(
        &without_tools(&submit),
        &[
            "`ch-run` is not on PATH",
            "apt-get install charliecloud-runtime",
        ],
    );
    let outside = [
        "slurm-submit",
        "--dry-run",
        "--container",
        dir,
        "--",
        "--checkpoint-dir",
        "/ckpt",
    ];
    one_line_error(&without_tools(&outside), &["relative to --output-dir"]);
}
