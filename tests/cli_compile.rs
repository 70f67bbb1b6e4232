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

/// Runs aec with no tuning cache location (the user's cache would add
/// tuned kernels to the libraries these tests compile).
fn aec(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(args)
        .env_remove("AEC_TUNING_CACHE")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("HOME")
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
    assert_eq!(k["plan"]["launches"][0]["threads"], 128);
    assert_eq!(k["builds"][0]["target"], "a100");
    let hopper = &variants[0]["kernels"][1];
    assert_eq!(hopper["pass"], "forward");
    assert_eq!(hopper["plan"]["launches"][0]["threads"], 384);
    assert_eq!(hopper["builds"][0]["target"], "h100");
    let hopper_src =
        std::fs::read_to_string(a.join(hopper["source"].as_str().unwrap())).expect("source");
    assert!(hopper_src.contains("wgmma.mma_async"));
    assert_eq!(
        k["row_outputs"],
        serde_json::json!(["scale.lse", "state.m", "state.l"])
    );
    assert_eq!(
        variants[1]["kernels"][0]["plan"]["launches"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["ptr"] == "slopes")
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
    let launches = bk["plan"]["launches"].as_array().expect("launches");
    assert_eq!(launches.len(), 3);
    for l in launches {
        let e = l["entry"].as_str().expect("entry");
        assert!(bsrc.contains(&format!("{e}(BWD_ARGS)")), "{e} defined");
    }
    // ALiBi's slopes get a gradient argument.
    assert_eq!(
        launches[1]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["ptr"] == "dslopes")
            .count(),
        1
    );
    let grad = bk["plan"]["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "dslopes")
        .expect("the slopes' gradient buffer");
    assert_eq!(grad["zeroed"], true, "the kernels add into it");
    assert_eq!(grad["shape"], serde_json::json!(["H"]));
    // With NVRTC (CI installs it), one cubin per architecture; without, sources only.
    for b in bk["builds"].as_array().expect("backward builds") {
        if aec::runtime::nvrtc_present() {
            let cubin =
                std::fs::read(a.join(b["cubin"].as_str().expect("cubin path"))).expect("cubin");
            assert_eq!(&cubin[..4], b"\x7fELF");
            // ptxas's report (through NVRTC) names each of the three entries.
            let usage = b["report"]["usage"].as_array().expect("usage");
            for l in launches {
                let u = usage
                    .iter()
                    .find(|u| u["entry"] == l["entry"])
                    .unwrap_or_else(|| panic!("{} not in {usage:?}", l["entry"]));
                assert!(u["registers"].as_u64().unwrap() > 0, "{u}");
            }
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
            // The build's report: the forward's entry with its registers; the
            // sm_90a forward spills nothing (the compile check's rule).
            assert!(
                b["report"]["compiler"]
                    .as_str()
                    .unwrap()
                    .starts_with("nvrtc ")
            );
            let usage = b["report"]["usage"].as_array().expect("usage");
            assert_eq!(usage.len(), 1, "{usage:?}");
            let registers = usage[0]["registers"].as_u64().unwrap();
            assert!(registers > 0 && registers <= 255, "{usage:?}");
            if b["arch"] == "sm_90a" {
                assert_eq!(usage[0]["entry"], hopper["entry"]);
                assert_eq!(usage[0]["spill_store_bytes"], 0, "{usage:?}");
                assert_eq!(usage[0]["spill_load_bytes"], 0, "{usage:?}");
            } else {
                assert_eq!(usage[0]["entry"], k["entry"]);
            }
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
        .env_remove("AEC_TUNING_CACHE")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("HOME")
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
        let launches = b["plan"]["launches"].as_array().expect("three launches");
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

/// Recurrent variants get their CUDA forward (source, cubin with NVRTC,
/// launch facts, arguments, configuration) and backward (two sources, the
/// states pass and the backward kernels, each with its cubin; one plan that
/// launches the states pass from its own module).
#[test]
fn recurrent_variants_get_their_cuda_forward_and_backward() {
    let dir = scratch("rec");
    let (code, err) = aec(&[
        "compile",
        "examples/retnet_recurrent.rs",
        "examples/mamba2.rs",
        "-t",
        "h100",
        "--head-dims",
        "64x96",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");
    let m = manifest(&dir);
    let variants = m["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 2);
    for (v, name, customs) in [
        (&variants[0], "RetNetRecurrent", &[][..]),
        (&variants[1], "Mamba2", &["a", "dt"][..]),
    ] {
        assert_eq!(v["name"], name);
        assert_eq!(v["pattern"], "recurrent");
        assert!(v.get("skipped").is_none(), "{v}");
        assert!(
            v.get("backward").is_none() && v.get("backward_note").is_none(),
            "{v}"
        );
        let kernels = v["kernels"].as_array().expect("kernels");
        assert_eq!(kernels.len(), 2, "{kernels:?}");
        check_recurrent_backward(&dir, &kernels[1], customs);
        let k = &kernels[0];
        assert_eq!(k["pass"], "forward");
        assert_eq!(k["head_dims"], serde_json::json!({ "Dk": 64, "Dv": 96 }));
        // Dv = 96 is not a multiple of 64: three 32-column slices per head.
        assert_eq!(k["config"]["dv_tile"], 32);
        assert_eq!(k["config"]["chunk"], 64);
        assert_eq!(k["config"]["elem"], "bf16");
        let launch = &k["plan"]["launches"][0];
        assert_eq!(launch["grid"], serde_json::json!([3, "H", "B"]));
        assert_eq!(launch["threads"], 256);
        assert!(launch["dynamic_smem_bytes"].as_u64().unwrap() > 48 * 1024);
        assert_eq!(k["normalized"], false);
        // Launch order: q, k, v, o, the custom inputs, the nullable states,
        // cu_seqlens (null: libraries launch batches of equal lengths), B, H, S.
        let args: Vec<String> = launch["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| match a["null"].as_str() {
                Some(n) => format!("null {n}"),
                None => a["ptr"].as_str().or(a["i32"].as_str()).unwrap().to_string(),
            })
            .collect();
        let mut expected: Vec<String> = ["q", "k", "v", "o"].map(String::from).to_vec();
        expected.extend(customs.iter().map(|c| c.to_string()));
        expected
            .extend(["state_in", "state_out", "null cu_seqlens", "B", "H", "S"].map(String::from));
        assert_eq!(args, expected);
        let buffers = k["plan"]["buffers"].as_array().unwrap();
        let role = |n: &str| {
            let b = buffers.iter().find(|b| b["name"] == n).expect(n);
            assert_eq!(b["dtype"], "f32");
            assert_eq!(b["shape"], serde_json::json!(["B", "H", 64, 96]));
            b["role"].as_str().unwrap().to_string()
        };
        assert_eq!(role("state_in"), "optional_input");
        assert_eq!(role("state_out"), "optional_output");
        let entry = k["entry"].as_str().expect("entry");
        let source = std::fs::read_to_string(dir.join(k["source"].as_str().unwrap()))
            .expect("kernel source");
        assert!(source.contains(&format!("{entry}(")), "entry in the source");
        assert!(source.contains("#define DK 64") && source.contains("#define DV 96"));
        let builds = k["builds"].as_array().expect("builds");
        assert_eq!(builds.len(), 1);
        assert_eq!(builds[0]["target"], "h100");
        assert_eq!(builds[0]["arch"], "sm_90a");
        if aec::runtime::nvrtc_present() {
            let cubin = std::fs::read(dir.join(builds[0]["cubin"].as_str().expect("cubin path")))
                .expect("cubin");
            assert_eq!(&cubin[..4], b"\x7fELF", "a cubin is an ELF file");
        } else {
            assert!(
                !aec::runtime::toolchains_required(),
                "NVRTC must be present when toolchains are required"
            );
            assert!(builds[0]["cubin"].is_null());
        }
    }
    // Mamba2 reads `dt` per step and `a` per head: both are declared inputs.
    let inputs: Vec<&str> = variants[1]["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(inputs, ["q", "k", "v", "a", "dt"]);
}

/// A recurrent backward record: the states pass (its own source and, per
/// build, `modules.states` cubin) launched first from that module, then the
/// backward kernels of the record's source, with the custom inputs'
/// gradients zero-filled.
fn check_recurrent_backward(dir: &Path, bk: &serde_json::Value, customs: &[&str]) {
    assert_eq!(bk["pass"], "backward", "{bk}");
    let plan = &bk["plan"];
    assert_eq!(plan["pass"], "backward");
    let launches = plan["launches"].as_array().expect("launches");
    let states_entry = launches[0]["entry"].as_str().expect("entry");
    assert!(
        states_entry.starts_with("aec_rec_states_"),
        "{states_entry}"
    );
    assert_eq!(launches[0]["module"], "states");
    // The states pass never fills the final state.
    assert!(
        launches[0]["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!({ "null": "state_out" })),
        "{}",
        launches[0]
    );
    let states_src =
        std::fs::read_to_string(dir.join(bk["sources"]["states"].as_str().expect("states source")))
            .expect("states source");
    assert!(states_src.contains(&format!("{states_entry}(")));
    let src = std::fs::read_to_string(dir.join(bk["source"].as_str().expect("source")))
        .expect("backward source");
    let entries: Vec<&str> = launches[1..]
        .iter()
        .map(|l| l["entry"].as_str().unwrap())
        .collect();
    assert_eq!(
        entries,
        bk["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect::<Vec<_>>()
    );
    assert!(entries.len() >= 3, "{entries:?}");
    for (l, e) in launches[1..].iter().zip(&entries) {
        assert!(l.get("module").is_none(), "{l}");
        assert!(
            src.contains(&format!("{e}(")),
            "{e} defined in the backward source"
        );
    }
    let buffers = plan["buffers"].as_array().unwrap();
    for c in customs {
        let g = buffers
            .iter()
            .find(|b| b["name"] == format!("d{c}"))
            .expect("custom gradient");
        assert_eq!(g["zeroed"], true, "{g}");
        assert_eq!(g["role"], "output");
    }
    let builds = bk["builds"].as_array().expect("builds");
    assert!(!builds.is_empty());
    for b in builds {
        let (cubin, states) = (&b["cubin"], &b["modules"]["states"]);
        if aec::runtime::nvrtc_present() {
            for c in [cubin, states] {
                let bytes =
                    std::fs::read(dir.join(c.as_str().expect("cubin path"))).expect("cubin");
                assert_eq!(&bytes[..4], b"\x7fELF", "{c}");
            }
            assert_ne!(cubin, states, "two modules");
        } else {
            assert!(cubin.is_null() && states.is_null(), "{b}");
        }
    }
}

/// A normalised variant takes the normaliser's states too; the A100 and the
/// Hopper targets share one source where their configurations agree; AMD
/// targets get the HIP forward and backward (their code objects where the
/// HIP toolchain is installed), the backward with the normaliser's `_pre`.
#[test]
fn recurrent_normaliser_shared_sources_and_amd_targets() {
    let dir = scratch("rec-rfa");
    let (code, err) = aec(&[
        "compile",
        "examples/rfa.rs",
        "-t",
        "a100,h100,h200,mi250",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let m = manifest(&dir);
    let v = &m["variants"][0];
    let kernels = v["kernels"].as_array().expect("kernels");
    let cuda: Vec<_> = kernels
        .iter()
        .filter(|k| k["pass"] == "forward" && k["builds"][0].get("cubin").is_some())
        .collect();
    // Dk = Dv = 128 (the default): double-buffered on both instruction sets,
    // so one source with a cubin per architecture.
    assert_eq!(cuda.len(), 1, "{kernels:?}");
    let k = cuda[0];
    assert_eq!(k["head_dims"], serde_json::json!({ "Dk": 128, "Dv": 128 }));
    assert_eq!(k["normalized"], true);
    let states: Vec<&str> = k["plan"]["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["role"].as_str().unwrap().starts_with("optional"))
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["state_in", "state_out", "norm_in", "norm_out"]);
    let targets: Vec<&str> = k["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["a100", "h100", "h200"]);
    if aec::runtime::nvrtc_present() {
        let cubins: Vec<&str> = k["builds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["cubin"].as_str().expect("cubin"))
            .collect();
        // h100 and h200 share the sm_90a cubin.
        assert_eq!(cubins[1], cubins[2]);
        assert_ne!(cubins[0], cubins[1]);
        for c in cubins {
            assert_eq!(&std::fs::read(dir.join(c)).expect("cubin")[..4], b"\x7fELF");
        }
    }
    let amd: Vec<_> = kernels
        .iter()
        .filter(|k| k["target"] == "mi250" || k["builds"][0]["target"] == "mi250")
        .collect();
    assert_eq!(amd.len(), 2, "{kernels:?}");
    let (fwd, bwd) = (amd[0], amd[1]);
    assert_eq!(
        fwd["entry"], "aec_rec_fwd_rfa_bf16_d128x128_c64v64_gfx90a",
        "{fwd}"
    );
    assert_eq!(
        fwd["source"],
        "kernels/aec_rec_fwd_rfa_bf16_d128x128_c64v64_gfx90a.hip"
    );
    assert!(dir.join(fwd["source"].as_str().unwrap()).is_file());
    assert_eq!(fwd["normalized"], true);
    assert_eq!(fwd["config"]["warps"], 4, "four waves: {fwd}");
    let plan_names: Vec<&str> = fwd["plan"]["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        plan_names,
        [
            "q",
            "k",
            "v",
            "g",
            "o",
            "state_in",
            "state_out",
            "norm_in",
            "norm_out"
        ]
    );
    let build = &fwd["builds"][0];
    assert_eq!(build["arch"], "gfx90a");
    if aec::runtime::find_hip_compiler("gfx90a").is_ok() {
        let co = dir.join(build["code_object"].as_str().expect("code object"));
        assert_eq!(&std::fs::read(co).expect("code object")[..4], b"\x7fELF");
        let usage = &build["report"]["usage"];
        assert_eq!(usage["scratch_bytes"], 0, "{build}");
        assert!(
            usage["lds_bytes"]
                .as_u64()
                .is_some_and(|l| l > 0 && l <= 65536),
            "{build}"
        );
    } else {
        assert!(build["code_object"].is_null(), "{build}");
    }
    // The HIP backward: the normaliser's step first, the decay's scan last,
    // the states pass writing the output before normalisation into `o_raw`.
    assert_eq!(bwd["pass"], "backward");
    assert!(bwd.get("skipped").is_none(), "{bwd}");
    assert!(!err.contains("no HIP backward"), "{err}");
    let suffixes: Vec<&str> = bwd["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().rsplit('_').next().unwrap())
        .collect();
    assert_eq!(suffixes, ["pre", "dstate", "dqk", "dv", "decay"], "{bwd}");
    let launches = bwd["plan"]["launches"].as_array().expect("launches");
    assert_eq!(launches[0]["module"], "states", "{:?}", launches[0]);
    assert!(
        launches[0]["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!({ "ptr": "o_raw" })),
        "{:?}",
        launches[0]
    );
    let hip_build = &bwd["builds"][0];
    assert_eq!(hip_build["arch"], "gfx90a");
    if aec::runtime::find_hip_compiler("gfx90a").is_ok() {
        for c in [&hip_build["code_object"], &hip_build["modules"]["states"]] {
            let co =
                std::fs::read(dir.join(c.as_str().expect("code object"))).expect("code object");
            assert_eq!(&co[..4], b"\x7fELF", "{c}");
        }
    }
    // The CUDA backward: per instruction set (the `_dv` kernel's buffers
    // follow the shared memory), the normaliser's workspaces and gradients in
    // the plan, each record's files its own.
    let backward: Vec<_> = kernels
        .iter()
        .filter(|k| {
            k["pass"] == "backward"
                && k.get("plan").is_some()
                && k["builds"][0]["target"] != "mi250"
        })
        .collect();
    assert!(!backward.is_empty(), "{kernels:?}");
    let mut targets: Vec<&str> = Vec::new();
    let mut sources: Vec<&str> = Vec::new();
    for bk in &backward {
        check_recurrent_backward(&dir, bk, &[]);
        assert_eq!(bk["normalized"], true);
        let names: Vec<&str> = bk["plan"]["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap())
            .collect();
        for n in [
            "norm_in",
            "d_norm_out",
            "d_norm_in",
            "norm_states",
            "o_raw",
            "row_n",
            "dn",
        ] {
            assert!(names.contains(&n), "{n} in {names:?}");
        }
        // The states pass writes its output into `o_raw`.
        assert!(
            bk["plan"]["launches"][0]["args"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!({ "ptr": "o_raw" }))
        );
        targets.extend(
            bk["builds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["target"].as_str().unwrap()),
        );
        assert!(
            !sources.contains(&bk["source"].as_str().unwrap()),
            "one file per record"
        );
        sources.push(bk["source"].as_str().unwrap());
    }
    targets.sort_unstable();
    assert_eq!(targets, ["a100", "h100", "h200"]);
    // Head dims the recurrent template does not take: a clear refusal.
    let (code, err) = aec(&[
        "compile",
        "examples/rfa.rs",
        "-t",
        "h100",
        "--head-dims",
        "48x64",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("`Rfa` (examples/rfa.rs)") && err.contains("Dk = 48"),
        "{err}"
    );
}

#[test]
fn broken_files_point_at_the_token() {
    let dir = scratch("broken");
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

/// The manifest records a definition per variant and pass (free and fixed
/// axes, inputs and outputs), the workloads asked for with `--workload`
/// where they fit, the tools and the tuning method; a workload that fits no
/// kernel is refused with the free sizes named.
#[test]
fn manifest_records_definitions_and_workloads() {
    let dir = scratch("defs");
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "examples/decode.rs",
        "examples/mamba2.rs",
        "-t",
        "h100",
        "--head-dims",
        "128x64",
        "--workload",
        "B=4,H=16,Sq=4096,Skv=4096",
        "--workload",
        "B=2, H=8, S=1000",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let m = manifest(&dir);
    let names: Vec<&str> = m["definitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "softmax_forward_dqk128_dv64",
            "softmax_backward_dqk128_dv64",
            "decode_forward_dqk128_dv64",
            "decode_backward_dqk128_dv64",
            "mamba2_forward_dk128_dv64",
            "mamba2_backward_dk128_dv64"
        ]
    );
    let softmax = &m["definitions"][0];
    assert_eq!(softmax["axes"]["Sq"]["type"], "var");
    assert_eq!(
        softmax["axes"]["Hkv"],
        serde_json::json!({ "type": "alias", "of": "H" })
    );
    assert_eq!(
        softmax["axes"]["Dv"],
        serde_json::json!({ "type": "const", "value": 64 })
    );
    assert_eq!(
        softmax["inputs"]["q"]["shape"],
        serde_json::json!(["B", "H", "Sq", 128])
    );
    assert_eq!(softmax["outputs"]["o"]["dtype"], "bf16");
    // Decode fixes Sq: a constant axis, so the first workload does not fit it.
    assert_eq!(m["definitions"][2]["axes"]["Sq"]["type"], "const");
    let mamba = &m["definitions"][4];
    assert_eq!(mamba["inputs"]["state_in"]["optional"], true);
    // The recurrent backward: dO and the optional final-state gradient in,
    // the gradients (the initial state's when asked for) out.
    let mamba_bwd = &m["definitions"][5];
    assert_eq!(mamba_bwd["pass"], "backward");
    assert_eq!(
        mamba_bwd["inputs"]["do"]["shape"],
        serde_json::json!(["B", "H", "S", 64])
    );
    assert_eq!(mamba_bwd["inputs"]["d_state_out"]["optional"], true);
    assert_eq!(mamba_bwd["outputs"]["d_state_in"]["optional"], true);
    assert_eq!(mamba_bwd["outputs"]["ddt"]["dtype"], "f32");
    assert!(
        mamba_bwd["inputs"].get("states").is_none(),
        "workspaces are not inputs"
    );
    let workloads: Vec<&str> = m["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["definition"].as_str().unwrap())
        .collect();
    assert_eq!(
        workloads,
        [
            "softmax_forward_dqk128_dv64",
            "softmax_backward_dqk128_dv64",
            "mamba2_forward_dk128_dv64",
            "mamba2_backward_dk128_dv64"
        ]
    );
    assert_eq!(
        m["workloads"][1]["workload"]["inputs"]["o"]["type"],
        "forward"
    );
    assert_eq!(m["workloads"][2]["workload"]["axes"]["S"], 1000);
    assert_eq!(m["tuning"]["method"], "defaults");
    // The loaders next to the manifest.
    assert_eq!(
        std::fs::read_to_string(dir.join("python/aec_library.py")).expect("python module"),
        aec::library::python::MODULE
    );
    let header = std::fs::read_to_string(dir.join("include/aec_library.h")).expect("C header");
    assert!(header.contains("aec_softmax_forward(") && header.contains("aec_mamba2_forward("));
    assert!(dir.join("include/aec_loader.h").is_file());
    assert_eq!(m["tools"]["aec"], env!("CARGO_PKG_VERSION"));
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "-t",
        "a100",
        "--workload",
        "B=4,Skv=0",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("`0` must be a positive integer"), "{err}");
    let (code, err) = aec(&[
        "compile",
        "examples/softmax.rs",
        "-t",
        "a100",
        "--workload",
        "B=4,H=2,S=8",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("fits no kernel") && err.contains("`B,H,Skv,Sq`"),
        "{err}"
    );
}

/// A recurrent backward whose plan cannot name its buffers (a custom input
/// `states` takes the name of the backward's workspace `states`) is not written: the
/// manifest has a skipped backward record with the reason, the forward is
/// there, and the compile succeeds with a warning.
#[test]
fn a_recurrent_backward_that_cannot_be_planned_is_skipped_with_the_reason() {
    let dir = scratch("rec-skip");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clash.rs");
    std::fs::write(
        &file,
        "attention! {\n    pub struct Clash: recurrent {\n        q: [B, H, S, Dk];\n        \
         k: [B, H, S, Dk];\n        v: [B, H, S, Dv];\n        states: [H];\n        \
         decay = |b, h, t| exp(-states);\n    }\n}\n",
    )
    .unwrap();
    let out = dir.join("lib");
    let (code, err) = aec(&[
        "compile",
        file.to_str().unwrap(),
        "-t",
        "a100",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: `Clash`")
            && err.contains("no backward kernels for sm_80")
            && err.contains("buffer `states` is declared twice"),
        "{err}"
    );
    let m = manifest(&out);
    let kernels = m["variants"][0]["kernels"].as_array().unwrap();
    assert_eq!(kernels[0]["pass"], "forward");
    assert!(kernels[0].get("plan").is_some());
    let skipped = kernels
        .iter()
        .find(|k| k["pass"] == "backward")
        .expect("a backward record");
    assert!(skipped.get("plan").is_none());
    assert_eq!(skipped["arch"], "sm_80");
    assert!(
        skipped["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("buffer `states` is declared twice")),
        "{skipped}"
    );
}

/// A recurrent variant with a scalar decay gets its HIP backward on AMD
/// targets: the backward kernels and the states pass as two `.hip` sources,
/// their code objects (where the HIP toolchain is installed) and a launch
/// plan whose states pass runs from the `states` module.
#[test]
fn recurrent_hip_backward_for_amd_targets() {
    let dir = scratch("rec-mamba2-amd");
    let (code, err) = aec(&[
        "compile",
        "examples/mamba2.rs",
        "-t",
        "mi300x",
        "--head-dims",
        "64x64",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("no HIP backward"), "{err}");
    let m = manifest(&dir);
    let kernels = m["variants"][0]["kernels"].as_array().expect("kernels");
    let bwd: Vec<_> = kernels.iter().filter(|k| k["pass"] == "backward").collect();
    assert_eq!(bwd.len(), 1, "{kernels:?}");
    let b = bwd[0];
    assert!(b.get("skipped").is_none(), "{b}");
    let entry = b["entry"].as_str().expect("entry");
    assert!(
        entry.starts_with("aec_rec_bwd_mamba2_bf16_d64x64") && entry.ends_with("gfx942"),
        "{entry}"
    );
    let names: Vec<&str> = b["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let suffixes: Vec<&str> = names
        .iter()
        .map(|n| n.rsplit('_').next().unwrap())
        .collect();
    assert_eq!(suffixes, ["dstate", "dqk", "dv", "decay"], "{names:?}");
    for src in [&b["source"], &b["sources"]["states"]] {
        let path = dir.join(src.as_str().expect("source path"));
        assert!(path.extension().is_some_and(|e| e == "hip"), "{src}");
        assert!(path.is_file(), "{src}");
    }
    // The plan: the states pass first (from the `states` module), then the
    // four kernels; the gradients of Mamba2's custom inputs among the buffers.
    let launches = b["plan"]["launches"].as_array().expect("launches");
    assert_eq!(launches.len(), 5, "{launches:?}");
    assert_eq!(launches[0]["module"], "states", "{:?}", launches[0]);
    let buffers: Vec<&str> = b["plan"]["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    for want in ["do", "dq", "dk", "dv", "da", "ddt"] {
        assert!(buffers.contains(&want), "no {want} in {buffers:?}");
    }
    let build = &b["builds"][0];
    assert_eq!(build["arch"], "gfx942");
    if aec::runtime::find_hip_compiler("gfx942").is_ok() {
        let (co, states) = (&build["code_object"], &build["modules"]["states"]);
        assert_ne!(co, states, "two modules");
        for c in [co, states] {
            let bytes =
                std::fs::read(dir.join(c.as_str().expect("code object"))).expect("code object");
            assert_eq!(&bytes[..4], b"\x7fELF", "{c}");
        }
        assert_eq!(build["report"]["usage"]["scratch_bytes"], 0, "{build}");
    } else {
        assert!(build["code_object"].is_null(), "{build}");
    }
}

/// `--v-in-k`: the forward reads V from K's rows (multi-head latent
/// attention's cache), its plan takes the cache as both `k` and `v` and
/// every loader refuses two tensors; the same for AMD targets; no backward,
/// no recurrent variants.
#[test]
fn shared_kv_storage_libraries_take_the_cache_as_k_and_v() {
    let dir = scratch("v-in-k");
    let (code, err) = aec(&[
        "compile",
        "examples/mla_decode.rs",
        "-t",
        "h100",
        "--v-in-k",
        "--no-tuning",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("built with --v-in-k"), "{err}");
    let m = manifest(&dir);
    let kernels = m["variants"][0]["kernels"].as_array().expect("kernels");
    let forward = kernels
        .iter()
        .find(|k| k["pass"] == "forward")
        .expect("a forward record");
    assert!(
        forward["entry"].as_str().unwrap().ends_with("_vk"),
        "{forward}"
    );
    let plan = &forward["plan"];
    assert_eq!(plan["same_tensor"], serde_json::json!([["v", "k"]]));
    let buffer = |name: &str| {
        plan["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("buffer {name}"))
            .clone()
    };
    assert_eq!(buffer("v")["shape"], buffer("k")["shape"], "{plan}");
    assert_eq!(buffer("k")["shape"][3], 576, "{plan}");
    let backward = kernels
        .iter()
        .find(|k| k["pass"] == "backward")
        .expect("a backward record");
    assert!(
        backward["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("--v-in-k")),
        "{backward}"
    );
    let header = std::fs::read_to_string(dir.join("include/aec_library.h")).expect("the C header");
    assert!(
        header.contains("buffers->v must be buffers->k"),
        "the C loader checks v is k"
    );
    let python =
        std::fs::read_to_string(dir.join("python/aec_library.py")).expect("the Python module");
    assert!(
        python.contains("same_tensor"),
        "the Python module checks it"
    );
    // Without --v-in-k the plan takes V apart.
    let apart = scratch("v-apart");
    let (code, err) = aec(&[
        "compile",
        "examples/mla_decode.rs",
        "-t",
        "h100",
        "--no-tuning",
        "-o",
        apart.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let m = manifest(&apart);
    let plan = &m["variants"][0]["kernels"][0]["plan"];
    assert!(plan.get("same_tensor").is_none(), "{plan}");
    // AMD targets read V from K's rows too (no backward either).
    let amd = scratch("v-in-k-amd");
    let (code, err) = aec(&[
        "compile",
        "examples/mla_decode.rs",
        "-t",
        "mi300x",
        "--v-in-k",
        "--no-tuning",
        "-o",
        amd.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let m = manifest(&amd);
    let kernels = m["variants"][0]["kernels"].as_array().unwrap();
    let fwd = &kernels[0];
    assert!(
        fwd["entry"].as_str().unwrap().ends_with("_vk_gfx942"),
        "{fwd}"
    );
    assert_eq!(fwd["config"]["v_in_k"], true, "{fwd}");
    assert_eq!(
        fwd["plan"]["same_tensor"],
        serde_json::json!([["v", "k"]]),
        "{fwd}"
    );
    assert!(
        kernels[1]["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("--v-in-k")),
        "{}",
        kernels[1]
    );
    // A recurrent variant is refused with the reason.
    let (code, err) = aec(&[
        "compile",
        "examples/mamba2.rs",
        "-t",
        "h100",
        "--v-in-k",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--v-in-k") && err.contains("recurrent"),
        "{err}"
    );
}
