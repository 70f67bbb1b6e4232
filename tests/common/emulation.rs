//! Building and running the HIP templates' CPU emulation (the kernel source
//! rendered with `HipPrelude::CpuEmulation` plus a C++ driver in one
//! directory).

use std::path::Path;
use std::process::Command;

/// The C++20 compiler (`$CXX`, else g++); `None` after a skip line when
/// there is none, a failure where toolchains are required.
pub fn cxx() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    super::tool_ready(&cxx, "the HIP emulation needs a C++20 compiler (set CXX)").then_some(cxx)
}

/// Builds `dir/driver.cpp` (which includes the kernel sources next to it)
/// with `cxx` and runs it in `dir`; `what` names the case in failures.
pub fn build_and_run(cxx: &str, dir: &Path, what: &str) {
    run(
        Command::new(cxx).current_dir(dir).args([
            "-std=c++20",
            "-O1",
            "-pthread",
            "-w",
            "driver.cpp",
            "-o",
            "driver",
        ]),
        &format!("{what}: building the emulated kernel"),
    );
    run(
        Command::new(dir.join("driver")).current_dir(dir),
        &format!("{what}: the emulated kernel"),
    );
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
