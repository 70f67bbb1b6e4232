//! The Rust backward API: `ParallelKernels::backward`.
//!
//! - `cpu_*` tests run everywhere: backward generation for every parallel
//!   example and the errors that need no GPU.
//! - `gpu_*` tests run the forward and then the backward of an example on
//!   device 0 with random bf16 inputs and a random bf16 `dO` (lengths that
//!   are not tile multiples, grouped-query heads, causal and general masks,
//!   Dqk ≠ Dv, custom inputs with gradients) and compare dq, dk, dv and the
//!   custom inputs' gradients with the f64 reference interpreter's backward
//!   on the same inputs: ‖got − ref‖ / ‖ref‖ < 2e-2 and no NaN. Without a
//!   CUDA driver they print a skip line unless `AEC_REQUIRE_GPU=1`. Build
//!   with `cargo test --test gpu_backward --no-run --release` and run the
//!   binary from the repository root on a GPU machine.

mod common;

use aec::compiler::BackwardConfig;
use aec::frontend::parse_file;
use aec::frontend::reference::{self, Tensor};
use aec::prelude::*;
use aec::{Error, backward_source};
use common::example;
use common::gpu::{GpuCall, device, download_f64, prepare_def, rel_err};
use rand::SeedableRng;
use rand::rngs::StdRng;

#[test]
fn cpu_every_parallel_example_has_backward_kernels() {
    let mut generated = 0;
    for entry in std::fs::read_dir(common::examples_dir()).expect("examples") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let def = example(&name);
        if def.parallel().is_none() {
            continue;
        }
        let fixed = |a: aec::frontend::ir::Axis| {
            def.fixed_sizes
                .iter()
                .find(|(x, _)| *x == a)
                .map(|(_, n)| *n as u32)
                .unwrap_or(128)
        };
        let dims = HeadDims::new(
            fixed(aec::frontend::ir::Axis::Dqk),
            fixed(aec::frontend::ir::Axis::Dv),
        );
        if dims.dqk > aec::compiler::MAX_DQK {
            // Forward-only head dims (MLA decoding's 576): a clear refusal.
            let e = backward_source(&def, dims, &KernelOptions::default(), Isa::Sm80)
                .expect_err("a backward above the largest Dqk");
            assert!(
                e.to_string()
                    .contains("is not supported by the parallel backward"),
                "{name}: {e}"
            );
            continue;
        }
        let src = backward_source(&def, dims, &KernelOptions::default(), Isa::Sm80)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for k in [&src.pre, &src.main, &src.post] {
            assert!(
                src.source.contains(&format!("{}(BWD_ARGS)", k.name)),
                "{name}: no kernel {}",
                k.name
            );
        }
        // Softmax-family variants read dO·O; score-only weights do not.
        let reads_dot = src.source.contains("dot[row] = acc;");
        let plain = def.parallel().unwrap().online.state.is_empty();
        assert_eq!(reads_dot, !plain, "{name}: dO·O use");
        generated += 1;
    }
    assert!(generated >= 13, "{generated} parallel examples");
}

#[test]
fn cpu_a_normalisation_without_kernel_form_is_refused_with_the_reduction() {
    // Weights `s - rowmax(s)`: the backward needs rowsum(dP) at the row's
    // maximum, which is not proportional to dO·O.
    let src = r#"
        attention! {
            pub struct Shifted: parallel {
                q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];
                online {
                    state { m = -inf }
                    fwd = |s, st| {
                        let m = max(st.m, rowmax(s));
                        (s - m, State { m }, 1.0)
                    }
                    epilogue = |o, st| (o, Scales {})
                }
            }
        }
    "#;
    let Ok(mut found) = parse_file(src) else {
        panic!("test variant parses")
    };
    let def = found.remove(0).variant.expect("valid variant");
    match backward_source(
        &def,
        HeadDims::square(64),
        &KernelOptions::default(),
        Isa::Sm80,
    ) {
        Err(Error::Compile { kernel, source, .. }) => {
            assert_eq!(kernel, "backward");
            let m = source.to_string();
            assert!(
                m.contains("the normalisation backward of `Shifted` needs the row reduction")
                    && m.contains("rowsum")
                    && m.contains("no kernel form yet"),
                "{m}"
            );
        }
        other => panic!("expected Error::Compile, got {other:?}"),
    }
}

