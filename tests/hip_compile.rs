//! HIP compile checks without an AMD GPU (issue: AMD backend): the parallel
//! forward and backward of every parallel example and the recurrent forward
//! (and, where it exists, backward) of every recurrent example, compiled for gfx90a (MI250) and gfx942
//! (MI300X), with its resources read back from the code object's metadata and
//! the matrix instructions (`v_mfma`) confirmed in the ISA: no scratch, no
//! spills, LDS within a workgroup's 64 KiB, 64-lane wavefronts.
//!
//! Needs Debian's hipcc / clang-19 / llvm (`cargo xtask toolchains` installs
//! them as root; `cargo xtask test` sets `AEC_REQUIRE_TOOLCHAINS=1`, so in CI a
//! missing piece fails the test instead of skipping it).

mod common;

use aec::compiler::hip::backward::{
    HipBackwardConfig, MAX_BACKWARD_DV, MAX_WAVE_DV, hip_parallel_backward,
};
use aec::compiler::hip::dialect::{Gfx, HipPrelude, MAX_LDS_BYTES};
use aec::compiler::hip::forward::{HipForwardConfig, hip_parallel_forward};
use aec::compiler::hip::recurrent::{
    HipRecurrentConfig, hip_recurrent_forward, recurrent_lds_bytes,
};
use aec::compiler::hip::recurrent_bwd::{hip_recurrent_backward, recurrent_bwd_lds_bytes};
use aec::compiler::{Elem, ForwardKind, KernelSource};
use aec::frontend::Variant;
use aec::runtime::{
    HipResourceUsage, find_hip_compiler, hip_compile, hip_isa, hip_resources, toolchains_required,
};

fn toolchain_ready() -> bool {
    let missing: Vec<String> = ["gfx90a", "gfx942"]
        .iter()
        .filter_map(|g| find_hip_compiler(g).err().map(|e| e.to_string()))
        .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!("HIP toolchain missing: {}", missing.join("; "));
    assert!(!toolchains_required(), "{msg}");
    eprintln!("skipped: {msg}");
    false
}

struct Checked {
    resources: HipResourceUsage,
    isa: String,
}

/// Compiles `source` and reads back the resources of `entry` and the ISA.
fn compile_checked(source: &str, entry: &str, gfx: Gfx) -> Checked {
    let co = hip_compile(source, gfx.name())
        .unwrap_or_else(|e| panic!("{entry} for {}: {e}", gfx.name()));
    let res = hip_resources(&co.elf).expect("metadata");
    let resources = res
        .iter()
        .find(|r| r.name == entry)
        .unwrap_or_else(|| panic!("no metadata for {entry} in {res:?}"))
        .clone();
    let isa = hip_isa(&co.elf, gfx.name()).expect("isa");
    Checked { resources, isa }
}

/// 64-lane waves, no scratch or spills, LDS within a workgroup's, room for
/// `threads` work-items.
fn assert_resources(what: &str, threads: u32, r: &HipResourceUsage) {
    assert_eq!(r.wavefront_size, 64, "{what}: {r:?}");
    assert_eq!(
        (r.scratch_bytes, r.vgpr_spills, r.sgpr_spills),
        (0, 0, 0),
        "{what} spills: {r:?}"
    );
    assert!(r.lds_bytes <= MAX_LDS_BYTES, "{what}: LDS {r:?}");
    assert!(r.max_workgroup_size >= threads, "{what}: {r:?}");
}

/// [`assert_resources`], static LDS tiles and MFMA in the ISA.
fn assert_healthy(entry: &str, threads: u32, gfx: Gfx, c: &Checked) {
    let r = &c.resources;
    let what = format!("{entry} on {}", gfx.name());
    assert_resources(&what, threads, r);
    assert!(r.lds_bytes > 0, "{what}: the tiles are static LDS: {r:?}");
    let mfma = c.isa.matches("v_mfma_f32_16x16x16").count();
    assert!(mfma > 0, "{what}: no MFMA in the ISA");
}

fn check_forward(k: &KernelSource, gfx: Gfx) -> Checked {
    let c = compile_checked(&k.source, &k.name, gfx);
    assert_healthy(&k.name, k.threads, gfx, &c);
    if let Some(combine) = &k.combine {
        // The split-KV combine: no scratch either, room for its work-items.
        let cc = compile_checked(&k.source, combine, gfx);
        assert_resources(
            &format!("{combine} on {}", gfx.name()),
            k.combine_threads(),
            &cc.resources,
        );
    }
    assert!(
        c.isa.contains("ds_bpermute_b32"),
        "{} on {}: row reductions exchange lanes with ds_bpermute",
        k.name,
        gfx.name()
    );
    c
}

