//! The Rust forward API (`aec::run`): `ParallelKernels::compile` /
//! `Variant::compile` and `ParallelKernels::forward`.
//!
//! - `cpu_*` tests run everywhere: the input checks (exact messages) and
//!   kernel generation need no GPU.
//! - `gpu_*` tests compile the forward of an example with NVRTC, run it on
//!   device 0 with random bf16 inputs (sizes that are not tile multiples) and
//!   compare the output and the row outputs with the f64 reference
//!   interpreter on the same inputs. Without a CUDA driver they print a skip
//!   line, unless `AEC_REQUIRE_GPU=1` (then they fail). The GPU machines have
//!   no Rust: build with `cargo test --test gpu_forward --no-run --release`
//!   and run the binary there from the repository root.

mod common;

use aec::compiler::{BackwardConfig, Elem, ForwardConfig, Isa};
use aec::prelude::*;
use aec::reference;
use aec::runtime::RuntimeError;
use aec::{Error, check_shapes, forward_source};
use common::example;
use common::gpu::{
    GpuCall, compiled, device, download_f64, prepare_def, prepare_with, rel_err, skip, sm90a_device,
};

// ---------------------------------------------------------------- helpers

fn shape_error(r: Result<(), Error>) -> String {
    match r {
        Err(Error::Shape(m)) => m,
        other => panic!("expected Error::Shape, got {other:?}"),
    }
}

// -------------------------------------------------------------- CPU tests

#[test]
fn cpu_wrong_element_count_names_the_tensor_and_its_shape() {
    let v = example("softmax");
    let shape = Shape::mha(2, 4, 37, 37);
    let n = 2 * 4 * 37 * 128;
    check_shapes(
        &v,
        HeadDims::square(128),
        shape,
        &[("q", n), ("k", n), ("v", n)],
    )
    .expect("right sizes");
    assert_eq!(
        shape_error(check_shapes(
            &v,
            HeadDims::square(128),
            shape,
            &[("q", n), ("k", 4096), ("v", n)]
        )),
        "tensor `k` has 4096 elements, expected [B, H, Skv, Dqk] = [2, 4, 37, 128] = 37888"
    );
    // Dv differs from Dqk: v and the output use Dv.
    let dims = HeadDims::new(128, 64);
    assert_eq!(
        shape_error(check_shapes(
            &v,
            dims,
            shape,
            &[("q", n), ("k", n), ("v", n)]
        )),
        "tensor `v` has 37888 elements, expected [B, H, Skv, Dv] = [2, 4, 37, 64] = 18944"
    );
    assert_eq!(
        shape_error(check_shapes(
            &v,
            HeadDims::square(128),
            shape,
            &[("q", n), ("v", n)]
        )),
        "tensor `k` is missing"
    );
    assert_eq!(
        shape_error(check_shapes(
            &v,
            HeadDims::square(128),
            shape,
            &[("q", n), ("k", n), ("q", n), ("v", n)]
        )),
        "tensor `q` is given twice"
    );
}

#[test]
fn cpu_grouped_query_sizes() {
    let v = example("softmax_gqa");
    let shape = Shape::new(2, 4, 2, 97, 133);
    let (q, kv) = (2 * 4 * 97 * 64, 2 * 2 * 133 * 64);
    check_shapes(
        &v,
        HeadDims::square(64),
        shape,
        &[("q", q), ("k", kv), ("v", kv)],
    )
    .expect("right sizes");
    assert_eq!(
        shape_error(check_shapes(
            &v,
            HeadDims::square(64),
            shape,
            &[("q", q), ("k", q), ("v", kv)]
        )),
        "tensor `k` has 49664 elements, expected [B, Hkv, Skv, Dqk] = [2, 2, 133, 64] = 34048"
    );
    assert_eq!(
        shape_error(check_shapes(
            &v,
            HeadDims::square(64),
            Shape::new(2, 4, 3, 97, 133),
            &[]
        )),
        "H = 4 query heads is not a multiple of Hkv = 3 key/value heads \
         (shape [B = 2, H = 4, Hkv = 3, Sq = 97, Skv = 133])"
    );
    // A variant without grouped-query heads needs Hkv = H.
    assert_eq!(
        shape_error(check_shapes(
            &example("softmax"),
            HeadDims::square(64),
            shape,
            &[]
        )),
        "`Softmax` has no grouped-query heads (k and v are declared with H heads), so Hkv \
         must equal H, but the shape [B = 2, H = 4, Hkv = 2, Sq = 97, Skv = 133] has H = 4 \
         and Hkv = 2: use Shape::mha"
    );
}

#[test]
fn cpu_custom_inputs_are_checked_by_name_with_their_axes() {
    let v = example("alibi");
    let shape = Shape::mha(2, 4, 97, 133);
    let dims = HeadDims::square(64);
    let (q, kv) = (2 * 4 * 97 * 64, 2 * 4 * 133 * 64);
    check_shapes(
        &v,
        dims,
        shape,
        &[("q", q), ("k", kv), ("v", kv), ("slopes", 4)],
    )
    .expect("right sizes");
    assert_eq!(
        shape_error(check_shapes(
            &v,
            dims,
            shape,
            &[("q", q), ("k", kv), ("v", kv)]
        )),
        "missing custom input `slopes`: `Alibi` declares it as [H] = [4]; pass (\"slopes\", \
         buffer) with 4 f32 elements in `customs`"
    );
    assert_eq!(
        shape_error(check_shapes(
            &v,
            dims,
            shape,
            &[("q", q), ("k", kv), ("v", kv), ("slope", 4)]
        )),
        "unknown custom input `slope`: `Alibi` declares the custom inputs `slopes`"
    );
    assert_eq!(
        shape_error(check_shapes(
            &v,
            dims,
            shape,
            &[("q", q), ("k", kv), ("v", kv), ("slopes", 3)]
        )),
        "custom input `slopes` has 3 elements, expected [H] = [4] = 4"
    );
    let doc = example("document_mask");
    assert_eq!(
        shape_error(check_shapes(
            &doc,
            dims,
            shape,
            &[
                ("q", q),
                ("k", kv),
                ("v", kv),
                ("doc_q", 2 * 97),
                ("doc_k", 97)
            ]
        )),
        "custom input `doc_k` has 97 elements, expected [B, Skv] = [2, 133] = 266"
    );
    assert_eq!(
        shape_error(check_shapes(
            &example("softmax"),
            dims,
            shape,
            &[("q", q), ("k", kv), ("v", kv), ("slopes", 4)]
        )),
        "unknown custom input `slopes`: `Softmax` declares no custom inputs"
    );
}

#[test]
fn cpu_fixed_sizes_and_limits() {
    let decode = example("decode");
    assert_eq!(
        shape_error(check_shapes(
            &decode,
            HeadDims::square(128),
            Shape::new(3, 4, 2, 97, 301),
            &[]
        )),
        "`Decode` fixes Sq = 1, but the shape [B = 3, H = 4, Hkv = 2, Sq = 97, Skv = 301] \
         has Sq = 97"
    );
    let deepseek = example("deepseek");
    assert_eq!(
        shape_error(check_shapes(
            &deepseek,
            HeadDims::square(128),
            Shape::mha(1, 2, 10, 10),
            &[]
        )),
        "`Deepseek` fixes Dqk = 192, but the head dims ask for Dqk = 128: compile with \
         HeadDims { dqk: 192, dv: 128 }"
    );
    let softmax = example("softmax");
    assert_eq!(
        shape_error(check_shapes(
            &softmax,
            HeadDims::square(64),
            Shape::mha(2, 4, 0, 10),
            &[]
        )),
        "Sq = 0 in the shape [B = 2, H = 4, Hkv = 4, Sq = 0, Skv = 10]: every size must be \
         at least 1"
    );
    assert_eq!(
        shape_error(check_shapes(
            &softmax,
            HeadDims::square(64),
            Shape::mha(1, 1, 1, 1 << 31),
            &[]
        )),
        "Skv = 2147483648 in the shape [B = 1, H = 1, Hkv = 1, Sq = 1, Skv = 2147483648] \
         does not fit the kernel's 32-bit sizes (at most 2147483647): split the call"
    );
    assert_eq!(
        shape_error(check_shapes(
            &softmax,
            HeadDims::square(64),
            Shape::mha(70_000, 1, 1, 1),
            &[]
        )),
        "B = 70000 in the shape [B = 70000, H = 1, Hkv = 1, Sq = 1, Skv = 1] exceeds CUDA's \
         grid limit of 65535 (the grid is (ceil(Sq / block_m), H, B)): split the call"
    );
    assert_eq!(
        shape_error(check_shapes(
            &softmax,
            HeadDims::square(64),
            Shape::mha(65_535, 65_535, 1, 1),
            &[]
        )),
        "B · H = 4294836225 in the shape [B = 65535, H = 65535, Hkv = 65535, Sq = 1, Skv = 1] \
         does not fit the kernel's 32-bit row index (at most 2147483647): split the batch"
    );
}

#[test]
fn cpu_recurrent_variants_point_to_recurrent_kernels() {
    let v = example("retnet_recurrent");
    let expected = "`RetNetRecurrent` is a recurrent variant: ParallelKernels runs parallel \
                    variants only; compile it with RecurrentKernels::compile (or \
                    `Variant::compile_recurrent` for a variant declared with attention!) and \
                    check its inputs with check_recurrent_shapes";
    match forward_source(
        &v,
        HeadDims::square(64),
        &KernelOptions::default(),
        Isa::Sm80,
    ) {
        Err(Error::Pattern(m)) => assert_eq!(m, expected),
        other => panic!("expected Error::Pattern, got {other:?}"),
    }
    match check_shapes(&v, HeadDims::square(64), Shape::mha(1, 1, 8, 8), &[]) {
        Err(Error::Pattern(m)) => assert_eq!(m, expected),
        other => panic!("expected Error::Pattern, got {other:?}"),
    }
    // No recurrent backward exists yet: said as such.
    match aec::backward_source(
        &v,
        HeadDims::square(64),
        &KernelOptions::default(),
        Isa::Sm80,
    ) {
        Err(Error::NotImplemented(m)) => assert_eq!(
            m,
            "`RetNetRecurrent` is a recurrent variant: its backward kernel is not implemented \
             yet (RecurrentKernels runs its forward; aec::reference::backward computes its \
             gradients on the CPU)"
        ),
        other => panic!("expected Error::NotImplemented, got {other:?}"),
    }
}

#[test]
fn cpu_forward_source_generates_without_a_gpu() {
    use aec::compiler::{ArgKind, Elem, ForwardConfig};
    let v = example("alibi");
    let src = forward_source(
        &v,
        HeadDims::square(64),
        &KernelOptions::default(),
        Isa::Sm80,
    )
    .unwrap();
    assert!(src.source.contains(&format!("{}(", src.name)));
    assert!(src.args.contains(&ArgKind::Custom("slopes".into())));
    assert_eq!(src.row_outputs, ["scale.lse", "state.m", "state.l"]);
    assert_eq!((src.dqk, src.dv), (64, 64));

    match forward_source(
        &v,
        HeadDims::square(100),
        &KernelOptions::default(),
        Isa::Sm80,
    ) {
        Err(e @ Error::Compile { .. }) => assert_eq!(
            e.to_string(),
            "cannot generate the forward kernel of `Alibi`: head dimension Dqk = 100 is not \
             supported by the parallel forward templates: it needs a multiple of 16 up to 576"
        ),
        other => panic!("expected Error::Compile, got {other:?}"),
    }
    // A K/V ring that does not fit an sm_80 block's shared memory, and one
    // deeper than the template holds.
    let deep = |stages, block_n| KernelOptions {
        config: Some(ForwardConfig {
            stages,
            block_n,
            ..ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm80)
        }),
        ..KernelOptions::default()
    };
    // 128 Q rows and four stages of 128 K and V rows, 256 bytes each.
    match forward_source(&v, HeadDims::square(128), &deep(4, 128), Isa::Sm80) {
        Err(e @ Error::Compile { .. }) => assert_eq!(
            e.to_string(),
            "cannot generate the forward kernel of `Alibi`: the tile configuration needs 294912 \
             bytes of shared memory per block, more than the 166912 an Sm80 block may use: use \
             fewer `stages` or smaller blocks, or leave `KernelOptions::config` to the default"
        ),
        other => panic!("expected Error::Compile, got {other:?}"),
    }
    match forward_source(&v, HeadDims::square(128), &deep(5, 64), Isa::Sm80) {
        Err(e @ Error::Compile { .. }) => assert_eq!(
            e.to_string(),
            "cannot generate the forward kernel of `Alibi`: 5 K/V stages: the forward's K/V \
             ring holds 2 to 4 blocks"
        ),
        other => panic!("expected Error::Compile, got {other:?}"),
    }
    assert!(forward_source(&v, HeadDims::square(128), &deep(3, 64), Isa::Sm80).is_ok());
    // A configuration whose element type contradicts the options'.
    let mixed = KernelOptions {
        config: Some(ForwardConfig {
            elem: Elem::F16,
            ..ForwardConfig::default_for(&v, 64, 64, Elem::Bf16, Isa::Sm80)
        }),
        ..KernelOptions::default()
    };
    match forward_source(&v, HeadDims::square(64), &mixed, Isa::Sm80) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "the tile configuration asks for f16 elements but the kernel options for bf16: \
             set `KernelOptions::elem` and the configuration's `elem` alike"
        ),
        other => panic!("expected Error::Shape, got {other:?}"),
    }
    // f16 kernels: the same kernel with f16 operands.
    let f16 = KernelOptions {
        elem: Elem::F16,
        ..KernelOptions::default()
    };
    let src = forward_source(&v, HeadDims::square(64), &f16, Isa::Sm80).expect("f16 forward");
    assert!(src.source.contains("typedef __half elem_t;"));
    assert!(
        src.source
            .contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    );
    assert_eq!(src.elem, Elem::F16);
}

#[test]
fn cpu_runtime_errors_keep_their_message() {
    let e = Error::from(RuntimeError::NoDevice {
        ordinal: 3,
        count: 1,
    });
    assert_eq!(
        e.to_string(),
        "CUDA runtime: no CUDA device 3: the driver sees 1 device(s); pick an ordinal below 1 \
         (and check CUDA_VISIBLE_DEVICES)"
    );
    assert!(std::error::Error::source(&e).is_some());
}

// -------------------------------------------------------------- GPU tests

/// Runs the forward of `examples/<name>.rs` on the GPU and compares it with
/// the reference interpreter on the same (bf16) inputs.
fn check_example(test: &str, name: &str, shape: Shape, dims: HeadDims, custom_range: (f64, f64)) {
    check_example_with(
        test,
        name,
        shape,
        dims,
        custom_range,
        &KernelOptions::default(),
    );
}

