//! Compile checks without a GPU for the recurrent (chunked) forward: every
//! recurrent example at its benchmark head dims and at small ones, compiled by NVRTC for sm_80 and sm_90a, ptxas's register and
//! spill report read back, HMMA confirmed in the SASS. Bad configurations
//! and head dims get an error that names them.
//!
//! Needs the pinned toolchain like `cuda_compile.rs`.

mod common;

use aec::compiler::{Elem, Isa, RecurrentConfig, recurrent_backward, recurrent_forward};
use aec::runtime::{CompileOptions, compile, ptxas_resources, sass};

/// (example, Dk, Dv): the workloads' dims and small ones.
const CASES: &[(&str, u32, u32)] = &[
    ("retnet_recurrent", 256, 512),
    ("retnet_recurrent", 64, 96),
    ("gated_retention", 256, 256),
    ("mamba2", 128, 64),
    ("rfa", 64, 64),
    ("rfa", 32, 128),
    ("gla", 64, 64),
    ("gla", 128, 128),
    ("gla", 256, 256),
];

#[test]
fn every_recurrent_forward_compiles_for_sm80_and_sm90a() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    // The defaults on both architectures, and on sm_90a the two-blocks-per-SM
    // configurations the benchmark sweeps.
    let mut jobs = Vec::new();
    for &(example, dk, dv) in CASES {
        for arch in ["sm_80", "sm_90a"] {
            let v = common::example(example);
            let cfg = RecurrentConfig::for_variant(&v, dk, dv, Elem::Bf16, Isa::for_arch(arch));
            jobs.push((example, dk, dv, arch, cfg));
        }
    }
    // 32-step chunks (the `mma.sync` forward only), one block per SM.
    for &(example, dk, dv) in CASES {
        for arch in ["sm_80", "sm_90a"] {
            let v = common::example(example);
            let cfg = RecurrentConfig {
                chunk: 32,
                wgmma: false,
                ..RecurrentConfig::for_variant(&v, dk, dv, Elem::Bf16, Isa::Sm80)
            };
            jobs.push((example, dk, dv, arch, cfg));
        }
    }
    for (example, dk, dv) in [("retnet_recurrent", 256, 512), ("mamba2", 128, 64)] {
        let cfg = RecurrentConfig {
            dv_tile: 32,
            stages: 1,
            blocks_per_sm: 2,
            wgmma: false,
            ..RecurrentConfig::default_for(dk, dv, Elem::Bf16, Isa::Sm90a)
        };
        jobs.push((example, dk, dv, "sm_90a", cfg));
    }
    for (example, dk, dv, arch, cfg) in jobs {
        let v = common::example(example);
        {
            let isa = Isa::for_arch(arch);
            let k = recurrent_forward(&v, dk, dv, &cfg)
                .unwrap_or_else(|e| panic!("{example} {dk}/{dv}: {e}"));
            assert!(
                k.smem_bytes <= isa.max_dynamic_smem()
                    && k.smem_bytes * cfg.blocks_per_sm <= isa.smem_per_sm(cfg.blocks_per_sm),
                "{example} {dk}/{dv} ({arch}): {} bytes of shared memory for {} blocks per SM",
                k.smem_bytes,
                cfg.blocks_per_sm
            );
            let compiled = compile(&k.source, &CompileOptions::new(arch))
                .unwrap_or_else(|e| panic!("{example} {dk}/{dv} ({arch}): {e}"));
            let mma = if k.wgmma {
                "wgmma.mma_async.sync.aligned.m64n64k16"
            } else {
                "mma.sync.aligned.m16n8k16"
            };
            assert!(compiled.ptx.contains(mma), "{example} ({arch}): no {mma}");
            let usage = ptxas_resources(&compiled.ptx, arch)
                .unwrap_or_else(|e| panic!("{example} ({arch}): ptxas: {e}"));
            let entry = usage
                .iter()
                .find(|u| u.function == k.name)
                .unwrap_or_else(|| panic!("{example} ({arch}): no entry `{}`", k.name));
            // Two blocks per SM cap registers at 128: NVRTC 13.0.88 spills
            // 196 bytes for the Dk 256 state there (148 before the kernel
            // took packed variable-length batches; nvcc none), which the
            // benchmark's sweep weighs; one block per SM must not spill.
            let allowed = if cfg.blocks_per_sm == 2 { 224 } else { 0 };
            assert!(
                entry.spill_store_bytes <= allowed,
                "{example} {dk}/{dv} ({arch}): spills (allowed {allowed} B): {entry:?}"
            );
            assert!(entry.performance_warnings.is_empty(), "{entry:?}");
            assert!(
                entry.registers <= 65536 / (k.threads * cfg.blocks_per_sm),
                "{example} ({arch}): {} registers do not let {} blocks share an SM",
                entry.registers,
                cfg.blocks_per_sm
            );
            let text = sass(&compiled.cubin).expect("cuobjdump");
            let sass_mma = if k.wgmma { "HGMMA" } else { "HMMA" };
            assert!(text.contains(sass_mma), "{example} ({arch}): no {sass_mma}");
            if k.wgmma {
                // The state is staged with stmatrix and O leaves 16 bytes per
                // lane: scattered 4-byte shared and global stores were on the
                // state warpgroup's chain (bench/NOTES.md).
                for op in ["STSM", "STG.E.128"] {
                    assert!(text.contains(op), "{example} ({arch}): no {op}");
                }
            }
            eprintln!(
                "{example:17} {dk:>3}/{dv:<3} {arch:7} {:>3} regs, {:>6} B smem, {}",
                entry.registers, k.smem_bytes, k.name
            );
        }
    }
}

