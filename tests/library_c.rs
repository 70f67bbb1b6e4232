//! The C interface of kernel libraries on a machine without a GPU: `aec
//! compile` on four examples (parallel, custom input, fixed size with GQA and
//! split-KV, recurrent), the generated `aec_library.h` over `aec_loader.h`
//! compiled as C99 and C++17 with warnings as errors, and the test program
//! `tests/c/api_check.c` run against it: every call-time check answers with
//! its status and message before anything needs the driver, and opening the
//! library without libcuda gives the loader's clear message and no crash.
//! The generator's text is deterministic and it refuses malformed manifests.
//!
//! Needs a C and a C++ compiler (`cc`, `c++`); without them the test is
//! skipped with a note, or fails where `AEC_REQUIRE_TOOLCHAINS=1` says they
//! must be there. The GPU side is `bench/library_c_check.sh`.

mod common;

use aec::library::c_header::{LOADER_H, generate};
use aec::runtime::driver_present;
use common::{repo, show};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// `aec compile` of the four examples into `dir`; the include/ files from
/// the generator where the CLI did not write them. Returns the manifest.
fn compile_library(dir: &Path) -> Value {
    common::compile_example_library(dir);
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let include = dir.join("include");
    std::fs::create_dir_all(&include).expect("include dir");
    let header = generate(&manifest).unwrap_or_else(|e| panic!("generate: {e}"));
    match std::fs::read_to_string(include.join("aec_library.h")) {
        // The CLI wrote it: it is the generator's text.
        Ok(written) => assert!(
            written == header,
            "the CLI's aec_library.h differs from generate(manifest)"
        ),
        Err(_) => {
            std::fs::write(include.join("aec_library.h"), &header).expect("write aec_library.h")
        }
    }
    match std::fs::read_to_string(include.join("aec_loader.h")) {
        Ok(written) => assert!(
            written == LOADER_H,
            "the CLI's aec_loader.h differs from LOADER_H"
        ),
        Err(_) => {
            std::fs::write(include.join("aec_loader.h"), LOADER_H).expect("write aec_loader.h")
        }
    }
    manifest
}

/// Compiles and links `source` against `dir/include`; C99 (`cc`) or C++17
/// (`c++`), warnings as errors.
fn build(source: &Path, dir: &Path, cpp: bool, exe: &Path) {
    let mut cmd = if cpp {
        let mut c = Command::new("c++");
        c.args(["-std=c++17", "-x", "c++"]);
        c
    } else {
        let mut c = Command::new("cc");
        c.args(["-std=c99", "-pedantic"]);
        c
    };
    // Fortified as Ubuntu builds by default (its checks warn where plain -O2 does not).
    cmd.args([
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O2",
        "-D_FORTIFY_SOURCE=2",
        "-I",
    ])
    .arg(dir.join("include"))
    .arg(source)
    .arg("-o")
    .arg(exe)
    .args(["-ldl", "-lm"]);
    let out = cmd.output().expect("run the compiler");
    assert!(
        out.status.success(),
        "{} of {} failed: {}",
        if cpp { "c++ -std=c++17" } else { "cc -std=c99" },
        source.display(),
        show(&out)
    );
}

