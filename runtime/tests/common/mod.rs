//! Skipping tests whose toolchain or GPU is missing — unless the environment
//! says it must be there, then failing with what to do.

#![allow(dead_code)]

use std::fmt::Display;

/// Call when `what` is missing: panics when `AEC_REQUIRE_TOOLCHAINS=1`
/// (CI), else prints a skip line; the caller then returns.
pub fn skip_toolchain(test: &str, what: impl Display) {
    if aec_runtime::toolchains_required() {
        panic!(
            "{test}: {what}\nAEC_REQUIRE_TOOLCHAINS=1 requires the CUDA toolchain: \
             run `cargo xtask toolchains` (or just `cargo xtask test`, which sets \
             everything up)"
        );
    }
    eprintln!("skipped {test}: {what} (run `cargo xtask test` to check it)");
}

/// Call when there is no GPU: panics when `AEC_REQUIRE_GPU=1`, else prints a
/// skip line; the caller then returns.
pub fn skip_gpu(test: &str, what: impl Display) {
    if std::env::var_os("AEC_REQUIRE_GPU").is_some_and(|v| v == "1") {
        panic!("{test}: {what}\nAEC_REQUIRE_GPU=1 requires a CUDA GPU and its driver");
    }
    eprintln!("skipped {test}: {what}");
}