/// The `mma.sync` forward's tile space (what the benchmark sweeps): both
/// chunk sizes where they fit, nothing over the shared memory of one block
/// or of the blocks an SM should hold, every point generating a kernel.
#[test]
fn mma_sync_tile_space_spans_chunks_within_limits() {
    for (example, dk, dv) in [
        ("gated_retention", 256, 256),
        ("mamba2", 128, 64),
        ("gla", 128, 128),
        ("rfa", 64, 64),
    ] {
        let v = common::example(example);
        for isa in [Isa::Sm80, Isa::Sm90a] {
            let space = RecurrentConfig::mma_sync_space(&v, dk, dv, Elem::Bf16, isa);
            for chunk in [32, 64] {
                assert!(
                    space.iter().any(|c| c.chunk == chunk),
                    "{example} {dk}/{dv} ({isa:?}): no {chunk}-step chunks in {space:?}"
                );
            }
            for cfg in &space {
                assert!(!cfg.wgmma && dv % cfg.dv_tile == 0, "{cfg:?}");
                let k = recurrent_forward(&v, dk, dv, cfg)
                    .unwrap_or_else(|e| panic!("{example} {cfg:?}: {e}"));
                assert!(
                    k.smem_bytes <= isa.max_dynamic_smem()
                        && k.smem_bytes * cfg.blocks_per_sm <= isa.smem_per_sm(cfg.blocks_per_sm),
                    "{example} {cfg:?}: {} bytes",
                    k.smem_bytes
                );
            }
        }
    }
    // Dk 256 with two stages of 64-step chunks does not fit an A100's
    // block; with 32-step chunks it does.
    let v = common::example("gated_retention");
    let a100 = RecurrentConfig::mma_sync_space(&v, 256, 256, Elem::Bf16, Isa::Sm80);
    assert!(
        !a100
            .iter()
            .any(|c| c.chunk == 64 && c.stages == 2 && c.dv_tile == 64)
    );
    assert!(
        a100.iter()
            .any(|c| c.chunk == 32 && c.stages == 2 && c.dv_tile == 64)
    );
}

