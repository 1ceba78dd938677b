//! The emulator's cp.async (`cpp/emu_kernel.h`) holds each copy until the
//! `cp.async.wait_group` that lets it finish, so a kernel that reads its
//! staged tile before the wait reads stale shared memory and fails the
//! parity suite. Checked on one thread, with the header compiled as a small
//! C++ program (`$CXX`, else `c++`: what the emulator itself is built with).

use std::path::Path;
use std::process::Command;
use std::{env, fs};

/// Stands in for the runtime (`cpp/fibers.cpp`): one thread, a barrier
/// that has no one to wait for. Prints one line per wrong value.
const PROGRAM: &str = r#"
#include "emu_kernel.h"
#include <cstdio>

namespace cuda_emu {
dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};
void syncthreads() {}
}  // namespace cuda_emu

static int failures = 0;
static void expect(const char* what, float got, float want) {
    if (got != want) {
        std::printf("%s: %g, want %g\n", what, got, want);
        ++failures;
    }
}

int main() {
    const float global[3] = {1.0f, 2.0f, 3.0f};
    float shared[4] = {-1.0f, -1.0f, -1.0f, -1.0f};
    cp_async_f32(&shared[0], &global[0], true);
    cp_async_f32(&shared[1], &global[1], false);  // zero fill
    cp_async_commit();
    cp_async_f32(&shared[2], &global[2], true);
    cp_async_commit();
    cp_async_f32(&shared[3], &global[1], true);  // not committed yet
    expect("read before any wait", shared[0], -1.0f);
    expect("zero fill before any wait", shared[1], -1.0f);
    cp_async_wait<1>();
    expect("the older group after wait_group 1", shared[0], 1.0f);
    expect("its zero fill", shared[1], 0.0f);
    expect("the newer group after wait_group 1", shared[2], -1.0f);
    cp_async_wait<0>();
    expect("the newer group after wait_group 0", shared[2], 3.0f);
    expect("an uncommitted copy after wait_group 0", shared[3], -1.0f);
    cp_async_commit();
    cp_async_wait<0>();
    expect("that copy once committed and waited for", shared[3], 2.0f);
    return failures == 0 ? 0 : 1;
}
"#;

#[test]
fn cp_async_copies_land_at_their_wait_and_not_before() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cp-async");
    fs::create_dir_all(&dir).expect("create the test folder");
    let source = dir.join("cp_async.cpp");
    fs::write(&source, PROGRAM).expect("write the program");
    let binary = dir.join("cp_async");
    let compiler = env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let headers = Path::new(env!("CARGO_MANIFEST_DIR")).join("cpp");
    let built = Command::new(&compiler)
        .args(["-std=c++20", "-O1", "-I"])
        .arg(&headers)
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .unwrap_or_else(|e| panic!("run `{compiler}` (the emulator's compiler): {e}"));
    assert!(
        built.status.success(),
        "compile: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = Command::new(&binary).output().expect("run the program");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stdout)
    );
}