/// The row outputs of `out` against the reference forward `want`: infinite
/// where the reference is (rows that see no key), close elsewhere. Whether
/// all hold, and a report per output.
fn check_row_outputs(
    test: &str,
    names: &[String],
    out: &ForwardOutput<bf16>,
    stream: &aec::runtime::Stream,
    want: &reference::Forward,
) -> (bool, Vec<String>) {
    let mut rows_ok = true;
    let mut report = Vec::new();
    for name in names {
        let reference = match name.split_once('.') {
            Some(("scale", s)) => &want.scales[s],
            Some(("state", f)) => &want.row_state[f],
            _ => panic!("{test}: unexpected row output `{name}`"),
        };
        let got = out.download_row(stream, name).unwrap();
        let (mut g, mut r) = (Vec::new(), Vec::new());
        let mut same_inf = true;
        for (&x, &y) in got.iter().zip(&reference.data) {
            if y.is_finite() {
                g.push(f64::from(x));
                r.push(y);
            } else {
                same_inf &= f64::from(x) == y;
            }
        }
        let e = if r.is_empty() { 0.0 } else { rel_err(&g, &r) };
        rows_ok &= same_inf && e < 1e-2 && !e.is_nan();
        report.push(format!(
            "{name}={e:.2e}{}",
            if same_inf { "" } else { " (inf differs)" }
        ));
    }
    (rows_ok, report)
}

fn check_example_with(
    test: &str,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    options: &KernelOptions,
) {
    check_def_with(
        test,
        example(name),
        name,
        shape,
        dims,
        custom_range,
        options,
    );
}

/// [`check_example_with`] for the variant `def` (`name` seeds its inputs).
fn check_def_with(
    test: &str,
    def: aec::frontend::Variant,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
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
    let out = kernels
        .forward(stream, q, k, v, &customs, shape)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let o = download_f64(stream, &out.o);

    let fwd = reference::forward(def, inputs, Options::default()).expect("reference forward");
    assert_eq!(fwd.o.shape, [shape.b, shape.h, shape.sq, dims.dv as usize]);
    let nan = o.iter().any(|x| x.is_nan());
    let err = rel_err(&o, &fwd.o.data);

    let (rows_ok, row_report) =
        check_row_outputs(test, kernels.row_output_names(), &out, stream, &fwd);
    let pass = err < 1e-2 && !nan && rows_ok;
    eprintln!(
        "{test}: {} `{}` on {} {shape} Dqk={} Dv={}: rel_err(o)={err:.2e} nan={nan} rows[{}]",
        if pass { "PASS" } else { "FAIL" },
        kernels.forward_source().name,
        device.name(),
        dims.dqk,
        dims.dv,
        row_report.join(", ")
    );
    assert!(!nan, "{test}: NaN in the output");
    assert!(err < 1e-2, "{test}: relative error of o {err:.3e}");
    assert!(
        rows_ok,
        "{test}: row outputs differ: {}",
        row_report.join(", ")
    );
}