/// The wgmma forward reads its per-step inputs (the decay's, a row-scale
/// modification's) a chunk ahead of the arithmetic on them: each closure is
/// split into `_reads`, which loads exactly the custom inputs it reads, and
/// `_from`, which reads none.
#[test]
fn per_step_reads_are_split_from_their_arithmetic() {
    let body = |src: &str, name: &str| {
        let at = src
            .find(&format!(" {name}(const"))
            .unwrap_or_else(|| panic!("no `{name}` in the source"));
        let rest = &src[at..];
        rest[..rest.find("\n}\n").expect("function end")].to_string()
    };
    for (example, dk, dv, reads) in [
        ("gated_retention", 256, 256, &[("DECAY_FN", 1)][..]),
        (
            "mamba2",
            128,
            64,
            &[("DECAY_FN", 2), ("MODIFY_V_ROW", 1)][..],
        ),
        (
            "retnet_recurrent",
            64,
            64,
            &[("DECAY_FN", 0), ("MODIFY_Q_ROW", 0)][..],
        ),
    ] {
        let v = common::example(example);
        let cfg = RecurrentConfig::for_variant(&v, dk, dv, Elem::Bf16, Isa::Sm90a);
        let k = recurrent_forward(&v, dk, dv, &cfg).expect("wgmma forward");
        assert!(k.wgmma, "{example}: expected the wgmma forward");
        for &(name, n) in reads {
            let lower = name.to_lowercase();
            // The count is at least 1: a C array cannot be empty.
            assert!(
                k.source
                    .contains(&format!("#define {name}_READS {}\n", n.max(1))),
                "{example}: {name}_READS"
            );
            let reads_fn = body(&k.source, &format!("{lower}_reads"));
            assert_eq!(
                reads_fn.matches("P.in").count(),
                n,
                "{example}: {lower}_reads:\n{reads_fn}"
            );
            let from_fn = body(&k.source, &format!("{lower}_from"));
            assert!(
                !from_fn.contains("P.in"),
                "{example}: {lower}_from reads memory:\n{from_fn}"
            );
            // Defined once, called at least once.
            assert!(
                k.source.matches(&format!("{lower}_reads(")).count() >= 2,
                "{example}: the template does not issue {lower}_reads"
            );
        }
        assert!(
            k.source.contains("chunk_decay_reads(xd_raw, "),
            "{example}: the wgmma forward does not read the decay ahead"
        );
        // The chains of the `mma.sync` forward (and the backward's states
        // pass) and of `_dstate` read the decay's inputs a chunk ahead too.
        let mma = RecurrentConfig {
            wgmma: false,
            ..cfg
        };
        let fwd = recurrent_forward(&v, dk, dv, &mma).expect("mma.sync forward");
        let bwd = recurrent_backward(&v, dk, dv, &mma, Isa::Sm90a).expect("backward");
        for (what, src) in [
            ("mma.sync forward", &fwd.source),
            ("states pass", &bwd.states.source),
            ("backward", &bwd.source),
        ] {
            assert!(
                src.contains("chunk_decay_reads(decay_raw, "),
                "{example}: the {what} does not read the decay ahead"
            );
        }
    }
}

#[test]
fn unsupported_recurrent_shapes_are_refused_with_their_names() {
    let v = common::example("retnet_recurrent");
    let cfg = RecurrentConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80);
    let err = |dk, dv, cfg: &RecurrentConfig| {
        recurrent_forward(&v, dk, dv, cfg)
            .expect_err("refused")
            .to_string()
    };
    assert!(err(96, 128, &cfg).contains("Dk = 96"));
    assert!(err(128, 80, &cfg).contains("Dv = 80"));
    // Chunks: 32 or 64 on `mma.sync`, 64 on wgmma and in the backward
    // (which runs 64-step chunks whatever the forward's).
    let chunk128 = RecurrentConfig { chunk: 128, ..cfg };
    assert!(err(128, 128, &chunk128).contains("chunk = 128"));
    let chunk32 = RecurrentConfig { chunk: 32, ..cfg };
    assert!(recurrent_forward(&v, 128, 128, &chunk32).is_ok());
    let wgmma32 = RecurrentConfig {
        chunk: 32,
        ..RecurrentConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a)
    };
    assert!(wgmma32.wgmma);
    assert!(err(128, 128, &wgmma32).contains("chunk = 32 is not supported by the wgmma"));
    let bwd_err = recurrent_backward(&v, 128, 128, &chunk32, Isa::Sm90a)
        .expect_err("refused")
        .to_string();
    assert!(
        bwd_err.contains("chunk = 32") && bwd_err.contains("backward_for"),
        "{bwd_err}"
    );
    let bwd_cfg = chunk32.backward_for(&v, 128, 128, Isa::Sm90a);
    assert_eq!(bwd_cfg.chunk, 64);
    assert!(recurrent_backward(&v, 128, 128, &bwd_cfg, Isa::Sm90a).is_ok());
    assert_eq!(cfg.backward_for(&v, 128, 128, Isa::Sm80), cfg);
    let tile48 = RecurrentConfig { dv_tile: 48, ..cfg };
    assert!(err(128, 96, &tile48).contains("dv_tile = 48"));
    // A 256 × 128 state slice would need 128 registers per thread.
    let wide = RecurrentConfig {
        dv_tile: 128,
        ..cfg
    };
    assert!(err(256, 256, &wide).contains("registers"));
    // GLA's decay per key dimension: its forward with a wgmma configuration
    // still runs on `mma.sync`, and the default for it fits the A100's
    // shared memory at Dk 256.
    let gla = common::example("gla");
    let hopper = RecurrentConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(hopper.wgmma);
    assert!(
        !recurrent_forward(&gla, 128, 128, &hopper)
            .expect("forward")
            .wgmma
    );
    let a100 = RecurrentConfig::for_variant(&gla, 256, 256, Elem::Bf16, Isa::Sm80);
    let k = recurrent_forward(&gla, 256, 256, &a100).expect("forward");
    assert!(
        k.smem_bytes <= Isa::Sm80.max_dynamic_smem(),
        "{a100:?}: {}",
        k.smem_bytes
    );
    let softmax = common::example("softmax");
    let e = recurrent_forward(&softmax, 128, 128, &cfg)
        .expect_err("parallel")
        .to_string();
    assert!(e.contains("parallel variant"), "{e}");
}

