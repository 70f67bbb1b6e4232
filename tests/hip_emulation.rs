//! The HIP forward template run on the CPU (issue: AMD backend; see
//! ARCHITECTURE.md, "How the HIP kernels are checked"). There is no AMD GPU
//! here, so the template is rendered with the emulation prelude
//! (`templates/hip/prelude_emulation.h`): the same kernel text — tiles, LDS
//! layout, index arithmetic, lane exchanges, the user's online normalisation,
//! split-KV and its combine — built by the system C++ compiler, every
//! work-item a thread, each 64-lane wavefront meeting where the hardware
//! exchanges data, and `mfma16` a reference routine over the documented
//! operand layout. Outputs and row outputs are compared with the f64
//! reference interpreter on random inputs at sizes that are not tile
//! multiples.

mod common;

use aec::compiler::hip::backward::{HipBackwardConfig, HipBackwardSource, hip_parallel_backward};
use aec::compiler::hip::dialect::{Gfx, HipPrelude};
use aec::compiler::hip::forward::{HipForwardConfig, hip_parallel_forward};
use aec::compiler::{ArgKind, Elem, KernelSource};
use aec::prelude::*;
use aec::reference::{self, Options};
use aec::runtime::{bf16, f16};
use common::emulation::{build_and_run, cxx};
use common::gpu::{random_call, rel_err};
use std::fmt::Write as _;

