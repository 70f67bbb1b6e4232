//! Recurrent (chunked) cases for `bench/recurrent_check.py`: per case the
//! kernel, random inputs (an initial state on some) and the f64 reference
//! interpreter's output and final state; per recurrent workload of
//! workloads.json the kernel in the default configuration and in the
//! other Dv tilings (a small sweep the script times side by side).

use crate::{CubinCompiler, as_bf16, as_f32, bf16_round, compile_source, load, normal};
use aec_compiler::{
    ArgKind, Elem, Isa, RecurrentBackwardSource, RecurrentConfig, RecurrentGridX, RecurrentSource,
    RecurrentStepSource, recurrent_backward, recurrent_forward, recurrent_step,
};
use aec_frontend::Variant;
use aec_frontend::ir::Axis;
use aec_frontend::reference::{self, Inputs, Options, Tensor};
use indexmap::IndexMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::path::Path;

struct Case {
    id: &'static str,
    example: &'static str,
    /// B, H, S, Dk, Dv
    sizes: [usize; 5],
    /// Whether the case starts from a random state (and normaliser).
    initial_state: bool,
}

/// Three shapes per example, lengths that are not chunk multiples, head dims
/// that leave one, two or several Dv slices per head.
const CASES: &[Case] = &[
    Case {
        id: "retnet_rec_a",
        example: "retnet_recurrent",
        sizes: [2, 3, 200, 64, 96],
        initial_state: true,
    },
    Case {
        id: "retnet_rec_b",
        example: "retnet_recurrent",
        sizes: [1, 2, 64, 128, 128],
        initial_state: false,
    },
    Case {
        id: "retnet_rec_c",
        example: "retnet_recurrent",
        sizes: [1, 2, 333, 256, 512],
        initial_state: false,
    },
    Case {
        id: "gated_ret_a",
        example: "gated_retention",
        sizes: [2, 2, 150, 128, 64],
        initial_state: true,
    },
    Case {
        id: "gated_ret_b",
        example: "gated_retention",
        sizes: [1, 3, 77, 64, 128],
        initial_state: false,
    },
    Case {
        id: "gated_ret_c",
        example: "gated_retention",
        sizes: [1, 1, 300, 256, 256],
        initial_state: false,
    },
    Case {
        id: "mamba2_a",
        example: "mamba2",
        sizes: [2, 4, 250, 128, 64],
        initial_state: true,
    },
    Case {
        id: "mamba2_b",
        example: "mamba2",
        sizes: [1, 2, 64, 64, 32],
        initial_state: false,
    },
    Case {
        id: "mamba2_c",
        example: "mamba2",
        sizes: [1, 2, 129, 32, 64],
        initial_state: false,
    },
    Case {
        id: "rfa_a",
        example: "rfa",
        sizes: [2, 2, 190, 64, 64],
        initial_state: true,
    },
    Case {
        id: "rfa_b",
        example: "rfa",
        sizes: [1, 2, 100, 32, 128],
        initial_state: false,
    },
    Case {
        id: "rfa_c",
        example: "rfa",
        sizes: [1, 1, 257, 128, 64],
        initial_state: false,
    },
];

/// The range of each example's custom inputs: gate logits, Mamba2's A
/// (negative) and step sizes, RFA's gate after its sigmoid.
fn custom_range(name: &str) -> (f64, f64) {
    match name {
        "gate" => (-1.0, 3.0),
        "a" => (-4.0, -0.5),
        "dt" => (0.01, 0.2),
        "g" => (0.5, 0.99),
        _ => (0.0, 1.0),
    }
}

/// Recurrent workloads of workloads.json: (id, example).
const BENCH: &[(&str, &str)] = &[
    (
        "retention-recurrent-b2-h32-s4096-d256-v512",
        "retnet_recurrent",
    ),
    ("gated-retention-b2-h40-s4096-d256-v256", "gated_retention"),
    ("mamba2-b2-h80-s4096-d128-v64", "mamba2"),
];

