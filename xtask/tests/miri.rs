//! `cargo xtask miri` in the test suite: the CPU kernels' `unsafe` code,
//! AVX-512 included, under Miri. Skipped, saying so, where the nightly
//! toolchain has no Miri; `REQUIRE_MIRI=1` makes that a failure.

use std::path::Path;
use std::process::Command;

#[test]
fn the_cpu_kernels_do_nothing_undefined_on_either_instruction_set() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("miri")
        .current_dir(root)
        .output()
        .expect("running cargo xtask miri");
    let said = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && said.contains("Miri is not installed") {
        assert!(
            std::env::var_os("REQUIRE_MIRI").is_none_or(|v| v != "1"),
            "REQUIRE_MIRI=1, but {said}"
        );
        eprintln!("SKIPPED: {}", said.trim());
        return;
    }
    assert!(out.status.success(), "cargo xtask miri failed:\n{said}");
    // Both instruction sets ran the kernels' tests.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let runs = stdout
        .matches("test simd::tests::a_block_is_its_documented_sum ... ok")
        .count();
    assert_eq!(runs, 2, "{stdout}");
}