/// Every recurrent example's backward (the states pass and the `_pre`,
/// `_dstate`, `_dqk`, `_dv`, `_decay` kernels) compiles for sm_80 and sm_90a
/// without spills, on tensor cores, within each block's shared memory.
#[test]
fn every_recurrent_backward_compiles_for_sm80_and_sm90a() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    for &(example, dk, dv) in CASES {
        for arch in ["sm_80", "sm_90a"] {
            let v = common::example(example);
            let isa = Isa::for_arch(arch);
            let cfg = RecurrentConfig::for_variant(&v, dk, dv, Elem::Bf16, isa);
            let bwd = recurrent_backward(&v, dk, dv, &cfg, isa)
                .unwrap_or_else(|e| panic!("{example} {dk}/{dv} ({arch}): {e}"));
            let rec = v.recurrent().expect("recurrent");
            let mut want = vec!["dstate", "dqk", "dv"];
            if rec.normalize.is_some() {
                want.insert(0, "pre");
            }
            if rec.decay.is_some() {
                want.push("decay");
            }
            let names: Vec<&str> = bwd
                .kernels
                .iter()
                .map(|k| k.name.rsplit('_').next().unwrap_or(""))
                .collect();
            assert_eq!(names, want, "{example}");
            for (source, entries) in [
                (
                    &bwd.states.source,
                    vec![(bwd.states.name.clone(), bwd.states.smem_bytes)],
                ),
                (
                    &bwd.source,
                    bwd.kernels
                        .iter()
                        .map(|k| (k.name.clone(), k.smem_bytes))
                        .collect(),
                ),
            ] {
                let compiled = compile(source, &CompileOptions::new(arch))
                    .unwrap_or_else(|e| panic!("{example} {dk}/{dv} ({arch}): {e}"));
                let usage = ptxas_resources(&compiled.ptx, arch)
                    .unwrap_or_else(|e| panic!("{example} ({arch}): ptxas: {e}"));
                for (name, smem) in entries {
                    assert!(
                        smem <= isa.max_dynamic_smem(),
                        "{name}: {smem} B of shared memory"
                    );
                    let entry = usage
                        .iter()
                        .find(|u| u.function == name)
                        .unwrap_or_else(|| panic!("{example} ({arch}): no entry `{name}`"));
                    assert_eq!(
                        entry.spill_store_bytes, 0,
                        "{name} ({arch}) spills: {entry:?}"
                    );
                    assert!(entry.performance_warnings.is_empty(), "{entry:?}");
                    eprintln!(
                        "{name:60} {arch:7} {:>3} regs, {smem:>6} B smem",
                        entry.registers
                    );
                }
                let text = sass(&compiled.cubin).expect("cuobjdump");
                assert!(text.contains("HMMA"), "{example} ({arch}): no HMMA");
            }
        }
    }
}