/// A kernel's argument list as the driver's C++ expressions (the vectors it
/// declares: tensors and workspaces by name, custom input `n` as `c<n>`, its
/// gradient as `g<n>`).
fn call_args(
    args: &[ArgKind],
    shape: Shape,
    customs: &[(String, usize)],
    n_splits: u32,
    v_in_k: bool,
) -> String {
    let custom = |name: &str| customs.iter().position(|(c, _)| c == name).expect("custom");
    args.iter()
        .map(|a| match a {
            // V stored in K's rows: the cache is passed as both.
            ArgKind::Tensor("v") if v_in_k => "k.data()".into(),
            ArgKind::Tensor(n) | ArgKind::Workspace(n) => format!("{n}.data()"),
            ArgKind::RowOut => "rowout.data()".into(),
            ArgKind::Custom(name) => format!("c{}.data()", custom(name)),
            ArgKind::CustomGrad(name) => format!("g{}.data()", custom(name)),
            ArgKind::Size(ax) => shape.size(*ax).expect("size").to_string(),
            ArgKind::KvSplits => n_splits.to_string(),
            other @ (ArgKind::State(_)
            | ArgKind::CuSeqlens
            | ArgKind::CuSeqlensKv
            | ArgKind::PagedKv(_)
            | ArgKind::BlockMask(_)
            | ArgKind::Segments(_)
            | ArgKind::TensorMap(_)) => {
                unreachable!("HIP parallel kernels take no {other:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The C++ driver: reads q, k, v (bf16 bits) and the custom inputs (f32)
/// from `in.bin`, launches the kernel (and the combine kernel with
/// `n_splits` > 1) on the emulator, writes o (bf16 bits) and the row outputs
/// (f32) to `out.bin`.
fn driver(
    k: &KernelSource,
    bwd: Option<&HipBackwardSource>,
    shape: Shape,
    customs: &[(String, usize)],
    n_splits: u32,
) -> String {
    let rows = shape.rows();
    let (gx, gy, gz) = k
        .split_grid_for([shape.b, shape.h, shape.hkv, shape.sq], n_splits)
        .expect("grid");
    let q_len = shape.b * shape.h * shape.sq * k.dqk as usize;
    let kv_len = shape.b * shape.hkv * shape.skv * k.dqk as usize;
    let v_len = shape.b * shape.hkv * shape.skv * k.dv as usize;
    let o_len = rows * k.dv as usize;
    let nrow = k.row_outputs.len().max(1) * rows;
    let mut s = String::from("#include \"kernel.hip\"\n");
    if bwd.is_some() {
        // The backward's source has its own copy of the prelude and regions.
        s += "namespace bwd {\n#include \"backward.hip\"\n}\n";
    }
    s += "#include <cstdio>\n#include <vector>\n\n";
    s += "template <class T> static void rd(FILE* f, std::vector<T>& v) { if (fread(v.data(), sizeof(T), v.size(), f) != v.size()) abort(); }\n";
    s += "int main() {\n    FILE* f = fopen(\"in.bin\", \"rb\");\n";
    let _ = writeln!(
        s,
        "    std::vector<unsigned short> q({q_len}), k({kv_len}), v({v_len}), o({o_len}, 0xffff);\n    std::vector<float> rowout({nrow}, -12345.0f);\n    rd(f, q); rd(f, k); rd(f, v);"
    );
    for (n, (_, len)) in customs.iter().enumerate() {
        let _ = writeln!(s, "    std::vector<float> c{n}({len}); rd(f, c{n});");
    }
    let ws_o = k.workspace_len("opart", rows, n_splits);
    let ws_s = k.workspace_len("spart", rows, n_splits);
    let _ = writeln!(
        s,
        "    fclose(f);\n    std::vector<float> opart({ws_o}), spart({ws_s});"
    );
    let call = call_args(&k.args, shape, customs, n_splits, k.v_in_k);
    let _ = writeln!(
        s,
        "    aec_emu::launch({gx}, {gy}, {gz}, {}, [&] {{ {}({call}); }});",
        k.threads, k.name
    );
    if let (Some(combine), true) = (&k.combine, n_splits > 1) {
        let (cx, cy, cz) = k.combine_grid(rows).expect("combine grid");
        let _ = writeln!(
            s,
            "    aec_emu::launch({cx}, {cy}, {cz}, {}, [&] {{ {combine}({call}); }});",
            k.combine_threads()
        );
    }
    s += "    FILE* g = fopen(\"out.bin\", \"wb\");\n    fwrite(o.data(), 2, o.size(), g);\n    fwrite(rowout.data(), 4, rowout.size(), g);\n";
    if let Some(b) = bwd {
        // dO follows the inputs in `in.bin`; gradients follow the forward's outputs.
        let dq_len = rows * b.dqk as usize;
        let _ = writeln!(
            s,
            "    std::vector<unsigned short> dout({o_len}), qmod({dq_len}), dq({dq_len}, 0xffff), dk({kv_len}, 0xffff), dv({v_len}, 0xffff);\n    std::vector<float> dot({rows}), dq_acc({dq_len});\n    {{ FILE* f2 = fopen(\"dout.bin\", \"rb\"); rd(f2, dout); fclose(f2); }}"
        );
        for (n, (_, len)) in customs.iter().enumerate() {
            let _ = writeln!(s, "    std::vector<float> g{n}({len}, 0.0f);");
        }
        let call = call_args(&b.args, shape, customs, n_splits, false);
        let sizes = [shape.b, shape.h, shape.hkv, shape.sq, shape.skv];
        for l in [&b.pre, &b.main, &b.post] {
            let (x, y, z) = l.grid_for(sizes, b.dqk).expect("grid");
            let _ = writeln!(
                s,
                "    bwd::aec_emu::launch({x}, {y}, {z}, {}, [&] {{ bwd::{}({call}); }});",
                l.threads, l.name
            );
        }
        s += "    fwrite(dq.data(), 2, dq.size(), g);\n    fwrite(dk.data(), 2, dk.size(), g);\n    fwrite(dv.data(), 2, dv.size(), g);\n";
        for n in 0..customs.len() {
            let _ = writeln!(s, "    fwrite(g{n}.data(), 4, g{n}.size(), g);");
        }
    }
    s += "    fclose(g);\n    return 0;\n}\n";
    s
}

/// Renders `examples/<name>.rs`'s HIP forward with the emulation prelude,
/// runs it on a random call and checks it against the reference.
fn check(
    name: &str,
    shape: Shape,
    dims: HeadDims,
    range: (f64, f64),
    tune: impl Fn(&mut HipForwardConfig),
    n_splits: u32,
) {
    check_with(name, shape, dims, range, tune, n_splits, None);
}

/// [`check`], then the backward (with `bwd`'s tiles) on a random dO: dq, dk,
/// dv and the custom inputs' gradients against the reference's.
fn check_with(
    name: &str,
    shape: Shape,
    dims: HeadDims,
    range: (f64, f64),
    tune: impl Fn(&mut HipForwardConfig),
    n_splits: u32,
    bwd: Option<HipBackwardConfig>,
) {
    let Some(cxx) = cxx() else { return };
    let def = common::example(name);
    let mut cfg = HipForwardConfig::default_for(&def, dims.dqk, dims.dv, Elem::Bf16);
    tune(&mut cfg);
    // The element type's bits in and out (the inputs are bf16 values, exact
    // in f16 at these magnitudes).
    let f16 = cfg.elem == Elem::F16;
    let encode = |x: f64| {
        if f16 {
            f16::from_f64(x).to_bits()
        } else {
            bf16::from_f64(x).to_bits()
        }
    };
    let decode = |b: u16| {
        if f16 {
            f16::from_bits(b).to_f64()
        } else {
            bf16::from_bits(b).to_f64()
        }
    };
    let k = hip_parallel_forward(
        &def,
        dims.dqk,
        dims.dv,
        &cfg,
        Gfx::Gfx90a,
        HipPrelude::CpuEmulation,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(n_splits == 1 || k.combine.is_some(), "{name}: no split-KV");
    let mut call = random_call(&def, shape, dims, range, name);
    if k.v_in_k {
        // The reference's V is K's first Dv columns; the driver still
        // uploads an independent random v, which the kernel must not read.
        let kt = call.inputs.k.clone();
        call.inputs.v = reference::Tensor::from_fn(&call.inputs.v.shape, |idx| kt.get(idx));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let p = |f: &str| dir.path().join(f);
    std::fs::write(p("kernel.hip"), &k.source).unwrap();
    let customs: Vec<(String, usize)> = call
        .customs_host
        .iter()
        .map(|(n, h)| (n.clone(), h.len()))
        .collect();
    let b = bwd.map(|c| {
        hip_parallel_backward(
            &def,
            dims.dqk,
            dims.dv,
            &c,
            Gfx::Gfx90a,
            HipPrelude::CpuEmulation,
        )
        .unwrap_or_else(|e| panic!("{name} backward: {e}"))
    });
    if let Some(b) = &b {
        std::fs::write(p("backward.hip"), &b.source).unwrap();
    }
    std::fs::write(
        p("driver.cpp"),
        driver(&k, b.as_ref(), shape, &customs, n_splits),
    )
    .unwrap();
    let mut rng = common::rng(7);
    let d_o: Vec<bf16> = (0..shape.rows() * dims.dv as usize)
        .map(|_| bf16::from_f64(common::gpu::normal(&mut rng)))
        .collect();
    std::fs::write(
        p("dout.bin"),
        d_o.iter()
            .flat_map(|x| encode(x.to_f64()).to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let mut input: Vec<u8> = Vec::new();
    for t in [&call.q_host, &call.k_host, &call.v_host] {
        input.extend(
            t.iter()
                .flat_map(|x: &bf16| encode(x.to_f64()).to_le_bytes()),
        );
    }
    for (_, h) in &call.customs_host {
        input.extend(h.iter().flat_map(|x| x.to_le_bytes()));
    }
    std::fs::write(p("in.bin"), input).unwrap();
    build_and_run(&cxx, dir.path(), name);
    let out = std::fs::read(p("out.bin")).unwrap();
    let o_len = shape.rows() * dims.dv as usize;
    let o: Vec<f64> = out[..2 * o_len]
        .chunks(2)
        .map(|b| decode(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    let rowout: Vec<f64> = out[2 * o_len..]
        .chunks(4)
        .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect();
    let fwd = reference::forward(&def, &call.inputs, Options::default()).expect("reference");
    assert!(o.iter().all(|x| !x.is_nan()), "{name}: NaN in o");
    let err = rel_err(&o, &fwd.o.data);
    let mut report = format!("{name} {} ({n_splits} splits): o {err:.2e}", k.name);
    assert!(err < 1e-2, "{report}");
    for (r, row_name) in k.row_outputs.iter().enumerate() {
        let want = match row_name.split_once('.') {
            Some(("scale", s)) => &fwd.scales[s],
            Some(("state", f)) => &fwd.row_state[f],
            _ => panic!("{name}: row output {row_name}"),
        };
        let got = &rowout[r * shape.rows()..(r + 1) * shape.rows()];
        assert!(got.iter().all(|x| !x.is_nan()), "{name}: NaN in {row_name}");
        let (mut g, mut w) = (Vec::new(), Vec::new());
        for (x, y) in got.iter().zip(&want.data) {
            if y.is_finite() {
                g.push(*x);
                w.push(*y);
            } else {
                assert_eq!(x, y, "{name}: {row_name}: infinite where the reference is");
            }
        }
        let e = if w.is_empty() { 0.0 } else { rel_err(&g, &w) };
        let _ = write!(report, ", {row_name} {e:.2e}");
        assert!(e < 1e-2, "{report}");
    }
    if let Some(b) = &b {
        let rows_len = k.row_outputs.len().max(1) * shape.rows();
        let mut at = 2 * o_len + 4 * rows_len;
        let mut take_bf16 = |n: usize| -> Vec<f64> {
            let v = out[at..at + 2 * n]
                .chunks(2)
                .map(|b| decode(u16::from_le_bytes([b[0], b[1]])))
                .collect();
            at += 2 * n;
            v
        };
        let dq = take_bf16(shape.rows() * dims.dqk as usize);
        let dk = take_bf16(shape.b * shape.hkv * shape.skv * dims.dqk as usize);
        let dv = take_bf16(shape.b * shape.hkv * shape.skv * dims.dv as usize);
        let mut grads_c = Vec::new();
        for (_, len) in &customs {
            grads_c.push(
                out[at..at + 4 * len]
                    .chunks(4)
                    .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect::<Vec<f64>>(),
            );
            at += 4 * len;
        }
        assert_eq!(at, out.len(), "{name}: output length");
        let d_o_ref = reference::Tensor {
            shape: fwd.o.shape.clone(),
            data: d_o.iter().map(|x| x.to_f64()).collect(),
        };
        let want = reference::backward(&def, &call.inputs, &d_o_ref).expect("reference backward");
        let mut grads = vec![
            ("dq", dq, &want.dq.data),
            ("dk", dk, &want.dk.data),
            ("dv", dv, &want.dv.data),
        ];
        for ((cname, _), g) in customs.iter().zip(grads_c) {
            grads.push((cname.as_str(), g, &want.customs[cname].data));
        }
        let _ = write!(report, "; backward {}:", b.main.name);
        for (gname, got, want) in &grads {
            assert!(got.iter().all(|x| !x.is_nan()), "{name}: NaN in {gname}");
            let e = rel_err(got, want);
            let _ = write!(report, " {gname} {e:.2e}");
            assert!(e < 2e-2, "{report}");
        }
    }
    eprintln!("{report}");
}

fn keep(_: &mut HipForwardConfig) {}

#[test]
fn emulated_softmax_at_sizes_that_are_not_tile_multiples() {
    check(
        "softmax",
        Shape::mha(2, 2, 77, 101),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
    );
}

#[test]
fn emulated_causal_with_two_tiles_per_wave() {
    // 32 rows per wave: the K and Vᵀ fragments feed two MFMAs each.
    check(
        "softmax_causal",
        Shape::mha(1, 2, 150, 150),
        HeadDims::square(64),
        (0.0, 1.0),
        |c| {
            c.block_m = 128;
            c.block_n = 64;
        },
        1,
    );
}

#[test]
fn emulated_grouped_query_heads_and_unequal_head_dims() {
    check(
        "softmax_gqa",
        Shape::new(1, 4, 2, 40, 90),
        HeadDims::new(64, 128),
        (0.0, 1.0),
        keep,
        1,
    );
    check(
        "deepseek",
        Shape::mha(1, 1, 33, 70),
        HeadDims::new(192, 128),
        (0.0, 1.0),
        keep,
        1,
    );
}

#[test]
fn emulated_masks_scores_and_custom_inputs() {
    // A fully masked row (document mask), ALiBi slopes per head, softcapped
    // scores, RetNet's decay from a custom input, sigmoid without a state.
    check(
        "document_mask",
        Shape::mha(1, 2, 70, 70),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
    );
    check(
        "alibi",
        Shape::mha(1, 2, 45, 80),
        HeadDims::square(64),
        (0.0, 0.5),
        keep,
        1,
    );
    check(
        "softcap",
        Shape::mha(1, 1, 50, 66),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
    );
    check(
        "retnet_parallel",
        Shape::mha(1, 2, 40, 40),
        HeadDims::square(64),
        (0.8, 0.99),
        keep,
        1,
    );
    check(
        "sigmoid",
        Shape::mha(1, 1, 37, 75),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
    );
}

/// 20 splits: more than one combine chunk (16 at Dv 128), and splits past
/// the last key block (ten of 32 keys), which see no key.
#[test]
fn emulated_decode_split_kv_and_combine() {
    for splits in [1, 3, 20] {
        check(
            "decode",
            Shape::new(1, 4, 2, 1, 300),
            HeadDims::square(128),
            (0.0, 1.0),
            keep,
            splits,
        );
    }
}

/// Multi-head latent attention decoding (Dqk 576, Dv 512): Dv split between
/// workgroups and split-KV (6 splits: two combine chunks of 4, one split
/// past the last of five key blocks), with separate k and v and with V read
/// from K's rows (`v_in_k`), at a key count that is not a multiple of the
/// key block.
#[test]
fn emulated_latent_decode_with_v_in_k() {
    for (v_in_k, splits) in [(false, 1), (true, 1), (true, 3), (true, 6)] {
        check(
            "mla_decode",
            Shape::new(1, 6, 2, 1, 75),
            HeadDims::new(576, 512),
            (0.0, 1.0),
            |c| c.v_in_k = v_in_k,
            splits,
        );
    }
}

#[test]
fn emulated_dv_split_between_workgroups() {
    check(
        "softmax",
        Shape::mha(1, 1, 20, 40),
        HeadDims::new(64, 384),
        (0.0, 1.0),
        keep,
        1,
    );
}

fn bwd(waves: u32) -> Option<HipBackwardConfig> {
    Some(HipBackwardConfig {
        block_m: 32,
        waves,
        elem: Elem::Bf16,
        split_d: 1,
    })
}

/// `waves` waves, two per 16 keys, each with half of the dK and dV columns.
fn bwd_split(block_m: u32, waves: u32) -> Option<HipBackwardConfig> {
    Some(HipBackwardConfig {
        block_m,
        waves,
        elem: Elem::Bf16,
        split_d: 2,
    })
}

#[test]
fn emulated_backward_with_dv_split_between_waves() {
    // Dv above 256 (RetNet's 256/512, the default tile: two waves per 16
    // keys, 16 query rows a step) and the split at small head dims, where
    // the two waves' dP halves, dK/dV column slices, the owner's dS and the
    // custom inputs' gradients (ALiBi's slopes, RetNet's decay: added by one
    // wave only) all show up against the reference.
    let retnet = HipBackwardConfig::default_for(256, 512, Elem::Bf16);
    assert_eq!((retnet.split_d, retnet.block_m), (2, 16), "{retnet:?}");
    check_with(
        "retnet_parallel",
        Shape::mha(1, 2, 23, 37),
        HeadDims::new(256, 512),
        (0.8, 0.99),
        keep,
        1,
        Some(retnet),
    );
    check_with(
        "softmax_causal",
        Shape::mha(1, 2, 45, 70),
        HeadDims::new(64, 128),
        (0.0, 1.0),
        keep,
        1,
        bwd_split(32, 4),
    );
    check_with(
        "alibi",
        Shape::mha(1, 2, 40, 40),
        HeadDims::square(64),
        (0.0, 0.5),
        keep,
        1,
        bwd_split(16, 2),
    );
    check_with(
        "softmax_gqa",
        Shape::new(1, 4, 2, 33, 50),
        HeadDims::new(64, 128),
        (0.0, 1.0),
        keep,
        1,
        bwd_split(32, 8),
    );
}

#[test]
fn emulated_backward_softmax_and_causal() {
    check_with(
        "softmax",
        Shape::mha(1, 2, 45, 70),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
        bwd(4),
    );
    check_with(
        "softmax_causal",
        Shape::mha(1, 1, 70, 70),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
        bwd(2),
    );
}

#[test]
fn emulated_backward_grouped_heads_unequal_dims_and_custom_gradients() {
    // GQA sums dK/dV over a group's query heads; ALiBi's slopes and RetNet's
    // decay get gradients; softcap differentiates the score modification.
    check_with(
        "softmax_gqa",
        Shape::new(1, 4, 2, 33, 50),
        HeadDims::new(64, 128),
        (0.0, 1.0),
        keep,
        1,
        bwd(2),
    );
    check_with(
        "alibi",
        Shape::mha(1, 2, 40, 40),
        HeadDims::square(64),
        (0.0, 0.5),
        keep,
        1,
        bwd(2),
    );
    check_with(
        "retnet_parallel",
        Shape::mha(1, 2, 36, 36),
        HeadDims::square(64),
        (0.8, 0.99),
        keep,
        1,
        bwd(2),
    );
    check_with(
        "softcap",
        Shape::mha(1, 1, 30, 47),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
        bwd(1),
    );
    check_with(
        "document_mask",
        Shape::mha(1, 1, 50, 50),
        HeadDims::square(64),
        (0.0, 1.0),
        keep,
        1,
        bwd(2),
    );
}

#[test]
fn emulated_indexed_input_forward_and_backward() {
    // rel[i − j + 16] with Skv − Sq = 37: the distances run past both ends
    // of the 33-entry table (clamped), and the table's gradient gathers
    // every score of a distance through the indexed read's atomics.
    check_with(
        "relative_bias",
        Shape::mha(1, 2, 40, 77),
        HeadDims::square(64),
        (-1.0, 1.0),
        keep,
        1,
        bwd(2),
    );
}

#[test]
fn emulated_f16_operands() {
    check(
        "softmax_gqa",
        Shape::new(1, 4, 2, 29, 61),
        HeadDims::square(64),
        (0.0, 1.0),
        |c| c.elem = Elem::F16,
        1,
    );
}
