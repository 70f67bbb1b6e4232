//! `aec compile`: library layout, manifest, determinism, refusals.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn aec(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run aec");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "aec {args:?} panicked:\n{stderr}"
    );
    (out.status.code(), stderr)
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json"),
    )
    .expect("valid JSON")
}

#[test]
fn compiles_an_example_into_a_library_deterministically() {
    let (a, b) = (scratch("a"), scratch("b"));
    for dir in [&a, &b] {
        let (code, err) = aec(&[
            "compile",
            "examples/softmax.rs",
            "examples/alibi.rs",
            "-t",
            "h100,a100",
            "-o",
            dir.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(0), "{err}");
    }
    let m = manifest(&a);
    let variants = m["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 2);
    let k = &variants[0]["kernels"][0];
    assert_eq!(variants[0]["name"], "Softmax");
    let entry = k["entry"].as_str().expect("entry");
    let source =
        std::fs::read_to_string(a.join(k["source"].as_str().unwrap())).expect("kernel source");
    assert!(
        source.contains(&format!("{entry}(")),
        "the source defines the entry point"
    );
    // One forward kernel per instruction set: sm_80 (mma.sync) for the A100,
    // sm_90a (wgmma, a producer warpgroup and two computing ones) for the H100.
    assert_eq!(k["pass"], "forward");
    assert_eq!(k["launch"]["threads"], 128);
    assert_eq!(k["builds"][0]["target"], "a100");
    let hopper = &variants[0]["kernels"][1];
    assert_eq!(hopper["pass"], "forward");
    assert_eq!(hopper["launch"]["threads"], 384);
    assert_eq!(hopper["builds"][0]["target"], "h100");
    let hopper_src =
        std::fs::read_to_string(a.join(hopper["source"].as_str().unwrap())).expect("source");
    assert!(hopper_src.contains("wgmma.mma_async"));
    assert_eq!(
        k["row_outputs"],
        serde_json::json!(["scale.lse", "state.m", "state.l"])
    );
    assert_eq!(
        variants[1]["kernels"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["kind"] == "custom")
            .count(),
        1
    );
    // Same inputs, byte-identical library.
    assert_eq!(
        std::fs::read(a.join("manifest.json")).unwrap(),
        std::fs::read(b.join("manifest.json")).unwrap()
    );
    assert_eq!(
        source,
        std::fs::read_to_string(b.join(k["source"].as_str().unwrap())).unwrap()
    );
    // The backward: one source with the three entry points the manifest lists.
    let bk = &variants[1]["kernels"][2];
    assert_eq!(bk["pass"], "backward");
    let bsrc =
        std::fs::read_to_string(a.join(bk["source"].as_str().unwrap())).expect("backward source");
    let launches = bk["launches"].as_array().expect("launches");
    assert_eq!(launches.len(), 3);
    for l in launches {
        let e = l["entry"].as_str().expect("entry");
        assert!(bsrc.contains(&format!("{e}(BWD_ARGS)")), "{e} defined");
    }
    // ALiBi's slopes get a gradient argument.
    assert_eq!(
        bk["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["kind"] == "custom_grad" && x["name"] == "slopes")
            .count(),
        1
    );
    // With NVRTC (CI installs it), one cubin per architecture; without, sources only.
    for b in bk["builds"].as_array().expect("backward builds") {
        if aec::runtime::nvrtc_present() {
            let cubin =
                std::fs::read(a.join(b["cubin"].as_str().expect("cubin path"))).expect("cubin");
            assert_eq!(&cubin[..4], b"\x7fELF");
        }
    }
    let builds: Vec<&serde_json::Value> = [k, hopper]
        .iter()
        .flat_map(|k| k["builds"].as_array().expect("builds"))
        .collect();
    assert_eq!(builds.len(), 2);
    if aec::runtime::nvrtc_present() {
        for b in builds {
            let cubin =
                std::fs::read(a.join(b["cubin"].as_str().expect("cubin path"))).expect("cubin");
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "{}: a cubin is an ELF file",
                b["arch"]
            );
        }
    } else {
        assert!(
            !aec::runtime::toolchains_required(),
            "NVRTC must be present when toolchains are required"
        );
        assert!(builds.iter().all(|b| b["cubin"].is_null()));
    }
}

fn aec_with_path(args: &[&str], path: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(args)
        .current_dir(root())
        .env("PATH", path)
        .env_remove("AEC_HIPCC")
        .output()
        .expect("run aec");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// AMD targets get the HIP forward and backward: sources, and with a HIP
/// compiler on PATH the code objects (AMDGPU ELFs) and their resources;
/// without one, the sources and a note saying what to install.
#[test]
fn amd_targets_get_hip_kernels() {
    let dir = scratch("amd");
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "-t",
        "mi250,mi300x",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let m = manifest(&dir);
    let kernels = m["variants"][0]["kernels"].as_array().expect("kernels");
    let forwards: Vec<_> = kernels.iter().filter(|k| k["pass"] == "forward").collect();
    assert_eq!(forwards.len(), 2, "{kernels:?}");
    let has_compiler = aec::runtime::find_hip_compiler("gfx942").is_ok();
    for (k, gfx) in forwards.iter().zip(["gfx90a", "gfx942"]) {
        let entry = k["entry"].as_str().expect("entry");
        assert!(entry.ends_with(gfx), "{entry}");
        let source = std::fs::read_to_string(dir.join(k["source"].as_str().unwrap())).unwrap();
        assert!(
            source.contains(&format!("void {entry}(")),
            "entry in source"
        );
        assert!(source.contains("#define WAVE 64"));
        let build = &k["builds"][0];
        assert_eq!(build["arch"], gfx);
        if has_compiler {
            let co = std::fs::read(dir.join(build["code_object"].as_str().expect("code object")))
                .unwrap();
            assert_eq!(&co[..4], b"\x7fELF", "an AMDGPU code object is an ELF file");
            assert_eq!(build["report"]["usage"]["scratch_bytes"], 0);
            assert!(build["report"]["usage"]["lds_bytes"].as_u64().unwrap() > 0);
        } else {
            assert!(!aec::runtime::toolchains_required(), "HIP tools required");
        }
    }
    let backwards: Vec<_> = kernels.iter().filter(|k| k["pass"] == "backward").collect();
    assert_eq!(backwards.len(), 2, "{kernels:?}");
    for b in backwards {
        let launches = b["launches"].as_array().expect("three launches");
        assert_eq!(launches.len(), 3);
        let source = std::fs::read_to_string(dir.join(b["source"].as_str().unwrap())).unwrap();
        for l in launches {
            let entry = l["entry"].as_str().unwrap();
            assert!(source.contains(&format!("void {entry}(")), "{entry}");
        }
        if has_compiler {
            assert!(b["builds"][0]["code_object"].is_string(), "{b}");
        }
    }
    // No HIP compiler on PATH: the sources and a note, no failure.
    let bare = scratch("amd-bare");
    let (code, err) = aec_with_path(
        &[
            "compile",
            "examples/softmax.rs",
            "-t",
            "mi300x",
            "-o",
            bare.to_str().unwrap(),
        ],
        "/nonexistent",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("clang++-19") && err.contains("install"),
        "{err}"
    );
    let k = &manifest(&bare)["variants"][0]["kernels"][0];
    assert!(k["builds"][0]["code_object"].is_null());
    assert!(bare.join(k["source"].as_str().unwrap()).is_file());
}

#[test]
fn bad_dims_and_targets_are_refused_clearly() {
    let dir = scratch("bad");
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "-t",
        "h100",
        "--head-dims",
        "12x",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--head-dims `12x`"), "{err}");
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "-t",
        "h100",
        "--head-dims",
        "72",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("Dqk = 72") && err.contains("multiple of 16"),
        "{err}"
    );
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "-t",
        "tpu",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("invalid value 'tpu'"), "{err}");
}

#[test]
fn recurrent_variants_are_skipped_with_a_warning_and_broken_files_point_at_the_token() {
    let dir = scratch("rec");
    let (code, err) = aec(&[
        "compile",
        "examples/mamba2.rs",
        "-t",
        "h100",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("recurrent kernels are not implemented yet"),
        "{err}"
    );
    assert_eq!(
        manifest(&dir)["variants"][0]["skipped"],
        "recurrent kernels are not implemented yet"
    );
    let (code, err) = aec(&[
        "compile",
        "tests/cli_fixtures/unknown_function.rs",
        "-t",
        "h100",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("tests/cli_fixtures/unknown_function.rs:")
            && err.contains("unknown function `expo`"),
        "{err}"
    );
}
