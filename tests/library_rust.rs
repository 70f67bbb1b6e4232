//! The Rust loader of kernel libraries (`aec::library`), without a GPU: a
//! library compiled by the CLI reads back (every plan deserialises and
//! round-trips), entry selection per architecture and its errors, the
//! checks of a call (`check_call`, every error path, exact messages), and
//! `Library::open_device` failing clearly where there is no GPU. The same
//! calls on a GPU are tests/gpu_library.rs.

mod common;

use std::path::Path;

use aec::compiler::launch_plan::{
    ArgPlan, EntryPlan, Role, backward_plan, forward_plan, recurrent_backward_plan,
    recurrent_forward_plan,
};
use aec::compiler::{Elem, Isa, RecurrentConfig, recurrent_backward};
use aec::library::{CallArg, Dtype, Library, MANIFEST_FORMAT, Manifest, check_call, cuda_arch_for};
use aec::prelude::*;
use aec::runtime::RuntimeError;
use aec::{Error, backward_source, forward_source, recurrent_source};
use common::example;
use serde_json::{Value, json};

// ---------------------------------------------------------------- helpers

const SMS: u32 = 132;

fn dims() -> HeadDims {
    HeadDims::new(128, 64)
}

/// The forward plan of a parallel example at 128x64, as `aec compile`
/// writes it.
fn parallel_forward(name: &str, isa: Isa) -> EntryPlan {
    let def = example(name);
    let k = forward_source(&def, dims(), &KernelOptions::default(), isa).expect("forward source");
    forward_plan(&def, &k)
}

fn parallel_backward(name: &str, isa: Isa) -> EntryPlan {
    let def = example(name);
    let b = backward_source(&def, dims(), &KernelOptions::default(), isa).expect("backward source");
    backward_plan(&def, (128, 64), Elem::Bf16, b.kernels())
}

fn mamba2_forward() -> EntryPlan {
    let def = example("mamba2");
    let k = recurrent_source(
        &def,
        RecurrentDims::new(128, 64),
        &KernelOptions::default(),
        Isa::Sm90a,
    )
    .expect("recurrent source");
    recurrent_forward_plan(&def, &k)
}

/// Mamba2's recurrent backward at 128x64 (states pass and backward
/// kernels), as `aec compile` plans it.
fn mamba2_backward(isa: Isa) -> EntryPlan {
    let def = example("mamba2");
    let cfg = RecurrentConfig::default_for(128, 64, Elem::Bf16, isa);
    let b = recurrent_backward(&def, 128, 64, &cfg, isa).expect("recurrent backward");
    recurrent_backward_plan(&def, &b)
}

fn shape_error<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::Shape(m)) => m,
        other => panic!("expected Error::Shape, got {other:?}"),
    }
}

fn library_error<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(e @ Error::Library { .. }) => e.to_string(),
        other => panic!("expected Error::Library, got {other:?}"),
    }
}

/// A parallel call's sizes and input element counts (q, k, v at 128x64,
/// custom inputs by their declared axes), computed from the sizes here, not
/// from the plan.
struct Parallel {
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
}

