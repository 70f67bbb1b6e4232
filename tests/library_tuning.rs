//! The tuning table of kernel libraries, without a GPU: `aec compile` reads
//! a tuning cache (written here through the runtime's API, as `aec tune`
//! and `aec tune --backward` write it) and adds one forward kernel, or one
//! backward, per tuned configuration with the GPUs and shape buckets it
//! serves; the Rust loader's and the C header's choice of kernel follows the
//! pass, the GPU name and the call's bucket, and falls back to the default
//! elsewhere. (The Python module's choice is tested in
//! `tests/python/test_aec_library.py`; on a GPU, `bench/library_gpu.sh`.)

mod common;

use aec::compiler::{BackwardConfig, Elem, ForwardConfig, Isa, parallel_backward};
use aec::library::Manifest;
use aec::library::c_header::{LOADER_H, generate};
use aec::runtime::{ShapeBucket, TunedEntry, TuningCache, TuningKey};
use aec::tune::{
    PARALLEL_BACKWARD, PARALLEL_FORWARD, backward_template_version, template_version, variant_hash,
};
use common::{repo, show};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const H100: &str = "NVIDIA H100 80GB HBM3";
const H200: &str = "NVIDIA H200";

fn softmax() -> aec::frontend::Variant {
    let source = std::fs::read_to_string(repo().join("examples/softmax.rs")).unwrap();
    let mut found = aec::frontend::parse_file(&source).expect("examples/softmax.rs parses");
    found.remove(0).variant.expect("Softmax traces")
}

/// A result of `aec tune` for the softmax forward on `gpu`, as the tuner
/// keys it.
fn tuned(gpu: &str, shape: ShapeBucket, config: ForwardConfig, variant_hash: &str) -> TunedEntry {
    TunedEntry {
        key: TuningKey {
            variant: "Softmax".into(),
            variant_hash: variant_hash.into(),
            kernel: PARALLEL_FORWARD.into(),
            template_version: template_version(),
            target: "sm_90a".into(),
            gpu: gpu.into(),
            driver: "580.65".into(),
            toolkit: "nvrtc 13.0".into(),
            dtype: "bf16".into(),
            dqk: 128,
            dv: 128,
            shape,
        },
        config: serde_json::to_value(config).unwrap(),
        config_label: format!("n{} s{}", config.block_n, config.stages),
        best_us: 100.0,
        default_us: 120.0,
        median_us: 130.0,
        plans_tried: 9,
        rejected: vec![],
        tuning_seconds: 20.0,
        tflops: 500.0,
        efficiency: 0.5,
    }
}

/// A result of `aec tune --backward` for the softmax backward on `gpu`.
fn tuned_backward(gpu: &str, shape: ShapeBucket, config: BackwardConfig, hash: &str) -> TunedEntry {
    let forward = tuned(
        gpu,
        shape,
        ForwardConfig::default_for(&softmax(), 128, 128, Elem::Bf16, Isa::Sm90a),
        hash,
    );
    TunedEntry {
        key: TuningKey {
            kernel: PARALLEL_BACKWARD.into(),
            template_version: backward_template_version(),
            ..forward.key
        },
        config: serde_json::to_value(config).unwrap(),
        config_label: config.label(),
        ..forward
    }
}

