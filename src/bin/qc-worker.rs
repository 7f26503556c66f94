//! `qc-worker`: the bundled SQS consumer. Everything is in `qc::worker::cli`, which `qc-operator` also
//! runs when started under this name (the image's one binary, docs/image.md).
#![deny(clippy::unwrap_used)]

use std::process::ExitCode;

/// mimalloc instead of the C library's malloc: allocation was an eighth of the worker's CPU per
/// message with glibc's (docs/benchmarks-history.md), and the image's musl malloc is slower still.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    qc::worker::cli::main()
}