fn check_backward(v: &Variant, dqk: u32, dv: u32, elem: Elem, gfx: Gfx) -> Checked {
    let cfg = HipBackwardConfig::default_for(dqk, dv, elem);
    let b = hip_parallel_backward(v, dqk, dv, &cfg, gfx, HipPrelude::Amdgcn)
        .unwrap_or_else(|e| panic!("{} backward {dqk}x{dv}: {e}", v.name));
    let c = compile_checked(&b.source, &b.main.name, gfx);
    assert_healthy(&b.main.name, b.main.threads, gfx, &c);
    c
}

#[test]
fn every_parallel_kernel_compiles_for_gfx90a_and_gfx942() {
    if !toolchain_ready() {
        return;
    }
    let examples = common::parallel_examples();
    assert!(examples.len() >= 10, "found {} examples", examples.len());
    let mut report = String::new();
    for (name, v) in &examples {
        let (dqk, dv) = common::head_dims(v);
        for gfx in [Gfx::Gfx90a, Gfx::Gfx942] {
            let cfg = HipForwardConfig::default_for(v, dqk, dv, Elem::Bf16);
            let k = hip_parallel_forward(v, dqk, dv, &cfg, gfx, HipPrelude::Amdgcn)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let c = check_forward(&k, gfx);
            // The second kernel reported: the backward, or for MLA decoding
            // (Dqk 576, forward only) the forward with V read from K's rows,
            // whose backward refuses the head dim clearly.
            let (second, b, waves) = if dqk > aec::compiler::MAX_DQK {
                let latent = HipForwardConfig {
                    v_in_k: true,
                    ..cfg
                };
                let kl = hip_parallel_forward(v, dqk, dv, &latent, gfx, HipPrelude::Amdgcn)
                    .unwrap_or_else(|e| panic!("{name} v_in_k: {e}"));
                assert!(kl.v_in_k && kl.name.contains("_vk"), "{}", kl.name);
                let bcfg = HipBackwardConfig::default_for(dqk, dv, Elem::Bf16);
                let e = hip_parallel_backward(v, dqk, dv, &bcfg, gfx, HipPrelude::Amdgcn)
                    .expect_err("HIP backward above its largest Dqk");
                assert!(e.to_string().contains("up to 256"), "{name}: {e}");
                ("fwd vk", check_forward(&kl, gfx), cfg.waves)
            } else {
                (
                    "bwd",
                    check_backward(v, dqk, dv, Elem::Bf16, gfx),
                    HipBackwardConfig::default_for(dqk, dv, Elem::Bf16).waves,
                )
            };
            for (pass, c, waves) in [("fwd", &c, cfg.waves), (second, &b, waves)] {
                let r = &c.resources;
                report.push_str(&format!(
                    "{name:<22} {pass} {:<7} {:>3} VGPRs ({:>3} of them AGPRs) {:>3} SGPRs {:>6} B LDS, {} waves/SIMD\n",
                    gfx.name(),
                    r.vgprs,
                    r.agprs,
                    r.sgprs,
                    r.lds_bytes,
                    r.waves_per_simd(waves)
                ));
            }
        }
    }
    eprintln!("{report}");
}