/// `aec compile examples/softmax.rs -t h100` with `extra` arguments, the
/// environment's cache locations removed and NVRTC off the loader path
/// (sources only: fast).
fn compile(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(["compile", "examples/softmax.rs", "-t", "h100", "-o"])
        .arg(dir)
        .args(extra)
        .env_remove("AEC_TUNING_CACHE")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("HOME")
        .env_remove("LD_LIBRARY_PATH")
        .current_dir(repo())
        .output()
        .expect("run aec compile")
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The manifest with a cubin path in every sm_90a build, as a compile with
/// NVRTC would have written (named as the record's source).
fn with_cubins(mut m: Value) -> Value {
    for v in m["variants"].as_array_mut().unwrap() {
        for k in v["kernels"].as_array_mut().unwrap() {
            let Some(source) = k["source"].as_str() else {
                continue;
            };
            let cubin = source.replace(".cu", ".sm_90a.cubin");
            for b in k["builds"].as_array_mut().into_iter().flatten() {
                b["cubin"] = Value::String(cubin.clone());
            }
        }
    }
    m
}

/// `tests/c/tuning_pick.c` built against the C header generated from
/// `manifest` (written into `lib`'s include/), in `dir`.
fn tuning_pick(lib: &Path, manifest: &Value, dir: &Path) -> std::path::PathBuf {
    let include = lib.join("include");
    std::fs::write(include.join("aec_library.h"), generate(manifest).unwrap()).unwrap();
    std::fs::write(include.join("aec_loader.h"), LOADER_H).unwrap();
    let exe = dir.join("tuning_pick");
    let built = Command::new("cc")
        .args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&include)
        .arg(repo().join("tests/c/tuning_pick.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", show(&built));
    exe
}

/// The first tile of the backward's space, other than the default, that
/// generates for softmax at 128/128 on sm_90a.
fn other_backward_tile(default: &BackwardConfig) -> BackwardConfig {
    let v = softmax();
    BackwardConfig::space(128, 128, Elem::Bf16, Isa::Sm90a)
        .into_iter()
        .find(|c| c != default && parallel_backward(&v, 128, 128, c).is_ok())
        .expect("the space holds another tile")
}

#[test]
fn a_tuning_cache_becomes_kernels_chosen_by_gpu_and_bucket() {
    let tmp = tempfile::tempdir().unwrap();
    let v = softmax();
    let hash = variant_hash(&v);
    let default = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    let x = ForwardConfig {
        block_n: 64,
        stages: 2,
        ..default
    };
    let y = ForwardConfig {
        persistent: !default.persistent,
        ..default
    };
    assert!(x != default && y != default && x != y);
    let bwd_default = BackwardConfig::for_variant(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    let z = other_backward_tile(&bwd_default);
    let cache_file = tmp.path().join("tuning.json");
    let (mut cache, warning) = TuningCache::open(&cache_file);
    assert_eq!(warning, None);
    cache
        .record(vec![
            tuned(H100, ShapeBucket::of(2, 3, 3, 450, 450), x, &hash),
            tuned(H200, ShapeBucket::of(1, 8, 8, 64, 64), x, &hash),
            tuned(H100, ShapeBucket::of(2, 3, 3, 4000, 4000), y, &hash),
            // The default won here: no kernel of its own.
            tuned(H100, ShapeBucket::of(8, 16, 16, 2048, 2048), default, &hash),
            // The backward: a tile for one bucket, the default for another.
            tuned_backward(H100, ShapeBucket::of(2, 3, 3, 450, 450), z, &hash),
            tuned_backward(
                H100,
                ShapeBucket::of(8, 16, 16, 2048, 2048),
                bwd_default,
                &hash,
            ),
            // Another variant's result (an edited softmax): ignored.
            tuned(
                H100,
                ShapeBucket::of(2, 3, 3, 100, 100),
                y,
                "0123456789abcdef",
            ),
        ])
        .unwrap();

    let lib = tmp.path().join("lib");
    let out = compile(&lib, &["--tuning-cache", cache_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "tuning table: 3 tuned kernels (2 forward, 1 backward) for 4 GPU and shape buckets from"
        ),
        "{stderr}"
    );
    let m = manifest(&lib);
    assert_eq!(m["tuning"]["method"], "tuning cache");
    assert_eq!(m["tuning"]["tuned_kernels"], 3);
    assert_eq!(m["tuning"]["tuned_backward_kernels"], 1);
    let forwards: Vec<&Value> = m["variants"][0]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["pass"] == "forward")
        .collect();
    assert_eq!(forwards.len(), 3, "the default and two tuned forwards");
    assert!(forwards[0].get("tuned_for").is_none());
    let names: Vec<&str> = forwards
        .iter()
        .map(|k| k["entry"].as_str().unwrap())
        .collect();
    for (k, cfg) in forwards[1..].iter().zip([x, y]) {
        assert_eq!(k["config"]["block_n"], cfg.block_n);
        assert_eq!(k["config"]["persistent"], cfg.persistent);
        let source = lib.join(k["source"].as_str().unwrap());
        assert!(source.is_file(), "{} written", source.display());
    }
    assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2]);
    let x_for = forwards[1]["tuned_for"].as_array().unwrap();
    assert_eq!(x_for.len(), 2);
    assert_eq!(x_for[0]["gpu"], H100);
    assert_eq!(x_for[0]["sizes"]["Sq"], 512);
    assert_eq!(x_for[0]["sizes"]["B"], 2);
    assert_eq!(x_for[1]["gpu"], H200);
    assert_eq!(forwards[2]["tuned_for"][0]["sizes"]["Skv"], 4096);
    let backwards: Vec<&Value> = m["variants"][0]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["pass"] == "backward" && k.get("plan").is_some())
        .collect();
    assert_eq!(backwards.len(), 2, "the default and one tuned backward");
    assert!(backwards[0].get("tuned_for").is_none());
    assert_ne!(backwards[0]["source"], backwards[1]["source"]);
    assert!(lib.join(backwards[1]["source"].as_str().unwrap()).is_file());
    for (k, cfg) in backwards.iter().zip([bwd_default, z]) {
        assert_eq!(k["config"]["block_m"], cfg.block_m);
        assert_eq!(k["config"]["split_d"], cfg.split_d);
        assert_eq!(k["config"]["warp_specialized"], cfg.warp_specialized);
        assert_eq!(k["config"]["shared_scores"], cfg.shared_scores);
    }
    let z_for = backwards[1]["tuned_for"].as_array().unwrap();
    assert_eq!(z_for.len(), 1);
    assert_eq!(z_for[0]["gpu"], H100);
    assert_eq!(z_for[0]["sizes"]["Sq"], 512);
    assert_eq!(z_for[0]["config_label"], z.label());

    // Without the flag, the default cache location ($AEC_TUNING_CACHE here)
    // gives the same table.
    let by_env = tmp.path().join("by-env");
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args(["compile", "examples/softmax.rs", "-t", "h100", "-o"])
        .arg(&by_env)
        .env("AEC_TUNING_CACHE", &cache_file)
        .env_remove("LD_LIBRARY_PATH")
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let again = manifest(&by_env);
    assert_eq!(again["tuning"]["tuned_kernels"], 3);
    assert_eq!(again["variants"][0]["kernels"], m["variants"][0]["kernels"]);

    // The Rust loader: the default stays the default; the table's records
    // are found for their GPU and hold their buckets.
    let patched = with_cubins(m.clone());
    let text = serde_json::to_string(&patched).unwrap();
    let parsed = Manifest::parse(&lib, &text).expect("the manifest reads");
    let (_, record, _) = parsed.select("Softmax", "forward", "sm_90a").unwrap();
    assert!(record.tuned_for.is_empty());
    assert_eq!(
        record.plan.as_ref().unwrap().launches[0].entry,
        names[0],
        "the default record"
    );
    let on_h100 = parsed.select_tuned("Softmax", "forward", "sm_90a", H100, 132);
    assert_eq!(on_h100.len(), 2);
    let sizes = |b, h, sq, skv| [("B", b), ("H", h), ("Hkv", h), ("Sq", sq), ("Skv", skv)];
    assert!(on_h100[0].2[0].contains(&sizes(2, 3, 300, 511)));
    assert!(!on_h100[0].2[0].contains(&sizes(2, 3, 300, 513)));
    assert!(on_h100[1].2[0].contains(&sizes(2, 3, 2049, 4096)));
    assert_eq!(
        parsed
            .select_tuned("Softmax", "forward", "sm_90a", H200, 132)
            .len(),
        1
    );
    assert!(
        parsed
            .select_tuned("Softmax", "forward", "sm_90a", "NVIDIA A100", 132)
            .is_empty()
    );
    let (_, bwd, _) = parsed.select("Softmax", "backward", "sm_90a").unwrap();
    assert!(bwd.tuned_for.is_empty(), "the default backward");
    let bwd_on_h100 = parsed.select_tuned("Softmax", "backward", "sm_90a", H100, 132);
    assert_eq!(bwd_on_h100.len(), 1);
    assert!(bwd_on_h100[0].2[0].contains(&sizes(2, 3, 300, 511)));
    assert!(!bwd_on_h100[0].2[0].contains(&sizes(2, 3, 2048, 2048)));
    assert_ne!(
        bwd_on_h100[0].0.plan.as_ref().unwrap().launches[1].entry,
        bwd.plan.as_ref().unwrap().launches[1].entry,
        "the tuned backward's main kernel is its own"
    );
    assert!(
        parsed
            .select_tuned("Softmax", "backward", "sm_90a", H200, 132)
            .is_empty()
    );
    assert!(
        parsed
            .select_tuned("Softmax", "forward", "sm_80", H100, 132)
            .is_empty()
    );

    // The C header: the pick follows the GPU name and the bucket.
    if !common::tool_ready("cc", "the C header's pick is not compiled") {
        return;
    }
    let exe = tuning_pick(&lib, &patched, tmp.path());
    let pick_pass = |pass: &str, gpu: &str, b: u32, h: u32, sq: u32, skv: u32| -> String {
        let o = Command::new(&exe)
            .arg(pass)
            .arg(gpu)
            .args([b, h, sq, skv].map(|n| n.to_string()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", show(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let pick = |gpu: &str, b, h, sq, skv| pick_pass("forward", gpu, b, h, sq, skv);
    let cubin = |i: usize| format!("kernels/{}.sm_90a.cubin", names[i]);
    assert_eq!(pick(H100, 2, 3, 450, 300), cubin(1));
    assert_eq!(pick(H100, 2, 3, 512, 257), cubin(1));
    assert_eq!(
        pick(H100, 2, 3, 513, 300),
        cubin(0),
        "Sq 513 is bucket 1024"
    );
    assert_eq!(pick(H100, 3, 3, 450, 300), cubin(0), "B is matched exactly");
    assert_eq!(pick(H100, 2, 3, 3000, 4096), cubin(2));
    assert_eq!(pick(H200, 1, 8, 33, 64), cubin(1));
    assert_eq!(pick(H200, 2, 3, 450, 300), cubin(0), "the H100's bucket");
    assert_eq!(pick("NVIDIA A100", 2, 3, 450, 300), cubin(0));
    let bwd_cubin = |i: usize| {
        backwards[i]["source"]
            .as_str()
            .unwrap()
            .replace(".cu", ".sm_90a.cubin")
    };
    assert_eq!(pick_pass("backward", H100, 2, 3, 450, 300), bwd_cubin(1));
    assert_eq!(
        pick_pass("backward", H100, 8, 16, 2048, 2048),
        bwd_cubin(0),
        "the default won that bucket"
    );
    assert_eq!(pick_pass("backward", H200, 2, 3, 450, 300), bwd_cubin(0));
}

#[test]
fn compile_without_a_tuning_table_and_with_bad_caches() {
    let tmp = tempfile::tempdir().unwrap();
    // --no-tuning: the defaults, said so in the manifest.
    let lib = tmp.path().join("plain");
    let out = compile(&lib, &["--no-tuning"]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(manifest(&lib)["tuning"]["method"], "defaults");
    // A cache named but missing: an error naming it, nothing written.
    let missing = tmp.path().join("nope.json");
    let lib = tmp.path().join("missing");
    let out = compile(&lib, &["--tuning-cache", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "--tuning-cache {}: no such file",
            missing.display()
        )),
        "{stderr}"
    );
    assert!(!lib.join("manifest.json").exists());
    // A corrupt cache: a warning, then the defaults.
    let corrupt = tmp.path().join("corrupt.json");
    std::fs::write(&corrupt, "{ not json").unwrap();
    let lib = tmp.path().join("corrupt");
    let out = compile(&lib, &["--tuning-cache", corrupt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not a valid aec tuning cache"),
        "{stderr}"
    );
    assert!(
        stderr.contains("tuning table: 0 tuned kernels (0 forward, 0 backward)"),
        "{stderr}"
    );
    let m = manifest(&lib);
    assert_eq!(m["tuning"]["tuned_kernels"], 0);
    let forwards = m["variants"][0]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["pass"] == "forward")
        .count();
    assert_eq!(forwards, 1);
    // Both flags: clap refuses.
    let out = compile(
        &tmp.path().join("both"),
        &["--no-tuning", "--tuning-cache", corrupt.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
}

/// `aec compile --workload`: each declared workload whose untuned tile on a
/// product target (what `compile_for_shape` runs there: on sm_90a the cost
/// model's choice for a grid the default leaves short of a wave) differs
/// from the default gets that tile as one more forward, listed for the
/// product (its name and multiprocessors) and the workload's bucket, after
/// the measured records, which win a bucket they share. The Rust loader and
/// the C header pick by the GPU's name and multiprocessor count.
#[test]
fn declared_workloads_take_their_untuned_tile_per_product() {
    use aec::compiler::schedule::DeviceConfig;
    use aec::run::{HeadDims, Shape, UntunedReason, untuned_choice};
    let tmp = tempfile::tempdir().unwrap();
    let v = softmax();
    let hash = variant_hash(&v);
    let default = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    let untuned = |product: &str, shape: Shape| {
        let device = DeviceConfig::named(product).unwrap();
        let dims = HeadDims::new(128, 128);
        untuned_choice(&v, dims, shape, Elem::Bf16, Isa::Sm90a, &device, false)
    };
    // Two small grids the model moves off the default on both products;
    // the benchmark shape keeps it.
    let small = untuned("h100", Shape::mha(1, 12, 300, 300));
    let medium = untuned("h100", Shape::mha(2, 16, 512, 512));
    for c in [&small, &medium] {
        assert!(matches!(c.reason, UntunedReason::Model { .. }), "{c:?}");
        assert_eq!(c.plain, default);
        assert_ne!(c.config, default);
    }
    assert_ne!(small.config, medium.config);
    assert_eq!(
        untuned("h200", Shape::mha(1, 12, 300, 300)).config,
        small.config
    );
    assert_eq!(
        untuned("h100", Shape::mha(8, 32, 2048, 2048)).reason,
        UntunedReason::Default
    );
    // A measured result for the first bucket on the H100.
    let x = ForwardConfig {
        block_n: 64,
        stages: 2,
        ..default
    };
    assert!(x != small.config && x != medium.config && x != default);
    let cache_file = tmp.path().join("tuning.json");
    let (mut cache, _) = TuningCache::open(&cache_file);
    cache
        .record(vec![tuned(
            H100,
            ShapeBucket::of(1, 12, 12, 300, 300),
            x,
            &hash,
        )])
        .unwrap();
    let lib = tmp.path().join("lib");
    let out = compile(
        &lib,
        &[
            "-t",
            "h200",
            "--tuning-cache",
            cache_file.to_str().unwrap(),
            "--workload",
            "B=1,H=12,Sq=300,Skv=300",
            "--workload",
            "B=2,H=16,Sq=512,Skv=512",
            "--workload",
            "B=8,H=32,Sq=2048,Skv=2048",
            // The first one's bucket again: its tile holds it.
            "--workload",
            "B=1,H=12,Sq=257,Skv=400",
        ],
    );
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "workload tiles: 2 forward kernels for 4 product and shape buckets of 4 declared workloads"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("workload tile: `Softmax` on h100 at B=1,H=12,Sq=300,Skv=300: m"),
        "{stderr}"
    );
    let m = manifest(&lib);
    assert_eq!(m["tuning"]["workload_tiles"]["kernels"], 2);
    assert_eq!(m["tuning"]["workload_tiles"]["buckets"], 4);
    let forwards: Vec<&Value> = m["variants"][0]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["pass"] == "forward")
        .collect();
    assert_eq!(
        forwards.len(),
        4,
        "the default, the measured one, two tiles"
    );
    assert_eq!(forwards[1]["tuned_for"][0]["gpu"], H100);
    for (k, c) in forwards[2..].iter().zip([&small, &medium]) {
        assert_eq!(k["config"]["block_m"], c.config.block_m);
        assert_eq!(k["config"]["block_n"], c.config.block_n);
        assert_eq!(k["config"]["persistent"], c.config.persistent);
        assert_eq!(k["config"]["dv_split"], c.config.dv_split);
        let items = k["tuned_for"].as_array().unwrap();
        assert_eq!(items.len(), 2, "one per product");
        for (item, product) in items.iter().zip(["h100", "h200"]) {
            assert_eq!(item["device"], product);
            assert_eq!(item["sms"], 132);
            assert!(item.get("gpu").is_none());
            assert_eq!(item["chosen_by"], "cost model");
            assert!(item["model_speedup"].as_f64().unwrap() >= 1.3);
        }
    }
    let first = &forwards[2]["tuned_for"][0];
    assert_eq!(first["workload"], "B=1,H=12,Sq=300,Skv=300");
    assert_eq!(
        (
            &first["sizes"]["B"],
            &first["sizes"]["H"],
            &first["sizes"]["Hkv"]
        ),
        (&Value::from(1), &Value::from(12), &Value::from(12))
    );
    assert_eq!(
        (&first["sizes"]["Sq"], &first["sizes"]["Skv"]),
        (&Value::from(512), &Value::from(512))
    );

    // The Rust loader: by name for the measured record, by product and
    // multiprocessors for the tiles, in manifest order.
    let patched = with_cubins(m.clone());
    let text = serde_json::to_string(&patched).unwrap();
    let parsed = Manifest::parse(&lib, &text).expect("the manifest reads");
    let entry = |k: &aec::library::KernelRecord| k.plan.as_ref().unwrap().launches[0].entry.clone();
    let call = [("B", 1), ("H", 12), ("Hkv", 12), ("Sq", 300), ("Skv", 300)];
    let first_for = |gpu: &str, sms: u32| {
        parsed
            .select_tuned("Softmax", "forward", "sm_90a", gpu, sms)
            .into_iter()
            .find(|(_, _, buckets)| buckets.iter().any(|b| b.contains(&call)))
            .map(|(k, _, _)| entry(k))
    };
    let name = |i: usize| forwards[i]["entry"].as_str().unwrap().to_string();
    assert_eq!(
        first_for(H100, 132),
        Some(name(1)),
        "the measured record wins"
    );
    assert_eq!(first_for(H200, 132), Some(name(2)));
    assert_eq!(first_for("NVIDIA H100 NVL", 132), Some(name(2)));
    assert_eq!(
        first_for("NVIDIA H100 PCIe", 114),
        None,
        "fewer multiprocessors"
    );
    assert_eq!(first_for("NVIDIA A100-SXM4-80GB", 108), None);

    // The C header picks the same.
    if !common::tool_ready("cc", "the C header's pick is not compiled") {
        return;
    }
    let exe = tuning_pick(&lib, &patched, tmp.path());
    let pick = |gpu: &str, sizes: [u32; 4], sms: u32| -> String {
        let o = Command::new(&exe)
            .args(["forward", gpu])
            .args(sizes.map(|n| n.to_string()))
            .arg(sms.to_string())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", show(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let cubin = |i: usize| format!("kernels/{}.sm_90a.cubin", name(i));
    assert_eq!(pick(H100, [1, 12, 300, 300], 132), cubin(1));
    assert_eq!(pick(H200, [1, 12, 300, 300], 132), cubin(2));
    assert_eq!(pick(H200, [1, 12, 257, 400], 132), cubin(2));
    assert_eq!(pick("nvidia h100 nvl", [1, 12, 300, 300], 132), cubin(2));
    assert_eq!(pick("NVIDIA H100 PCIe", [1, 12, 300, 300], 114), cubin(0));
    assert_eq!(pick(H100, [2, 16, 512, 512], 132), cubin(3));
    assert_eq!(
        pick(H100, [2, 16, 600, 512], 132),
        cubin(0),
        "Sq 600 is bucket 1024"
    );
    assert_eq!(pick(H100, [8, 32, 2048, 2048], 132), cubin(0));
}

/// A declared workload whose query heads are not a multiple of its key/value
/// heads is refused with both named, and nothing is written.
#[test]
fn a_declared_workload_with_an_uneven_head_group_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let lib = tmp.path().join("lib");
    let out = Command::new(env!("CARGO_BIN_EXE_aec"))
        .args([
            "compile",
            "examples/softmax_gqa.rs",
            "-t",
            "h100",
            "--no-tuning",
        ])
        .args(["--workload", "B=1,H=12,Hkv=5,Sq=300,Skv=300", "-o"])
        .arg(&lib)
        .env_remove("LD_LIBRARY_PATH")
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--workload `B=1,H=12,Hkv=5,Sq=300,Skv=300`: H = 12 is not a multiple of Hkv = 5"
        ),
        "{stderr}"
    );
    assert!(!lib.exists(), "nothing written");
}