impl Parallel {
    fn sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("B", self.b),
            ("H", self.h),
            ("Hkv", self.hkv),
            ("Sq", self.sq),
            ("Skv", self.skv),
        ]
    }

    fn forward_inputs(
        &self,
        customs: &[(&'static str, usize)],
    ) -> Vec<(&'static str, Dtype, usize)> {
        let mut t = vec![
            ("q", Dtype::Bf16, self.b * self.h * self.sq * 128),
            ("k", Dtype::Bf16, self.b * self.hkv * self.skv * 128),
            ("v", Dtype::Bf16, self.b * self.hkv * self.skv * 64),
        ];
        t.extend(customs.iter().map(|&(n, len)| (n, Dtype::F32, len)));
        t
    }

    fn backward_inputs(
        &self,
        customs: &[(&'static str, usize)],
    ) -> Vec<(&'static str, Dtype, usize)> {
        let rows = self.b * self.h * self.sq;
        let mut t = self.forward_inputs(customs);
        t.extend([
            ("o", Dtype::Bf16, rows * 64),
            ("row_outputs", Dtype::F32, 3 * rows),
            ("dout", Dtype::Bf16, rows * 64),
        ]);
        t
    }
}

fn mamba2_inputs(b: usize, h: usize, s: usize) -> Vec<(&'static str, Dtype, usize)> {
    vec![
        ("q", Dtype::Bf16, b * h * s * 128),
        ("k", Dtype::Bf16, b * h * s * 128),
        ("v", Dtype::Bf16, b * h * s * 64),
        ("a", Dtype::F32, h),
        ("dt", Dtype::F32, b * h * s),
    ]
}

fn with(
    t: &[(&'static str, Dtype, usize)],
    name: &'static str,
    value: Option<(Dtype, usize)>,
) -> Vec<(&'static str, Dtype, usize)> {
    let mut out: Vec<_> = t.iter().copied().filter(|(n, _, _)| *n != name).collect();
    if let Some((d, len)) = value {
        out.push((name, d, len));
    }
    out
}

fn buffer_index(plan: &EntryPlan, name: &str) -> usize {
    plan.buffers
        .iter()
        .position(|b| b.name == name)
        .unwrap_or_else(|| panic!("no buffer `{name}`"))
}

/// Whether launch `launch` of `call` passes buffer `name` non-null.
fn passes(plan: &EntryPlan, call: &aec::library::CallPlan, launch: usize, name: &str) -> bool {
    let i = buffer_index(plan, name);
    let l = &call.launches[launch];
    let pos = plan.launches[l.index]
        .args
        .iter()
        .position(|a| matches!(a, aec::compiler::launch_plan::ArgPlan::Ptr(n) if n == name))
        .unwrap_or_else(|| panic!("launch {launch} takes no `{name}`"));
    match l.args[pos] {
        CallArg::Buffer(j) => {
            assert_eq!(i, j);
            true
        }
        CallArg::Null => false,
        CallArg::I32(_) => panic!("`{name}` passed as an integer"),
        CallArg::TensorMap { .. } => panic!("`{name}` passed as a tensor map"),
    }
}

// ------------------------------------------------- a library from the CLI

#[test]
fn a_compiled_library_reads_back_and_its_calls_check() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    common::compile_example_library(dir);
    let manifest = Manifest::read(dir).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = manifest.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["Softmax", "Alibi", "Decode", "Mamba2"]);
    assert_eq!(manifest.aec_version, env!("CARGO_PKG_VERSION"));

    // Every record with a plan deserialised into the plan types, losslessly.
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(raw["format"], MANIFEST_FORMAT);
    let mut plans = 0;
    for (v, rv) in manifest
        .variants
        .iter()
        .zip(raw["variants"].as_array().unwrap())
    {
        let raw_kernels = rv["kernels"].as_array().unwrap();
        assert_eq!(v.kernels.len(), raw_kernels.len(), "{}", v.name);
        for (k, rk) in v.kernels.iter().zip(raw_kernels) {
            match (&k.plan, rk.get("plan")) {
                (Some(plan), Some(p)) => {
                    assert_eq!(&serde_json::to_value(plan).unwrap(), p, "{}", v.name);
                    plans += 1;
                }
                (None, None) => assert!(k.skipped.is_some(), "{}", v.name),
                other => panic!("{}: plan read as {:?}", v.name, other.0.is_some()),
            }
            assert_eq!(rk["pass"], k.pass.as_str());
        }
    }
    // Forward and backward per instruction set for the three parallel
    // variants; a recurrent forward per instruction set (mma.sync on sm_80,
    // the wgmma kernel on sm_90a) and a recurrent backward per instruction
    // set (their `_dv` kernels differ).
    assert_eq!(plans, 3 * 4 + 2 + 2);
    let mamba = manifest.variant("Mamba2").unwrap();
    assert_eq!(mamba.pattern, "recurrent");
    assert!(mamba.backward_note.is_none());

    let nvrtc = aec::runtime::nvrtc_present();
    assert_eq!(
        manifest.cuda_archs(),
        if nvrtc {
            vec!["sm_80", "sm_90a"]
        } else {
            vec![]
        }
    );
    for arch in ["sm_90a", "sm_80"] {
        for variant in ["Softmax", "Alibi", "Decode", "Mamba2"] {
            for pass in ["forward", "backward"] {
                let r = manifest.select(variant, pass, arch);
                if !nvrtc {
                    let m = library_error(r);
                    assert!(m.contains("compiled without NVRTC"), "{m}");
                    continue;
                }
                let (_, record, build) = r.unwrap_or_else(|e| panic!("{variant} {pass}: {e}"));
                assert_eq!(build.arch, arch);
                assert_eq!(record.pass, pass);
                let cubin = build.cubin.as_ref().expect("cubin");
                assert!(dir.join(cubin).is_file(), "{}", cubin.display());
                // The recurrent backward's states pass: a second cubin.
                if variant == "Mamba2" && pass == "backward" {
                    let states = build.modules["states"].as_ref().expect("states cubin");
                    assert!(dir.join(states).is_file(), "{}", states.display());
                    assert_ne!(states, cubin);
                } else {
                    assert!(build.modules.is_empty(), "{variant} {pass}");
                }
                let want = if pass == "forward" && variant != "Mamba2" {
                    vec!["scale.lse", "state.m", "state.l"]
                } else {
                    vec![]
                };
                assert_eq!(record.row_outputs, want, "{variant} {pass}");
            }
        }
    }
    if !nvrtc {
        eprintln!("note: NVRTC absent, the library has sources only; plans checked below");
    }

    // Calls against the manifest's own plans, for both architectures.
    let plan = |variant: &str, pass: &str, arch: &str| -> EntryPlan {
        manifest
            .variant(variant)
            .unwrap()
            .kernels
            .iter()
            .find(|k| k.pass == pass && k.builds.iter().any(|b| b.arch == arch))
            .and_then(|k| k.plan.clone())
            .unwrap_or_else(|| panic!("no {pass} plan of {variant} for {arch}"))
    };
    for arch in ["sm_90a", "sm_80"] {
        let p = Parallel {
            b: 2,
            h: 4,
            hkv: 4,
            sq: 97,
            skv: 133,
        };
        for (variant, customs) in [("Softmax", vec![]), ("Alibi", vec![("slopes", 4)])] {
            let fwd = plan(variant, "forward", arch);
            let call = check_call(&fwd, &p.sizes(), &p.forward_inputs(&customs), &[], SMS)
                .unwrap_or_else(|e| panic!("{variant} {arch}: {e}"));
            assert_eq!(call.kv_splits, 1);
            assert_eq!(call.launches.len(), 1);
            // sm_90a: persistent, min(units, SMs) blocks, a unit one pair
            // of row blocks (here one: ceil(97 / 128)) per head and batch.
            let expected = if arch == "sm_90a" {
                (8, 1, 1)
            } else {
                (1, 4, 2)
            };
            assert_eq!(
                call.launches[0].grid, expected,
                "{variant} {arch}: one block row per head and batch"
            );
            assert!(passes(&fwd, &call, 0, "o") && passes(&fwd, &call, 0, "row_outputs"));
            let o = &call.buffers[buffer_index(&fwd, "o")];
            assert_eq!(o.elements, 2 * 4 * 97 * 64);
            let bwd = plan(variant, "backward", arch);
            let call = check_call(&bwd, &p.sizes(), &p.backward_inputs(&customs), &[], SMS)
                .unwrap_or_else(|e| panic!("{variant} {arch} backward: {e}"));
            assert_eq!(call.launches.len(), 3);
            if variant == "Alibi" {
                let i = buffer_index(&bwd, "dslopes");
                assert_eq!(bwd.buffers[i].role, Role::Output);
                assert!(bwd.buffers[i].zeroed);
                assert_eq!(call.buffers[i].elements, 4);
            }
        }
        // Decode: Sq fixed to 1 (left out), grouped kv heads; a long cache
        // with one sequence splits the keys, a wide batch does not.
        let fwd = plan("Decode", "forward", arch);
        let p = Parallel {
            b: 1,
            h: 4,
            hkv: 2,
            sq: 1,
            skv: 3001,
        };
        let sizes = [("B", 1), ("H", 4), ("Hkv", 2), ("Skv", 3001)];
        let call = check_call(&fwd, &sizes, &p.forward_inputs(&[]), &[], SMS).unwrap();
        assert!(call.kv_splits > 1, "{arch}: {} split(s)", call.kv_splits);
        assert_eq!(call.size("Sq"), Some(1));
        assert_eq!(call.launches.len(), 2, "main and combine");
        assert!(passes(&fwd, &call, 0, "opart") && passes(&fwd, &call, 1, "spart"));
        let opart = &call.buffers[buffer_index(&fwd, "opart")];
        assert_eq!(opart.elements, call.kv_splits * 4 * 64);
        let p = Parallel {
            b: 40,
            h: 16,
            hkv: 8,
            sq: 1,
            skv: 77,
        };
        let call = check_call(&fwd, &p.sizes(), &p.forward_inputs(&[]), &[], SMS).unwrap();
        assert_eq!(call.kv_splits, 1);
        assert_eq!(call.launches.len(), 1, "no combine with one split");
        assert!(!passes(&fwd, &call, 0, "opart") && !passes(&fwd, &call, 0, "spart"));
        let bwd = plan("Decode", "backward", arch);
        check_call(&bwd, &p.sizes(), &p.backward_inputs(&[]), &[], SMS).unwrap();

        // Mamba2: the initial state in and the final state out are optional.
        let fwd = plan("Mamba2", "forward", arch);
        let sizes = [("B", 2), ("H", 4), ("S", 150)];
        let inputs = mamba2_inputs(2, 4, 150);
        let call = check_call(&fwd, &sizes, &inputs, &[], SMS).unwrap();
        assert!(!passes(&fwd, &call, 0, "state_in") && !passes(&fwd, &call, 0, "state_out"));
        let state = Some((Dtype::F32, 2 * 4 * 128 * 64));
        let call = check_call(
            &fwd,
            &sizes,
            &with(&inputs, "state_in", state),
            &["state_out"],
            SMS,
        )
        .unwrap();
        assert!(passes(&fwd, &call, 0, "state_in") && passes(&fwd, &call, 0, "state_out"));
        assert_eq!(call.launches[0].grid, (1, 4, 2));

        // Mamba2's backward: the states pass, then _dstate, _dqk, _dv, _decay.
        let bwd = plan("Mamba2", "backward", arch);
        let mut inputs = mamba2_inputs(2, 4, 150);
        inputs.push(("do", Dtype::Bf16, 2 * 4 * 150 * 64));
        let call = check_call(&bwd, &sizes, &inputs, &[], SMS).unwrap();
        let grids: Vec<(u32, u32, u32)> = call.launches.iter().map(|l| l.grid).collect();
        // S = 150: 3 chunks of 64; _dqk splits Dk = 128 in two.
        assert_eq!(
            grids,
            [(1, 4, 2), (1, 4, 2), (6, 4, 2), (3, 4, 2), (1, 4, 2)],
            "{arch}"
        );
        let states = &call.buffers[buffer_index(&bwd, "states")];
        assert_eq!(states.elements, 2 * 4 * 3 * 128 * 64);
        assert!(!passes(&bwd, &call, 0, "state_in") && !passes(&bwd, &call, 1, "d_state_in"));
        assert!(passes(&bwd, &call, 0, "states") && passes(&bwd, &call, 4, "dlog"));
        assert!(bwd.buffers[buffer_index(&bwd, "dlog")].zeroed);
    }

    // Opening on device 0: without a GPU a clear error naming the library.
    match Library::open_device(dir, 0) {
        Ok(lib) => {
            assert_eq!(lib.variants(), ["Softmax", "Alibi", "Decode", "Mamba2"]);
            eprintln!("a GPU is present: the library opened for {}", lib.arch());
        }
        Err(
            e @ Error::Runtime {
                source: RuntimeError::NoDriver { .. } | RuntimeError::NoDevice { .. },
                ..
            },
        ) => {
            let m = e.to_string();
            assert!(
                m.starts_with(&format!(
                    "opening CUDA device 0 for the kernel library {}: ",
                    dir.display()
                )),
                "{m}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

// --------------------------------------------------------- manifest errors

#[test]
fn a_missing_or_malformed_manifest_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let path = dir.join("manifest.json");
    let m = library_error(Manifest::read(dir));
    assert!(
        m.starts_with(&format!(
            "{}: cannot read the library's manifest (",
            path.display()
        )) && m.ends_with("a kernel library is a directory written by `aec compile … -o DIR`"),
        "{m}"
    );
    // The same through Library::open_device: the manifest is read first.
    assert_eq!(library_error(Library::open_device(dir, 0)), m);

    let read = |text: &str| {
        std::fs::write(&path, text).unwrap();
        library_error(Manifest::read(dir))
    };
    let at = |m: &str| format!("{}: {m}", path.display());
    let m = read("{ \"format\": 2, ");
    assert!(m.starts_with(&at("not valid JSON: ")), "{m}");
    assert_eq!(
        read("{\"format\": 1, \"variants\": []}"),
        at(&format!(
            "manifest format 1, but this aec ({}) reads format 4: compile the library again \
             with this version's `aec compile`",
            env!("CARGO_PKG_VERSION")
        ))
    );
    assert_eq!(
        read("[]"),
        at("the manifest: expected an object, found an array")
    );
    assert_eq!(
        read("{\"format\": 4, \"aec_version\": \"0.1.0\"}"),
        at("the manifest: missing field `variants`")
    );

    // A plan that does not deserialise, and one that is inconsistent.
    let plan = serde_json::to_value(parallel_forward("softmax", Isa::Sm80)).unwrap();
    let manifest = |plan: Value| {
        json!({
            "format": 4, "aec_version": "0.1.0",
            "variants": [{
                "name": "Softmax", "file": "examples/softmax.rs", "pattern": "parallel",
                "kernels": [{
                    "pass": "forward",
                    "builds": [{ "target": "a100", "arch": "sm_80", "cubin": null }],
                    "plan": plan,
                }],
            }],
        })
        .to_string()
    };
    let mut bad = plan.clone();
    bad["buffers"][0]["dtype"] = json!("f64");
    let m = read(&manifest(bad));
    assert!(
        m.starts_with(&at(
            "variants[0] (`Softmax`).kernels[0].plan: not a launch plan: unknown variant `f64`"
        )),
        "{m}"
    );
    let mut bad = plan.clone();
    bad["launches"][0]["args"][0] = json!({ "ptr": "qq" });
    assert_eq!(
        read(&manifest(bad)),
        at(&format!(
            "variants[0] (`Softmax`).kernels[0].plan: launch 0 (`{}`) passes `qq`, which is \
             not a buffer",
            plan["launches"][0]["entry"].as_str().unwrap()
        ))
    );
    let mut bad = plan.clone();
    bad["buffers"][0]["shape"][0] = json!("Batch");
    assert_eq!(
        read(&manifest(bad)),
        at(
            "variants[0] (`Softmax`).kernels[0].plan: the shape of `q` reads `Batch`, which is \
            not a size of the plan"
        )
    );
    let mut bad = plan.clone();
    bad["pass"] = json!("backward");
    assert_eq!(
        read(&manifest(bad)),
        at(
            "variants[0] (`Softmax`).kernels[0].plan: the plan is a backward plan in a forward \
            record"
        )
    );
    // The unmodified plan reads back.
    std::fs::write(&path, manifest(plan)).unwrap();
    let read_back = Manifest::read(dir).unwrap();
    assert_eq!(read_back.variants[0].kernels[0].builds[0].cubin, None);
}

// ------------------------------------------------------ entry selection

/// A library manifest of generated plans (no cubins on disk): Softmax
/// forward for sm_90a and a skipped backward, Alibi without NVRTC, Mamba2
/// with a variant-level backward note (what a manifest may say of a
/// variant without a backward; `aec compile` writes recurrent backwards).
fn selection_manifest() -> Manifest {
    let text = json!({
        "format": 4, "aec_version": "0.1.0",
        "variants": [
            {
                "name": "Softmax", "file": "examples/softmax.rs", "pattern": "parallel",
                "kernels": [
                    {
                        "pass": "forward",
                        "builds": [{ "target": "h100", "arch": "sm_90a", "cubin": "kernels/s.sm_90a.cubin" }],
                        "plan": parallel_forward("softmax", Isa::Sm90a),
                    },
                    { "pass": "backward", "skipped": "the generator refused it" },
                    { "pass": "backward", "target": "mi300x", "skipped": "no HIP backward" },
                ],
            },
            {
                "name": "Alibi", "file": "examples/alibi.rs", "pattern": "parallel",
                "kernels": [{
                    "pass": "forward",
                    "builds": [{ "target": "h100", "arch": "sm_90a", "cubin": null }],
                    "plan": parallel_forward("alibi", Isa::Sm90a),
                }],
            },
            {
                "name": "Mamba2", "file": "examples/mamba2.rs", "pattern": "recurrent",
                "backward": null, "backward_note": "not implemented yet",
                "kernels": [{
                    "pass": "forward",
                    "builds": [
                        { "target": "a100", "arch": "sm_80", "cubin": "kernels/m.sm_80.cubin" },
                        { "target": "h100", "arch": "sm_90a", "cubin": "kernels/m.sm_90a.cubin" },
                        { "target": "mi300x", "arch": "gfx942", "code_object": "kernels/m_gfx942.co" },
                    ],
                    "plan": mamba2_forward(),
                }],
            },
        ],
    });
    Manifest::parse("/libs/x", &text.to_string()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn entry_selection_says_why_there_is_no_entry() {
    let m = selection_manifest();
    assert_eq!(m.cuda_archs(), ["sm_80", "sm_90a"]);
    assert_eq!(m.hip_archs(), ["gfx942"]);
    let (_, k, b) = m.select("Softmax", "forward", "sm_90a").unwrap();
    assert_eq!(k.pass, "forward");
    assert_eq!(
        b.cubin.as_deref(),
        Some(Path::new("kernels/s.sm_90a.cubin"))
    );
    let (_, _, b) = m.select("Mamba2", "forward", "sm_80").unwrap();
    assert_eq!(b.target, "a100");

    assert_eq!(
        library_error(m.select("softmax", "forward", "sm_90a")),
        "/libs/x: no variant `softmax` in this library: it has Softmax, Alibi, Mamba2; did you \
         mean `Softmax`?"
    );
    assert_eq!(
        library_error(m.select("Flash", "forward", "sm_90a")),
        "/libs/x: no variant `Flash` in this library: it has Softmax, Alibi, Mamba2"
    );
    assert_eq!(
        library_error(m.select("Softmax", "forwad", "sm_90a")),
        "/libs/x: no pass `forwad`: an entry point is `forward` or `backward`; did you mean \
         `forward`?"
    );
    assert_eq!(
        library_error(m.select("Softmax", "backward", "sm_90a")),
        "/libs/x: `Softmax` has no backward kernels: the generator refused it; no HIP backward \
         (target mi300x)"
    );
    assert_eq!(
        library_error(m.select("Softmax", "forward", "sm_80")),
        "/libs/x: the forward of `Softmax` has no build for sm_80: it is built for sm_90a; \
         compile the library for a target of sm_80"
    );
    assert_eq!(
        library_error(m.select("Alibi", "forward", "sm_90a")),
        "/libs/x: the forward of `Alibi` has no cubin for sm_90a: the library was compiled \
         without NVRTC (only CUDA sources were written); compile it again with NVRTC \
         (libnvrtc.so.13) on the loader path"
    );
    assert_eq!(
        library_error(m.select("Alibi", "backward", "sm_90a")),
        "/libs/x: `Alibi` has no backward kernels in this library"
    );
    match m.select("Mamba2", "backward", "sm_90a") {
        Err(Error::NotImplemented(msg)) => assert_eq!(
            msg,
            "`Mamba2` has no backward in this library: not implemented yet"
        ),
        other => panic!("expected NotImplemented, got {other:?}"),
    }
}

#[test]
fn architectures_by_compute_capability() {
    assert_eq!(cuda_arch_for(9, 0), Some("sm_90a"));
    assert_eq!(cuda_arch_for(8, 0), Some("sm_80"));
    assert_eq!(cuda_arch_for(8, 6), Some("sm_80"));
    assert_eq!(cuda_arch_for(8, 9), Some("sm_80"));
    assert_eq!(cuda_arch_for(10, 0), None);
    assert_eq!(cuda_arch_for(7, 5), None);
}

// ------------------------------------------------------------ call checks

#[test]
fn sizes_are_checked_by_name() {
    let plan = parallel_forward("alibi", Isa::Sm90a);
    let p = Parallel {
        b: 2,
        h: 8,
        hkv: 8,
        sq: 100,
        skv: 100,
    };
    let t = p.forward_inputs(&[("slopes", 8)]);
    check_call(&plan, &p.sizes(), &t, &[], SMS).expect("a valid call");
    let sizes = |s: &[(&'static str, usize)]| shape_error(check_call(&plan, s, &t, &[], SMS));
    let all = p.sizes();
    let replace = |name: &str, n: usize| -> Vec<(&'static str, usize)> {
        all.iter()
            .map(|&(m, v)| (m, if m == name { n } else { v }))
            .collect()
    };
    assert_eq!(
        sizes(&all[1..]),
        "size `B` is missing: the call binds B, H, Hkv, Sq, Skv (fixed sizes may be left out)"
    );
    let mut twice = all.clone();
    twice.push(("H", 8));
    assert_eq!(sizes(&twice), "size `H` is given twice");
    let mut extra = all.clone();
    extra.push(("Sk", 8));
    assert_eq!(
        sizes(&extra),
        "unknown size `Sk`: the call binds B, H, Hkv, Sq, Skv (did you mean `Sq`?)"
    );
    let mut splits = all.clone();
    splits.push(("kv_splits", 2));
    assert_eq!(
        sizes(&splits),
        "`kv_splits` is not a size of the call: the loader computes it from the sizes and the \
         device; the call binds B, H, Hkv, Sq, Skv"
    );
    assert_eq!(
        sizes(&replace("Sq", 0)),
        "size `Sq` = 0: every size must be at least 1"
    );
    assert_eq!(
        sizes(&replace("Skv", 1 << 31)),
        "size `Skv` = 2147483648 does not fit the kernels' 32-bit sizes (at most 2147483647): \
         split the call"
    );
    assert_eq!(
        sizes(&replace("Hkv", 4)),
        "Hkv = 4 must equal H = 8 (this variant's k and v have H heads)"
    );

    // Grouped-query heads (Decode): H a multiple of Hkv; Sq fixed to 1.
    let plan = parallel_forward("decode", Isa::Sm90a);
    let p = Parallel {
        b: 2,
        h: 8,
        hkv: 2,
        sq: 1,
        skv: 300,
    };
    let t = p.forward_inputs(&[]);
    check_call(&plan, &p.sizes(), &t, &[], SMS).expect("Sq given and equal to its fixed value");
    let sizes = |s: &[(&'static str, usize)]| shape_error(check_call(&plan, s, &t, &[], SMS));
    assert_eq!(
        sizes(&[("B", 2), ("H", 8), ("Hkv", 2), ("Sq", 4), ("Skv", 300)]),
        "size `Sq` = 4, but the variant fixes Sq = 1"
    );
    assert_eq!(
        sizes(&[("B", 2), ("H", 8), ("Hkv", 3), ("Skv", 300)]),
        "H = 8 is not a multiple of Hkv = 3"
    );
    assert_eq!(
        sizes(&[("B", 2), ("H", 8), ("Hkv", 2)]),
        "size `Skv` is missing: the call binds B, H, Hkv, Sq (fixed: 1), Skv (fixed sizes may \
         be left out)"
    );
}

#[test]
fn tensors_are_checked_by_name_dtype_and_shape() {
    let plan = parallel_forward("alibi", Isa::Sm90a);
    let p = Parallel {
        b: 2,
        h: 8,
        hkv: 8,
        sq: 100,
        skv: 100,
    };
    let t = p.forward_inputs(&[("slopes", 8)]);
    let call = |t: &[(&str, Dtype, usize)]| shape_error(check_call(&plan, &p.sizes(), t, &[], SMS));
    assert_eq!(
        call(&with(&t, "q", Some((Dtype::Bf16, 1000)))),
        "tensor `q`: expected [B, H, Sq, 128] = [2, 8, 100, 128] = 204800 elements, got 1000"
    );
    assert_eq!(
        call(&with(&t, "v", Some((Dtype::F16, 2 * 8 * 100 * 64)))),
        "tensor `v`: expected bf16 elements, got f16"
    );
    assert_eq!(
        call(&with(&t, "slopes", Some((Dtype::F32, 7)))),
        "tensor `slopes`: expected [H] = [8] = 8 elements, got 7"
    );
    assert_eq!(
        call(&with(&t, "slopes", None)),
        "tensor `slopes` is missing: expected f32 [H] = [8] = 8 elements (custom input)"
    );
    assert_eq!(
        call(&with(&t, "k", None)),
        "tensor `k` is missing: expected bf16 [B, H, Skv, 128] = [2, 8, 100, 128] = 204800 \
         elements (k input)"
    );
    assert_eq!(
        call(&with(&t, "slope", Some((Dtype::F32, 8)))),
        "unknown tensor `slope`: this entry takes q, k, v, slopes (did you mean `slopes`?)"
    );
    let mut twice = t.clone();
    twice.push(("q", Dtype::Bf16, 204800));
    assert_eq!(call(&twice), "tensor `q` is given twice");
    assert_eq!(
        call(&with(&t, "o", Some((Dtype::Bf16, 2 * 8 * 100 * 64)))),
        "`o` is an output of this entry, not an input: the library allocates it"
    );

    // The backward takes the forward's outputs and dO.
    let plan = parallel_backward("alibi", Isa::Sm90a);
    let t = p.backward_inputs(&[("slopes", 8)]);
    let call = |t: &[(&str, Dtype, usize)]| shape_error(check_call(&plan, &p.sizes(), t, &[], SMS));
    check_call(&plan, &p.sizes(), &t, &[], SMS).expect("a valid backward call");
    assert_eq!(
        call(&with(&t, "row_outputs", Some((Dtype::F32, 1600)))),
        "tensor `row_outputs`: expected [3, B, H, Sq] = [3, 2, 8, 100] = 4800 elements, got 1600"
    );
    assert_eq!(
        call(&with(&t, "dout", None)),
        "tensor `dout` is missing: expected bf16 [B, H, Sq, 64] = [2, 8, 100, 64] = 102400 \
         elements (the gradient of the output)"
    );
    assert_eq!(
        call(&with(&t, "dq_acc", Some((Dtype::F32, 204800)))),
        "`dq_acc` is a workspace of this entry, not an input: the library allocates it"
    );
}

#[test]
fn optional_buffers_wanted_outputs_and_limits() {
    let plan = mamba2_forward();
    let sizes = [("B", 2), ("H", 4), ("S", 150)];
    let t = mamba2_inputs(2, 4, 150);
    let call = |t: &[(&str, Dtype, usize)], want: &[&str]| {
        shape_error(check_call(&plan, &sizes, t, want, SMS))
    };
    assert_eq!(
        call(&with(&t, "state_in", Some((Dtype::F32, 10))), &[]),
        "tensor `state_in`: expected [B, H, 128, 64] = [2, 4, 128, 64] = 65536 elements, got 10"
    );
    assert_eq!(
        call(&with(&t, "state_in", Some((Dtype::Bf16, 65536))), &[]),
        "tensor `state_in`: expected f32 elements, got bf16"
    );
    assert_eq!(
        call(&with(&t, "state_out", Some((Dtype::F32, 65536))), &[]),
        "`state_out` is an output of this entry, not an input: the library allocates it (ask \
         for it in `want`)"
    );
    assert_eq!(
        call(&with(&t, "stat_in", Some((Dtype::F32, 65536))), &[]),
        "unknown tensor `stat_in`: this entry takes q, k, v, a, dt, state_in (optional) (did \
         you mean `state_in`?)"
    );
    assert_eq!(
        call(&t, &["state"]),
        "cannot return `state`: this entry returns o, state_out (optional)"
    );
    assert_eq!(
        call(&t, &["stateout"]),
        "cannot return `stateout`: this entry returns o, state_out (optional) (did you mean \
         `state_out`?)"
    );
    assert_eq!(
        call(&t, &["q"]),
        "cannot return `q`: this entry returns o, state_out (optional)"
    );
    assert_eq!(
        call(&t, &["state_out", "state_out"]),
        "output `state_out` is asked for twice"
    );
    // Outputs that are always returned may be named in `want`.
    let c = check_call(&plan, &sizes, &t, &["o"], SMS).unwrap();
    assert_eq!(c.launches.len(), 1);

    // CUDA's grid: heads and batch are grid y and z.
    let big = [("B", 70_000), ("H", 1), ("S", 1)];
    let t = mamba2_inputs(70_000, 1, 1);
    let m = shape_error(check_call(&plan, &big, &t, &[], SMS));
    assert!(
        m.starts_with("launch 0 (`aec_rec_fwd_mamba2_")
            && m.ends_with(
                "`): the grid [1, H, B] = [1, 1, 70000] exceeds CUDA's limits (x ≤ 2147483647, \
                 y and z ≤ 65535): split the call"
            ),
        "{m}"
    );
    // The forward's grid x counts query blocks: Sq near 2^31 still fits
    // 32-bit sizes but its element counts need 64 bits, which they get.
    let plan = parallel_forward("softmax", Isa::Sm80);
    let p = Parallel {
        b: 1,
        h: 1,
        hkv: 1,
        sq: (1 << 31) - 1,
        skv: 1,
    };
    let c = check_call(&plan, &p.sizes(), &p.forward_inputs(&[]), &[], SMS).unwrap();
    assert_eq!(
        c.buffers[buffer_index(&plan, "o")].elements,
        ((1u64 << 31) - 1) * 64
    );
}

/// The recurrent backward's call checks: `do` and the optional final-state
/// gradient by shape and dtype, the initial state's gradient only when
/// asked for, null pointers for absent buffers and the states pass's
/// never-filled final state, and its grids for S not a multiple of the
/// chunk.
#[test]
fn recurrent_backward_calls_check_do_and_the_state_gradients() {
    let plan = mamba2_backward(Isa::Sm90a);
    let sizes = [("B", 2), ("H", 4), ("S", 65)];
    let mut t = mamba2_inputs(2, 4, 65);
    t.push(("do", Dtype::Bf16, 2 * 4 * 65 * 64));
    let state = Some((Dtype::F32, 2 * 4 * 128 * 64));
    let call = |t: &[(&str, Dtype, usize)], want: &[&str]| {
        shape_error(check_call(&plan, &sizes, t, want, SMS))
    };
    assert_eq!(
        call(&with(&t, "do", Some((Dtype::Bf16, 2 * 4 * 65 * 128))), &[]),
        "tensor `do`: expected [B, H, S, 64] = [2, 4, 65, 64] = 33280 elements, got 66560"
    );
    assert_eq!(
        call(&with(&t, "do", Some((Dtype::F32, 2 * 4 * 65 * 64))), &[]),
        "tensor `do`: expected bf16 elements, got f32"
    );
    assert_eq!(
        call(&with(&t, "do", None), &[]),
        "tensor `do` is missing: expected bf16 [B, H, S, 64] = [2, 4, 65, 64] = 33280 elements \
         (the gradient of the output)"
    );
    assert_eq!(
        call(
            &with(&t, "d_state_out", Some((Dtype::F32, 2 * 4 * 64 * 64))),
            &[]
        ),
        "tensor `d_state_out`: expected [B, H, 128, 64] = [2, 4, 128, 64] = 65536 elements, got \
         32768"
    );
    assert_eq!(
        call(&with(&t, "d_state_out", Some((Dtype::Bf16, 65536))), &[]),
        "tensor `d_state_out`: expected f32 elements, got bf16"
    );
    assert_eq!(
        call(&with(&t, "d_state_in", state), &[]),
        "`d_state_in` is an output of this entry, not an input: the library allocates it (ask \
         for it in `want`)"
    );
    assert_eq!(
        call(&with(&t, "states", Some((Dtype::Bf16, 1))), &[]),
        "`states` is a workspace of this entry, not an input: the library allocates it"
    );
    assert_eq!(
        call(&t, &["d_norm_in"]),
        "cannot return `d_norm_in`: this entry returns dq, dk, dv, da, ddt, d_state_in \
         (optional)"
    );
    assert_eq!(
        call(&with(&t, "norm_in", Some((Dtype::F32, 2 * 4 * 128))), &[]),
        "unknown tensor `norm_in`: this entry takes q, k, v, a, dt, do, state_in (optional), \
         d_state_out (optional)"
    );

    // A valid call: absent optional buffers are null pointers, the states
    // pass's `state_out` always is; S = 65 is two chunks.
    let c = check_call(&plan, &sizes, &t, &[], SMS).unwrap();
    assert_eq!(plan.launches[0].module.as_deref(), Some("states"));
    let null_at = plan.launches[0]
        .args
        .iter()
        .position(|a| *a == ArgPlan::Null("state_out".into()))
        .expect("the states pass's state_out");
    assert_eq!(c.launches[0].args[null_at], CallArg::Null);
    assert!(!passes(&plan, &c, 0, "state_in"));
    assert!(!passes(&plan, &c, 1, "d_state_out") && !passes(&plan, &c, 1, "d_state_in"));
    assert!(!c.buffers[buffer_index(&plan, "d_state_in")].present);
    assert_eq!(
        c.buffers[buffer_index(&plan, "dstates")].elements,
        2 * 4 * 2 * 128 * 64
    );
    let grids: Vec<u32> = c.launches.iter().map(|l| l.grid.0).collect();
    assert_eq!(grids, [1, 1, 4, 2, 1]);
    // With the forward's initial state, a final-state gradient, and the
    // initial state's gradient asked for: all passed.
    let t2 = with(&with(&t, "state_in", state), "d_state_out", state);
    let c = check_call(&plan, &sizes, &t2, &["d_state_in"], SMS).unwrap();
    assert!(passes(&plan, &c, 0, "state_in"));
    for l in 1..c.launches.len() {
        assert!(passes(&plan, &c, l, "d_state_out") && passes(&plan, &c, l, "d_state_in"));
    }
    assert_eq!(c.launches[0].args[null_at], CallArg::Null);
}

/// A record whose launches name a module its builds do not list is refused
/// when the manifest is read.
#[test]
fn a_module_the_builds_lack_is_refused() {
    let plan = serde_json::to_value(mamba2_backward(Isa::Sm80)).unwrap();
    let states = plan["launches"][0]["entry"].as_str().unwrap().to_string();
    let manifest = |build: Value| {
        json!({
            "format": 4, "aec_version": "0.1.0",
            "variants": [{
                "name": "Mamba2", "file": "examples/mamba2.rs", "pattern": "recurrent",
                "kernels": [{ "pass": "backward", "builds": [build], "plan": plan.clone() }],
            }],
        })
        .to_string()
    };
    let ok = Manifest::parse(
        "/libs/x",
        &manifest(json!({
            "target": "a100", "arch": "sm_80", "cubin": "kernels/b.cubin",
            "modules": { "states": "kernels/s.cubin" },
        })),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (_, _, b) = ok.select("Mamba2", "backward", "sm_80").unwrap();
    assert_eq!(
        b.modules["states"].as_deref(),
        Some(Path::new("kernels/s.cubin"))
    );
    let m = library_error(Manifest::parse(
        "/libs/x",
        &manifest(json!({ "target": "a100", "arch": "sm_80", "cubin": "kernels/b.cubin" })),
    ));
    assert_eq!(
        m,
        format!(
            "/libs/x/manifest.json: variants[0] (`Mamba2`).kernels[0].builds[0]: launch 0 \
             (`{states}`) is in the module `states`, which the build does not list (it has: \
             none)"
        )
    );
    let m = library_error(Manifest::parse(
        "/libs/x",
        &manifest(json!({
            "target": "a100", "arch": "sm_80", "cubin": "kernels/b.cubin",
            "modules": { "states": null },
        })),
    ));
    assert!(
        m.ends_with("the module `states` has no cubin, but the build's own module has one"),
        "{m}"
    );
    // Without NVRTC both are null: the record reads, and selecting it says why.
    let bare = Manifest::parse(
        "/libs/x",
        &manifest(json!({
            "target": "a100", "arch": "sm_80", "cubin": null, "modules": { "states": null },
        })),
    )
    .unwrap();
    let m = library_error(bare.select("Mamba2", "backward", "sm_80"));
    assert!(m.contains("compiled without NVRTC"), "{m}");
}

#[test]
fn kv_splits_follow_the_rule_and_gate_the_combine() {
    let plan = parallel_forward("decode", Isa::Sm90a);
    let split = plan.kv_splits.as_ref().expect("decode has split-KV");
    let run = |b: usize, hkv: usize, skv: usize, sms: u32| {
        let p = Parallel {
            b,
            h: 4 * hkv,
            hkv,
            sq: 1,
            skv,
        };
        check_call(&plan, &p.sizes(), &p.forward_inputs(&[]), &[], sms).unwrap()
    };
    // One block per (batch, kv head) here (the 4 query heads of a group
    // share it).
    let c = run(1, 2, 3001, 132);
    assert_eq!(
        split.blocks.to_string(),
        "ceil(ceil(H / Hkv) * Sq / 16) * Hkv * B"
    );
    assert_eq!(split.key_blocks.to_string(), "ceil(Skv / 32)");
    // 2 blocks on 132 SMs: one block per SM whatever the splits, and 94 key
    // blocks allow 23 splits (a quarter); 19 already give every block at
    // most 5 key blocks, as 23 do: the fewest splits that are as fast.
    assert_eq!(c.kv_splits, 19);
    assert_eq!(c.size("kv_splits"), Some(c.kv_splits));
    let (x, _, _) = c.launches[0].grid;
    assert_eq!(
        u64::from(x),
        c.kv_splits,
        "the main grid's x is multiplied by the splits"
    );
    // The combine: Dv / 4 threads per row, 128 threads per block (Dv 64
    // here: 8 rows per block).
    assert_eq!(
        c.launches[1].grid,
        (1, 1, 1),
        "combine: 8 query rows, 8 per block"
    );
    let combine = &plan.launches[c.launches[1].index];
    assert_eq!(combine.threads, 128, "combine threads");
    // Fewer SMs, fewer splits: on 4 SMs (residency unknown, so every block
    // counts as resident) 6 splits put three blocks of 16 key blocks on
    // each, 36 KiB of K/V in flight (12 KiB a block: one 32-key stage of Dqk
    // 128 and Dv 64), besides each block's Q and partial rows (0.67 of a key
    // block). A full grid, none.
    assert_eq!(split.block_bytes_in_flight, 32 * (128 + 64) * 2);
    assert_eq!(
        split.block_fixed_work,
        1024 + 16 * (128 * 2 + 64 * 4) * 1024 / 12288
    );
    assert_eq!(run(1, 2, 3001, 4).kv_splits, 6);
    let c = run(200, 2, 3001, 132);
    assert_eq!(c.kv_splits, 1);
    assert_eq!(c.launches.len(), 1);
    let spart = buffer_index(&plan, "spart");
    assert!(!c.buffers[spart].present);
}