/// Head dims the issue lists, f16 as well as bf16, and Dv above 256 split
/// between workgroups (forward) and between the waves of each 16 keys
/// (backward), on both targets; RetNet's 256/512 backward too, and Dv past
/// what two waves hold is refused clearly.
#[test]
fn head_dims_and_element_types_compile_for_both_targets() {
    if !toolchain_ready() {
        return;
    }
    let v: Variant = common::example("softmax");
    for (dqk, dv, elem) in [
        (64, 64, Elem::Bf16),
        (80, 80, Elem::F16),
        (96, 96, Elem::Bf16),
        (192, 128, Elem::Bf16),
        (256, 256, Elem::F16),
        (128, 512, Elem::Bf16),
    ] {
        for gfx in [Gfx::Gfx90a, Gfx::Gfx942] {
            let cfg = HipForwardConfig::default_for(&v, dqk, dv, elem);
            let k = hip_parallel_forward(&v, dqk, dv, &cfg, gfx, HipPrelude::Amdgcn)
                .unwrap_or_else(|e| panic!("{dqk}x{dv}: {e}"));
            let c = check_forward(&k, gfx);
            // (Dv 512: two waves share each 16 keys, each with half the columns.)
            assert_eq!(
                HipBackwardConfig::default_for(dqk, dv, elem).split_d,
                if dv > MAX_WAVE_DV { 2 } else { 1 },
                "{dqk}x{dv}"
            );
            let b = check_backward(&v, dqk, dv, elem, gfx);
            let mnemonic = match elem {
                Elem::Bf16 if gfx == Gfx::Gfx90a => "v_mfma_f32_16x16x16bf16_1k",
                Elem::Bf16 => "v_mfma_f32_16x16x16_bf16",
                Elem::F16 if gfx == Gfx::Gfx90a => "v_mfma_f32_16x16x16f16",
                Elem::F16 => "v_mfma_f32_16x16x16_f16",
            };
            for isa in [&c.isa, &b.isa] {
                assert!(
                    isa.contains(mnemonic),
                    "{dqk}x{dv} {elem:?} on {}: expected {mnemonic}",
                    gfx.name()
                );
            }
        }
    }
    // RetNet's 256/512 backward, and a Dv split the waves cannot hold.
    let retnet: Variant = common::example("retnet_parallel");
    for gfx in [Gfx::Gfx90a, Gfx::Gfx942] {
        check_backward(&retnet, 256, 512, Elem::Bf16, gfx);
        let whole = HipBackwardConfig {
            split_d: 1,
            ..HipBackwardConfig::default_for(256, 512, Elem::Bf16)
        };
        let err = hip_parallel_backward(&retnet, 256, 512, &whole, gfx, HipPrelude::Amdgcn)
            .expect_err("Dv 512 on one wave per 16 keys");
        assert!(err.to_string().contains("split_d 2"), "{err}");
    }
    assert_eq!(MAX_BACKWARD_DV, 2 * MAX_WAVE_DV);
}

/// The recurrent forward of every recurrent example (RetNet, gated retention,
/// Mamba2, random-feature attention with its normaliser, GLA with a decay per
/// key dimension) at Dk × Dv 128 × 128, and the head dims that change its
/// tiles (Dk 256: 32-step chunks; Dv 96: 32-column slices of two waves; f16).
/// Every recurrent example at 128 × 128 in bf16, then `extra` (example,
/// Dk, Dv, element type).
fn recurrent_cases(extra: &[(&str, u32, u32, Elem)]) -> Vec<(String, Variant, u32, u32, Elem)> {
    let examples = common::recurrent_examples();
    assert!(examples.len() >= 5, "found {} examples", examples.len());
    let mut cases: Vec<(String, Variant, u32, u32, Elem)> = examples
        .into_iter()
        .map(|(name, v)| (name, v, 128, 128, Elem::Bf16))
        .collect();
    for &(name, dk, dv, elem) in extra {
        cases.push((name.to_string(), common::example(name), dk, dv, elem));
    }
    cases
}

#[test]
fn every_recurrent_forward_compiles_for_gfx90a_and_gfx942() {
    if !toolchain_ready() {
        return;
    }
    let mut report = String::new();
    let cases = recurrent_cases(&[
        ("retnet_recurrent", 256, 512, Elem::Bf16),
        ("gated_retention", 256, 256, Elem::F16),
        ("mamba2", 64, 96, Elem::Bf16),
        ("gla", 256, 64, Elem::Bf16),
        ("rfa", 16, 32, Elem::Bf16),
    ]);
    for (name, v, dk, dv, elem) in &cases {
        let kind = ForwardKind::of(v);
        let cfg = HipRecurrentConfig::default_for(*dk, *dv, kind, *elem);
        for gfx in [Gfx::Gfx90a, Gfx::Gfx942] {
            let k = hip_recurrent_forward(v, *dk, *dv, &cfg, gfx, HipPrelude::Amdgcn)
                .unwrap_or_else(|e| panic!("{name} {dk}x{dv}: {e}"));
            let c = compile_checked(&k.source, &k.name, gfx);
            assert_healthy(&k.name, k.threads, gfx, &c);
            let lds = recurrent_lds_bytes(&cfg, *dk, kind);
            assert!(
                c.resources.lds_bytes >= lds,
                "{}: {} B of LDS in the code object, the model counts {lds}",
                k.name,
                c.resources.lds_bytes
            );
            if !kind.per_key {
                assert!(
                    c.isa.contains("ds_bpermute_b32"),
                    "{}: the decay scan exchanges lanes with ds_bpermute",
                    k.name
                );
            }
            let r = &c.resources;
            report.push_str(&format!(
                "{name:<18} {dk}x{dv} {elem:?} c{} v{} {:<7} {:>3} VGPRs ({:>3} AGPRs) {:>3} SGPRs {:>6} B LDS, {} waves/SIMD\n",
                cfg.chunk,
                cfg.dv_tile,
                gfx.name(),
                r.vgprs,
                r.agprs,
                r.sgprs,
                r.lds_bytes,
                r.waves_per_simd(cfg.waves())
            ));
        }
    }
    eprintln!("{report}");
}

