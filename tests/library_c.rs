//! The C interface of kernel libraries on a machine without a GPU: `aec
//! compile` on four examples (parallel, custom input, fixed size with GQA and
//! split-KV, recurrent), the generated `aec_library.h` over `aec_loader.h`
//! compiled as C99 and C++17 with warnings as errors, and the test program
//! `tests/c/api_check.c` run against it: every call-time check answers with
//! its status and message before anything needs the driver, and opening the
//! library without libcuda gives the loader's clear message and no crash.
//! The generator's text is deterministic and it refuses malformed manifests.
//!
//! Tensor maps (the sm_90a kernels' TMA descriptors, passed by value) are
//! checked against `tests/c/fake_cuda.c`, a test double of libcuda.so.1
//! that decodes the maps it encoded at launch: a small plan's and the
//! Softmax forward's maps reach the kernel as the plan says, a failing
//! encoder, a driver without one and a HIP backend are refused by name, and
//! malformed tensor-map arguments are refused by the generator.
//!
//! Needs a C and a C++ compiler (`cc`, `c++`); without them the test is
//! skipped with a note, or fails where `AEC_REQUIRE_TOOLCHAINS=1` says they
//! must be there. The GPU side is `bench/library_c_check.sh`.

mod common;

use aec::compiler::launch_plan::{ArgPlan, Dtype, EntryPlan, SizeExpr};
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
        // The decoding forward's KV splits: the call caps them by the
        // driver's occupancy count of its split launch (registers
        // included), the workspace query by shared memory alone (an upper
        // bound of the call's).
        "_plan(lib, s, aecl_resident_blocks(lib, fn[0], ",
        "_plan(lib, sizes, 0, &layout, err, sizeof err)",
        "lib->sm_count, lib->smem_per_sm, resident);",
        // The sm_90a Softmax forward takes tensor maps of q, k and v.
        "aecl_tensor_map_encode(lib, maps + 0u * AECL_TENSOR_MAP_BYTES, AECL_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2u, aecl_dptr(b->q), ",
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

/// Compiles the CUDA driver's test double (`tests/c/fake_cuda.c`) into
/// `dir/libcuda.so.1`; `old`: without `cuTensorMapEncodeTiled`, as drivers
/// before CUDA 12.
fn build_fake_cuda(dir: &Path, old: bool) {
    std::fs::create_dir_all(dir).expect("fake driver dir");
    let mut cmd = Command::new("cc");
    cmd.args([
        "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC",
    ]);
    if old {
        cmd.arg("-DFAKE_CUDA_NO_TENSOR_MAP");
    }
    let out = cmd
        .arg(repo().join("tests/c/fake_cuda.c"))
        .arg("-o")
        .arg(dir.join("libcuda.so.1"))
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc fake_cuda.c: {}", show(&out));
}

/// `LD_LIBRARY_PATH` with `dir` first (a test double found before the real
/// driver).
fn library_path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).expect("LD_LIBRARY_PATH")
}

/// An image the test double's `cuModuleLoadData` takes (it only looks for
/// the ELF magic).
const FAKE_CUBIN: &[u8] = b"\x7fELF\x02\x01\x01\0fake cubin for the CUDA driver's test double\n";

/// What the CUDA double logs for a launch of `launch` with the buffers at
/// `ptrs` (name -> hex address) for `sizes` (kv_splits 1, `sms` 132: the
/// double's multiprocessors), tensor maps decoded.
fn expected_fake_launch(
    plan: &EntryPlan,
    launch: &aec::compiler::launch_plan::LaunchPlan,
    sizes: &[(&str, u64)],
    ptrs: &[(String, String)],
) -> String {
    let var = |n: &str| match n {
        "kv_splits" => Some(1),
        "sms" => Some(132),
        _ => sizes.iter().find(|(s, _)| *s == n).map(|x| x.1),
    };
    let ev = |e: &SizeExpr| e.eval(&var).unwrap_or_else(|| panic!("evaluate {e}"));
    let ptr = |n: &str| {
        ptrs.iter()
            .find(|(p, _)| p == n)
            .unwrap_or_else(|| panic!("no address of {n}"))
            .1
            .clone()
    };
    let mut line = format!(
        "launch {} grid {} {} {} block {} 1 1 smem {} args",
        launch.entry,
        ev(&launch.grid[0]),
        ev(&launch.grid[1]),
        ev(&launch.grid[2]),
        launch.threads,
        launch.dynamic_smem_bytes
    );
    for a in &launch.args {
        match a {
            ArgPlan::Ptr(n) => line += &format!(" p{}", ptr(n)),
            ArgPlan::Null(_) => line += " p0",
            ArgPlan::I32(e) => line += &format!(" i{}", ev(e)),
            ArgPlan::TensorMap(m) => {
                let b = plan.buffer(&m.buffer).expect("mapped buffer");
                let d = m.dims.clone().map(|e| ev(&e));
                let bytes = b.dtype.bytes();
                let [b0, b1, b2] = m.box_dims;
                line += &format!(
                    " m{},3,{},{}x{}x{},{}x{},{b0}x{b1}x{b2},1x1x1,0,3,2,0",
                    b.dtype.tensor_map_data_type(),
                    ptr(&m.buffer),
                    d[0],
                    d[1],
                    d[2],
                    d[0] * bytes,
                    d[0] * d[1] * bytes
                );
            }
        }
    }
    line
}