/// Forward then backward of `examples/<name>.rs` on the GPU, against the
/// reference interpreter's gradients on the same inputs.
fn check_backward(test: &str, name: &str, shape: Shape, dims: HeadDims, custom_range: (f64, f64)) {
    check_backward_with(
        test,
        name,
        shape,
        dims,
        custom_range,
        2e-2,
        &KernelOptions::default(),
    );
}

/// [`check_backward`] with `custom_tol` the relative error allowed for the
/// custom-input gradients (each a sum over every score, so rounding in the
/// terms it cancels shows more there than in dq, dk, dv).
fn check_backward_with(
    test: &str,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    custom_tol: f64,
    options: &KernelOptions,
) {
    check_backward_def(
        test,
        example(name),
        name,
        shape,
        dims,
        custom_range,
        custom_tol,
        options,
    );
}

/// [`check_backward_with`] for the variant `def` (`name` seeds its inputs).
#[allow(clippy::too_many_arguments)]
fn check_backward_def(
    test: &str,
    def: aec::frontend::Variant,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    custom_tol: f64,
    options: &KernelOptions,
) {
    let Some(gpu) = prepare_def(test, def, name, shape, dims, custom_range, options) else {
        return;
    };
    let GpuCall {
        device,
        stream,
        def,
        kernels,
        call,
        q,
        k,
        v,
        ..
    } = &gpu;
    let customs = gpu.customs();
    let inputs = &call.inputs;
    let mut rng = StdRng::seed_from_u64(0x5eed ^ shape.sq as u64);
    let do_len = shape.rows() * dims.dv as usize;
    let do_host: Vec<bf16> = (0..do_len)
        .map(|_| bf16::from_f64(common::gpu::normal(&mut rng)))
        .collect();

    let d_o = stream.upload(&do_host).unwrap();
    let out = kernels
        .forward(stream, q, k, v, &customs, shape)
        .unwrap_or_else(|e| panic!("{test}: forward: {e}"));
    let grads = kernels
        .backward(stream, q, k, v, &customs, &out, &d_o)
        .unwrap_or_else(|e| panic!("{test}: backward: {e}"));

    let d_o_ref = Tensor {
        shape: vec![shape.b, shape.h, shape.sq, dims.dv as usize],
        data: do_host.iter().map(|x| x.to_f64()).collect(),
    };
    let reference = reference::backward(def, inputs, &d_o_ref).expect("reference backward");
    let down = |b: &DeviceBuffer<bf16>| download_f64(stream, b);
    let mut results: Vec<(String, f64, bool)> = vec![
        ("dq".into(), &down(&grads.dq), &reference.dq.data),
        ("dk".into(), &down(&grads.dk), &reference.dk.data),
        ("dv".into(), &down(&grads.dv), &reference.dv.data),
    ]
    .into_iter()
    .map(|(n, got, want)| (n, rel_err(got, want), got.iter().any(|x| x.is_nan())))
    .collect();
    for (cname, want) in &reference.customs {
        let got = download_f64(
            stream,
            grads.custom(cname).expect("gradient per custom input"),
        );
        let nan = got.iter().any(|x| x.is_nan());
        // Inputs no gradient reaches (a mask's) are zero on both sides.
        let norm: f64 = want.data.iter().map(|x| x * x).sum();
        let err = if norm == 0.0 {
            got.iter().map(|x| x.abs()).fold(0.0, f64::max)
        } else {
            rel_err(&got, &want.data)
        };
        results.push((format!("d{cname}"), err, nan));
    }
    let pass = results.iter().enumerate().all(|(k, (_, e, nan))| {
        let tol = if k < 3 { 2e-2 } else { custom_tol };
        *e < tol && !nan
    });
    let report: Vec<String> = results
        .iter()
        .map(|(n, e, nan)| format!("{n}={e:.2e}{}", if *nan { " NaN" } else { "" }))
        .collect();
    eprintln!(
        "{test}: {} backward of `{}` on {} {shape} Dqk={} Dv={}: {}",
        if pass { "PASS" } else { "FAIL" },
        def.name,
        device.name(),
        dims.dqk,
        dims.dv,
        report.join(", ")
    );
    assert!(pass, "{test}: {}", report.join(", "));
}