#[test]
fn every_recurrent_backward_compiles_for_gfx90a_and_gfx942() {
    if !toolchain_ready() {
        return;
    }
    let mut report = String::new();
    let mut built = 0;
    let cases = recurrent_cases(&[
        ("retnet_recurrent", 256, 512, Elem::Bf16),
        ("gated_retention", 256, 256, Elem::F16),
        ("mamba2", 32, 96, Elem::Bf16),
        ("gla", 256, 256, Elem::Bf16),
        ("rfa", 64, 96, Elem::F16),
    ]);
    for (name, v, dk, dv, elem) in &cases {
        let kind = ForwardKind::of(v);
        let cfg = HipRecurrentConfig::default_for(*dk, *dv, kind, *elem);
        for gfx in [Gfx::Gfx90a, Gfx::Gfx942] {
            let b = hip_recurrent_backward(v, *dk, *dv, &cfg, gfx, HipPrelude::Amdgcn)
                .unwrap_or_else(|e| panic!("{name} {dk}x{dv}: {e}"));
            // The normaliser's step and the decay's scan exist where the variant needs them.
            let has = |suffix: &str| b.kernels.iter().any(|k| k.name.ends_with(suffix));
            assert_eq!(has("_pre"), kind.normalize, "{name}: _pre");
            assert_eq!(has("_decay"), b.decay, "{name}: _decay");
            // The states pass: the forward template writing each chunk's state.
            let c = compile_checked(&b.states.source, &b.states.name, gfx);
            assert_healthy(&b.states.name, b.states.threads, gfx, &c);
            let co = hip_compile(&b.source, gfx.name())
                .unwrap_or_else(|e| panic!("{} for {}: {e}", b.name, gfx.name()));
            let res = hip_resources(&co.elf).expect("metadata");
            let isa = hip_isa(&co.elf, gfx.name()).expect("isa");
            let lds = recurrent_bwd_lds_bytes(&cfg, *dk, kind);
            for k in &b.kernels {
                let r = res
                    .iter()
                    .find(|r| r.name == k.name)
                    .unwrap_or_else(|| panic!("no metadata for {} in {res:?}", k.name));
                let what = format!("{} on {}", k.name, gfx.name());
                assert_resources(&what, k.threads, r);
                let model = match k.name.rsplit('_').next() {
                    Some("dstate") => Some(lds.0),
                    Some("dqk") => Some(lds.1),
                    Some("dv") => Some(lds.2),
                    _ => None,
                };
                if let Some(model) = model {
                    assert!(
                        r.lds_bytes >= model,
                        "{what}: {} B of LDS in the code object, the model counts {model}",
                        r.lds_bytes
                    );
                }
                report.push_str(&format!(
                    "{:<60} {:<7} {:>3} VGPRs ({:>3} AGPRs) {:>3} SGPRs {:>6} B LDS, {} waves/SIMD\n",
                    k.name,
                    gfx.name(),
                    r.vgprs,
                    r.agprs,
                    r.sgprs,
                    r.lds_bytes,
                    r.waves_per_simd(k.threads / 64)
                ));
            }
            // The GEMM kernels run on the matrix unit; the scans exchange lanes.
            assert!(
                isa.matches("v_mfma_f32_16x16x16").count() >= 3,
                "{}: the backward's GEMMs are MFMA",
                b.name
            );
            assert!(
                isa.contains("ds_bpermute_b32"),
                "{}: the decay scans and row sums exchange lanes",
                b.name
            );
            built += 1;
        }
    }
    eprintln!("{report}");
    assert_eq!(built, 2 * cases.len(), "every case builds for both targets");
}