/// The letters the CUDA double decodes a launch's arguments by.
fn fake_arg_kinds(launch: &aec::compiler::launch_plan::LaunchPlan) -> String {
    launch
        .args
        .iter()
        .map(|a| match a {
            ArgPlan::Ptr(_) | ArgPlan::Null(_) => 'p',
            ArgPlan::I32(_) => 'i',
            ArgPlan::TensorMap(_) => 'm',
        })
        .collect()
}

/// The `name=hex` pairs of a `ptrs ...` line.
fn parse_ptrs(stdout: &str) -> Vec<(String, String)> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("ptrs "))
        .unwrap_or_else(|| panic!("no ptrs line in {stdout}"));
    line["ptrs ".len()..]
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("name=hex");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The message of a `call <what>: <status> <message>` line.
fn call_line<'a>(stdout: &'a str, what: &str) -> &'a str {
    let tag = format!("call {what}: ");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(tag.as_str()))
        .unwrap_or_else(|| panic!("no `{tag}` line in {stdout}"))
}

/// A small plan with tensor maps of two inputs (bf16 and f16), one used
/// by two launches, next to plain pointers and ints.
fn tensor_map_manifest() -> Value {
    json!({"variants": [{"name": "Tmap", "file": "tmap.rs", "pattern": "parallel", "kernels": [{
        "pass": "forward", "head_dims": {"D": 64},
        "builds": [{"target": "h100", "arch": "sm_90a", "cubin": "kernels/tmap.sm_90a.cubin"}],
        "plan": {
            "pass": "forward",
            "sizes": [{"name": "B"}, {"name": "S"}],
            "buffers": [
                {"name": "x", "role": "input", "dtype": "bf16", "shape": ["B", "S", 64], "doc": "x"},
                {"name": "h", "role": "input", "dtype": "f16", "shape": ["B", "S", 64], "doc": "h"},
                {"name": "y", "role": "output", "dtype": "f32", "shape": ["B", "S", 64], "doc": "y"},
                {"name": "w", "role": "input", "dtype": "f32", "shape": ["B"], "doc": "w"}
            ],
            "launches": [
                {"entry": "k_main", "grid": [{"ceil_div": ["S", 64]}, "B", 1], "threads": 128,
                 "dynamic_smem_bytes": 1024,
                 "args": [{"ptr": "x"}, {"ptr": "y"}, {"i32": "S"},
                          {"tensor_map": {"buffer": "x", "dims": [64, "S", "B"], "box": [64, 64, 1]}},
                          {"tensor_map": {"buffer": "h", "dims": [64, {"mul": ["S", "B"]}, 1], "box": [32, 128, 1]}}]},
                {"entry": "k_tail", "grid": ["B", 1, 1], "threads": 64, "dynamic_smem_bytes": 0,
                 "args": [{"ptr": "w"}, {"tensor_map": {"buffer": "x", "dims": [64, "S", "B"], "box": [64, 64, 1]}}]}
            ]
        }
    }]}]})
}

/// A program calling the `Tmap` forward of [`tensor_map_manifest`] with
/// B = 3, S = 100 (every pointer allocated on the device) and printing
/// what the call returned.
const TMAP_CALL_C: &str = r#"#include "aec_library.h"