/// Whether device 0 is an sm_90 GPU, which the wgmma backward needs; a skip
/// line otherwise (and a panic without a GPU under `AEC_REQUIRE_GPU=1`).
fn hopper(test: &str) -> bool {
    let Some(dev) = device(test) else {
        return false;
    };
    if dev.compute_capability().0 != 9 {
        println!("{test}: SKIP (the wgmma backward needs sm_90a)");
        return false;
    }
    true
}

/// [`check_backward_with`] with the backward's configuration chosen.
fn check_backward_config(
    test: &str,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    custom_tol: f64,
    cfg: BackwardConfig,
) {
    check_backward_with(
        test,
        name,
        shape,
        dims,
        custom_range,
        custom_tol,
        &KernelOptions {
            backward_config: Some(cfg),
            ..KernelOptions::default()
        },
    );
}

#[test]
fn gpu_backward_softmax() {
    check_backward(
        "gpu_backward_softmax",
        "softmax",
        Shape::mha(2, 3, 97, 133),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_softmax_d64() {
    check_backward(
        "gpu_backward_softmax_d64",
        "softmax",
        Shape::mha(1, 2, 200, 77),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_softmax_d80_d96_d256() {
    for d in [80, 96, 256] {
        check_backward(
            &format!("gpu_backward_softmax_d{d}"),
            "softmax",
            Shape::mha(1, 2, 75, 91),
            HeadDims::square(d),
            (0.0, 1.0),
        );
    }
}

#[test]
fn gpu_backward_softmax_gqa() {
    check_backward(
        "gpu_backward_softmax_gqa",
        "softmax_gqa",
        Shape::new(2, 4, 2, 97, 133),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_softmax_causal() {
    check_backward(
        "gpu_backward_softmax_causal",
        "softmax_causal",
        Shape::mha(2, 2, 150, 150),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

/// Ten (batch, head) pairs: the causal dispatch order's windows of eight
/// pairs, the last one partial.
#[test]
fn gpu_backward_causal_dispatch_windows() {
    check_backward(
        "gpu_backward_causal_dispatch_windows",
        "softmax_causal",
        Shape::mha(2, 5, 150, 330),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_deepseek() {
    check_backward(
        "gpu_backward_deepseek",
        "deepseek",
        Shape::mha(1, 2, 97, 133),
        HeadDims::new(192, 128),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_diff_transformer() {
    check_backward(
        "gpu_backward_diff_transformer",
        "diff_transformer",
        Shape::mha(1, 2, 97, 70),
        HeadDims::new(128, 256),
        (0.0, 1.0),
    );
}

/// The sm_90a backward with both warpgroups on 64 keys, in the panel
/// layouts DiffTransformer does not cover: 192/192 (three dK/dV panels per
/// warpgroup, three dQ panels; the default there) and, with GQA, 64/256
/// (five panels: warpgroup 1 holds two; chosen here, the default takes a
/// warpgroup per 64 keys on 32-query steps). On sm_80 devices the default
/// backward.
#[test]
fn gpu_backward_split_key_panels() {
    check_backward(
        "gpu_backward_split_key_panels_d192",
        "softmax",
        Shape::mha(1, 2, 75, 91),
        HeadDims::square(192),
        (0.0, 1.0),
    );
    let dims = HeadDims::new(64, 256);
    let default = BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a);
    check_backward_with(
        "gpu_backward_split_key_panels_gqa_d64x256",
        "softmax_gqa",
        Shape::new(2, 4, 2, 97, 133),
        dims,
        (0.0, 1.0),
        2e-2,
        &KernelOptions {
            backward_config: device("gpu_backward_split_key_panels")
                .filter(|d| d.compute_capability().0 == 9)
                .map(|_| BackwardConfig {
                    block_m: 64,
                    split_d: 2,
                    shared_scores: true,
                    ..default
                }),
            ..KernelOptions::default()
        },
    );
}

#[test]
fn gpu_backward_sigmoid() {
    check_backward(
        "gpu_backward_sigmoid",
        "sigmoid",
        Shape::mha(2, 2, 97, 133),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_relu() {
    check_backward(
        "gpu_backward_relu",
        "relu",
        Shape::mha(2, 2, 97, 133),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_retnet_parallel() {
    check_backward(
        "gpu_backward_retnet_parallel",
        "retnet_parallel",
        Shape::mha(1, 2, 120, 120),
        HeadDims::square(64),
        (0.8, 0.99),
    );
}

/// Dv = 512 (RetNet's workload dims): the forward splits Dv between two
/// blocks; the backward on sm_90a takes 32-query steps with six dK/dV panels
/// per warpgroup (on sm_80, four warps share keys). dγ's error grows
/// with the head dims while dq, dk, dv stay at 2.5e-3 (H100: 1.1e-3 at
/// 64×64, 4e-3 at 256×128, 1.7e-2 at 256×256 with two warps per key tile,
/// 9.6e-3 at 64×512 and 3.0e-2 at 256×512 with four): rounding in a sum
/// whose terms cancel, not a slice that is lost (that would be ≥ 25%).
#[test]
fn gpu_backward_retnet_parallel_dv512() {
    check_backward_with(
        "gpu_backward_retnet_parallel_dv512",
        "retnet_parallel",
        Shape::mha(1, 2, 120, 120),
        HeadDims { dqk: 256, dv: 512 },
        (0.8, 0.99),
        6e-2,
        &KernelOptions::default(),
    );
}

/// The sm_90a wgmma backward without its producer warpgroup
/// (`warp_specialized: false`: the computing warpgroups copy Q/dO and add
/// dQ themselves), still a configuration a caller may choose: a warpgroup
/// per 64 keys (causal) and on 32-query steps (DeepSeek). Skipped on
/// GPUs other than sm_90.
#[test]
fn gpu_backward_wgmma_without_producer() {
    let test = "gpu_backward_wgmma_without_producer";
    if !hopper(test) {
        return;
    }
    for (name, shape, dims) in [
        (
            "softmax_causal",
            Shape::mha(2, 2, 150, 150),
            HeadDims::square(128),
        ),
        (
            "deepseek",
            Shape::mha(1, 2, 97, 133),
            HeadDims { dqk: 192, dv: 128 },
        ),
    ] {
        let cfg = BackwardConfig {
            warp_specialized: false,
            ..BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a)
        };
        assert!(cfg.wgmma, "{name}: {cfg:?}");
        check_backward_config(
            &format!("{test}_{name}"),
            name,
            shape,
            dims,
            (0.0, 1.0),
            2e-2,
            cfg,
        );
    }
}

/// The sm_90a backward with the dK/dV panels split between several blocks
/// of one key block (`kv_groups`, 32 queries per step; the default takes
/// one block, `gpu_backward_retnet_parallel_dv512` and `…_d256`): RetNet at
/// 256/512 in two and three blocks under its causal mask; GQA softmax at
/// 128/512 (ten panels on four slots, the last with one) and DeepSeek's
/// dims (three dQ panels on four slots) in two, with the producer
/// warpgroup, which adds only its block's dQ panels. Skipped on GPUs other
/// than sm_90.
#[test]
fn gpu_backward_key_panels_in_several_blocks() {
    let test = "gpu_backward_key_panels_in_several_blocks";
    if !hopper(test) {
        return;
    }
    let retnet = HeadDims { dqk: 256, dv: 512 };
    let default =
        |dims: HeadDims| BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a);
    let cases = [
        (
            "retnet_parallel",
            Shape::mha(1, 2, 120, 120),
            retnet,
            2,
            (0.8, 0.99),
        ),
        (
            "retnet_parallel",
            Shape::mha(1, 2, 120, 120),
            retnet,
            3,
            (0.8, 0.99),
        ),
        (
            "softmax_gqa",
            Shape::new(2, 4, 2, 97, 133),
            HeadDims { dqk: 128, dv: 512 },
            2,
            (0.0, 1.0),
        ),
        (
            "deepseek",
            Shape::mha(1, 2, 97, 133),
            HeadDims { dqk: 192, dv: 128 },
            2,
            (0.0, 1.0),
        ),
    ];
    for (name, shape, dims, kv_groups, range) in cases {
        let cfg = BackwardConfig {
            block_m: 32,
            split_d: 2,
            kv_groups,
            shared_scores: true,
            ..default(dims)
        };
        assert!(cfg.wgmma, "{name}: {cfg:?}");
        check_backward_config(
            &format!("{test}_{name}_{}x{}_g{kv_groups}", dims.dqk, dims.dv),
            name,
            shape,
            dims,
            range,
            6e-2,
            cfg,
        );
    }
}

/// The split-key tiles without shared scores (`split_d` 2: both warpgroups
/// compute Sᵀ and dPᵀ of the same 64 keys, each with half of the dK/dV
/// panels), with and without the producer warpgroup: their warpgroup index
/// is made warp-uniform for ptxas (bench/NOTES.md session 55), and their
/// per-warpgroup panel branches must still pick each warpgroup's own
/// panels. Tuning-space tiles, not defaults. Skipped on GPUs other than sm_90.
#[test]
fn gpu_backward_split_key_without_shared_scores() {
    let test = "gpu_backward_split_key_without_shared_scores";
    if !hopper(test) {
        return;
    }
    let cases = [
        (
            "softmax_causal",
            Shape::mha(1, 2, 150, 150),
            HeadDims::square(128),
        ),
        (
            "deepseek",
            Shape::mha(1, 2, 97, 133),
            HeadDims::new(192, 128),
        ),
    ];
    for (name, shape, dims) in cases {
        for (block_m, warp_specialized) in [(64, true), (32, false)] {
            let cfg = BackwardConfig {
                block_m,
                split_d: 2,
                shared_scores: false,
                warp_specialized,
                tma_loads: warp_specialized,
                ..BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a)
            };
            assert!(cfg.wgmma, "{name}: {cfg:?}");
            check_backward_config(
                &format!("{test}_{name}_m{block_m}_ws{}", warp_specialized as u8),
                name,
                shape,
                dims,
                (0.0, 1.0),
                2e-2,
                cfg,
            );
        }
    }
}

/// The sm_90a backward on 80-query steps with dQ computed transposed
/// (`block_m` 80, the default without a mask or under the causal one),
/// pinned so that it stays covered whatever the default: GQA softmax at
/// 128/128 and 64/64 (one dQ panel per warpgroup, and one warpgroup without
/// a panel), with a last step of 10, 17 and 1 rows, sigmoid with queries
/// fewer than one step, and masked walks (causal, GQA causal, a sliding
/// window, documents).
#[test]
fn gpu_backward_80_query_steps() {
    let test = "gpu_backward_80_query_steps";
    if !hopper(test) {
        return;
    }
    let cases = [
        (
            "softmax_gqa",
            Shape::new(2, 4, 2, 170, 133),
            HeadDims::square(128),
        ),
        (
            "softmax_gqa",
            Shape::new(1, 4, 1, 97, 300),
            HeadDims::square(64),
        ),
        ("softmax", Shape::mha(1, 2, 161, 77), HeadDims::square(128)),
        ("sigmoid", Shape::mha(2, 2, 50, 129), HeadDims::square(128)),
        // Causal walks start at each key block's diagonal row (0, 128, 256:
        // no multiple of 80), GQA heads restarting them, fewer queries than
        // keys, and a window that trims the walk's tail.
        (
            "softmax_causal",
            Shape::mha(2, 3, 300, 300),
            HeadDims::square(128),
        ),
        (
            "softmax_gqa_causal",
            Shape::new(1, 4, 2, 203, 203),
            HeadDims::square(64),
        ),
        (
            "softmax_causal",
            Shape::mha(1, 2, 170, 333),
            HeadDims::square(128),
        ),
        (
            "sliding_window",
            Shape::mha(1, 2, 650, 650),
            HeadDims::square(128),
        ),
        // A mask that can hide whole steps inside a walk (the producer
        // skips their dQ tiles).
        (
            "document_mask",
            Shape::mha(2, 2, 300, 300),
            HeadDims::square(128),
        ),
    ];
    for (name, shape, dims) in cases {
        let cfg = BackwardConfig {
            block_m: 80,
            ..BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a)
        };
        assert!(cfg.transposes_dq(), "{cfg:?}");
        let def = if name == "softmax_gqa_causal" {
            gqa_causal()
        } else {
            example(name)
        };
        check_backward_def(
            &format!("{test}_{name}_{}_sq{}", dims.dqk, shape.sq),
            def,
            name,
            shape,
            dims,
            (0.0, 1.0),
            2e-2,
            &KernelOptions {
                backward_config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
}

/// The transposed-dQ kernel on 48-query steps at the head dims whose dK
/// and dV fill a warpgroup's registers (Dqk + Dv up to 320: DeepSeek's
/// 192/128, GQA at 64/256, 256/64): causal walks from each key block's
/// diagonal row (0, 128, 256: no multiple of 48), fewer rows than one
/// step, a head whose walk ends inside a step, GQA heads restarting the
/// walk, and a sliding window that trims it. Skipped on GPUs other than
/// sm_90.
#[test]
fn gpu_backward_48_query_steps() {
    let test = "gpu_backward_48_query_steps";
    if !hopper(test) {
        return;
    }
    let deepseek = HeadDims::new(192, 128);
    let cases = [
        ("deepseek", Shape::mha(2, 3, 300, 300), deepseek),
        ("deepseek", Shape::mha(1, 2, 97, 133), deepseek),
        ("deepseek", Shape::mha(2, 1, 40, 40), deepseek),
        (
            "softmax_gqa",
            Shape::new(2, 4, 2, 170, 133),
            HeadDims::new(64, 256),
        ),
        ("softmax", Shape::mha(1, 2, 161, 77), HeadDims::new(256, 64)),
        ("sliding_window", Shape::mha(1, 2, 650, 650), deepseek),
    ];
    for (name, shape, dims) in cases {
        let cfg = BackwardConfig {
            block_m: 48,
            ..BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a)
        };
        assert!(cfg.transposes_dq() && cfg.adds_dq_in_bulk(false), "{cfg:?}");
        check_backward_config(
            &format!("{test}_{name}_{}x{}_sq{}", dims.dqk, dims.dv, shape.sq),
            name,
            shape,
            dims,
            (0.0, 1.0),
            2e-2,
            cfg,
        );
    }
}

/// `examples/softmax_gqa.rs` with the causal mask (the benchmark's GQA
/// causal workload declares it the same way).
fn gqa_causal() -> aec::frontend::Variant {
    let path = common::examples_dir().join("softmax_gqa.rs");
    let src = std::fs::read_to_string(&path).expect("softmax_gqa example");
    let masked = src.replacen(
        "modify_q = |q| q * rsqrt(Dqk);",
        "modify_q = |q| q * rsqrt(Dqk);\n        mask = |b, h, i, j| i >= j;",
        1,
    );
    assert_ne!(masked, src, "softmax_gqa.rs changed shape");
    parse_file(&masked)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("GQA causal variant")
}

/// The sm_90a backward with a warpgroup per 64 keys on 32-query steps
/// (`block_m` 32, `split_d` 1: dK and dV of Dqk + Dv up to 320 in each
/// warpgroup's registers, 128 keys per block): DeepSeek's dims with and
/// without the producer warpgroup, and GQA softmax at 64/256. Skipped on
/// GPUs other than sm_90.
#[test]
fn gpu_backward_own_keys_on_32_query_steps() {
    let test = "gpu_backward_own_keys_on_32_query_steps";
    if !hopper(test) {
        return;
    }
    let deepseek = HeadDims { dqk: 192, dv: 128 };
    let gqa = HeadDims { dqk: 64, dv: 256 };
    // With the producer the steps pair for dQ on 64-row boundaries: 97 rows
    // end on a pair's second half, 80 and 300 on a first half that closes
    // alone (300 also after three key blocks' causal starts), and with two
    // query heads per KV head of 80 rows a head's walk ends mid-pair. A
    // sliding window keeps single steps, each staging and adding (in bulk,
    // like the pairs) a 32-row tile.
    let cases = [
        ("deepseek", Shape::mha(1, 2, 97, 133), deepseek, true),
        ("deepseek", Shape::mha(1, 2, 97, 133), deepseek, false),
        ("deepseek", Shape::mha(2, 3, 80, 80), deepseek, true),
        ("deepseek", Shape::mha(1, 2, 300, 300), deepseek, true),
        ("sliding_window", Shape::mha(1, 2, 300, 300), deepseek, true),
        ("softmax_gqa", Shape::new(2, 4, 2, 97, 133), gqa, true),
        ("softmax_gqa", Shape::new(2, 4, 2, 80, 100), gqa, true),
    ];
    for (name, shape, dims, ws) in cases {
        let cfg = BackwardConfig {
            block_m: 32,
            split_d: 1,
            shared_scores: false,
            warp_specialized: ws,
            tma_loads: ws,
            ..BackwardConfig::default_for(dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a)
        };
        check_backward_config(
            &format!(
                "{test}_{name}_{}x{}_ws{ws}_sq{}",
                dims.dqk, dims.dv, shape.sq
            ),
            name,
            shape,
            dims,
            (0.0, 1.0),
            2e-2,
            cfg,
        );
    }
}

#[test]
fn gpu_backward_alibi() {
    check_backward(
        "gpu_backward_alibi",
        "alibi",
        Shape::mha(2, 4, 133, 133),
        HeadDims::square(64),
        (0.01, 0.3),
    );
}

#[test]
fn gpu_backward_relative_bias() {
    // The table's gradient: every score adds to its distance's entry.
    check_backward(
        "gpu_backward_relative_bias",
        "relative_bias",
        Shape::mha(2, 3, 100, 137),
        HeadDims::square(64),
        (-1.0, 1.0),
    );
}

#[test]
fn gpu_backward_softcap() {
    check_backward(
        "gpu_backward_softcap",
        "softcap",
        Shape::mha(1, 2, 97, 133),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_sliding_window() {
    check_backward(
        "gpu_backward_sliding_window",
        "sliding_window",
        Shape::mha(1, 2, 300, 300),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_document_mask() {
    check_backward(
        "gpu_backward_document_mask",
        "document_mask",
        Shape::mha(2, 2, 150, 150),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_backward_decode() {
    check_backward(
        "gpu_backward_decode",
        "decode",
        Shape::new(3, 4, 2, 1, 301),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

/// `aec tune --backward`'s path: the tuner profiles the default and the
/// first plans of the backward's space on the GPU (each checked against the
/// default's gradients), keeps the fastest, and the plan it keeps matches
/// the reference interpreter.
#[test]
fn gpu_backward_tuning_keeps_a_plan_that_matches_the_reference() {
    use aec::compiler::schedule::DeviceConfig;
    use aec::tune::dispatch::DeviceKeyParts;
    use aec::tune::gpu::BackwardGpuProfiler;
    use aec::tune::{TuneOptions, backward_key, entry_config, tune_backward, variant_hash};
    let test = "gpu_backward_tuning_keeps_a_plan_that_matches_the_reference";
    if !hopper(test) {
        return;
    }
    let dev = device(test).expect("hopper() opened it");
    let v = example("softmax_causal");
    let (dims, shape) = (HeadDims::square(128), Shape::mha(2, 3, 333, 333));
    let model = DeviceConfig::detect(dev.name(), dev.compute_capability(), dev.sm_count());
    let parts = DeviceKeyParts::of(&dev);
    let key = backward_key(
        &v,
        &variant_hash(&v),
        dims,
        shape,
        Elem::Bf16,
        &parts.parts(),
    );
    let options = TuneOptions {
        top: 4,
        warmup: 1,
        warmup_ms: 0.0,
        reps: 3,
        ..TuneOptions::default()
    };
    let mut profiler =
        BackwardGpuProfiler::<bf16>::new(&v, &dev, dims, shape, options.clone(), Vec::new())
            .unwrap_or_else(|e| panic!("{test}: {e}"));
    let r = tune_backward(
        &v,
        &model,
        dims,
        shape,
        Elem::Bf16,
        key,
        &options,
        &mut profiler,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{test}: {e}"));
    for p in &r.profiled {
        println!("{test}: {} {:?}", p.label, p.measured);
    }
    assert_eq!(r.profiled.len(), 5, "the default and four more");
    let measured = r.profiled.iter().filter(|p| p.measured.is_ok()).count();
    assert!(measured >= 4, "{measured} of 5 plans measured");
    assert!(r.entry.best_us <= r.entry.default_us);
    let best: BackwardConfig = entry_config(&r.entry).expect("a backward configuration");
    check_backward_config(test, "softmax_causal", shape, dims, (0.0, 1.0), 2e-2, best);
}
