//! `aec-bench --nvrtc` builds the benchmark's cubins with NVRTC and the
//! runtime's options (what the runtime and `aec compile` ship) and says so
//! in `index.json`; asking for two compilers is refused.

use serde_json::Value;
use std::process::Command;

fn aec_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_aec-bench"))
}

#[test]
fn nvrtc_builds_the_benchmark_cubins_and_index_names_it() {
    let headers = aec::runtime::cuda_include_dirs()
        .iter()
        .any(|d| d.join("cuda_bf16.h").is_file());
    if !aec::runtime::nvrtc_present() || !headers {
        let msg =
            "NVRTC or the CUDA headers (AEC_CUDA_INCLUDE) not found: `aec-bench --nvrtc` untested";
        assert!(!aec::runtime::toolchains_required(), "{msg}");
        eprintln!("skipped: {msg}");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let out = aec_bench()
        .arg(dir.path())
        .args(["--nvrtc", "--workloads", "relu-b64-h6-s1024-d64"])
        .output()
        .expect("run aec-bench");
    assert!(
        out.status.success(),
        "aec-bench failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("index.json")).expect("index.json"),
    )
    .expect("index.json is JSON");
    let compiler = index["compiler"].as_str().expect("compiler recorded");
    assert!(compiler.starts_with("nvrtc "), "{compiler}");
    let entry = &index["bench"][0];
    assert_eq!(entry["workload"], "relu-b64-h6-s1024-d64");
    for meta in [&entry["kernel"], &entry["backward"]] {
        let cubin = meta["cubin"].as_str().expect("a cubin name");
        let bytes = std::fs::read(dir.path().join(cubin)).expect("the cubin");
        assert_eq!(&bytes[..4], b"\x7fELF", "{cubin} is not an ELF cubin");
        let ptxas = meta["ptxas"].to_string();
        assert!(ptxas.contains("registers"), "{cubin}: ptxas lines {ptxas}");
    }
}

#[test]
fn two_compilers_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = aec_bench()
        .arg(dir.path())
        .args(["--nvrtc", "--nvcc", "/usr/bin/false"])
        .output()
        .expect("run aec-bench");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pick one compiler"), "{err}");
    assert!(
        !dir.path().join("index.json").exists(),
        "wrote cases despite the refusal"
    );
}