int main(int argc, char **argv)
{
    aec_library lib;
    aec_tmap_sizes s;
    aec_tmap_forward_buffers b;
    void *x = NULL, *h = NULL, *y = NULL, *w = NULL;
    int st;
    if (argc != 2)
        return 2;
    st = aec_library_open(&lib, argv[1]);
    printf("open: %s %s\n", aec_status_name(st), aec_last_error(&lib));
    if (st != AEC_OK)
        return 1;
    s.B = 3; s.S = 100; s.D = AEC_TMAP_D;
    if (aec_device_alloc(&lib, 3 * 100 * 64 * 2, &x) != AEC_OK || aec_device_alloc(&lib, 3 * 100 * 64 * 2, &h) != AEC_OK ||
        aec_device_alloc(&lib, 3 * 100 * 64 * 4, &y) != AEC_OK || aec_device_alloc(&lib, 3 * 4, &w) != AEC_OK)
        return 1;
    b.x = x; b.h = h; b.y = (float *)y; b.w = (const float *)w;
    printf("ptrs x=%llx h=%llx y=%llx w=%llx\n", (unsigned long long)(uintptr_t)x, (unsigned long long)(uintptr_t)h,
           (unsigned long long)(uintptr_t)y, (unsigned long long)(uintptr_t)w);
    st = aec_tmap_forward(&lib, &s, &b, NULL, NULL);
    printf("call forward: %s %s\n", aec_status_name(st), aec_last_error(&lib));
    aec_device_free(&lib, x);
    aec_device_free(&lib, h);
    aec_device_free(&lib, y);
    aec_device_free(&lib, w);
    aec_library_close(&lib);
    return 0;
}
"#;