#[test]
fn c_interface_compiles_checks_calls_and_reports_the_missing_driver() {
    let untested = "the C interface is not compiled";
    if !common::tool_ready("cc", untested) || !common::tool_ready("c++", untested) {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let lib = tmp.path().join("lib");
    let manifest = compile_library(&lib);
    let header = std::fs::read_to_string(lib.join("include/aec_library.h")).expect("header");

    // What the header declares for these four variants.
    for decl in [
        "typedef struct aec_softmax_sizes {",
        "static inline int aec_softmax_forward(aec_library *lib, const aec_softmax_sizes *sizes,",
        "static inline int aec_softmax_backward(aec_library *lib, const aec_softmax_sizes *sizes,",
        "static inline size_t aec_decode_forward_workspace_bytes(const aec_library *lib, const aec_decode_sizes *sizes);",
        "    const float *slopes; /* input, f32 [H]: custom input */",
        "    float *dslopes; /* output, f32 [H]: the gradient of `slopes` (zero-filled by the call: the kernels add into it) */",
        "    const float *state_in; /* optional input (NULL: absent), f32 [B, H, 128, 64]",
        "#define AEC_HAVE_MAMBA2_FORWARD 1",
        "#define AEC_DECODE_DQK 128",
        // The recurrent backward: dO (`do` is a C keyword), the optional
        // final-state gradient, the initial state's gradient when wanted.
        "#define AEC_HAVE_MAMBA2_BACKWARD 1",
        "static inline int aec_mamba2_backward(aec_library *lib, const aec_mamba2_sizes *sizes,",
        "    const void *do_; /* input, bf16 [B, H, S, 64]: the gradient of the output */",
        "    const float *d_state_out; /* optional input (NULL: absent), f32 [B, H, 128, 64]",
        "    float *d_state_in; /* optional output (NULL: not wanted), f32 [B, H, 128, 64]",
        "    float *ddt; /* output, f32 [B, H, S]: the gradient of `dt` (zero-filled by the call",
        // Its states pass is loaded from the build's second cubin, and
        // passed a null final state.
        "    const char *module_0 = NULL; /* the module `states` */",
        "        module_0 = \"kernels/aec_rec_states_mamba2_",
        "    if ((status = aecl_function_get(lib, module_0, \"aec_rec_states_mamba2_",
        "&p_state_in, &null_arg, &p_states, ",
    ] {
        assert!(header.contains(decl), "aec_library.h lacks `{decl}`");
    }
    assert!(
        !header.contains("No aec_mamba2_backward"),
        "the recurrent variant has its backward entry point"
    );
    // Deterministic: the same manifest gives the same text.
    assert_eq!(
        generate(&manifest).unwrap(),
        header,
        "generate is not deterministic"
    );

    let c_dir = repo().join("tests/c");
    for cpp in [false, true] {
        let suffix = if cpp { "cpp" } else { "c" };
        // The GPU check program must at least build here.
        build(
            &c_dir.join("forward_check.c"),
            &lib,
            cpp,
            &tmp.path().join(format!("forward_check_{suffix}")),
        );
        let exe = tmp.path().join(format!("api_check_{suffix}"));
        build(&c_dir.join("api_check.c"), &lib, cpp, &exe);
        let out = Command::new(&exe)
            .arg(&lib)
            .output()
            .expect("run api_check");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Every section of the program ran (the four variants are there).
        for section in [
            "softmax forward",
            "softmax backward",
            "alibi forward",
            "decode forward",
            "mamba2 forward",
            "mamba2 backward",
        ] {
            assert!(
                stdout.contains(&format!("section {section}")),
                "api_check ({suffix}) skipped the {section} checks: {}",
                show(&out)
            );
        }
        assert!(
            !stderr.contains("FAIL"),
            "api_check ({suffix}): {}",
            show(&out)
        );
        if driver_present() {
            // A machine with libcuda: the program opened the library (0) or
            // the driver refused (4, no device); either way no check failed.
            assert!(
                matches!(out.status.code(), Some(0 | 4)),
                "api_check ({suffix}) with a driver: {}",
                show(&out)
            );
            eprintln!("note: libcuda is present here; the missing-driver message is not checked");
        } else {
            assert_eq!(
                out.status.code(),
                Some(3),
                "api_check ({suffix}) without libcuda: {}",
                show(&out)
            );
            assert!(
                stderr.contains(
                    "aec_library_open: libcuda.so.1 not found: the NVIDIA driver is not installed"
                ),
                "api_check ({suffix}) did not print the loader's message: {}",
                show(&out)
            );
        }
    }

    // The same library as if built for AMD only, and as if NVRTC had been
    // missing: no CUDA build to pick, the header still compiles and every
    // check before the driver still answers.
    for (name, record) in [
        (
            "amd",
            json!({"target": "mi300x", "arch": "gfx942", "code_object": "kernels/x.co",
                   "modules": {"states": "kernels/x_states.co"}}),
        ),
        (
            "no_nvrtc",
            json!({"target": "h100", "arch": "sm_90a", "cubin": null}),
        ),
    ] {
        let mut m = manifest.clone();
        for v in m["variants"].as_array_mut().unwrap() {
            for k in v["kernels"].as_array_mut().unwrap() {
                if k.get("builds").is_some() {
                    k["builds"] = json!([record.clone()]);
                }
            }
        }
        let other = tmp.path().join(name);
        std::fs::create_dir_all(other.join("include")).unwrap();
        std::fs::write(other.join("manifest.json"), m.to_string()).unwrap();
        let h = generate(&m).unwrap_or_else(|e| panic!("generate ({name}): {e}"));
        let arch = record["arch"].as_str().unwrap();
        if name == "amd" {
            // The HIP builds are picked by arch, and only the HIP backend is
            // tried when the library is opened.
            assert!(
                h.contains("strcmp(lib->arch, \"gfx942\") == 0")
                    && h.contains("#define AEC_LIBRARY_BACKENDS (AEC_BACKEND_HIP)")
                    && !h.contains("sm_90a"),
                "{name}: the header should pick gfx942 and try HIP only"
            );
        } else {
            assert!(
                h.contains(&format!("kernels for {arch} (")) && !h.contains("strcmp(lib->arch"),
                "{name}: the header should list {arch} and pick nothing"
            );
        }
        std::fs::write(other.join("include/aec_library.h"), h).unwrap();
        std::fs::write(other.join("include/aec_loader.h"), LOADER_H).unwrap();
        let exe = tmp.path().join(format!("api_check_{name}"));
        build(&c_dir.join("api_check.c"), &other, false, &exe);
        let out = Command::new(&exe)
            .arg(&other)
            .output()
            .expect("run api_check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if name == "amd" {
            // No AMD GPU here: ROCm's runtime is absent (3), or present and
            // sees no GPU (4, as in CI, which installs libamdhip64). The
            // CUDA driver is never tried.
            match out.status.code() {
                Some(3) => assert!(
                    stderr.contains("aec_library_open: libamdhip64.so not found"),
                    "api_check ({name}): {}",
                    show(&out)
                ),
                Some(4) => assert!(
                    stderr.contains("aec_library_open: hip"),
                    "api_check ({name}): {}",
                    show(&out)
                ),
                _ => panic!("api_check ({name}) without an AMD GPU: {}", show(&out)),
            }
            assert!(!stderr.contains("libcuda"), "{name}: {}", show(&out));
        } else if !driver_present() {
            assert_eq!(
                out.status.code(),
                Some(3),
                "api_check ({name}): {}",
                show(&out)
            );
        }
    }
}

#[test]
fn generate_refuses_malformed_manifests_with_the_place() {
    let plan = json!({
        "pass": "forward",
        "sizes": [{"name": "B"}],
        "buffers": [{"name": "x", "role": "input", "dtype": "bf16", "shape": ["B", 64], "doc": "x"}],
        "launches": [{"entry": "k", "grid": ["B", 1, 1], "threads": 64, "dynamic_smem_bytes": 0,
                      "args": [{"ptr": "x"}, {"i32": "B"}]}]
    });
    let good = json!({"variants": [{"name": "V", "file": "v.rs", "pattern": "parallel", "kernels": [
        {"pass": "forward", "head_dims": {"D": 64}, "plan": plan,
         "builds": [{"target": "a100", "arch": "sm_80", "cubin": "kernels/k.sm_80.cubin"}]}
    ]}]});
    let h1 = generate(&good).expect("a well-formed manifest");
    assert_eq!(h1, generate(&good.clone()).unwrap(), "deterministic");

    let broken = |f: &dyn Fn(&mut Value)| {
        let mut m = good.clone();
        f(&mut m);
        generate(&m).expect_err("a malformed manifest must be refused")
    };
    let cases: Vec<(String, &str)> = vec![
        (broken(&|m| *m = json!([])), "`variants` is missing"),
        (
            broken(&|m| m["variants"][0]["kernels"] = json!(3)),
            "variants[0] (`V`): `kernels`",
        ),
        (
            broken(&|m| {
                m["variants"][0]["kernels"][0]["plan"]["buffers"][0]["role"] = json!("scratch")
            }),
            "variants[0] (`V`).kernels[0].plan",
        ),
        (
            broken(&|m| {
                m["variants"][0]["kernels"][0]["plan"]["launches"][0]["grid"][1] = json!("Skv")
            }),
            "grid[1] uses `Skv`",
        ),
        (
            broken(&|m| m["variants"][0]["kernels"][0]["plan"]["sizes"][0]["fixed"] = json!(0)),
            "fixed to 0",
        ),
        (
            broken(&|m| m["variants"][0]["kernels"][0]["head_dims"] = json!({"D": -1})),
            "head dim `D`",
        ),
        (
            broken(&|m| {
                m["variants"][0]["kernels"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("plan");
            }),
            "neither a `plan` nor a `skipped` note",
        ),
        (
            broken(&|m| {
                let mut second = m["variants"][0].clone();
                second["name"] = json!("v");
                m["variants"].as_array_mut().unwrap().push(second);
            }),
            "variant `v` needs the C name `aec_v_sizes`",
        ),
        (
            // A launch in a second module (the recurrent backward's states
            // pass) that the build does not list.
            broken(&|m| {
                m["variants"][0]["kernels"][0]["plan"]["launches"][0]["module"] = json!("states")
            }),
            "kernels[0].builds[0]: launch 0 (k) is in the module `states`, for which the build has no cubin",
        ),
    ];
    // With the module listed, the launch loads its entry from that cubin.
    let mut m = good.clone();
    m["variants"][0]["kernels"][0]["plan"]["launches"][0]["module"] = json!("states");
    m["variants"][0]["kernels"][0]["builds"][0]["modules"] =
        json!({"states": "kernels/s.sm_80.cubin"});
    let h = generate(&m).expect("a launch in a listed module");
    assert!(
        h.contains("        module_0 = \"kernels/s.sm_80.cubin\";")
            && h.contains("aecl_function_get(lib, module_0, \"k\", 0u, &fn[0])"),
        "{h}"
    );
    for (err, want) in cases {
        assert!(err.contains(want), "error `{err}` should contain `{want}`");
    }
}