#[test]
fn recurrent_backward_refuses_dk_16() {
    let v = common::example("retnet_recurrent");
    let cfg = RecurrentConfig::default_for(16, 64, Elem::Bf16, Isa::Sm80);
    let e = recurrent_backward(&v, 16, 64, &cfg, Isa::Sm80)
        .expect_err("Dk 16")
        .to_string();
    assert!(e.contains("Dk = 16") && e.contains("backward"), "{e}");
}

/// A recurrent variant declared inline, parsed like a file.
fn inline_variant(body: &str) -> aec::frontend::Variant {
    let src = format!("attention! {{\n    pub struct Inline: recurrent {{\n{body}\n    }}\n}}\n");
    let mut found = aec::frontend::parse_file(&src).expect("parses");
    found.remove(0).variant.expect("valid variant")
}

#[test]
fn row_scale_modifications_are_recognised() {
    use aec::compiler::cxx::closures::row_scale_factor;
    let factor = |v: &aec::frontend::Variant, which: &str| {
        let rec = v.recurrent().expect("recurrent");
        let region = match which {
            "q" => rec.modify_q.as_ref(),
            "k" => rec.modify_k.as_ref(),
            _ => rec.modify_v.as_ref(),
        };
        row_scale_factor(region.expect("modification")).is_some()
    };
    // x · f(b, h, t): a row scale, either way round.
    assert!(factor(&common::example("retnet_recurrent"), "q"));
    assert!(factor(&common::example("mamba2"), "v"));
    // Not linear in the element, or not a plain product with it.
    let rfa = common::example("rfa");
    assert!(!factor(&rfa, "q"));
    assert!(!factor(&rfa, "k"));
    let io = "        q: [B, H, S, Dk];\n        k: [B, H, S, Dk];\n        v: [B, H, S, Dv];";
    let v = inline_variant(&format!(
        "{io}\n        s: [B, H, S];\n        modify_q = |q, b, h, t| s * q;\n        modify_k = |k| k * k;\n        modify_v = |v| v * 2.0 + 1.0;"
    ));
    assert!(factor(&v, "q"));
    assert!(!factor(&v, "k"));
    assert!(!factor(&v, "v"));
    // A factor that varies along the head dim scales columns, not rows.
    let v = inline_variant(&format!(
        "{io}\n        w: [B, H, S, Dk];\n        modify_q = |q| q * w;"
    ));
    assert!(!factor(&v, "q"));
}

/// Every recurrent example's step (decode) kernel — GLA's per-key-dimension
/// decay included — compiles for sm_80 and sm_90a without spills or local
/// memory; head dims it does not take are refused with their names.
#[test]
fn every_recurrent_step_kernel_compiles() {
    use aec::compiler::recurrent_step;
    let v = common::example("retnet_recurrent");
    let err = |dk, dv| {
        recurrent_step(&v, dk, dv, Elem::Bf16)
            .expect_err("refused")
            .to_string()
    };
    assert!(err(130, 128).contains("Dk = 130"));
    assert!(err(512, 128).contains("Dk = 512"));
    assert!(err(128, 80).contains("Dv = 80"));
    let softmax = common::example("softmax");
    let e = recurrent_step(&softmax, 64, 64, Elem::Bf16)
        .expect_err("parallel")
        .to_string();
    assert!(e.contains("parallel variant"), "{e}");
    if !common::cuda_toolchain_ready() {
        return;
    }
    let cases = [
        ("retnet_recurrent", 256, 512, Elem::Bf16),
        ("gated_retention", 128, 128, Elem::F16),
        ("mamba2", 128, 64, Elem::Bf16),
        ("rfa", 64, 96, Elem::Bf16),
        ("gla", 100, 64, Elem::Bf16),
    ];
    for (example, dk, dv, elem) in cases {
        let v = common::example(example);
        let k = recurrent_step(&v, dk, dv, elem).unwrap_or_else(|e| panic!("{example}: {e}"));
        assert_eq!(k.normalized, example == "rfa");
        for arch in ["sm_80", "sm_90a"] {
            let compiled = compile(&k.source, &CompileOptions::new(arch))
                .unwrap_or_else(|e| panic!("{example} ({arch}): {e}"));
            let usage = ptxas_resources(&compiled.ptx, arch)
                .unwrap_or_else(|e| panic!("{example} ({arch}): ptxas: {e}"));
            let entry = usage
                .iter()
                .find(|u| u.function == k.name)
                .unwrap_or_else(|| panic!("{example} ({arch}): no entry `{}`", k.name));
            assert_eq!(entry.spill_store_bytes, 0, "{example} ({arch}): {entry:?}");
            assert_eq!(entry.stack_frame_bytes, 0, "{example} ({arch}): {entry:?}");
            eprintln!(
                "{example:17} {dk:>3}/{dv:<3} {arch:7} {:>3} regs, {}",
                entry.registers, k.name
            );
        }
    }
}