#[test]
fn gpu_forward_softmax() {
    check_example(
        "gpu_forward_softmax",
        "softmax",
        Shape::mha(2, 4, 97, 133),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_forward_softmax_gqa() {
    check_example(
        "gpu_forward_softmax_gqa",
        "softmax_gqa",
        Shape::new(2, 4, 2, 97, 133),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_forward_softmax_causal() {
    check_example(
        "gpu_forward_softmax_causal",
        "softmax_causal",
        Shape::mha(2, 4, 150, 150),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

/// DeepSeek's dims on their default tile: 128 keys with Q in shared memory
/// on a two-stage ring whose K and V have barriers of their own. Causal,
/// lengths that are not tile multiples, and (at 300 units of work on the
/// persistent grid) several tiles per block, so the ring's phases run on
/// across tiles.
#[test]
fn gpu_forward_deepseek_two_stage_ring() {
    let cfg = ForwardConfig::default_for(&example("deepseek"), 192, 128, Elem::Bf16, Isa::Sm90a);
    assert_eq!(
        (cfg.block_n, cfg.stages, cfg.q_in_registers, cfg.tma_loads),
        (128, 2, false, true)
    );
    for shape in [Shape::mha(2, 3, 333, 333), Shape::mha(3, 50, 300, 300)] {
        check_example(
            "gpu_forward_deepseek_two_stage_ring",
            "deepseek",
            shape,
            HeadDims::new(192, 128),
            (0.0, 1.0),
        );
    }
}

/// RetNet's benchmark dims, 256/512, on the default sm_90a tile: Dv in two
/// slices of 256 columns between blocks, whose Q descriptors take the
/// warpgroup index through a shuffle (`q_warpgroup`, bench/NOTES.md session
/// 75). Causal by its decay mask, lengths that are not tile multiples,
/// several tiles per persistent block at 60 heads. Skipped off sm_90.
#[test]
fn gpu_forward_dv_split_wgmma() {
    let test = "gpu_forward_dv_split_wgmma";
    if sm90a_device(test, "the tile is sm_90a's").is_none() {
        return;
    }
    let dims = HeadDims::new(256, 512);
    let cfg = ForwardConfig::default_for(
        &example("retnet_parallel"),
        256,
        512,
        Elem::Bf16,
        Isa::Sm90a,
    );
    assert!(cfg.wgmma && cfg.dv_split == 2, "{cfg:?}");
    for shape in [Shape::mha(1, 2, 150, 150), Shape::mha(1, 60, 200, 200)] {
        check_example_with(
            &format!("{test} {shape}"),
            "retnet_parallel",
            shape,
            dims,
            (0.8, 0.99),
            &KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
}

/// The 192-row tile: three consumer warpgroups beside the producer, on
/// 160 registers each. DeepSeek's dims on 96- and 112-key blocks, causal
/// softmax on 64-key blocks (two-stage rings whose first steps' blocks lie
/// past the first warpgroups' rows, which skip them) and softmax without a
/// mask, at lengths that are not tile multiples: the last row block's
/// second and third warpgroups have no rows at 400 (they skip every block),
/// the third some at 333; at 80 heads (160 units of two row blocks on the
/// persistent grid) the ring's phases run across tiles. (Measured slower
/// than the 128-row tile on an H200, bench/NOTES.md session 65: not a
/// default.)
#[test]
fn gpu_forward_three_consumer_warpgroups() {
    let test = "gpu_forward_three_consumer_warpgroups";
    let tile = |name: &str, dqk: u32, dv: u32, block_n: u32, stages: u32| {
        let base = ForwardConfig::default_for(&example(name), dqk, dv, Elem::Bf16, Isa::Sm90a);
        KernelOptions {
            config: Some(ForwardConfig {
                block_m: 192,
                block_n,
                warps: 12,
                stages,
                q_in_registers: false,
                late_epilogue: false,
                kv_multicast: false,
                ..base
            }),
            ..KernelOptions::default()
        }
    };
    // (The f64 reference takes most of the time: the many-tile shape only
    // where the walk skips.)
    let small = Shape::mha(2, 3, 333, 333);
    let many_tiles = Shape::mha(2, 40, 400, 400);
    for (name, dims, block_n, stages, shapes) in [
        (
            "deepseek",
            HeadDims::new(192, 128),
            96,
            2,
            vec![small, many_tiles],
        ),
        ("deepseek", HeadDims::new(192, 128), 112, 2, vec![small]),
        (
            "softmax_causal",
            HeadDims::square(128),
            64,
            2,
            vec![small, many_tiles],
        ),
        ("softmax", HeadDims::square(128), 96, 2, vec![small]),
    ] {
        let options = tile(name, dims.dqk, dims.dv, block_n, stages);
        for shape in shapes {
            if let Some(gpu) =
                common::gpu::prepare_with(test, name, shape, dims, (0.0, 1.0), &options)
            {
                let source = gpu.kernels.forward_source();
                assert!(
                    source.name.contains(&format!("_m192n{block_n}w12_")),
                    "{test}: {}",
                    source.name
                );
                assert!(
                    source
                        .source
                        .contains("setmaxnreg.inc.sync.aligned.u32 160;"),
                    "{test}: `{}` does not give its consumers 160 registers",
                    source.name
                );
            }
            check_example_with(
                &format!("{test} ({name}, {block_n} keys, {shape})"),
                name,
                shape,
                dims,
                (0.0, 1.0),
                &options,
            );
        }
    }
}

/// The cluster pair's K/V multicast (`ForwardConfig::kv_multicast`, not a
/// default): CTAs in clusters of two walking adjacent row-block pairs of one
/// head in step, each copying half of every shared key block into both.
/// At 512 rows (four row blocks a head) the pairing holds: under the causal
/// mask with each tile's extra diagonal block solo (DeepSeek's 128 keys,
/// softmax's with Q in registers and the late epilogue, DiffTransformer's
/// 64-key blocks under 128 rows), without a mask at 700 and 300 keys (a
/// partial last block) and with grouped KV heads. At 333 and 200 rows it
/// does not (three and two row blocks): each CTA loads its own blocks, and
/// at three heads of one pair an odd unit count leaves the grid's last CTA
/// idle. (Small enough for the sanitizers; `…_many_units` runs the walk
/// across tiles.)
#[test]
fn gpu_forward_kv_multicast() {
    check_kv_multicast(
        "gpu_forward_kv_multicast",
        &[
            (
                "deepseek",
                HeadDims::new(192, 128),
                Shape::mha(1, 4, 512, 512),
            ),
            (
                "deepseek",
                HeadDims::new(192, 128),
                Shape::mha(2, 3, 333, 333),
            ),
            (
                "softmax_causal",
                HeadDims::square(128),
                Shape::mha(1, 4, 512, 512),
            ),
            // (GQA: four query heads on each K/V head.)
            (
                "softmax_gqa",
                HeadDims::square(128),
                Shape::new(1, 8, 2, 512, 512),
            ),
            (
                "diff_transformer",
                HeadDims::new(128, 256),
                Shape::mha(1, 3, 512, 512),
            ),
            ("softmax", HeadDims::square(128), Shape::mha(1, 4, 512, 700)),
            ("softmax", HeadDims::square(128), Shape::mha(1, 3, 200, 333)),
            ("sigmoid", HeadDims::square(128), Shape::mha(1, 4, 512, 300)),
        ],
    );
}

/// [`gpu_forward_kv_multicast`] at 80 heads: 160 units on the persistent
/// grid, so each CTA pair walks several units and the ring's phases, the
/// pair's solo steps and the next tile's Q run across tiles.
#[test]
fn gpu_forward_kv_multicast_many_units() {
    check_kv_multicast(
        "gpu_forward_kv_multicast_many_units",
        &[
            (
                "deepseek",
                HeadDims::new(192, 128),
                Shape::mha(2, 40, 512, 512),
            ),
            (
                "softmax_causal",
                HeadDims::square(128),
                Shape::mha(2, 40, 512, 512),
            ),
            (
                "softmax",
                HeadDims::square(128),
                Shape::mha(2, 40, 512, 700),
            ),
        ],
    );
}

fn check_kv_multicast(test: &str, cases: &[(&str, HeadDims, Shape)]) {
    for &(name, dims, shape) in cases {
        let options = KernelOptions {
            config: Some(ForwardConfig {
                kv_multicast: true,
                ..ForwardConfig::default_for(
                    &example(name),
                    dims.dqk,
                    dims.dv,
                    Elem::Bf16,
                    Isa::Sm90a,
                )
            }),
            ..KernelOptions::default()
        };
        if let Some(gpu) = common::gpu::prepare_with(test, name, shape, dims, (0.0, 1.0), &options)
        {
            let source = gpu.kernels.forward_source();
            assert!(
                source.name.ends_with("_mc") && source.source.contains("multicast::cluster"),
                "{test}: `{}` is not the multicast kernel",
                source.name
            );
        }
        check_example_with(
            &format!("{test} ({name}, {shape})"),
            name,
            shape,
            dims,
            (0.0, 1.0),
            &options,
        );
    }
}

#[test]
fn gpu_forward_decode() {
    check_example(
        "gpu_forward_decode",
        "decode",
        Shape::new(3, 4, 2, 1, 301),
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

/// One sequence of a long context: the grid has two blocks, so the forward
/// splits the keys and merges the partial rows with the derived combine.
#[test]
fn gpu_forward_decode_split_kv() {
    let shape = Shape::new(1, 4, 2, 1, 3001);
    if let Some(gpu) = common::gpu::prepare_with(
        "gpu_forward_decode_split_kv",
        "decode",
        shape,
        HeadDims::square(128),
        (0.0, 1.0),
        &KernelOptions::default(),
    ) {
        let splits = gpu.kernels.kv_splits(shape);
        assert!(
            splits > 1,
            "expected split-KV for {shape}, got {splits} split(s)"
        );
    }
    check_example(
        "gpu_forward_decode_split_kv",
        "decode",
        shape,
        HeadDims::square(128),
        (0.0, 1.0),
    );
}

/// Split-KV decoding at Dv 96 and 192, whose rows take 24 and 48 threads
/// of the combine: its state butterflies span 8 and 16 lanes, so that no
/// lane segment holds two rows, and the splits (more than those lanes) are
/// merged in rounds — in the main kernel and in the combine kernel.
#[test]
fn gpu_forward_decode_split_kv_uneven_rows() {
    let test = "gpu_forward_decode_split_kv_uneven_rows";
    let def = common::example("decode");
    let shape = Shape::new(1, 4, 2, 1, 12001);
    for dv in [96, 192] {
        let dims = HeadDims { dqk: 128, dv };
        for fused_combine in [true, false] {
            let isa = Isa::Sm80;
            let cfg = ForwardConfig {
                fused_combine,
                ..ForwardConfig::default_for(&def, 128, dv, Elem::Bf16, isa).for_decode_shape(
                    [1, 4, 2, 1],
                    132,
                    128,
                    dv,
                    isa,
                )
            };
            assert!(cfg.split_kv && cfg.pack_gqa, "{cfg:?}");
            let opts = KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            };
            let name = format!("{test} (Dv {dv}, fused combine {fused_combine})");
            if let Some(gpu) =
                common::gpu::prepare_with(&name, "decode", shape, dims, (0.0, 1.0), &opts)
            {
                let splits = gpu.kernels.kv_splits(shape);
                assert!(
                    splits > 16,
                    "{name}: {splits} splits, expected more than the lanes"
                );
            }
            check_example_with(&name, "decode", shape, dims, (0.0, 1.0), &opts);
        }
    }
}

/// Dv = 384 on the sm_80 template (on any GPU): two blocks per row block,
/// each computing 192 columns of O from its own copy of the scores.
#[test]
fn gpu_forward_dv_split_between_blocks() {
    let v = example("softmax_causal");
    let cfg = ForwardConfig::default_for(&v, 128, 384, Elem::Bf16, Isa::Sm80);
    assert_eq!(cfg.dv_split, 2);
    check_example_with(
        "gpu_forward_dv_split_between_blocks",
        "softmax_causal",
        Shape::mha(2, 2, 97, 97),
        HeadDims { dqk: 128, dv: 384 },
        (0.0, 1.0),
        &KernelOptions {
            config: Some(cfg),
            ..KernelOptions::default()
        },
    );
}

/// A K/V ring of 3 and 4 blocks on the kernels without warp
/// specialisation (sm_80, and wgmma loading and computing in every warp):
/// causal prefill whose key counts leave the ring partly empty (1 and 2 key
/// blocks), and split-KV decoding whose splits end mid-ring.
#[test]
fn gpu_forward_deeper_ring() {
    for (stages, isa, wgmma) in [(3, Isa::Sm80, false), (3, Isa::Sm90a, true)] {
        let def = common::example("softmax_causal");
        let cfg = ForwardConfig {
            stages,
            wgmma,
            warp_specialized: false,
            persistent: false,
            q_in_registers: false,
            v_in_k: false,
            ..ForwardConfig::default_for(&def, 128, 128, Elem::Bf16, isa)
        };
        for shape in [
            Shape::mha(2, 3, 150, 150),
            Shape::mha(1, 2, 40, 40),
            Shape::mha(1, 2, 97, 97),
        ] {
            check_example_with(
                &format!("gpu_forward_deeper_ring (stages {stages}, {isa:?}, {shape})"),
                "softmax_causal",
                shape,
                HeadDims::square(128),
                (0.0, 1.0),
                &KernelOptions {
                    config: Some(cfg),
                    ..KernelOptions::default()
                },
            );
        }
    }
    let def = common::example("decode");
    let cfg = ForwardConfig {
        stages: 4,
        ..ForwardConfig::default_for(&def, 128, 128, Elem::Bf16, Isa::Sm80)
    };
    check_example_with(
        "gpu_forward_deeper_ring (decode, stages 4, split-KV)",
        "decode",
        Shape::new(1, 4, 2, 1, 3001),
        HeadDims::square(128),
        (0.0, 1.0),
        &KernelOptions {
            config: Some(cfg),
            ..KernelOptions::default()
        },
    );
}

/// Key blocks split between warps (`key_warps`), whose partial rows merge
/// through shared memory with the variant's combine: decoding with 2 and 4
/// key warps, with and without KV splits, at a length where the second
/// warp of the last block sees no key (and one so short that a warp sees
/// none at all); a causal mask and sigmoid (no normalising state) on
/// packed rows; paged decoding; the latent cache. Every row output is
/// checked too: the merged state must be the one pass's.
#[test]
fn gpu_forward_key_warps() {
    let test = "gpu_forward_key_warps";
    let with = |name: &str, d: u32, key_warps: u32, block_n: u32| {
        let def = example(name);
        KernelOptions {
            config: Some(ForwardConfig {
                block_m: 16,
                block_n,
                warps: key_warps,
                key_warps,
                pack_gqa: true,
                ..ForwardConfig::default_for(&def, d, d, Elem::Bf16, Isa::Sm80)
            }),
            ..KernelOptions::default()
        }
    };
    for (key_warps, block_n) in [(2, 32), (4, 64), (4, 128)] {
        for shape in [
            Shape::new(3, 4, 2, 1, 301),
            Shape::new(1, 4, 2, 1, 3001),
            Shape::new(2, 8, 2, 1, 5),
        ] {
            check_example_with(
                &format!("{test} (decode, {key_warps} key warps, {shape})"),
                "decode",
                shape,
                HeadDims::square(128),
                (0.0, 1.0),
                &with("decode", 128, key_warps, block_n),
            );
        }
    }
    for name in ["softmax_causal", "sigmoid"] {
        check_example_with(
            &format!("{test} ({name}, packed rows)"),
            name,
            Shape::mha(2, 3, 37, 70),
            HeadDims::square(64),
            (0.0, 1.0),
            &with(name, 64, 2, 64),
        );
    }
    // One long sequence: compile_for_shape gives its few blocks four key
    // warps on 128-key blocks, three stages where they fit
    // (ForwardConfig::for_few_blocks), and the combine in the main kernel
    // (ForwardConfig::with_combine_for_rows).
    if let Some(device) = device(test) {
        let def = example("decode");
        let (shape, dims) = (Shape::new(1, 4, 2, 1, 3001), HeadDims::square(128));
        let Some(kernels) = compiled(
            test,
            ParallelKernels::compile_for_shape(
                &def,
                &device,
                dims,
                shape,
                &KernelOptions::default(),
            ),
        ) else {
            return;
        };
        let name = &kernels.forward_source().name;
        assert!(
            name.contains("n128w4_gqa") && name.contains("_k4") && name.contains("_fc"),
            "{name}"
        );
        let (err, rows_ok, rows) = against_reference(
            test,
            &device,
            &def,
            &kernels,
            shape,
            dims,
            "decode_few_blocks",
        );
        eprintln!(
            "{test}: `{name}` {shape} splits={}: rel_err(o)={err:.2e} rows[{}]",
            kernels.kv_splits(shape),
            rows.join(", ")
        );
        assert!(kernels.kv_splits(shape) > 1);
        assert!(err < 1e-2 && rows_ok, "{test}: o {err:.3e}, rows {rows:?}");
    }
    check_paged_decode(test, &with("decode", 128, 2, 32));
    let def = example("mla_decode");
    let shape = Shape::new(2, 16, 1, 1, 1301);
    let config = ForwardConfig {
        warps: 2,
        key_warps: 2,
        dv_warps: 1,
        ..ForwardConfig::default_for(&def, 576, 512, Elem::Bf16, Isa::Sm80)
    };
    check_latent_tile(test, shape, config, "_k2");
}

/// One forward of `kernels` (no custom inputs) on random inputs (`seed`)
/// against the reference interpreter: the output's relative error and the
/// row outputs' check ([`check_row_outputs`]).
fn against_reference(
    test: &str,
    device: &Device,
    def: &aec::frontend::Variant,
    kernels: &ParallelKernels,
    shape: Shape,
    dims: HeadDims,
    seed: &str,
) -> (f64, bool, Vec<String>) {
    let call = common::gpu::random_call(def, shape, dims, (0.0, 1.0), seed);
    let stream = device.stream();
    let (q, k, v) = (
        stream.upload(&call.q_host).unwrap(),
        stream.upload(&call.k_host).unwrap(),
        stream.upload(&call.v_host).unwrap(),
    );
    let out = kernels
        .forward(&stream, &q, &k, &v, &[], shape)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let want = reference::forward(def, &call.inputs, Options::default()).expect("reference");
    let err = rel_err(&download_f64(&stream, &out.o), &want.o.data);
    let (rows_ok, rows) = check_row_outputs(test, kernels.row_output_names(), &out, &stream, &want);
    (err, rows_ok, rows)
}

/// Untuned prefill on a small grid (sm_90a): `compile_for_shape` takes the
/// cost model's first plan where it ranks the persistent default 1.3 times
/// slower (`untuned_config_for_shape`), and that tile matches the reference
/// — causal and not, Dqk 192 with Dv 128, a score closure without a
/// normalising state, at lengths that are not tile multiples.
#[test]
fn gpu_forward_small_grids_take_the_models_tile() {
    let test = "gpu_forward_small_grids_take_the_models_tile";
    let Some(device) = device(test) else { return };
    if Isa::for_arch(device.arch()) != Isa::Sm90a {
        skip(test, "the model's choice applies on sm_90a only");
        return;
    }
    for (name, dims, shape) in [
        (
            "softmax_causal",
            HeadDims::square(128),
            Shape::mha(1, 12, 300, 300),
        ),
        (
            "deepseek",
            HeadDims::new(192, 128),
            Shape::mha(1, 12, 300, 300),
        ),
        (
            "sigmoid",
            HeadDims::square(128),
            Shape::mha(2, 32, 250, 250),
        ),
        (
            "softmax",
            HeadDims::square(128),
            Shape::mha(2, 16, 500, 333),
        ),
        // Dv 256 in a 64-row tile, and a causal grid the model moved off
        // the default once the H100's L2 bandwidth was fitted (session 43).
        (
            "diff_transformer",
            HeadDims::new(128, 256),
            Shape::mha(2, 16, 500, 500),
        ),
        (
            "softmax_causal",
            HeadDims::square(128),
            Shape::mha(1, 16, 1000, 1000),
        ),
    ] {
        let def = example(name);
        let Some(kernels) = compiled(
            test,
            ParallelKernels::compile_for_shape(
                &def,
                &device,
                dims,
                shape,
                &KernelOptions::default(),
            ),
        ) else {
            return;
        };
        let chosen = &kernels.forward_source().name;
        let plain = ForwardConfig::default_for(&def, dims.dqk, dims.dv, Elem::Bf16, Isa::Sm90a);
        let plain_name = aec::compiler::parallel_forward(&def, dims.dqk, dims.dv, &plain)
            .unwrap()
            .name;
        assert_ne!(
            chosen, &plain_name,
            "{test}: {name} {shape} runs the model's tile"
        );
        let (err, rows_ok, rows) =
            against_reference(test, &device, &def, &kernels, shape, dims, test);
        eprintln!(
            "{test}: {name} {shape} `{chosen}` (default `{plain_name}`): rel_err(o)={err:.2e} rows[{}]",
            rows.join(", ")
        );
        assert!(
            err < 1e-2 && rows_ok,
            "{test}: {name} o {err:.3e}, rows {rows:?}"
        );
    }
}

/// Split-KV with the combine in the main kernel (`fused_combine`): the last
/// block of each row block merges the partial rows. Decoding with one, two
/// and four key warps (the others stay for the merge), with Dv split between
/// two blocks (the count covers both slices), at lengths where splits end
/// mid-block and where the last splits see no key; paged decoding; the
/// latent cache with Dv split between warps. Row outputs are checked too:
/// the merged state must be the one pass's.
#[test]
fn gpu_forward_fused_combine() {
    let test = "gpu_forward_fused_combine";
    let def = example("decode");
    let base = ForwardConfig {
        block_m: 16,
        pack_gqa: true,
        split_kv: true,
        fused_combine: true,
        ..ForwardConfig::default_for(&def, 128, 128, Elem::Bf16, Isa::Sm80)
    };
    let tiles = [(1, 1, 32, 1), (2, 2, 32, 1), (4, 4, 128, 1), (2, 2, 32, 2)];
    for (warps, key_warps, block_n, dv_split) in tiles {
        let options = KernelOptions {
            config: Some(ForwardConfig {
                warps,
                key_warps,
                block_n,
                dv_split,
                ..base
            }),
            ..KernelOptions::default()
        };
        // (Lengths that split for 128-key blocks too.)
        for shape in [
            Shape::new(1, 4, 2, 1, 3001),
            Shape::new(3, 8, 2, 1, 1301),
            Shape::new(2, 16, 1, 1, 999),
        ] {
            if let Some(gpu) = common::gpu::prepare_with(
                test,
                "decode",
                shape,
                HeadDims::square(128),
                (0.0, 1.0),
                &options,
            ) {
                let source = gpu.kernels.forward_source();
                assert!(
                    source.name.ends_with("_fc") || source.name.contains("_fc_"),
                    "{}",
                    source.name
                );
                assert!(
                    source.combine.is_none(),
                    "no combine kernel: {:?}",
                    source.combine
                );
                assert!(gpu.kernels.kv_splits(shape) > 1, "{shape}: one split");
            }
            check_example_with(
                &format!("{test} ({warps} warps, {key_warps} key warps, Dv/{dv_split}, {shape})"),
                "decode",
                shape,
                HeadDims::square(128),
                (0.0, 1.0),
                &options,
            );
        }
    }
    check_paged_decode(
        test,
        &KernelOptions {
            config: Some(ForwardConfig {
                warps: 2,
                key_warps: 2,
                block_n: 32,
                ..base
            }),
            ..KernelOptions::default()
        },
    );
    let latent = example("mla_decode");
    let shape = Shape::new(2, 16, 1, 1, 1301);
    let config = ForwardConfig {
        dv_split: 1,
        warps: 2,
        key_warps: 1,
        dv_warps: 2,
        fused_combine: true,
        ..ForwardConfig::default_for(&latent, 576, 512, Elem::Bf16, Isa::Sm80)
    };
    check_latent_tile(test, shape, config, "_fc");
}

/// Query heads of a group packed into the rows (the decoding kernels'
/// layout) at a length where 16-row tiles straddle heads, with a causal
/// mask: the tile's positions and the loop bound must cover both heads.
#[test]
fn gpu_forward_packed_gqa_rows_across_heads() {
    let packed = |def: &aec::frontend::Variant, d: u32| KernelOptions {
        config: Some(ForwardConfig {
            block_m: 16,
            block_n: 64,
            warps: 1,
            pack_gqa: true,
            ..ForwardConfig::default_for(def, d, d, Elem::Bf16, Isa::Sm80)
        }),
        ..KernelOptions::default()
    };
    check_example_with(
        "gpu_forward_packed_gqa_rows_across_heads",
        "softmax_gqa",
        Shape::new(2, 8, 2, 37, 70),
        HeadDims::square(64),
        (0.0, 1.0),
        &packed(&common::example("softmax_gqa"), 64),
    );
    check_example_with(
        "gpu_forward_packed_gqa_rows_across_heads (causal)",
        "softmax_causal",
        Shape::mha(2, 3, 37, 37),
        HeadDims::square(64),
        (0.0, 1.0),
        &packed(&common::example("softmax_causal"), 64),
    );
}

/// f16 tensors: the softmax forward and backward with f16 operands against
/// the f64 reference, and bf16 buffers refused by f16 kernels.
#[test]
fn gpu_f16_forward_and_backward() {
    let test = "gpu_f16_forward_and_backward";
    let Some(device) = device(test) else {
        return;
    };
    let def = common::example("softmax_gqa");
    let options = KernelOptions {
        elem: Elem::F16,
        ..KernelOptions::default()
    };
    let dims = HeadDims::square(64);
    let Some(kernels) = compiled(
        test,
        ParallelKernels::compile(&def, &device, dims, &options),
    ) else {
        return;
    };
    let shape = Shape::new(2, 4, 2, 77, 91);
    let call = common::gpu::random_call(&def, shape, dims, (0.0, 1.0), test);
    // bf16 values are exact in f16 at these magnitudes.
    let to_f16 = |x: &[bf16]| -> Vec<f16> { x.iter().map(|v| f16::from_f32(v.to_f32())).collect() };
    let stream = device.stream();
    let q = stream.upload(&to_f16(&call.q_host)).unwrap();
    let k = stream.upload(&to_f16(&call.k_host)).unwrap();
    let v = stream.upload(&to_f16(&call.v_host)).unwrap();
    let out = kernels
        .forward(&stream, &q, &k, &v, &[], shape)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let fwd = reference::forward(&def, &call.inputs, reference::Options::default()).unwrap();
    let o = download_f64(&stream, &out.o);
    let err_o = rel_err(&o, &fwd.o.data);
    let d_o_host: Vec<f16> = (0..o.len())
        .map(|i| f16::from_f32(((i * 7919 % 1000) as f32 / 500.0) - 1.0))
        .collect();
    let d_o = stream.upload(&d_o_host).unwrap();
    let grads = kernels
        .backward(&stream, &q, &k, &v, &[], &out, &d_o)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let d_o_ref = reference::Tensor {
        shape: fwd.o.shape.clone(),
        data: d_o_host.iter().map(|x| x.to_f64()).collect(),
    };
    let want = reference::backward(&def, &call.inputs, &d_o_ref).unwrap();
    let down = |b: &DeviceBuffer<f16>| download_f64(&stream, b);
    let errs = [
        err_o,
        rel_err(&down(&grads.dq), &want.dq.data),
        rel_err(&down(&grads.dk), &want.dk.data),
        rel_err(&down(&grads.dv), &want.dv.data),
    ];
    let pass = errs.iter().all(|e| *e < 1e-2);
    eprintln!(
        "{test}: {} f16 `{}` on {} {shape}: o={:.2e} dq={:.2e} dk={:.2e} dv={:.2e}",
        if pass { "PASS" } else { "FAIL" },
        def.name,
        device.name(),
        errs[0],
        errs[1],
        errs[2],
        errs[3]
    );
    assert!(pass, "{test}: {errs:?}");
    // bf16 buffers do not fit f16 kernels.
    let qb = stream.upload(&call.q_host).unwrap();
    let kb = stream.upload(&call.k_host).unwrap();
    let vb = stream.upload(&call.v_host).unwrap();
    match kernels.forward(&stream, &qb, &kb, &vb, &[], shape) {
        Err(Error::Shape(m)) => assert!(
            m.starts_with(
                "q, k and v are bf16 but the kernels of `SoftmaxGqa` were compiled for f16"
            ),
            "{m}"
        ),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
}

#[test]
fn gpu_forward_alibi() {
    check_example(
        "gpu_forward_alibi",
        "alibi",
        Shape::mha(2, 4, 133, 133),
        HeadDims::square(64),
        (0.01, 0.3),
    );
}

#[test]
fn gpu_forward_relative_bias() {
    // An indexed input: rel[i − j + 16], clamped at both ends of the table
    // (Skv − Sq = 37 puts distances past either end).
    check_example(
        "gpu_forward_relative_bias",
        "relative_bias",
        Shape::mha(2, 3, 100, 137),
        HeadDims::square(64),
        (-1.0, 1.0),
    );
}

#[test]
fn gpu_forward_document_mask() {
    check_example(
        "gpu_forward_document_mask",
        "document_mask",
        Shape::mha(2, 2, 150, 150),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

#[test]
fn gpu_forward_sigmoid() {
    check_example(
        "gpu_forward_sigmoid",
        "sigmoid",
        Shape::mha(2, 4, 97, 133),
        HeadDims::square(64),
        (0.0, 1.0),
    );
}

attention! {
    /// Softmax attention, declared in the test (the `Variant::compile` path).
    pub struct TestSoftmax: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = exp(s - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
        }
    }
}

attention! {
    /// RetNet-style retention, declared in the test.
    pub struct TestRetention: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        decay = |b, h, t| 0.9;
    }
}

#[test]
fn gpu_shape_error_returns_before_launch() {
    let test = "gpu_shape_error_returns_before_launch";
    let Some(device) = device(test) else {
        return;
    };
    let Some(kernels) = compiled(
        test,
        TestSoftmax::compile(&device, HeadDims::square(64), &KernelOptions::default()),
    ) else {
        return;
    };
    let stream = device.stream();
    let shape = Shape::mha(2, 4, 37, 37);
    let n = 2 * 4 * 37 * 64;
    let host = |len: usize, c: f32| -> Vec<bf16> {
        (0..len)
            .map(|i| bf16::from_f32(c * ((i % 13) as f32 - 6.0) / 8.0))
            .collect()
    };
    let (q_host, k_bad_host, v_host) = (host(n, 1.0), host(4096, 0.5), host(n, 0.25));
    let q = stream.upload(&q_host).unwrap();
    let k_bad = stream.upload(&k_bad_host).unwrap();
    let v = stream.upload(&v_host).unwrap();
    match kernels.forward(&stream, &q, &k_bad, &v, &[], shape) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "tensor `k` has 4096 elements, expected [B, H, Skv, Dqk] = [2, 4, 37, 64] = 18944"
        ),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    let extra = stream.upload(&[0.5f32; 4]).unwrap();
    match kernels.forward(&stream, &q, &v, &v, &[("slopes", &extra)], shape) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "unknown custom input `slopes`: `TestSoftmax` declares no custom inputs"
        ),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    match kernels.forward(&stream, &q, &v, &v, &[], Shape::new(2, 4, 2, 37, 37)) {
        Err(Error::Shape(m)) => assert!(m.contains("so Hkv must equal H"), "{m}"),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    // Nothing ran: the stream is clean and the inputs are untouched.
    stream.synchronize().unwrap();
    assert_eq!(stream.download(&q).unwrap(), q_host);
    assert_eq!(stream.download(&k_bad).unwrap(), k_bad_host);
    assert_eq!(stream.download(&v).unwrap(), v_host);
    // The same kernels then run a correct call.
    let k = stream.upload(&host(n, 0.5)).unwrap();
    let out = kernels.forward(&stream, &q, &k, &v, &[], shape).unwrap();
    let o = stream.download(&out.o).unwrap();
    assert_eq!(o.len(), n);
    assert!(o.iter().all(|x| x.to_f32().is_finite()));
    let lse = out.download_row(&stream, "lse").unwrap();
    assert_eq!(lse.len(), shape.rows());
    assert!(lse.iter().all(|x| x.is_finite()));
    assert!(matches!(
        out.download_row(&stream, "nope"),
        Err(Error::Shape(m)) if m == "no row output `nope`; this kernel has scale.lse, state.m, state.l"
    ));
    eprintln!("{test}: PASS (shape errors before launch, then a correct launch)");
}

#[test]
fn gpu_recurrent_compile_errors_clearly() {
    let test = "gpu_recurrent_compile_errors_clearly";
    let Some(device) = device(test) else {
        return;
    };
    match TestRetention::compile(&device, HeadDims::square(64), &KernelOptions::default()) {
        Err(Error::Pattern(m)) => assert!(
            m.starts_with("`TestRetention` is a recurrent variant: ParallelKernels runs parallel variants only; compile it with RecurrentKernels::compile"),
            "{test}: {m}"
        ),
        other => panic!("{test}: expected Error::Pattern, got {other:?}"),
    }
    let parsed = example("gla");
    let r = ParallelKernels::compile(
        &parsed,
        &device,
        HeadDims::square(64),
        &KernelOptions::default(),
    );
    assert!(
        matches!(&r, Err(Error::Pattern(m)) if m.contains("is a recurrent variant") && m.contains("RecurrentKernels")),
        "{test}: {r:?}"
    );
    eprintln!("{test}: PASS");
}

// ------------------------------------------------- variable-length batches

fn varlen_error(
    name: &str,
    dims: HeadDims,
    heads: (usize, usize),
    cu_q: &[usize],
    cu_k: &[usize],
    tensors: &[(&str, usize)],
) -> String {
    let batch = VarlenBatch {
        heads: heads.0,
        kv_heads: heads.1,
        cu_seqlens_q: cu_q,
        cu_seqlens_k: cu_k,
    };
    match aec::check_varlen_shapes(&example(name), dims, &batch, tensors) {
        Err(Error::Shape(m)) => m,
        other => panic!("expected Error::Shape, got {other:?}"),
    }
}

#[test]
fn cpu_varlen_boundaries_and_tensors_are_checked() {
    let d = HeadDims::square(64);
    let qkv = |tq: usize, tk: usize| [("q", 2 * tq * 64), ("k", 2 * tk * 64), ("v", 2 * tk * 64)];
    assert_eq!(
        varlen_error(
            "softmax",
            d,
            (2, 2),
            &[0, 5, 5, 9],
            &[0, 5, 6, 9],
            &qkv(9, 9)
        ),
        "`cu_seqlens_q` is not increasing: entry 2 is 5 after 5 (sequence 1 would have no rows)"
    );
    assert_eq!(
        varlen_error("softmax", d, (2, 2), &[1, 5], &[0, 5], &qkv(5, 5)),
        "`cu_seqlens_q` starts at 1; the first sequence starts at row 0"
    );
    assert_eq!(
        varlen_error("softmax", d, (2, 2), &[0, 5, 9], &[0], &qkv(9, 9)),
        "`cu_seqlens_k` has 1 entries; a packed batch of N sequences needs N + 1 (0, the end \
         of each sequence)"
    );
    assert_eq!(
        varlen_error("softmax", d, (2, 2), &[0, 5, 9], &[0, 9], &qkv(9, 9)),
        "`cu_seqlens_q` has 3 entries but `cu_seqlens_k` 2: both give N + 1 boundaries of the \
         same N sequences"
    );
    assert_eq!(
        varlen_error("softmax", d, (2, 2), &[0, 5, 9], &[0, 4, 12], &qkv(9, 11)),
        "`cu_seqlens_k` ends at 12, but k holds 11 rows ([1, heads, rows, Dqk] with 2 heads): \
         the last entry must be the total number of rows"
    );
    // v is checked against the packed shape like any tensor.
    assert_eq!(
        varlen_error(
            "softmax",
            d,
            (2, 2),
            &[0, 5, 9],
            &[0, 4, 12],
            &[("q", 2 * 9 * 64), ("k", 2 * 12 * 64), ("v", 2 * 11 * 64)]
        ),
        "tensor `v` has 1408 elements, expected [B, H, Skv, Dv] = [1, 2, 12, 64] = 1536"
    );
    // Inputs over positions have no packed layout.
    assert_eq!(
        varlen_error("document_mask", d, (2, 2), &[0, 9], &[0, 9], &qkv(9, 9)),
        "custom input `doc_q` of `DocumentMask` is declared over [B, Sq]; in a packed \
         variable-length batch every sequence is a batch of one at its own positions, so an \
         input over B, Sq or Skv has no packed layout: run its sequences as separate calls of \
         `forward`"
    );
    // A fixed Sq holds for every sequence (decoding: one query each).
    let dec = HeadDims::square(128);
    assert_eq!(
        varlen_error(
            "decode",
            dec,
            (4, 2),
            &[0, 1, 3],
            &[0, 50, 80],
            &[("q", 4 * 3 * 128), ("k", 2 * 80 * 128), ("v", 2 * 80 * 128)]
        ),
        "`Decode` fixes Sq = 1, but sequence 1 has 2 rows (`cu_seqlens_q`)"
    );
    let batch = VarlenBatch {
        heads: 4,
        kv_heads: 2,
        cu_seqlens_q: &[0, 1, 2],
        cu_seqlens_k: &[0, 50, 80],
    };
    let (packed, sizes) = aec::check_varlen_shapes(
        &example("decode"),
        dec,
        &batch,
        &[("q", 4 * 2 * 128), ("k", 2 * 80 * 128), ("v", 2 * 80 * 128)],
    )
    .expect("a valid varlen decode call");
    assert_eq!(packed, Shape::new(1, 4, 2, 2, 80));
    assert_eq!(sizes, Shape::new(2, 4, 2, 1, 50));
}

#[test]
fn cpu_varlen_forward_generates_without_a_gpu() {
    let v = example("softmax_causal");
    for isa in [Isa::Sm80, Isa::Sm90a] {
        let k =
            aec::varlen_forward_source(&v, HeadDims::square(128), &KernelOptions::default(), isa)
                .unwrap();
        assert!(k.name.ends_with("_varlen"), "{}", k.name);
        assert_eq!(
            &k.args[k.args.len() - 2..],
            &[
                aec::compiler::ArgKind::CuSeqlens,
                aec::compiler::ArgKind::CuSeqlensKv
            ]
        );
        assert!(k.source.contains("cu_q[bz + 1] - q_start"));
        // Its backward: the same arguments after the sizes; the main kernel
        // takes the sequence's lengths, the row kernels find a row's sequence.
        let b =
            aec::varlen_backward_source(&v, HeadDims::square(128), &KernelOptions::default(), isa)
                .unwrap();
        assert!(
            b.varlen && b.main.name.ends_with("_varlen_main"),
            "{}",
            b.main.name
        );
        assert_eq!(
            &b.args[b.args.len() - 2..],
            &[
                aec::compiler::ArgKind::CuSeqlens,
                aec::compiler::ArgKind::CuSeqlensKv
            ]
        );
        assert!(b.source.contains("cu_q[bz + 1] - q_start"));
        assert!(b.source.contains("if (cu_q[mid] <= t_)"));
        let dense = aec::backward_source(&v, HeadDims::square(128), &KernelOptions::default(), isa)
            .unwrap();
        assert!(!dense.varlen && !dense.source.contains("cu_q"));
    }
    // The decoding variant's packed, split-KV tile loses both forms.
    let k = aec::varlen_forward_source(
        &example("decode"),
        HeadDims::square(128),
        &KernelOptions::default(),
        Isa::Sm90a,
    )
    .unwrap();
    assert!(!k.packed_gqa && k.combine.is_none(), "{}", k.name);
}

/// A call's custom inputs on the device, by name.
fn upload_customs(
    stream: &Stream,
    call: &common::gpu::RandomCall,
) -> Vec<(String, DeviceBuffer<f32>)> {
    call.customs_host
        .iter()
        .map(|(n, x)| (n.clone(), stream.upload(x).unwrap()))
        .collect()
}

/// Uploads `host`, the per-sequence tensors `[1, heads, len_n, d]` packed
/// into `[1, heads, Σ len_n, d]`.
fn pack(parts: &[(&[bf16], usize)], heads: usize, d: usize) -> Vec<bf16> {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let mut out = Vec::with_capacity(heads * total * d);
    for h in 0..heads {
        for &(data, len) in parts {
            out.extend_from_slice(&data[h * len * d..(h + 1) * len * d]);
        }
    }
    out
}

/// The variable-length forward of example `name` over sequences of
/// `lens` (query, key) rows against the f64 reference run on each sequence
/// alone (`B = 1`), custom inputs shared.
fn check_varlen(
    test: &str,
    name: &str,
    heads: (usize, usize),
    lens: &[(usize, usize)],
    dims: HeadDims,
    options: &KernelOptions,
) {
    let Some(device) = device(test) else { return };
    let def = example(name);
    let Some(kernels) = compiled(test, ParallelKernels::compile(&def, &device, dims, options))
    else {
        return;
    };
    let stream = device.stream();
    let (h, hkv) = heads;
    let calls: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(n, &(lq, lk))| {
            common::gpu::random_call(
                &def,
                Shape::new(1, h, hkv, lq, lk),
                dims,
                (0.0, 0.5),
                &format!("{name}{n}"),
            )
        })
        .collect();
    let (dqk, dv) = (dims.dqk as usize, dims.dv as usize);
    // Each tensor's sequences packed: (host data of a call, its rows, heads, width).
    let packed = |part: fn(&common::gpu::RandomCall) -> &[bf16],
                  rows: fn(&(usize, usize)) -> usize,
                  heads,
                  d| {
        let parts: Vec<_> = calls
            .iter()
            .zip(lens)
            .map(|(c, l)| (part(c), rows(l)))
            .collect();
        pack(&parts, heads, d)
    };
    let q = packed(|c| &c.q_host, |l| l.0, h, dqk);
    let k = packed(|c| &c.k_host, |l| l.1, hkv, dqk);
    let v = packed(|c| &c.v_host, |l| l.1, hkv, dv);
    let mut cu_q = vec![0];
    let mut cu_k = vec![0];
    for &(lq, lk) in lens {
        cu_q.push(cu_q.last().unwrap() + lq);
        cu_k.push(cu_k.last().unwrap() + lk);
    }
    // Every sequence shares the first one's custom inputs (over heads only).
    let custom_bufs = upload_customs(&stream, &calls[0]);
    let customs: Vec<(&str, &DeviceBuffer<f32>)> =
        custom_bufs.iter().map(|(n, b)| (n.as_str(), b)).collect();
    let (qb, kb, vb) = (
        stream.upload(&q).unwrap(),
        stream.upload(&k).unwrap(),
        stream.upload(&v).unwrap(),
    );
    let batch = VarlenBatch {
        heads: h,
        kv_heads: hkv,
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
    };
    let out = kernels
        .forward_varlen(&stream, &qb, &kb, &vb, &customs, &batch)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let tq = *cu_q.last().unwrap();
    assert_eq!(out.shape, Shape::new(1, h, hkv, tq, *cu_k.last().unwrap()));
    let o = download_f64(&stream, &out.o);
    // The reference per sequence, scattered into the packed layout.
    let mut want_o = vec![0.0; o.len()];
    let names = kernels.row_output_names().to_vec();
    let mut want_rows = vec![vec![f64::NAN; h * tq]; names.len()];
    for (n, call) in calls.iter().enumerate() {
        let mut inputs = call.inputs.clone();
        inputs.customs = calls[0].inputs.customs.clone();
        let fwd = reference::forward(&def, &inputs, Options::default()).expect("reference");
        let lq = lens[n].0;
        for hh in 0..h {
            for i in 0..lq {
                let dst = (hh * tq + cu_q[n] + i) * dv;
                let src = (hh * lq + i) * dv;
                want_o[dst..dst + dv].copy_from_slice(&fwd.o.data[src..src + dv]);
                for (r, name) in names.iter().enumerate() {
                    let t = match name.split_once('.') {
                        Some(("scale", s)) => &fwd.scales[s],
                        Some(("state", f)) => &fwd.row_state[f],
                        _ => panic!("{test}: unexpected row output `{name}`"),
                    };
                    want_rows[r][hh * tq + cu_q[n] + i] = t.data[hh * lq + i];
                }
            }
        }
    }
    let err = rel_err(&o, &want_o);
    let mut row_errs = Vec::new();
    for (r, name) in names.iter().enumerate() {
        let got = out.download_row(&stream, name).unwrap();
        let (mut g, mut w) = (Vec::new(), Vec::new());
        for (x, y) in got.iter().zip(&want_rows[r]) {
            if y.is_finite() {
                g.push(f64::from(*x));
                w.push(*y);
            } else {
                assert_eq!(f64::from(*x), *y, "{test}: {name} differs on a masked row");
            }
        }
        row_errs.push((name.clone(), rel_err(&g, &w)));
    }
    let pass = err < 1e-2 && row_errs.iter().all(|(_, e)| *e < 1e-2);
    eprintln!(
        "{test}: {} `{}` on {} H={h} Hkv={hkv} lens={lens:?} Dqk={} Dv={}: rel_err(o)={err:.2e} rows{row_errs:?}",
        if pass { "PASS" } else { "FAIL" },
        kernels.varlen_source().unwrap().name,
        device.name(),
        dims.dqk,
        dims.dv,
    );
    assert!(err < 1e-2, "{test}: relative error of o {err:.3e}");
    for (name, e) in &row_errs {
        assert!(*e < 1e-2, "{test}: relative error of {name} {e:.3e}");
    }
    // The backward of the packed batch against the reference backward of
    // each sequence alone (custom-input gradients summed over sequences).
    let mut rng = common::gpu::seeded(tq as u64);
    let d_o_seq: Vec<Vec<bf16>> = lens
        .iter()
        .map(|&(lq, _)| {
            (0..h * lq * dv)
                .map(|_| bf16::from_f64(common::gpu::normal(&mut rng)))
                .collect()
        })
        .collect();
    let parts: Vec<_> = d_o_seq
        .iter()
        .zip(lens)
        .map(|(x, l)| (x.as_slice(), l.0))
        .collect();
    let d_o = stream.upload(&pack(&parts, h, dv)).unwrap();
    let grads = kernels
        .backward(&stream, &qb, &kb, &vb, &customs, &out, &d_o)
        .unwrap_or_else(|e| panic!("{test}: backward: {e}"));
    let tk = *cu_k.last().unwrap();
    let mut want_dq = vec![0.0; h * tq * dqk];
    let mut want_dk = vec![0.0; hkv * tk * dqk];
    let mut want_dv = vec![0.0; hkv * tk * dv];
    let mut want_customs: Vec<(String, Vec<f64>)> = Vec::new();
    for (n, call) in calls.iter().enumerate() {
        let mut inputs = call.inputs.clone();
        inputs.customs = calls[0].inputs.customs.clone();
        let (lq, lk) = lens[n];
        let d_o_ref = reference::Tensor {
            shape: vec![1, h, lq, dv],
            data: d_o_seq[n].iter().map(|x| x.to_f64()).collect(),
        };
        let want = reference::backward(&def, &inputs, &d_o_ref).expect("reference backward");
        // Rows `len` of each head of a sequence's tensor into the packed one.
        let scatter = |dst: &mut [f64], src: &[f64], heads, len, start, total, d| {
            for hh in 0..heads {
                for r in 0..len {
                    let (a, b) = ((hh * total + start + r) * d, (hh * len + r) * d);
                    dst[a..a + d].copy_from_slice(&src[b..b + d]);
                }
            }
        };
        scatter(&mut want_dq, &want.dq.data, h, lq, cu_q[n], tq, dqk);
        scatter(&mut want_dk, &want.dk.data, hkv, lk, cu_k[n], tk, dqk);
        scatter(&mut want_dv, &want.dv.data, hkv, lk, cu_k[n], tk, dv);
        for (cname, g) in &want.customs {
            match want_customs.iter_mut().find(|(c, _)| c == cname) {
                Some((_, acc)) => acc.iter_mut().zip(&g.data).for_each(|(a, x)| *a += x),
                None => want_customs.push((cname.clone(), g.data.clone())),
            }
        }
    }
    let mut grad_errs = vec![
        (
            "dq".to_string(),
            rel_err(&download_f64(&stream, &grads.dq), &want_dq),
        ),
        (
            "dk".to_string(),
            rel_err(&download_f64(&stream, &grads.dk), &want_dk),
        ),
        (
            "dv".to_string(),
            rel_err(&download_f64(&stream, &grads.dv), &want_dv),
        ),
    ];
    for (cname, want) in &want_customs {
        let got = download_f64(&stream, grads.custom(cname).expect("a gradient per input"));
        let norm: f64 = want.iter().map(|x| x * x).sum();
        let e = if norm == 0.0 {
            got.iter().map(|x| x.abs()).fold(0.0, f64::max)
        } else {
            rel_err(&got, want)
        };
        grad_errs.push((format!("d{cname}"), e));
    }
    let bwd = kernels.varlen_backward_source().unwrap();
    let pass = grad_errs.iter().all(|(_, e)| *e < 2e-2);
    eprintln!(
        "{test}: {} backward `{}` (m{}w{}s{}{}): {grad_errs:?}",
        if pass { "PASS" } else { "FAIL" },
        bwd.main.name,
        bwd.config.block_m,
        bwd.config.warps,
        bwd.config.split_d,
        if bwd.config.wgmma { " wgmma" } else { "" },
    );
    assert!(pass, "{test}: backward {grad_errs:?}");
}

/// Sequence lengths that are not tile multiples, one of a single row, and
/// more keys than queries in some.
const VARLEN_LENS: [(usize, usize); 5] = [(70, 70), (1, 9), (130, 300), (256, 256), (33, 200)];

#[test]
fn gpu_varlen_softmax_causal() {
    check_varlen(
        "gpu_varlen_softmax_causal",
        "softmax_causal",
        (4, 4),
        &VARLEN_LENS,
        HeadDims::square(128),
        &KernelOptions::default(),
    );
    // The persistent walk (the dense default on sm_90a) over the same batch.
    let v = example("softmax_causal");
    let isa = device("gpu_varlen_softmax_causal").map(|d| Isa::for_arch(d.arch()));
    if let Some(isa) = isa {
        let mut cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, isa);
        cfg.persistent = cfg.warp_specialized;
        check_varlen(
            "gpu_varlen_softmax_causal_persistent",
            "softmax_causal",
            (4, 4),
            &VARLEN_LENS,
            HeadDims::square(128),
            &KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
}

#[test]
fn gpu_varlen_softmax_causal_sm80_template() {
    // The sm_80 templates (a block per row block; the mma.sync backward) on
    // any GPU.
    let v = example("softmax_causal");
    let options = KernelOptions {
        config: Some(ForwardConfig::default_for(
            &v,
            128,
            128,
            Elem::Bf16,
            Isa::Sm80,
        )),
        backward_config: Some(BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80)),
        ..KernelOptions::default()
    };
    check_varlen(
        "gpu_varlen_softmax_causal_sm80_template",
        "softmax_causal",
        (4, 4),
        &VARLEN_LENS,
        HeadDims::square(128),
        &options,
    );
}

#[test]
fn gpu_varlen_gqa_alibi_deepseek() {
    check_varlen(
        "gpu_varlen_gqa",
        "softmax_gqa",
        (8, 2),
        &VARLEN_LENS,
        HeadDims::square(64),
        &KernelOptions::default(),
    );
    check_varlen(
        "gpu_varlen_alibi",
        "alibi",
        (3, 3),
        &VARLEN_LENS,
        HeadDims::square(64),
        &KernelOptions::default(),
    );
    check_varlen(
        "gpu_varlen_deepseek",
        "deepseek",
        (2, 2),
        &VARLEN_LENS,
        HeadDims::new(192, 128),
        &KernelOptions::default(),
    );
    check_varlen(
        "gpu_varlen_sliding_window",
        "sliding_window",
        (2, 2),
        &VARLEN_LENS,
        HeadDims::square(64),
        &KernelOptions::default(),
    );
}

#[test]
fn gpu_varlen_decode() {
    // One query per sequence over key caches of different lengths.
    check_varlen(
        "gpu_varlen_decode",
        "decode",
        (8, 2),
        &[(1, 1000), (1, 37), (1, 513), (1, 1)],
        HeadDims::square(128),
        &KernelOptions::default(),
    );
}

// ------------------------------------------------------- paged KV caches

fn paged_error(
    name: &str,
    dims: HeadDims,
    paged: &PagedKv<'_>,
    tensors: &[(&str, usize)],
) -> String {
    match aec::check_paged_shapes(&example(name), dims, paged, tensors) {
        Err(Error::Shape(m)) => m,
        other => panic!("expected Error::Shape, got {other:?}"),
    }
}

#[test]
fn cpu_paged_tables_and_caches_are_checked() {
    let d = HeadDims::square(128);
    // 6 pages of 2 KV heads x 16 rows.
    let cache = 6 * 2 * 16 * 128;
    let ok_tensors = [("q", 2 * 4 * 128), ("k", cache), ("v", cache)];
    let call = |page_size, table: &'static [u32], seqlens: &'static [usize]| PagedKv {
        heads: 4,
        kv_heads: 2,
        queries: 1,
        page_size,
        block_table: table,
        seqlens_k: seqlens,
    };
    assert_eq!(
        paged_error(
            "decode",
            d,
            &call(48, &[0, 1, 2, 3], &[20, 30]),
            &ok_tensors
        ),
        "page size 48 is not supported: pages hold a power of two of rows from 16 to 256"
    );
    assert_eq!(
        paged_error("decode", d, &call(16, &[0, 1, 2], &[20, 30]), &ok_tensors),
        "`block_table` has 3 entries, which is not B = 2 rows (one per entry of `seqlens_k`) \
         of at least one page"
    );
    assert_eq!(
        paged_error(
            "decode",
            d,
            &call(16, &[0, 1, 2, 3], &[20, 33]),
            &ok_tensors
        ),
        "sequence 1 has 33 keys (`seqlens_k[1]`), but its 2 pages of 16 rows hold 1 to 32"
    );
    assert_eq!(
        paged_error("decode", d, &call(16, &[0, 1, 2, 3], &[20, 0]), &ok_tensors),
        "sequence 1 has 0 keys (`seqlens_k[1]`), but its 2 pages of 16 rows hold 1 to 32"
    );
    // The second page of sequence 1 is read; the unread entry of sequence 0 is not.
    assert_eq!(
        paged_error(
            "decode",
            d,
            &call(16, &[0, 99, 2, 6], &[16, 20]),
            &ok_tensors
        ),
        "`block_table[1][1]` = 6 points outside the cache of 6 pages (sequence 1 reads its \
         first 2 pages)"
    );
    assert_eq!(
        paged_error(
            "decode",
            d,
            &call(16, &[0, 1, 2, 3], &[20, 30]),
            &[("q", 2 * 4 * 128), ("k", cache + 5), ("v", cache)]
        ),
        "tensor `k` has 24581 elements, which is not a whole number of pages [Hkv, page size, \
         Dqk] = [2, 16, 128]: the cache is [pages, Hkv, page size, Dqk]"
    );
    assert_eq!(
        paged_error(
            "decode",
            d,
            &call(16, &[0, 1, 2, 3], &[20, 30]),
            &[
                ("q", 2 * 4 * 128),
                ("k", cache),
                ("v", cache - 2 * 16 * 128)
            ]
        ),
        "tensor `v` has 20480 elements, expected [pages, Hkv, page size, Dv] = [6, 2, 16, 128] \
         = 24576 (as many pages as k)"
    );
    assert_eq!(
        paged_error(
            "decode",
            d,
            &PagedKv {
                queries: 2,
                ..call(16, &[0, 1, 2, 3], &[20, 30])
            },
            &ok_tensors
        ),
        "`Decode` fixes Sq = 1, but the call has 2 queries per sequence"
    );
    assert_eq!(
        paged_error(
            "decode",
            d,
            &call(16, &[0, 99, 2, 3], &[16, 30]),
            &[("q", 2 * 4 * 127), ("k", cache), ("v", cache)]
        ),
        "tensor `q` has 1016 elements, expected [B, H, Sq, Dqk] = [2, 4, 1, 128] = 1024"
    );
    let shape = aec::check_paged_shapes(
        &example("decode"),
        d,
        &call(16, &[0, 99, 2, 3], &[16, 30]),
        &ok_tensors,
    )
    .expect("a valid paged call (the unread entry 99 is never checked)");
    assert_eq!(shape, Shape::new(2, 4, 2, 1, 30));
}

/// The forward over a paged cache of example `name` (`queries` rows per
/// sequence, keys `seqlens`, pages of `page_size` rows placed in shuffled
/// order, unread rows and table entries filled with garbage) against the
/// f64 reference run on each sequence alone.
#[allow(clippy::too_many_arguments)]
fn check_paged(
    test: &str,
    name: &str,
    heads: (usize, usize),
    queries: usize,
    seqlens: &[usize],
    page_size: usize,
    dims: HeadDims,
    options: &KernelOptions,
) {
    use rand::seq::SliceRandom;
    let Some(device) = device(test) else { return };
    let def = example(name);
    let Some(kernels) = compiled(test, ParallelKernels::compile(&def, &device, dims, options))
    else {
        return;
    };
    let stream = device.stream();
    let (h, hkv) = heads;
    let (dqk, dv) = (dims.dqk as usize, dims.dv as usize);
    let calls: Vec<_> = seqlens
        .iter()
        .enumerate()
        .map(|(n, &lk)| {
            let mut call = common::gpu::random_call(
                &def,
                Shape::new(1, h, hkv, queries, lk),
                dims,
                (0.0, 0.5),
                &format!("{name}{n}"),
            );
            if options.v_in_k {
                v_from_k(&mut call, dims);
            }
            call
        })
        .collect();
    // One spare table entry per sequence (never read), pages shuffled.
    let per_seq = seqlens.iter().map(|n| n.div_ceil(page_size)).max().unwrap() + 1;
    let used: usize = seqlens.iter().map(|n| n.div_ceil(page_size)).sum();
    let pages = used + 3;
    let mut order: Vec<u32> = (0..pages as u32).collect();
    order.shuffle(&mut common::rng(7));
    let mut table = vec![u32::MAX; seqlens.len() * per_seq];
    let mut next = 0;
    for (s, &n) in seqlens.iter().enumerate() {
        for i in 0..n.div_ceil(page_size) {
            table[s * per_seq + i] = order[next];
            next += 1;
        }
    }
    // Rows no sequence owns hold large values: reading one shows.
    let garbage = bf16::from_f32(30.0);
    let mut k_cache = vec![garbage; pages * hkv * page_size * dqk];
    let mut v_cache = vec![garbage; pages * hkv * page_size * dv];
    for (s, call) in calls.iter().enumerate() {
        let n = seqlens[s];
        for hk in 0..hkv {
            for j in 0..n {
                let page = table[s * per_seq + j / page_size] as usize;
                let row = (page * hkv + hk) * page_size + j % page_size;
                k_cache[row * dqk..(row + 1) * dqk]
                    .copy_from_slice(&call.k_host[(hk * n + j) * dqk..(hk * n + j + 1) * dqk]);
                v_cache[row * dv..(row + 1) * dv]
                    .copy_from_slice(&call.v_host[(hk * n + j) * dv..(hk * n + j + 1) * dv]);
            }
        }
    }
    let q: Vec<bf16> = calls
        .iter()
        .flat_map(|c| c.q_host.iter().copied())
        .collect();
    // Every sequence shares the first one's custom inputs (over heads only).
    let custom_bufs = upload_customs(&stream, &calls[0]);
    let customs: Vec<(&str, &DeviceBuffer<f32>)> =
        custom_bufs.iter().map(|(n, b)| (n.as_str(), b)).collect();
    let (qb, kb, vb) = (
        stream.upload(&q).unwrap(),
        stream.upload(&k_cache).unwrap(),
        stream.upload(&v_cache).unwrap(),
    );
    let paged = PagedKv {
        heads: h,
        kv_heads: hkv,
        queries,
        page_size,
        block_table: &table,
        seqlens_k: seqlens,
    };
    // V stored in K: the K cache is passed as both.
    let vb = if options.v_in_k { &kb } else { &vb };
    let out = kernels
        .forward_paged(&stream, &qb, &kb, vb, &customs, &paged)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let o = download_f64(&stream, &out.o);
    let mut want = Vec::with_capacity(o.len());
    let names = kernels.row_output_names().to_vec();
    let mut want_rows = vec![Vec::new(); names.len()];
    for call in &calls {
        let mut inputs = call.inputs.clone();
        inputs.customs = calls[0].inputs.customs.clone();
        let fwd = reference::forward(&def, &inputs, Options::default()).expect("reference");
        want.extend_from_slice(&fwd.o.data);
        for (r, name) in names.iter().enumerate() {
            let t = match name.split_once('.') {
                Some(("scale", s)) => &fwd.scales[s],
                Some(("state", f)) => &fwd.row_state[f],
                _ => panic!("{test}: unexpected row output `{name}`"),
            };
            want_rows[r].extend_from_slice(&t.data);
        }
    }
    let err = rel_err(&o, &want);
    let mut row_errs = Vec::new();
    for (r, name) in names.iter().enumerate() {
        let got = out.download_row(&stream, name).unwrap();
        let (mut g, mut w) = (Vec::new(), Vec::new());
        for (x, y) in got.iter().zip(&want_rows[r]) {
            if y.is_finite() {
                g.push(f64::from(*x));
                w.push(*y);
            }
        }
        row_errs.push((name.clone(), rel_err(&g, &w)));
    }
    let pass = err < 1e-2 && row_errs.iter().all(|(_, e)| *e < 1e-2);
    eprintln!(
        "{test}: {} `{}` on {} H={h} Hkv={hkv} Sq={queries} seqlens_k={seqlens:?} page={page_size} \
         splits={} Dqk={} Dv={}: rel_err(o)={err:.2e} rows{row_errs:?}",
        if pass { "PASS" } else { "FAIL" },
        kernels.paged_source().unwrap().name,
        device.name(),
        kernels
            .paged_kv_splits(Shape {
                b: seqlens.len(),
                h,
                hkv,
                sq: queries,
                skv: *seqlens.iter().max().unwrap(),
            })
            .unwrap(),
        dims.dqk,
        dims.dv,
    );
    assert!(err < 1e-2, "{test}: relative error of o {err:.3e}");
    for (name, e) in &row_errs {
        assert!(*e < 1e-2, "{test}: relative error of {name} {e:.3e}");
    }
}

/// Makes `call`'s V the first `Dv` columns of its K rows (V stored in K,
/// `KernelOptions::v_in_k`), on the host and in the reference inputs.
fn v_from_k(call: &mut common::gpu::RandomCall, dims: HeadDims) {
    let (dqk, dv) = (dims.dqk as usize, dims.dv as usize);
    for (r, row) in call.v_host.chunks_mut(dv).enumerate() {
        row.copy_from_slice(&call.k_host[r * dqk..r * dqk + dv]);
    }
    let k = &call.inputs.k;
    call.inputs.v =
        aec::frontend::reference::Tensor::from_fn(&call.inputs.v.shape, |idx| k.get(idx));
}

/// A latent-cache call (`mla_decode`, Dqk 576 / Dv 512, V = K's first 512
/// columns) with kernels of `config` and `v_in_k`, prepared on the GPU.
fn prepare_latent(test: &str, shape: Shape, config: ForwardConfig) -> Option<GpuCall> {
    let dims = HeadDims::new(576, 512);
    let options = KernelOptions {
        v_in_k: true,
        config: Some(config),
        ..KernelOptions::default()
    };
    let mut gpu = common::gpu::prepare_with(test, "mla_decode", shape, dims, (0.0, 1.0), &options)?;
    v_from_k(&mut gpu.call, dims);
    Some(gpu)
}

/// Runs a `v_in_k` forward with the cache `k` as both k and v and checks it
/// against the reference of `call` (whose V is K's first Dv columns).
fn check_latent_forward(
    test: &str,
    kernels: &ParallelKernels,
    stream: &aec::runtime::Stream,
    call: &common::gpu::RandomCall,
    q: &DeviceBuffer<bf16>,
    k: &DeviceBuffer<bf16>,
    shape: Shape,
) -> ForwardOutput<bf16> {
    let out = kernels
        .forward(stream, q, k, k, &[], shape)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let want =
        reference::forward(kernels.variant(), &call.inputs, Options::default()).expect("reference");
    let err = rel_err(&download_f64(stream, &out.o), &want.o.data);
    let (rows_ok, rows) = check_row_outputs(test, kernels.row_output_names(), &out, stream, &want);
    eprintln!(
        "{test}: `{}` {shape} splits={}: rel_err(o)={err:.2e} rows[{}]",
        kernels.forward_source().name,
        kernels.kv_splits(shape),
        rows.join(", ")
    );
    assert!(err < 1e-2 && rows_ok, "{test}: o {err:.3e}, rows {rows:?}");
    out
}

/// The latent-cache forward of `config` at `shape` (with KV splits) against
/// the reference; its kernel's name must contain `tag`.
fn check_latent_tile(test: &str, shape: Shape, config: ForwardConfig, tag: &str) {
    let Some(gpu) = prepare_latent(test, shape, config) else {
        return;
    };
    check_latent_call(test, &gpu, shape, tag);
}

/// [`check_latent_tile`] for a call prepared with V = K's first Dv columns.
fn check_latent_call(test: &str, gpu: &GpuCall, shape: Shape, tag: &str) {
    let name = &gpu.kernels.forward_source().name;
    assert!(
        name.contains(tag),
        "{test}: `{name}` is not a `{tag}` kernel"
    );
    assert!(
        gpu.kernels.kv_splits(shape) > 1,
        "{test}: one split at {shape}"
    );
    check_latent_forward(
        test,
        &gpu.kernels,
        &gpu.stream,
        &gpu.call,
        &gpu.q,
        &gpu.k,
        shape,
    );
}

/// Paged decoding with the tiles of `options`: 8 query heads on 2 KV heads,
/// sequences of 1 to 1000 keys in pages of 64.
fn check_paged_decode(test: &str, options: &KernelOptions) {
    check_paged(
        &format!("{test} (paged decode)"),
        "decode",
        (8, 2),
        1,
        &[1000, 37, 513, 1, 300],
        64,
        HeadDims::square(128),
        options,
    );
}

/// Multi-head latent attention decoding with V stored in K (`v_in_k`, Dqk
/// 576, Dv 512, `examples/mla_decode.rs`): the one cache passed as k and v,
/// against the reference with V = K's first 512 columns. Dense with 16
/// query heads on one KV head (the default tiles: two Dv slices, KV splits)
/// and 3 per KV head over a long context (four Dv slices, more splits);
/// paged with pages of 64. A v buffer apart from k and the backward are
/// refused.
#[test]
fn gpu_forward_latent_cache() {
    let test = "gpu_forward_latent_cache";
    let dims = HeadDims::new(576, 512);
    let def = example("mla_decode");
    let default = ForwardConfig::default_for(&def, 576, 512, Elem::Bf16, Isa::Sm80);
    // Dv split between blocks (2, 4), and between the warps of one block
    // (dv_warps: the scores' Dqk split between the pair and summed).
    for (shape, cfg) in [
        (Shape::new(3, 16, 1, 1, 301), default),
        (
            Shape::new(1, 6, 2, 1, 2999),
            ForwardConfig {
                dv_split: 4,
                ..default
            },
        ),
        (
            Shape::new(3, 16, 1, 1, 301),
            ForwardConfig {
                dv_split: 1,
                warps: 4,
                key_warps: 2,
                dv_warps: 2,
                ..default
            },
        ),
        (
            Shape::new(1, 6, 2, 1, 2999),
            ForwardConfig {
                dv_split: 1,
                warps: 2,
                key_warps: 1,
                dv_warps: 2,
                ..default
            },
        ),
        (
            Shape::new(2, 128, 1, 1, 301),
            ForwardConfig {
                block_m: 64,
                dv_split: 1,
                warps: 8,
                key_warps: 1,
                dv_warps: 2,
                ..default
            },
        ),
    ] {
        let Some(gpu) = prepare_latent(test, shape, cfg) else {
            return;
        };
        let GpuCall {
            stream,
            kernels,
            call,
            q,
            k,
            v,
            ..
        } = &gpu;
        assert!(
            kernels.forward_source().v_in_k,
            "{:?}",
            kernels.forward_source().name
        );
        let out = check_latent_forward(test, kernels, stream, call, q, k, shape);
        // A separate V (its own values) would be silently ignored: refused.
        let e = shape_error(kernels.forward(stream, q, k, v, &[], shape).map(|_| ()));
        assert!(
            e.contains("v_in_k") && e.contains("both `k` and `v`"),
            "{e}"
        );
        let d_o = stream
            .upload(&vec![bf16::from_f32(1.0); out.o.len()])
            .unwrap();
        let e = kernels
            .backward(stream, q, k, k, &[], &out, &d_o)
            .map(|_| ())
            .expect_err("backward of a v_in_k forward");
        assert!(e.to_string().contains("not implemented"), "{e}");
    }
    // All 128 heads on the one latent head: compile_for_shape picks 64-row
    // blocks on four warps, wgmma on sm_90a (ForwardConfig::for_packed_rows).
    let Some(device) = device(test) else { return };
    let hopper = Isa::for_arch(device.arch()) == Isa::Sm90a;
    let shape = Shape::new(2, 128, 1, 1, 301);
    let options = KernelOptions {
        v_in_k: true,
        ..KernelOptions::default()
    };
    let Some(kernels) = compiled(
        test,
        ParallelKernels::compile_for_shape(&def, &device, dims, shape, &options),
    ) else {
        return;
    };
    assert_eq!(
        (
            kernels.forward_source().block_m,
            kernels.forward_source().name.contains("_gqa_wgmma")
        ),
        (64, hopper),
        "{}",
        kernels.forward_source().name
    );
    let mut call = common::gpu::random_call(&def, shape, dims, (0.0, 1.0), "mla_decode_h128");
    v_from_k(&mut call, dims);
    let stream = device.stream();
    let (q, k) = (
        stream.upload(&call.q_host).unwrap(),
        stream.upload(&call.k_host).unwrap(),
    );
    check_latent_forward(test, &kernels, &stream, &call, &q, &k, shape);
    check_paged(
        "gpu_paged_latent_cache",
        "mla_decode",
        (16, 1),
        1,
        &[1000, 37, 513, 1, 300],
        64,
        dims,
        &KernelOptions {
            v_in_k: true,
            ..KernelOptions::default()
        },
    );
}

/// The sm_90a decoding tile of many packed rows (`wgmma` without warp
/// specialisation, `ForwardConfig::for_packed_rows`), on Hopper only: the
/// latent cache (V in K, Dqk 576, two or four Dv slices) with 128 and 160
/// heads (a second, partial row block), one-warpgroup 64-row blocks and Dv
/// split between two warpgroups (with and without a producer warpgroup),
/// paged; d128 decoding without V in K (also with a producer warpgroup); packed rows that cross heads inside
/// a row block (Sq 37); a causal mask over two row blocks.
#[test]
fn gpu_forward_packed_wgmma() {
    let test = "gpu_forward_packed_wgmma";
    if sm90a_device(test, "wgmma needs sm_90a").is_none() {
        return;
    }
    let tile =
        |name: &str, dqk: u32, dv: u32, block_m: u32, block_n: u32, dv_split: u32| ForwardConfig {
            block_m,
            block_n,
            warps: block_m / 16,
            pack_gqa: true,
            wgmma: true,
            warp_specialized: false,
            persistent: false,
            tma_loads: false,
            late_epilogue: false,
            kv_multicast: false,
            q_in_registers: false,
            stages: 2,
            dv_split,
            key_warps: 1,
            dv_warps: 1,
            fused_combine: false,
            ..ForwardConfig::default_for(&example(name), dqk, dv, Elem::Bf16, Isa::Sm80)
        };
    for (shape, cfg) in [
        (
            Shape::new(2, 128, 1, 1, 301),
            tile("mla_decode", 576, 512, 128, 32, 2),
        ),
        (
            Shape::new(1, 160, 1, 1, 1777),
            tile("mla_decode", 576, 512, 128, 32, 4),
        ),
        (
            Shape::new(2, 128, 2, 1, 999),
            tile("mla_decode", 576, 512, 64, 64, 2),
        ),
        // Dv split between the two warpgroups of one block, and the same
        // with a producer warpgroup.
        (
            Shape::new(1, 160, 1, 1, 1777),
            ForwardConfig {
                warps: 8,
                dv_warps: 2,
                ..tile("mla_decode", 576, 512, 64, 64, 1)
            },
        ),
        (
            Shape::new(2, 160, 2, 1, 1001),
            ForwardConfig {
                warps: 8,
                dv_warps: 2,
                warp_specialized: true,
                ..tile("mla_decode", 576, 512, 64, 64, 1)
            },
        ),
    ] {
        check_latent_tile(test, shape, cfg, "_gqa_wgmma");
    }
    let decode = |shape: Shape, cfg: ForwardConfig| ("decode", shape, 128, cfg);
    for (what, (name, shape, d, cfg)) in [
        (
            "decode d128",
            decode(
                Shape::new(2, 256, 2, 1, 1001),
                tile("decode", 128, 128, 128, 64, 1),
            ),
        ),
        (
            "decode d128, the packed tile for 64 or more rows per KV head, no producer",
            decode(
                Shape::new(2, 256, 2, 1, 1001),
                ForwardConfig::default_for(&example("decode"), 128, 128, Elem::Bf16, Isa::Sm90a)
                    .for_packed_rows(128, 128, 128, Isa::Sm90a),
            ),
        ),
        (
            "decode d128, Dv warpgroups",
            decode(
                Shape::new(2, 256, 2, 1, 1001),
                ForwardConfig {
                    warps: 8,
                    dv_warps: 2,
                    ..tile("decode", 128, 128, 64, 64, 1)
                },
            ),
        ),
        (
            "decode d128, producer warpgroup",
            decode(
                Shape::new(3, 128, 2, 1, 777),
                ForwardConfig {
                    warp_specialized: true,
                    ..tile("decode", 128, 128, 128, 64, 1)
                },
            ),
        ),
        (
            "rows across heads",
            (
                "softmax_gqa",
                Shape::new(2, 8, 2, 37, 70),
                64,
                tile("softmax_gqa", 64, 64, 128, 32, 1),
            ),
        ),
        (
            "causal",
            (
                "softmax_causal",
                Shape::mha(2, 3, 150, 150),
                64,
                tile("softmax_causal", 64, 64, 128, 32, 1),
            ),
        ),
    ] {
        check_example_with(
            &format!("{test} ({what})"),
            name,
            shape,
            HeadDims::square(d),
            (0.0, 1.0),
            &KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
    // Paged: Dv slices between blocks, and Dv split between the two
    // warpgroups of a block (each loading the K panels it reads again).
    for (what, cfg) in [
        ("", tile("mla_decode", 576, 512, 128, 32, 2)),
        (
            ", Dv warpgroups",
            ForwardConfig {
                warps: 8,
                dv_warps: 2,
                ..tile("mla_decode", 576, 512, 64, 64, 1)
            },
        ),
    ] {
        check_paged(
            &format!("{test} (paged latent cache{what})"),
            "mla_decode",
            (128, 1),
            1,
            &[1000, 37, 513, 1, 300],
            64,
            HeadDims::new(576, 512),
            &KernelOptions {
                v_in_k: true,
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
}

#[test]
fn gpu_paged_decode() {
    // Packed GQA heads and KV splits over pages of 16, 64 and 256 rows.
    for page in [16, 64, 256] {
        check_paged(
            &format!("gpu_paged_decode_page{page}"),
            "decode",
            (8, 2),
            1,
            &[1000, 37, 513, 1, 300],
            page,
            HeadDims::square(128),
            &KernelOptions::default(),
        );
    }
}

#[test]
fn gpu_paged_prefill() {
    check_paged(
        "gpu_paged_prefill_gqa",
        "softmax_gqa",
        (8, 2),
        70,
        &[70, 200, 131],
        64,
        HeadDims::square(64),
        &KernelOptions::default(),
    );
    check_paged(
        "gpu_paged_prefill_causal",
        "softmax_causal",
        (2, 2),
        50,
        &[50, 120, 64],
        16,
        HeadDims::square(128),
        &KernelOptions::default(),
    );
    check_paged(
        "gpu_paged_prefill_alibi",
        "alibi",
        (3, 3),
        33,
        &[33, 300],
        32,
        HeadDims::square(64),
        &KernelOptions::default(),
    );
    // The sm_80 template on any GPU.
    let v = example("softmax_gqa");
    check_paged(
        "gpu_paged_prefill_sm80_template",
        "softmax_gqa",
        (8, 2),
        70,
        &[70, 200, 131],
        32,
        HeadDims::square(64),
        &KernelOptions {
            config: Some(ForwardConfig::default_for(
                &v,
                64,
                64,
                Elem::Bf16,
                Isa::Sm80,
            )),
            ..KernelOptions::default()
        },
    );
}

/// A random block mask in FlexAttention's layout for `shape`: per mask row
/// (of `planes` = batches · heads), each key block is left out, partial or
/// full at random, the listed ones in shuffled order; index entries past a
/// row's counts hold a block that does not exist (reading one would show).
/// Some rows list nothing.
#[allow(clippy::type_complexity)]
fn random_block_mask(
    shape: Shape,
    (batches, heads): (usize, usize),
    (bm, bn): (usize, usize),
    seed: u64,
) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
    use rand::Rng;
    use rand::seq::SliceRandom;
    let mut rng = common::rng(seed);
    let (rows, cols) = (shape.sq.div_ceil(bm), shape.skv.div_ceil(bn));
    let planes = batches * heads;
    let (mut np, mut nf) = (vec![0; planes * rows], vec![0; planes * rows]);
    let (mut ip, mut ifull) = (
        vec![9999; planes * rows * cols],
        vec![9999; planes * rows * cols],
    );
    for at in 0..planes * rows {
        let mut blocks: Vec<u32> = (0..cols as u32).collect();
        blocks.shuffle(&mut rng);
        let empty_row = rng.random_range(0..5) == 0;
        for blk in blocks {
            match if empty_row { 0 } else { rng.random_range(0..3) } {
                1 => {
                    ip[at * cols + np[at] as usize] = blk;
                    np[at] += 1;
                }
                2 => {
                    ifull[at * cols + nf[at] as usize] = blk;
                    nf[at] += 1;
                }
                _ => {}
            }
        }
    }
    (np, ip, nf, ifull)
}

/// The block-sparse forward of `gpu`'s call under `mask` against `want`:
/// o's relative error, and whether the row outputs match (with the report).
fn block_sparse_against(
    test: &str,
    gpu: &GpuCall,
    shape: Shape,
    mask: &aec::BlockMask<'_>,
    want: &reference::Forward,
) -> (f64, bool, Vec<String>) {
    let out = gpu
        .kernels
        .forward_block_sparse(
            &gpu.stream,
            &gpu.q,
            &gpu.k,
            &gpu.v,
            &gpu.customs(),
            shape,
            mask,
        )
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let err = rel_err(&download_f64(&gpu.stream, &out.o), &want.o.data);
    let (rows_ok, report) = check_row_outputs(
        test,
        gpu.kernels.row_output_names(),
        &out,
        &gpu.stream,
        want,
    );
    (err, rows_ok, report)
}

/// The block-sparse forward of `name` against the f64 reference with the
/// mask's rule (unlisted blocks hidden, partial ones masked by the variant,
/// full ones shown), o and the row outputs.
#[allow(clippy::too_many_arguments)]
fn check_block_sparse(
    test: &str,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    planes: (usize, usize),
    blocks: (usize, usize),
    options: &KernelOptions,
) {
    use aec::reference::KeyRule;
    let Some(gpu) = prepare_with(test, name, shape, dims, (0.0, 1.0), options) else {
        return;
    };
    let (np, ip, nf, ifull) = random_block_mask(shape, planes, blocks, 11);
    let mask = aec::BlockMask {
        block_m: blocks.0,
        block_n: blocks.1,
        batches: planes.0,
        heads: planes.1,
        kv_num_blocks: &np,
        kv_indices: &ip,
        full_kv_num_blocks: &nf,
        full_kv_indices: &ifull,
    };
    let (rows, cols) = (shape.sq.div_ceil(blocks.0), shape.skv.div_ceil(blocks.1));
    let rule = |b: usize, h: usize, i: usize, j: usize| {
        let plane =
            (if planes.0 == 1 { 0 } else { b }) * planes.1 + if planes.1 == 1 { 0 } else { h };
        let at = plane * rows + i / blocks.0;
        let blk = (j / blocks.1) as u32;
        let listed =
            |n: &[u32], idx: &[u32]| idx[at * cols..at * cols + n[at] as usize].contains(&blk);
        if listed(&nf, &ifull) {
            KeyRule::Shown
        } else if listed(&np, &ip) {
            KeyRule::Masked
        } else {
            KeyRule::Hidden
        }
    };
    let want = reference::forward_with_rule(&gpu.def, &gpu.call.inputs, Options::default(), &rule)
        .expect("reference");
    let (err, rows_ok, report) = block_sparse_against(test, &gpu, shape, &mask, &want);
    let listed: u32 = np.iter().chain(&nf).sum();
    let pass = err < 1e-2 && rows_ok;
    eprintln!(
        "{test}: {} `{}` on {} {shape} Dqk={} Dv={} mask {}x{} blocks, planes {planes:?}, {listed} \
         listed of {}: rel_err(o)={err:.2e} rows[{}]",
        if pass { "PASS" } else { "FAIL" },
        gpu.kernels.block_sparse_source().unwrap().name,
        gpu.device.name(),
        dims.dqk,
        dims.dv,
        blocks.0,
        blocks.1,
        np.len() * cols,
        report.join(", ")
    );
    assert!(err < 1e-2, "{test}: relative error of o {err:.3e}");
    assert!(rows_ok, "{test}: row outputs differ: {}", report.join(", "));
}

#[test]
fn gpu_block_sparse() {
    // The default tiles (sm_90a: warp-specialised, persistent), a causal
    // variant, one mask for every head.
    check_block_sparse(
        "gpu_block_sparse_causal",
        "softmax_causal",
        Shape::mha(2, 3, 300, 333),
        HeadDims::square(128),
        (2, 1),
        (128, 128),
        &KernelOptions::default(),
    );
    // More row blocks (6 x 24 heads) than an H100 or H200 has CTAs, with
    // uneven lists and empty rows: CTAs of the persistent kernel take
    // several tickets, in the tile order, each head its own mask.
    check_block_sparse(
        "gpu_block_sparse_tickets",
        "softmax",
        Shape::mha(1, 24, 700, 400),
        HeadDims::square(64),
        (1, 24),
        (128, 128),
        &KernelOptions::default(),
    );
    // No mask of its own, GQA, one mask for every sequence, 256-row blocks.
    check_block_sparse(
        "gpu_block_sparse_gqa",
        "softmax_gqa",
        Shape::new(2, 4, 2, 270, 200),
        HeadDims::square(64),
        (1, 4),
        (256, 128),
        &KernelOptions::default(),
    );
    // A mask that reads a custom input (documents): full blocks skip it.
    check_block_sparse(
        "gpu_block_sparse_document",
        "document_mask",
        Shape::mha(1, 2, 260, 260),
        HeadDims::square(64),
        (1, 2),
        (128, 128),
        &KernelOptions::default(),
    );
    // The sm_80 template on any GPU: 64-key tiles, two per mask block.
    let v = example("softmax_causal");
    check_block_sparse(
        "gpu_block_sparse_sm80_template",
        "softmax_causal",
        Shape::mha(1, 2, 300, 333),
        HeadDims::square(128),
        (1, 2),
        (128, 128),
        &KernelOptions {
            config: Some(ForwardConfig::default_for(
                &v,
                128,
                128,
                Elem::Bf16,
                Isa::Sm80,
            )),
            ..KernelOptions::default()
        },
    );
}

/// The block mask of a variant's own predicate, listed as `create_block_mask`
/// would: per plane (batch, head) and mask row, the key blocks in order,
/// hidden (left out), full (every pair shown) or partial.
#[allow(clippy::type_complexity)]
fn brute_force_lists(
    shape: Shape,
    (batches, heads): (usize, usize),
    (bm, bn): (usize, usize),
    mask: impl Fn(usize, usize, usize, usize) -> bool,
) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
    let (rows, cols) = (shape.sq.div_ceil(bm), shape.skv.div_ceil(bn));
    let n = batches * heads * rows;
    let (mut np, mut nf) = (vec![0u32; n], vec![0u32; n]);
    let (mut ip, mut ifull) = (vec![0u32; n * cols], vec![0u32; n * cols]);
    for b in 0..batches {
        for h in 0..heads {
            for r in 0..rows {
                let at = (b * heads + h) * rows + r;
                for c in 0..cols {
                    let (mut any, mut all) = (false, true);
                    for i in r * bm..((r + 1) * bm).min(shape.sq) {
                        for j in c * bn..((c + 1) * bn).min(shape.skv) {
                            let m = mask(b, h, i, j);
                            any |= m;
                            all &= m;
                        }
                    }
                    if any && all {
                        ifull[at * cols + nf[at] as usize] = c as u32;
                        nf[at] += 1;
                    } else if any {
                        ip[at * cols + np[at] as usize] = c as u32;
                        np[at] += 1;
                    }
                }
            }
        }
    }
    (np, ip, nf, ifull)
}

/// `ParallelKernels::block_mask` against the brute-force lists of the same
/// predicate, then the block-sparse forward with them against the dense f64
/// reference (the lists must change nothing).
fn check_block_mask_from_predicate(
    test: &str,
    name: &str,
    shape: Shape,
    blocks: (usize, usize),
    planes: (usize, usize),
    mask: impl Fn(&common::gpu::RandomCall, usize, usize, usize, usize) -> bool,
) {
    let dims = HeadDims::square(64);
    let Some(gpu) = prepare_with(
        test,
        name,
        shape,
        dims,
        (0.0, 1.0),
        &KernelOptions::default(),
    ) else {
        return;
    };
    let lists = gpu
        .kernels
        .block_mask(&gpu.stream, &gpu.customs(), shape, blocks.0, blocks.1)
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(
        (lists.batches, lists.heads),
        planes,
        "{test}: the mask's planes"
    );
    let (np, ip, nf, ifull) = brute_force_lists(shape, planes, blocks, |b, h, i, j| {
        mask(&gpu.call, b, h, i, j)
    });
    assert_eq!(lists.kv_num_blocks, np, "{test}: partial counts");
    assert_eq!(lists.full_kv_num_blocks, nf, "{test}: full counts");
    let cols = shape.skv.div_ceil(blocks.1);
    for (at, (&p, &f)) in np.iter().zip(&nf).enumerate() {
        let row = at * cols;
        assert_eq!(
            lists.kv_indices[row..row + p as usize],
            ip[row..row + p as usize],
            "{test}: partial blocks of mask row {at}"
        );
        assert_eq!(
            lists.full_kv_indices[row..row + f as usize],
            ifull[row..row + f as usize],
            "{test}: full blocks of mask row {at}"
        );
    }
    let want =
        reference::forward(&gpu.def, &gpu.call.inputs, Options::default()).expect("reference");
    let (err, rows_ok, report) = block_sparse_against(test, &gpu, shape, &lists.as_mask(), &want);
    let total = np.len() * cols;
    eprintln!(
        "{test}: {} {} of {total} blocks listed ({} full), rel_err(o)={err:.2e} rows[{}]",
        if err < 1e-2 && rows_ok {
            "PASS"
        } else {
            "FAIL"
        },
        lists.listed(),
        nf.iter().sum::<u32>(),
        report.join(", ")
    );
    assert!(
        lists.listed() < total as u64,
        "{test}: the mask hides no block"
    );
    assert!(err < 1e-2, "{test}: relative error of o {err:.3e}");
    assert!(rows_ok, "{test}: row outputs differ: {}", report.join(", "));
}

#[test]
fn gpu_block_mask_from_predicate() {
    // Causal: decided by intervals alone; one mask for every batch and head.
    check_block_mask_from_predicate(
        "gpu_block_mask_causal",
        "softmax_causal",
        Shape::mha(2, 3, 300, 333),
        (128, 128),
        (1, 1),
        |_, _, _, i, j| i >= j,
    );
    // Documents: the intervals cannot decide (custom inputs), so the
    // builder evaluates every pair; per batch, shared by the heads.
    check_block_mask_from_predicate(
        "gpu_block_mask_document",
        "document_mask",
        Shape::mha(2, 2, 520, 390),
        (128, 128),
        (2, 1),
        |call, b, _, i, j| {
            let doc = |n: &str, len: usize, x: usize| {
                let (_, d) = call
                    .customs_host
                    .iter()
                    .find(|(c, _)| c == n)
                    .expect("doc input");
                d[b * len + x]
            };
            doc("doc_q", 520, i) == doc("doc_k", 390, j) && i >= j
        },
    );
}

/// A block mask needs a predicate: variants without one are refused.
#[test]
fn cpu_block_mask_builder_needs_a_mask() {
    let err = aec::compiler::block_mask_builder(&example("softmax"), 64, 64).unwrap_err();
    assert!(err.to_string().contains("has no mask"), "{err}");
    let b = aec::compiler::block_mask_builder(&example("softmax_causal"), 64, 64).unwrap();
    assert!(!b.per_batch && !b.per_head);
    assert!(b.source.contains("mask_block(i0, i1, j0, j1, b, h, hk, P)"));
    let d = aec::compiler::block_mask_builder(&example("document_mask"), 64, 64).unwrap();
    assert!(d.per_batch && !d.per_head, "document ids are per batch");
    let a = aec::compiler::block_mask_builder(&example("sliding_window"), 64, 64).unwrap();
    assert!(!a.per_batch && !a.per_head);
}

/// Bad block masks are refused before anything runs, naming the problem.
#[test]
fn cpu_block_mask_errors() {
    let v = example("softmax_causal");
    let dims = HeadDims::square(64);
    let shape = Shape::mha(1, 2, 200, 300);
    let n = 2 * 200 * 64;
    let lens = [("q", n), ("k", 2 * 300 * 64), ("v", 2 * 300 * 64)];
    // One mask for both heads: 2 rows of 128, 3 key blocks of 128.
    let (np, ip) = (vec![1u32, 1], vec![0u32, 9, 9, 1, 9, 9]);
    let (nf, ifull) = (vec![0u32, 1], vec![9u32, 9, 9, 0, 9, 9]);
    let mask = aec::BlockMask {
        block_m: 128,
        block_n: 128,
        batches: 1,
        heads: 1,
        kv_num_blocks: &np,
        kv_indices: &ip,
        full_kv_num_blocks: &nf,
        full_kv_indices: &ifull,
    };
    let tiles = (128, 128);
    assert!(aec::check_block_mask(&v, dims, shape, &mask, tiles, &lens).is_ok());
    let err = |m: &aec::BlockMask<'_>| match aec::check_block_mask(&v, dims, shape, m, tiles, &lens)
    {
        Err(Error::Shape(s)) => s,
        other => panic!("expected Error::Shape, got {other:?}"),
    };
    assert_eq!(
        err(&aec::BlockMask {
            block_n: 64,
            ..mask
        }),
        "the block mask's blocks are 128 × 64 (rows × keys); the kernel's tiles are 128 × 128, \
         and each mask block must cover whole tiles (multiples of both)"
    );
    assert_eq!(
        err(&aec::BlockMask { heads: 3, ..mask }),
        "the block mask has heads = 3: it must be 1 (shared) or the call's 2"
    );
    let bad_index = [0u32, 9, 9, 3, 9, 9];
    assert_eq!(
        err(&aec::BlockMask {
            kv_indices: &bad_index,
            ..mask
        }),
        "`kv_indices[0, 0, 1, 0]` = 3 is not a key block: Skv = 300 has 3 blocks of 128"
    );
    let twice = [0u32, 9, 9, 0, 9, 9];
    assert_eq!(
        err(&aec::BlockMask {
            kv_indices: &twice,
            ..mask
        }),
        "mask row [0, 0, 1] lists key block 0 twice (`full_kv_indices[0, 0, 1, 0]`): each block \
         is partial or full, once"
    );
    let too_many = [4u32, 1];
    assert_eq!(
        err(&aec::BlockMask {
            kv_num_blocks: &too_many,
            ..mask
        }),
        "mask row [0, 0, 0] lists 4 partial and 0 full key blocks; each list holds at most 3 \
         and Skv = 300 has 3 blocks of 128"
    );
    let one_row = [1u32];
    assert_eq!(
        err(&aec::BlockMask {
            kv_num_blocks: &one_row,
            full_kv_num_blocks: &one_row,
            kv_indices: &ip[..3],
            full_kv_indices: &ifull[..3],
            ..mask
        }),
        "`kv_num_blocks` has 1 mask rows per batch and head; Sq = 200 needs 2 rows of 128"
    );
}

/// Decoding forms of the examples (`Sq = 1` on q, k and v on `Hkv` heads)
/// whose one query sees every key — softcap, sigmoid, ReLU, a relative
/// bias, GQA softmax (the causal ones would see key 0 alone) — with 128
/// query heads on one KV head take the sm_90a `wgmma` tile for 64 or more
/// packed rows (`ForwardConfig::for_packed_rows`) and match the reference
/// at 777 keys; with Dv 512 its two 256-column slices too.
#[test]
fn gpu_forward_decoding_forms_on_wgmma() {
    let test = "gpu_forward_decoding_forms_on_wgmma";
    if sm90a_device(test, "wgmma needs sm_90a").is_none() {
        return;
    }
    for (name, dv_wide) in [
        ("softcap", None),
        ("sigmoid", None),
        ("relu", None),
        ("relative_bias", None),
        ("softmax_gqa", None),
        // Dv 512: two 256-column slices on blocks of their own.
        ("softmax_gqa", Some(512)),
    ] {
        let def = common::decoding_form(name);
        let (dqk, dv) = common::head_dims(&def);
        let dv = dv_wide.unwrap_or(dv);
        let cfg = ForwardConfig::default_for(&def, dqk, dv, Elem::Bf16, Isa::Sm90a)
            .for_packed_rows(128, dqk, dv, Isa::Sm90a);
        assert!(
            cfg.wgmma && cfg.dv_split == dv.div_ceil(256),
            "{name}: {cfg:?}"
        );
        check_def_with(
            &format!("{test} ({name})"),
            def,
            name,
            Shape::new(2, 128, 1, 1, 777),
            HeadDims::new(dqk, dv),
            (0.0, 1.0),
            &KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
}

/// The decoding example with a Q modification that is not a uniform scale
/// (`aec_compiler::q_scale` cannot move it onto the scores): the kernel
/// rewrites Q in shared memory.
fn decode_with_q_offset() -> aec::frontend::Variant {
    let path = common::examples_dir().join("decode.rs");
    let src = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace(
            "modify_q = |q| q * rsqrt(Dqk);",
            "modify_q = |q| q * rsqrt(Dqk) + 0.0625;",
        );
    assert!(
        src.contains("+ 0.0625"),
        "examples/decode.rs changed its modify_q"
    );
    aec::frontend::parse_file(&src)
        .expect("the decoding example parses")
        .remove(0)
        .variant
        .expect("a valid variant")
}

/// The packed decoding tiles with a producer warpgroup that the tuner's
/// space holds for 64 or more rows per KV head (one consumer warpgroup on
/// 64 rows or two on 128, or two key warpgroups over 64 rows taking the
/// key blocks in turn; the producer copies K and V by `cp.async`, a block
/// per row block and KV split): examples' decoding forms with and without
/// a score modification match the reference at 128 query heads on one KV
/// head over 777 keys, and on two KV heads; key warpgroups also at 1–300
/// keys (one of them with no block); the untuned MQA tile dense and paged.
#[test]
fn gpu_forward_packed_decoding_with_producer() {
    let test = "gpu_forward_packed_decoding_with_producer";
    let Some(device) = sm90a_device(test, "wgmma needs sm_90a") else {
        return;
    };
    // A packed tile of `block_m` rows with the producer, `key_warps` key
    // warpgroups over each 64 of them.
    let tile = |def: &aec::frontend::Variant, block_m, block_n, stages, key_warps| {
        let (dqk, dv) = common::head_dims(def);
        ForwardConfig {
            block_m,
            block_n,
            warps: block_m / 16 * key_warps,
            key_warps,
            stages,
            wgmma: true,
            dv_warps: 1,
            ..ForwardConfig::default_for(def, dqk, dv, Elem::Bf16, Isa::Sm90a).for_packed_rows(
                128,
                dqk,
                dv,
                Isa::Sm90a,
            )
        }
        .with_producer_warpgroup()
    };
    // (The last field: key warpgroups, which take the 64 rows' blocks in
    // turn; `decode_q_offset` modifies Q in shared memory, which the two
    // share.)
    for (name, block_m, block_n, stages, hkv, key_warps) in [
        ("softmax_gqa", 64, 128, 3, 1, 1),
        ("softmax_gqa", 128, 64, 3, 2, 1),
        ("softcap", 128, 128, 2, 1, 1),
        ("relative_bias", 64, 64, 2, 2, 1),
        ("softmax_gqa", 64, 128, 3, 1, 2),
        ("softcap", 64, 64, 4, 2, 2),
        ("relative_bias", 64, 128, 3, 2, 2),
        ("decode_q_offset", 64, 128, 3, 1, 2),
    ] {
        let def = if name == "decode_q_offset" {
            decode_with_q_offset()
        } else {
            common::decoding_form(name)
        };
        let (dqk, dv) = common::head_dims(&def);
        let cfg = tile(&def, block_m, block_n, stages, key_warps);
        check_def_with(
            &format!(
                "{test} ({name}, {block_m} rows, {block_n}-key blocks, {stages} stages, {hkv} KV heads, {key_warps} key warpgroups)"
            ),
            def,
            name,
            Shape::new(2, 128 * hkv, hkv, 1, 777),
            HeadDims::new(dqk, dv),
            (0.0, 1.0),
            &KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
    // Key warpgroups where one of them sees no block (one or two key blocks
    // over all splits) or the last block is partial.
    let def = common::decoding_form("softmax_gqa");
    for skv in [1, 100, 129, 300] {
        let cfg = tile(&def, 64, 128, 3, 2);
        check_def_with(
            &format!("{test} (softmax_gqa, key warpgroups, {skv} keys)"),
            def.clone(),
            "softmax_gqa",
            Shape::new(2, 128, 1, 1, skv),
            HeadDims::square(128),
            (0.0, 1.0),
            &KernelOptions {
                config: Some(cfg),
                ..KernelOptions::default()
            },
        );
    }
    // The untuned tile for 64 or more rows per KV head
    // (`with_decoding_producer`), dense through compile_for_shape and paged.
    let def = example("decode");
    let dims = HeadDims::square(128);
    let shape = Shape::new(3, 128, 1, 1, 2049);
    let Some(kernels) = compiled(
        test,
        ParallelKernels::compile_for_shape(&def, &device, dims, shape, &KernelOptions::default()),
    ) else {
        return;
    };
    let name = &kernels.forward_source().name;
    assert!(name.contains("_gqa_wgmma_ws"), "{name}");
    let untuned = ForwardConfig::default_for(&def, 128, 128, Elem::Bf16, Isa::Sm90a)
        .for_decoding_call(&def, [3, 128, 1, 1], 132, 128, 128, Isa::Sm90a);
    assert!(untuned.warp_specialized, "{untuned:?}");
    check_example_with(
        &format!("{test} (untuned MQA tile {name})"),
        "decode",
        shape,
        dims,
        (0.0, 1.0),
        &KernelOptions {
            config: Some(untuned),
            ..KernelOptions::default()
        },
    );
    check_paged(
        &format!("{test} (paged, untuned MQA tile)"),
        "decode",
        (128, 1),
        1,
        &[1000, 37, 513, 1, 300],
        64,
        dims,
        &KernelOptions {
            config: Some(untuned),
            ..KernelOptions::default()
        },
    );
}

/// Kernels that hold their row maximum (`aec_compiler::held_max`: `wgmma`
/// tiles with 256 O columns per warpgroup) against the reference, causal and not, with
/// scores six times the usual spread so that the held maximum both stays
/// (block maxima within 8 ln 2 of it) and moves; the row outputs must be
/// the variant's own final state (at the true maximum), not the held one.
#[test]
fn gpu_forward_held_row_maximum() {
    let test = "gpu_forward_held_row_maximum";
    let Some(device) = sm90a_device(test, "only the wgmma tiles hold their maxima") else {
        return;
    };
    // Softmax's online block.
    let online = "online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = exp(s - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
        }";
    for mask in ["", "mask = |b, h, i, j| i >= j;"] {
        let def = aec::frontend::parse_str(&format!(
            "pub struct Sharp: parallel {{
                q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];
                modify_q = |q| q * 6.0 * rsqrt(Dqk);
                {mask}
                {online}
            }}"
        ))
        .expect("variant");
        let (shape, dims) = (Shape::mha(2, 4, 300, 333), HeadDims::new(128, 256));
        let Some(kernels) = compiled(
            test,
            ParallelKernels::compile(&def, &device, dims, &KernelOptions::default()),
        ) else {
            return;
        };
        let source = kernels.forward_source();
        assert!(
            source.source.contains("#define ROW_MAX_HELD 1"),
            "{test}: `{}` does not hold its maximum",
            source.name
        );
        let (err, rows_ok, rows) =
            against_reference(test, &device, &def, &kernels, shape, dims, test);
        eprintln!(
            "{test} ({}): `{}` {shape}: rel_err(o)={err:.2e} rows[{}]",
            if mask.is_empty() { "dense" } else { "causal" },
            source.name,
            rows.join(", ")
        );
        assert!(err < 1e-2 && rows_ok, "{test}: o {err:.3e}, rows {rows:?}");
    }
    // The latent decoding tile over KV splits: each split's partial rows
    // leave the held form (the state at the true maximum, O times the
    // combine's factor to it) before the combine kernel merges them. (Its
    // scores' usual spread is √3 times d128's: 3.5 times it is about the
    // six of the tiles above.)
    let def = aec::frontend::parse_str(&format!(
        "pub struct SharpLatent: parallel {{
            q: [B, H, Sq = 1, Dqk = 576]; k: [B, Hkv, Skv, Dqk = 576]; v: [B, Hkv, Skv, Dv = 512];
            modify_q = |q| q * 3.5 * rsqrt(192.0);
            {online}
        }}"
    ))
    .expect("variant");
    let (shape, dims) = (Shape::new(2, 128, 1, 1, 1777), HeadDims::new(576, 512));
    // (The tile a call of this shape runs untuned, `compile_for_shape`.)
    let tile = ForwardConfig {
        v_in_k: true,
        ..ForwardConfig::default_for(&def, 576, 512, Elem::Bf16, Isa::Sm90a)
    }
    .for_packed_rows(128, 576, 512, Isa::Sm90a);
    let options = KernelOptions {
        v_in_k: true,
        config: Some(tile),
        ..KernelOptions::default()
    };
    let Some(mut gpu) = prepare_def(test, def, "mla_decode", shape, dims, (0.0, 1.0), &options)
    else {
        return;
    };
    v_from_k(&mut gpu.call, dims);
    assert!(
        gpu.kernels
            .forward_source()
            .source
            .contains("#define ROW_MAX_HELD 1"),
        "{test}: the latent tile does not hold its maximum"
    );
    check_latent_call(test, &gpu, shape, "_gqa_wgmma");
}
