//! The Python module of kernel libraries (`templates/library/aec_library.py`,
//! copied into `DIR/python/`): its unit tests
//! (`tests/python/test_aec_library.py`, stdlib only: no PyTorch, no GPU) run
//! against the plans of a library the CLI compiles here. Cubins are not
//! needed: the compile runs without `LD_LIBRARY_PATH` (no NVRTC from the
//! toolchain folder), which keeps it fast; with NVRTC found elsewhere it
//! builds cubins, and the tests pass either way.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn python_module_unit_tests_pass_on_a_compiled_library() {
    if !common::tool_ready("python3", "the Python module's unit tests need it") {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = tempfile::tempdir().expect("temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args([
            "compile",
            // Alibi: custom input, `equal` heads, a backward; Decode: a fixed
            // size, `multiple_of`, split-KV; Mamba2: recurrent, optional
            // state buffers, a backward with a states pass in a second
            // module. (Each parallel variant costs about
            // 9 s in a debug build, so no more than these.)
            "examples/alibi.rs",
            "examples/decode.rs",
            "examples/mamba2.rs",
            "--head-dims",
            "128x64",
            "--target",
            "h100,a100",
            "--no-tuning",
            "-o",
        ])
        .arg(lib.path())
        .env_remove("LD_LIBRARY_PATH")
        .current_dir(root)
        .output()
        .expect("run aec");
    assert!(
        out.status.success(),
        "aec compile failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("python3")
        .args(["-m", "unittest", "-v", "tests/python/test_aec_library.py"])
        .env("AEC_TEST_LIBRARY", lib.path())
        .env_remove("AEC_TEST_MANIFEST")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(root)
        .output()
        .expect("run python3");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the Python module's unit tests failed:\n{log}"
    );
    // The tests that read the library's plans ran (they skip without one).
    assert!(
        !log.contains("set AEC_TEST_LIBRARY"),
        "the manifest tests were skipped:\n{log}"
    );
    assert!(
        log.contains("WithManifest.test_every_plan_of_the_library_prepares) ... ok"),
        "the plan tests did not run:\n{log}"
    );
}