/// The C parameter names of a kernel's signature, from the text after
/// `open` to the closing parenthesis, or for a macro to its end (line
/// continuations removed).
fn parameter_names(source: &str, open: &str) -> Vec<String> {
    let start = source.find(open).unwrap_or_else(|| panic!("no `{open}`")) + open.len();
    let text = source[start..].replace("\\\n", " ");
    let close = if open.starts_with("#define") {
        '\n'
    } else {
        ')'
    };
    let end = text.find(close).expect("the signature's end");
    text[..end]
        .split(',')
        .map(|p| {
            p.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .rfind(|w| !w.is_empty())
                .unwrap_or_default()
                .to_string()
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// The C parameter name each argument kind binds to.
fn c_name(variant: &aec::frontend::Variant, a: &aec::compiler::ArgKind) -> String {
    use aec::compiler::ArgKind;
    use aec::frontend::ir::Axis;
    let custom = |n: &str| {
        variant
            .customs
            .iter()
            .position(|c| c.name == n)
            .expect("custom")
    };
    match a {
        ArgKind::Tensor("do") => "dout".into(),
        ArgKind::Tensor(n) | ArgKind::State(n) | ArgKind::Workspace(n) => n.to_string(),
        ArgKind::Custom(n) => format!("in{}", custom(n)),
        ArgKind::CustomGrad(n) => format!("g{}", custom(n)),
        ArgKind::CuSeqlens => "cu_seqlens".into(),
        ArgKind::Segments(n) => n.to_string(),
        ArgKind::Size(Axis::S) => "S_total".into(),
        ArgKind::Size(axis) => axis.name().to_string(),
        other => panic!("a recurrent kernel takes no {other:?}"),
    }
}

/// Every recurrent kernel's C signature takes its arguments in the order
/// `args` says (the runtime and the launch plans bind by that list).
#[test]
fn recurrent_argument_lists_match_the_kernel_signatures() {
    use aec::compiler::{recurrent_states, recurrent_step};
    for (example, dk, dv) in [("mamba2", 128, 64), ("rfa", 64, 64), ("gla", 64, 64)] {
        let v = common::example(example);
        let mut sources = Vec::new();
        for isa in [Isa::Sm80, Isa::Sm90a] {
            let cfg = RecurrentConfig::for_variant(&v, dk, dv, Elem::Bf16, isa);
            let fwd = recurrent_forward(&v, dk, dv, &cfg).expect("forward");
            sources.push((
                fwd.source.clone(),
                format!("{}(", fwd.name),
                fwd.args.clone(),
            ));
            let st = recurrent_states(&v, dk, dv, &cfg).expect("states pass");
            sources.push((st.source.clone(), format!("{}(", st.name), st.args.clone()));
            let bwd = recurrent_backward(&v, dk, dv, &cfg, isa).expect("backward");
            sources.push((
                bwd.source.clone(),
                "#define BWD_ARGS".into(),
                bwd.args.clone(),
            ));
        }
        let step = recurrent_step(&v, dk, dv, Elem::Bf16).expect("step");
        sources.push((
            step.source.clone(),
            format!("{}(", step.name),
            step.args.clone(),
        ));
        for (source, open, args) in sources {
            let got = parameter_names(&source, &open);
            let mut want: Vec<String> = args.iter().map(|a| c_name(&v, a)).collect();
            if open.contains("aec_rec_step") {
                // The step kernel takes the whole call's S.
                let last = want.len() - 1;
                want[last] = "S".into();
            }
            assert_eq!(got, want, "{example}: `{open}`");
        }
    }
}