/// Writes the cases and benchmark kernels; returns (cases, bench) for index.json.
pub fn write_all(
    out: &Path,
    root: &Path,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> (Vec<Value>, Vec<Value>) {
    let mut cases = Vec::new();
    for case in CASES {
        eprintln!("recurrent case {} …", case.id);
        let v = load(root, case.example);
        cases.push(write_case(out, case, &v, compiler, includes));
    }
    let mut bench = Vec::new();
    for (workload, example) in BENCH {
        let v = load(root, example);
        let (dk, dv) = dims_of(workload);
        let default = RecurrentConfig::default_for(dk, dv, Elem::Bf16, Isa::Sm90a);
        // The default (on sm_90a the wgmma kernel where the dims allow),
        // then the `mma.sync` template's whole tile space: chunk, Dv slice,
        // ring depth, blocks per SM.
        let mut configs = vec![default];
        configs.extend(
            RecurrentConfig::mma_sync_space(&v, dk, dv, Elem::Bf16, Isa::Sm90a)
                .into_iter()
                .filter(|c| *c != default),
        );
        for (n, cfg) in configs.iter().enumerate() {
            let tag = if cfg.wgmma {
                format!("c{}v{}w", cfg.chunk, cfg.dv_tile)
            } else {
                format!(
                    "c{}v{}s{}b{}",
                    cfg.chunk, cfg.dv_tile, cfg.stages, cfg.blocks_per_sm
                )
            };
            eprintln!("recurrent bench kernel {workload} {tag} …");
            let file = format!("rbench_{}_{tag}", workload.replace('-', "_"));
            let entry = match recurrent_forward(&v, dk, dv, cfg) {
                Ok(k) => json!({
                    "workload": workload,
                    "config": tag,
                    "default": n == 0,
                    "kernel": kernel_meta(out, &file, &k, compiler, includes),
                }),
                Err(e) => json!({ "workload": workload, "error": e.to_string() }),
            };
            bench.push(entry);
        }
        eprintln!("recurrent bench backward {workload} …");
        let file = format!("rbench_{}_bwd", workload.replace('-', "_"));
        bench.push(match recurrent_backward(&v, dk, dv, &default, Isa::Sm90a) {
            Ok(b) => json!({
                "workload": workload,
                "backward": backward_meta(out, &file, &b, compiler, includes),
            }),
            Err(e) => json!({ "workload": workload, "backward_error": e.to_string() }),
        });
        eprintln!("recurrent bench decode {workload} …");
        let file = format!("rbench_{}_step", workload.replace('-', "_"));
        bench.push(match recurrent_step(&v, dk, dv, Elem::Bf16) {
            Ok(k) => json!({
                "workload": workload,
                "decode": step_meta(out, &file, &k, compiler, includes),
            }),
            Err(e) => json!({ "workload": workload, "decode_error": e.to_string() }),
        });
    }
    (cases, bench)
}

/// The step (decode) kernel compiled, with what launching it needs (grid
/// `(grid_x, H, B)`).
fn step_meta(
    out: &Path,
    file: &str,
    k: &RecurrentStepSource,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let (cu, cubin, ptxas) = compile_source(out, file, &k.source, compiler, includes);
    let grid_x = k.grid_for(1, 1).map_or(0, |g| g.0);
    json!({
        "name": k.name,
        "source": cu,
        "cubin": cubin,
        "threads": k.threads,
        "smem_bytes": 0,
        "grid_x": grid_x,
        "normalized": k.normalized,
        "args": k.args.iter().map(arg_meta).collect::<Vec<_>>(),
        "ptxas": ptxas,
    })
}

fn arg_meta(a: &ArgKind) -> Value {
    match a {
        ArgKind::Tensor(t) => json!({ "kind": "tensor", "name": t }),
        ArgKind::Custom(c) => json!({ "kind": "custom", "name": c }),
        ArgKind::CustomGrad(c) => json!({ "kind": "custom_grad", "name": c }),
        ArgKind::State(s) => json!({ "kind": "state", "name": s }),
        ArgKind::Workspace(w) => json!({ "kind": "workspace", "name": w }),
        ArgKind::Size(ax) => json!({ "kind": "size", "axis": ax.name() }),
        ArgKind::CuSeqlens => json!({ "kind": "cu_seqlens" }),
        ArgKind::Segments(n) => json!({ "kind": "segments", "name": n }),
        other => unreachable!("the recurrent kernels take no {other:?}"),
    }
}

/// The backward's two sources compiled, with what launching them needs.
fn backward_meta(
    out: &Path,
    file: &str,
    b: &RecurrentBackwardSource,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let states = kernel_meta(
        out,
        &format!("{file}_states"),
        &b.states,
        compiler,
        includes,
    );
    let (cu, cubin, ptxas) = compile_source(out, file, &b.source, compiler, includes);
    let kernels: Vec<Value> = b
        .kernels
        .iter()
        .map(|k| {
            let (kind, n) = match k.grid_x {
                RecurrentGridX::DvSlices(n) => ("dv_slices", n),
                RecurrentGridX::Chunks(n) => ("chunks", n),
                RecurrentGridX::Rows(n) => ("rows", n),
                RecurrentGridX::One => ("one", 1),
            };
            json!({ "name": k.name, "threads": k.threads, "smem_bytes": k.smem_bytes, "grid_x": [kind, n] })
        })
        .collect();
    json!({
        "states": states,
        "source": cu,
        "cubin": cubin,
        "ptxas": ptxas,
        "kernels": kernels,
        "args": b.args.iter().map(arg_meta).collect::<Vec<_>>(),
        "chunk": b.config.chunk,
        "normalized": b.normalized,
        "decay": b.decay,
    })
}

/// Dk and Dv from a workload id (`…-d256-v512`).
fn dims_of(workload: &str) -> (u32, u32) {
    let num = |p: &str| {
        workload
            .split('-')
            .find_map(|s| s.strip_prefix(p).and_then(|n| n.parse().ok()))
            .unwrap_or_else(|| panic!("{workload}: no {p}<n>"))
    };
    (num("d"), num("v"))
}

fn kernel_meta(
    out: &Path,
    file: &str,
    k: &RecurrentSource,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let (cu, cubin, ptxas) = compile_source(out, file, &k.source, compiler, includes);
    let args: Vec<Value> = k.args.iter().map(arg_meta).collect();
    json!({
        "name": k.name,
        "source": cu,
        "cubin": cubin,
        "threads": k.threads,
        "smem_bytes": k.smem_bytes,
        "dv_tile": k.config.dv_tile,
        "chunk": k.config.chunk,
        "dk": k.dk,
        "segments": k.segments,
        "args": args,
        "ptxas": ptxas,
    })
}

fn write_case(
    out: &Path,
    case: &Case,
    v: &Variant,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let [b, h, s, dk, dv] = case.sizes;
    let mut rng = StdRng::seed_from_u64(case.id.len() as u64 * 7919 + 5);
    let size = |a: Axis| match a {
        Axis::B => b,
        Axis::H => h,
        Axis::S => s,
        Axis::Dk => dk,
        Axis::Dv => dv,
        other => unreachable!("a recurrent variant has no {other:?}"),
    };
    let shape = |axes: &[Axis]| axes.iter().map(|a| size(*a)).collect::<Vec<_>>();
    let tensor = |axes: &[Axis], rng: &mut StdRng| {
        Tensor::from_fn(&shape(axes), |_| bf16_round(normal(rng)))
    };
    let q = tensor(&v.q.axes, &mut rng);
    let k = tensor(&v.k.axes, &mut rng);
    let vv = tensor(&v.v.axes, &mut rng);
    let mut customs = IndexMap::new();
    for c in &v.customs {
        let (lo, hi) = custom_range(&c.name);
        customs.insert(
            c.name.clone(),
            Tensor::from_fn(&shape(&c.axes), |_| rng.random_range(lo..hi)),
        );
    }
    let normalized = v.recurrent().is_some_and(|r| r.normalize.is_some());
    let initial_state = case
        .initial_state
        .then(|| Tensor::from_fn(&[b, h, dk, dv], |_| normal(&mut rng)));
    let initial_normalizer = (case.initial_state && normalized)
        .then(|| Tensor::from_fn(&[b, h, dk], |_| rng.random_range(0.5..2.0)));
    let inputs = Inputs {
        q,
        k,
        v: vv,
        customs,
        initial_state,
        initial_normalizer,
    };
    let fwd = reference::forward(v, &inputs, Options::default()).expect("reference forward");
    let cfg = RecurrentConfig::default_for(dk as u32, dv as u32, Elem::Bf16, Isa::Sm90a);
    let kernel = recurrent_forward(v, dk as u32, dv as u32, &cfg)
        .unwrap_or_else(|e| panic!("{}: {e}", case.id));
    let km = kernel_meta(out, case.id, &kernel, compiler, includes);
    let write = |name: &str, data: Vec<u8>| {
        std::fs::write(out.join(format!("{}.{name}", case.id)), data).expect("write tensor")
    };
    write("q.bin", as_bf16(&inputs.q));
    write("k.bin", as_bf16(&inputs.k));
    write("v.bin", as_bf16(&inputs.v));
    for (name, t) in &inputs.customs {
        write(&format!("in_{name}.bin"), as_f32(t));
    }
    if let Some(t) = &inputs.initial_state {
        write("state_in.bin", as_f32(t));
    }
    if let Some(t) = &inputs.initial_normalizer {
        write("norm_in.bin", as_f32(t));
    }
    write("o_ref.bin", as_f32(&fwd.o));
    write(
        "state_ref.bin",
        as_f32(fwd.final_state.as_ref().expect("final state")),
    );
    if let Some(t) = &fwd.final_normalizer {
        write("norm_ref.bin", as_f32(t));
    }
    json!({
        "id": case.id,
        "variant": v.name,
        "sizes": { "B": b, "H": h, "S": s, "Dk": dk, "Dv": dv },
        "customs": v.customs.iter().map(|c| json!({ "name": c.name, "shape": shape(&c.axes) })).collect::<Vec<_>>(),
        "initial_state": case.initial_state,
        "normalized": normalized,
        "kernel": km,
    })
}
