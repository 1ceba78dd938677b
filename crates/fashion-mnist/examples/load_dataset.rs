//! Loads the data set from the directory given as the only argument and
//! prints its sizes, or the error. A small binary to measure the reader's
//! peak memory on a crafted copy (see docs/security.md, "Hostile inputs"):
//! `/usr/bin/time -v cargo run --release -p fashion-mnist --example load_dataset -- DIR`.

use fashion_mnist::FashionMnist;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: load_dataset DIR");
        return ExitCode::FAILURE;
    };
    match FashionMnist::load(&dir) {
        Ok(data) => {
            println!(
                "train {} and test {} examples",
                data.train.len, data.test.len
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