#[test]
fn generate_encodes_tensor_maps_and_refuses_malformed_ones() {
    let good = tensor_map_manifest();
    let h = generate(&good).unwrap_or_else(|e| panic!("generate: {e}"));
    assert_eq!(h, generate(&good).unwrap(), "deterministic");
    for want in [
        "#if !defined(AEC_LOADER_VERSION) || AEC_LOADER_VERSION != 3",
        // One map per distinct plan, the second launch reusing the first.
        "    unsigned char map_storage[2u * AECL_TENSOR_MAP_BYTES + AECL_TENSOR_MAP_ALIGN - 1u];",
        "    uint64_t map1[3], map1_elements; /* the tensor map of h: [64, S * B, 1] innermost first */",
        "    L->map1[1] = aecl_mul(n_S, n_B, &ovf);",
        "aecl_check_tensor_map(err, errn, \"aec_tmap_forward\", \"k_main\", \"h\", L->map1, 2u, L->map1_elements)",
        "        const uint32_t box[3] = {32u, 128u, 1u};",
        "aecl_tensor_map_encode(lib, maps + 0u * AECL_TENSOR_MAP_BYTES, AECL_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2u, aecl_dptr(b->x), L.map0, box, \"aec_tmap_forward\", \"k_main\", \"x\")",
        "AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2u, aecl_dptr(b->h), L.map1, box,",
        "void *args[] = {&p_x, &p_y, &a2, maps + 0u * AECL_TENSOR_MAP_BYTES, maps + 1u * AECL_TENSOR_MAP_BYTES};",
        "void *args[] = {&p_w, maps + 0u * AECL_TENSOR_MAP_BYTES};",
        // h is read only through its map.
        "    (void)p_h;",
    ] {
        assert!(h.contains(want), "the header lacks `{want}`:\n{h}");
    }
    assert_eq!(h.matches("aecl_tensor_map_encode(lib").count(), 2, "{h}");
    // The loader's enum values are the plan's (Dtype::tensor_map_data_type).
    for (dtype, name) in [
        (Dtype::Bf16, "BFLOAT16"),
        (Dtype::F16, "FLOAT16"),
        (Dtype::F32, "FLOAT32"),
    ] {
        let def = format!(
            "#define AECL_CU_TENSOR_MAP_DATA_TYPE_{name} {}\n",
            dtype.tensor_map_data_type()
        );
        assert!(LOADER_H.contains(&def), "aec_loader.h lacks `{def}`");
    }

    // Malformed tensor-map arguments are refused, naming the place and buffer.
    let broken = |arg: Value| {
        let mut m = good.clone();
        m["variants"][0]["kernels"][0]["plan"]["launches"][0]["args"][3] = arg;
        generate(&m).expect_err("a malformed tensor map must be refused")
    };
    let map = |buffer: &str, bx: Value| json!({"tensor_map": {"buffer": buffer, "dims": [64, "S", "B"], "box": bx}});
    let at = "variants[0] (`Tmap`).kernels[0].plan: launch 0 (k_main) argument 3";
    for (err, wants) in [
        (
            broken(map("z", json!([64, 64, 1]))),
            vec![
                at,
                "a tensor map of `z`, which is not one of the plan's buffers",
            ],
        ),
        (
            broken(map("y", json!([64, 64, 1]))),
            vec![at, "`y`, which is an output", "required inputs only"],
        ),
        (
            broken(map("w", json!([64, 64, 1]))),
            vec![at, "`w`, an f32 buffer", "bf16 or f16"],
        ),
        (
            broken(map("x", json!([64, 0, 1]))),
            vec![
                at,
                "the tensor map of `x`",
                "[64, 0, 1]: 0 is outside [1, 256]",
            ],
        ),
        (
            broken(map("x", json!([64, 300, 1]))),
            vec![at, "[64, 300, 1]: 300 is outside [1, 256]"],
        ),
        (
            broken(map("x", json!([128, 64, 1]))),
            vec![
                at,
                "box rows of 128 bf16 elements, 256 bytes",
                "128-byte swizzle",
            ],
        ),
        (
            broken(
                json!({"tensor_map": {"buffer": "x", "dims": [64, "Q", "B"], "box": [64, 64, 1]}}),
            ),
            vec![at, "(the tensor map of `x`) dims[1] uses `Q`"],
        ),
    ] {
        for want in wants {
            assert!(err.contains(want), "error `{err}` should contain `{want}`");
        }
    }

    // The generated code compiles warning-free as C99 and C++17, and with
    // the CUDA driver's test double it encodes both maps and passes them by
    // value to both launches.
    let untested = "the tensor-map code is not compiled";
    if !common::tool_ready("cc", untested) || !common::tool_ready("c++", untested) {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let lib = tmp.path().join("lib");
    std::fs::create_dir_all(lib.join("include")).unwrap();
    std::fs::create_dir_all(lib.join("kernels")).unwrap();
    std::fs::write(lib.join("manifest.json"), good.to_string()).unwrap();
    std::fs::write(lib.join("kernels/tmap.sm_90a.cubin"), FAKE_CUBIN).unwrap();
    std::fs::write(lib.join("include/aec_library.h"), &h).unwrap();
    std::fs::write(lib.join("include/aec_loader.h"), LOADER_H).unwrap();
    let source = tmp.path().join("tmap_call.c");
    std::fs::write(&source, TMAP_CALL_C).unwrap();
    let fake = tmp.path().join("fake");
    build_fake_cuda(&fake, false);
    let plan: EntryPlan =
        serde_json::from_value(good["variants"][0]["kernels"][0]["plan"].clone()).unwrap();
    let kinds: Vec<String> = plan.launches.iter().map(fake_arg_kinds).collect();
    for cpp in [false, true] {
        let exe = tmp.path().join(format!("tmap_call_{cpp}"));
        build(&source, &lib, cpp, &exe);
        let log = tmp.path().join(format!("tmap_{cpp}.log"));
        let out = Command::new(&exe)
            .arg(&lib)
            .env("LD_LIBRARY_PATH", library_path_with(&fake))
            .env("AEC_FAKE_CUDA_LOG", &log)
            .env("AEC_FAKE_CUDA_ARGS", kinds.join(","))
            .output()
            .expect("run tmap_call");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "tmap_call: {}", show(&out));
        assert!(
            call_line(&stdout, "forward").starts_with("AEC_OK"),
            "{}",
            show(&out)
        );
        let ptrs = parse_ptrs(&stdout);
        let sizes = [("B", 3), ("S", 100)];
        let want: Vec<String> = plan
            .launches
            .iter()
            .map(|l| expected_fake_launch(&plan, l, &sizes, &ptrs))
            .collect();
        let got = std::fs::read_to_string(&log).expect("the double's launch log");
        assert_eq!(got.lines().collect::<Vec<_>>(), want, "{}", show(&out));
    }
}

/// A code object the HIP runtime's test double (`tests/c/fake_hip.c`)
/// loads: an AMDGPU ELF header for gfx942 whose section headers (none)
/// start after `entry`'s name, so the double finds the entry in it.
fn fake_gfx942_code_object(entry: &str) -> Vec<u8> {
    let mut image = vec![0u8; 64];
    image[..4].copy_from_slice(b"\x7fELF");
    image[4] = 2; // 64-bit
    image[5] = 1; // little-endian
    image[18..20].copy_from_slice(&224u16.to_le_bytes()); // EM_AMDGPU
    image[48..52].copy_from_slice(&0x4cu32.to_le_bytes()); // gfx942
    image.extend_from_slice(entry.as_bytes());
    image.push(0);
    let end = image.len() as u64;
    image[40..48].copy_from_slice(&end.to_le_bytes());
    image
}

#[test]
fn softmax_tensor_maps_reach_the_driver_as_the_plan_says() {
    let untested = "the tensor maps of the generated calls are not checked";
    if !common::tool_ready("cc", untested) || !common::tool_ready("c++", untested) {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let lib = tmp.path().join("lib");
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .arg("compile")
        .arg(common::examples_dir().join("softmax.rs"))
        .args([
            "--target",
            "h100",
            "--head-dims",
            "128x64",
            "--no-tuning",
            "-o",
        ])
        .arg(&lib)
        .output()
        .expect("run aec compile");
    assert!(out.status.success(), "aec compile: {}", show(&out));
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(lib.join("manifest.json")).unwrap()).unwrap();
    // The sm_90a forward's record: its cubin replaced by an image the
    // double loads (the same with or without NVRTC here).
    let softmax = manifest["variants"]
        .as_array()
        .unwrap()
        .iter()
        .position(|v| v["name"] == "Softmax")
        .expect("the Softmax variant");
    let record = manifest["variants"][softmax]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .position(|k| k["pass"] == "forward" && k["builds"][0]["arch"] == "sm_90a")
        .expect("an sm_90a Softmax forward");
    let rec = &mut manifest["variants"][softmax]["kernels"][record];
    let plan: EntryPlan = serde_json::from_value(rec["plan"].clone()).unwrap();
    assert!(
        plan.launches[0]
            .args
            .iter()
            .any(|a| matches!(a, ArgPlan::TensorMap(_))),
        "the sm_90a Softmax forward takes no tensor maps: nothing to check"
    );
    rec["builds"][0]["cubin"] = json!("kernels/fake.sm_90a.cubin");
    std::fs::write(lib.join("kernels/fake.sm_90a.cubin"), FAKE_CUBIN).unwrap();
    std::fs::write(lib.join("manifest.json"), manifest.to_string()).unwrap();
    let header = generate(&manifest).unwrap_or_else(|e| panic!("generate: {e}"));
    std::fs::write(lib.join("include/aec_library.h"), &header).unwrap();
    std::fs::write(lib.join("include/aec_loader.h"), LOADER_H).unwrap();

    let c_dir = repo().join("tests/c");
    let exe = tmp.path().join("tensor_map_check");
    build(&c_dir.join("tensor_map_check.c"), &lib, false, &exe);
    build(
        &c_dir.join("tensor_map_check.c"),
        &lib,
        true,
        &tmp.path().join("tensor_map_check_cpp"),
    );
    let (fake, old) = (tmp.path().join("fake"), tmp.path().join("fake_old"));
    build_fake_cuda(&fake, false);
    build_fake_cuda(&old, true);
    let kinds: Vec<String> = plan.launches.iter().map(fake_arg_kinds).collect();
    let run = |driver: &Path, mode: &str, log: &Path, fail_encode: bool| {
        let mut cmd = Command::new(&exe);
        cmd.arg(&lib)
            .arg(mode)
            .env("LD_LIBRARY_PATH", library_path_with(driver))
            .env("AEC_FAKE_CUDA_LOG", log)
            .env("AEC_FAKE_CUDA_ARGS", kinds.join(","));
        if fail_encode {
            cmd.env("AEC_FAKE_CUDA_FAIL_ENCODE", "1");
        }
        let out = cmd.output().expect("run tensor_map_check");
        assert!(
            out.status.success(),
            "tensor_map_check {mode}: {}",
            show(&out)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            stdout.starts_with("open sm_90a "),
            "tensor_map_check {mode} opened another arch: {}",
            show(&out)
        );
        stdout
    };
    let launch = &plan.launches[0];
    let sizes = [("B", 2), ("H", 3), ("Hkv", 3), ("Sq", 70), ("Skv", 301)];

    // The call: q, k, v encoded as the plan says and passed by value.
    let log = tmp.path().join("run.log");
    let stdout = run(&fake, "run", &log, false);
    assert!(
        stdout.contains(&format!("kernel {}\n", launch.entry)),
        "{stdout}"
    );
    assert!(
        call_line(&stdout, "forward").starts_with("AEC_OK"),
        "{stdout}"
    );
    let want = expected_fake_launch(&plan, launch, &sizes, &parse_ptrs(&stdout));
    let got = std::fs::read_to_string(&log).expect("the double's launch log");
    assert_eq!(
        got.lines().collect::<Vec<_>>(),
        vec![want.as_str()],
        "{stdout}"
    );
    // Extents past 2^32 are refused before the driver, naming the map.
    let huge = call_line(&stdout, "huge");
    for want in [
        "AEC_ERROR_SHAPE aec_softmax_forward: the tensor map of q for kernel",
        "cuTensorMapEncodeTiled takes extents in [1, 2^32]",
    ] {
        assert!(huge.contains(want), "`{huge}` should contain `{want}`");
    }
    assert!(stdout.contains("huge workspace_bytes invalid"), "{stdout}");

    // A failing encode: the driver's error, the tensor, its extents and box;
    // nothing launched.
    let log = tmp.path().join("fail.log");
    let stdout = run(&fake, "fail", &log, true);
    let q = launch
        .args
        .iter()
        .find_map(|a| match a {
            ArgPlan::TensorMap(m) if m.buffer == "q" => Some(m),
            _ => None,
        })
        .expect("a tensor map of q");
    let dims = q.dims.clone().map(|e| {
        e.eval(&|n| sizes.iter().find(|(s, _)| *s == n).map(|x| x.1))
            .unwrap()
    });
    let msg = call_line(&stdout, "forward");
    for want in [
        "AEC_ERROR_DRIVER aec_softmax_forward: cuTensorMapEncodeTiled of q for kernel".to_string(),
        format!("extents ({}, {}, {})", dims[0], dims[1], dims[2]),
        format!(
            "box ({}, {}, {})",
            q.box_dims[0], q.box_dims[1], q.box_dims[2]
        ),
        "failed: CUDA_ERROR_INVALID_VALUE".to_string(),
    ] {
        assert!(msg.contains(&want), "`{msg}` should contain `{want}`");
    }
    assert!(!log.exists(), "a launch after a failed encode");

    // A driver without the encoder (before CUDA 12): said so, nothing launched.
    let log = tmp.path().join("old.log");
    let stdout = run(&old, "old", &log, false);
    let msg = call_line(&stdout, "forward");
    assert!(
        msg.starts_with("AEC_ERROR_DRIVER")
            && msg.contains("libcuda.so.1 lacks cuTensorMapEncodeTiled")
            && msg.contains("CUDA 12 or newer"),
        "{msg}"
    );
    assert!(!log.exists(), "a launch without tensor maps");

    // A HIP build of that record (never written by aec compile): a clear
    // refusal on the HIP backend, nothing launched.
    let hip = tmp.path().join("hip");
    let fake_hip = tmp.path().join("fake_hip");
    std::fs::create_dir_all(&fake_hip).unwrap();
    let out = Command::new("cc")
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-shared", "-fPIC",
        ])
        .arg(c_dir.join("fake_hip.c"))
        .arg("-o")
        .arg(fake_hip.join("libamdhip64.so"))
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc fake_hip.c: {}", show(&out));
    let mut m = manifest.clone();
    m["variants"][softmax]["kernels"][record]["builds"] = json!([
        {"target": "mi300x", "arch": "gfx942", "code_object": "kernels/fake.gfx942.co"}
    ]);
    std::fs::create_dir_all(hip.join("include")).unwrap();
    std::fs::create_dir_all(hip.join("kernels")).unwrap();
    std::fs::write(hip.join("manifest.json"), m.to_string()).unwrap();
    std::fs::write(
        hip.join("kernels/fake.gfx942.co"),
        fake_gfx942_code_object(&launch.entry),
    )
    .unwrap();
    std::fs::write(hip.join("include/aec_library.h"), generate(&m).unwrap()).unwrap();
    std::fs::write(hip.join("include/aec_loader.h"), LOADER_H).unwrap();
    let hip_exe = tmp.path().join("tensor_map_check_hip");
    build(&c_dir.join("tensor_map_check.c"), &hip, false, &hip_exe);
    let hip_log = tmp.path().join("hip.log");
    let out = Command::new(&hip_exe)
        .arg(&hip)
        .arg("hip")
        .env("LD_LIBRARY_PATH", library_path_with(&fake_hip))
        .env("AEC_FAKE_HIP_LOG", &hip_log)
        .output()
        .expect("run tensor_map_check hip");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("open gfx942 "),
        "tensor_map_check hip: {}",
        show(&out)
    );
    let msg = call_line(&stdout, "forward");
    assert!(
        msg.starts_with("AEC_ERROR_NO_KERNEL")
            && msg.contains("takes a CUDA tensor map of q")
            && msg.contains("HIP"),
        "{msg}"
    );
    assert!(!hip_log.exists(), "a HIP launch with a tensor map");
}
