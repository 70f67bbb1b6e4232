//! `gpu-cases <out_dir> [--nvrtc | --nvcc <path>]`: writes what `bench/gpu_check.py`
//! needs on a GPU machine that has no Rust:
//! - correctness cases: generated kernel source, random bf16 inputs (never
//!   zeros, sizes that are not tile multiples) and the f64 reference
//!   interpreter's outputs on exactly those inputs;
//! - benchmark kernels for the workloads of `shared/reference/workloads.json`.
//!
//! With `--nvrtc` (what the runtime and `aec compile` ship: NVRTC with the
//! runtime's options) or `--nvcc <path>`, every kernel is compiled to an
//! sm_90a cubin here (ptxas's register/spill report lands in the case's
//! JSON, the compiler in `index.json`), so the GPU machine only loads and
//! launches. The two compilers' builds of one source can run a few percent
//! apart (bench/NOTES.md session 70 item 6): benchmark what ships.

use aec_compiler::{
    ArgKind, BackwardConfig, BackwardSource, Elem, ForwardConfig, Grid, Isa, KernelSource,
    TensorMapSpec, block_mask_builder, parallel_backward, parallel_backward_varlen,
    parallel_forward, parallel_forward_block_sparse, parallel_forward_paged,
    parallel_forward_varlen, untuned_forward_config,
};
use aec_frontend::ir::Axis;
use aec_frontend::reference::{self, Inputs, Options, Tensor};
use aec_frontend::{Variant, parse_file};
use indexmap::IndexMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

mod recurrent;

struct Case {
    id: &'static str,
    example: &'static str,
    /// B, H, Hkv, Sq, Skv, Dqk, Dv
    sizes: [usize; 7],
    custom_range: (f64, f64),
}

const CASES: &[Case] = &[
    Case {
        id: "softmax",
        example: "softmax",
        sizes: [2, 4, 4, 197, 253, 128, 128],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "softmax_gqa",
        example: "softmax_gqa",
        sizes: [2, 4, 2, 197, 253, 128, 128],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "softmax_causal",
        example: "softmax_causal",
        sizes: [2, 4, 4, 250, 250, 128, 128],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "softmax_d64",
        example: "softmax",
        sizes: [2, 3, 3, 77, 301, 64, 64],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "decode",
        example: "decode",
        sizes: [3, 4, 2, 1, 301, 128, 128],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "mla_decode",
        example: "mla_decode",
        sizes: [3, 16, 1, 1, 301, 576, 512],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "mla_decode_gqa",
        example: "mla_decode",
        sizes: [2, 6, 2, 1, 517, 576, 512],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "deepseek",
        example: "deepseek",
        sizes: [1, 2, 2, 150, 150, 192, 128],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "diff_transformer",
        example: "diff_transformer",
        sizes: [1, 2, 2, 150, 150, 128, 256],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "sigmoid",
        example: "sigmoid",
        sizes: [2, 2, 2, 131, 199, 64, 64],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "relu",
        example: "relu",
        sizes: [2, 2, 2, 131, 199, 64, 64],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "retnet_parallel",
        example: "retnet_parallel",
        sizes: [1, 4, 4, 200, 200, 128, 128],
        custom_range: (0.8, 0.99),
    },
    Case {
        id: "retnet_parallel_v512",
        example: "retnet_parallel",
        sizes: [1, 2, 2, 150, 150, 256, 512],
        custom_range: (0.8, 0.99),
    },
    Case {
        id: "sliding_window",
        example: "sliding_window",
        sizes: [1, 2, 2, 300, 300, 64, 64],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "alibi",
        example: "alibi",
        sizes: [2, 4, 4, 200, 200, 64, 64],
        custom_range: (0.01, 0.3),
    },
    Case {
        id: "softcap",
        example: "softcap",
        sizes: [2, 2, 2, 180, 180, 128, 128],
        custom_range: (0.0, 1.0),
    },
    Case {
        id: "document_mask",
        example: "document_mask",
        sizes: [2, 2, 2, 170, 170, 64, 64],
        custom_range: (0.0, 1.0),
    },
];

/// A workload that is not in shared/reference/workloads.json: the sliding
/// window example at a long sequence, to measure the tile classification
/// (only blocks within the window are visited). Defined in `index.json`'s
/// `extra_workloads`.
const SLIDING_WINDOW: &str = "sliding-window-b1-h32-s8192-d128-w256";

/// Another workload of `index.json`'s `extra_workloads`: decoding one
/// sequence of a long context, where only split-KV fills the GPU.
const DECODE_B1: &str = "decode-gqa-b1-h32-kv8-kv32768-d128";

/// Another decoding workload of `extra_workloads`: eight sequences of 16384
/// keys (64 blocks before KV splits, under half an H100's or H200's SMs).
const DECODE_B8: &str = "decode-gqa-b8-h32-kv8-kv16384-d128";

/// Multi-query decoding at d128 with 128 query heads on one KV head: 128
/// packed rows per KV head, the sm_90a wgmma decoding tile's shape.
const DECODE_MQA_H128: &str = "decode-mqa-b16-h128-kv1-kv4096-d128";

/// Multi-head latent attention decoding (`examples/mla_decode.rs`, V stored
/// in K): DeepSeek-V3's 128 query heads over 8 GPUs (16 per GPU), one
/// latent cache row of 576 per token. Also in `extra_workloads`.
const DECODE_MLA: &str = "decode-mla-b64-h16-kv4096-d576-v512";

/// The same at all 128 query heads on one GPU: eight 16-row blocks per
/// sequence share each cache tile through L2.
const DECODE_MLA_H128: &str = "decode-mla-b16-h128-kv4096-d576-v512";

/// A decoding tile timed beside the default (each bench entry's `tiles`):
/// (tag, block_m, warps, key_warps, dv_split, block_n, stages, dv_warps,
/// kernel: the sm_80 template, `wgmma`, or `wgmma` with its producer
/// warpgroup).
type DecodeTile = (&'static str, u32, u32, u32, u32, u32, u32, u32, TileKernel);

/// The kernel a [`DecodeTile`] runs on.
#[derive(Clone, Copy, PartialEq)]
enum TileKernel {
    Sm80,
    Wgmma,
    WgmmaProducer,
}

/// Other tiles of the latent decoding forward.
const MLA_TILES: &[DecodeTile] = &[
    ("m16k2v2", 16, 2, 2, 2, 32, 2, 1, TileKernel::Sm80), // the default before Dv warps
    // Dv split between the warps of one block (S computed once).
    ("m16k2d2", 16, 4, 2, 1, 32, 2, 2, TileKernel::Sm80),
    ("m16d2", 16, 2, 1, 1, 32, 2, 2, TileKernel::Sm80),
    ("m16d2s3", 16, 2, 1, 1, 32, 3, 2, TileKernel::Sm80),
    ("m64d2", 64, 8, 1, 1, 32, 2, 2, TileKernel::Sm80),
    // wgmma (sm_90a) on one or two warpgroups, Dv in two 256-column slices
    // (the default at 128 heads is one warpgroup on 64-key blocks).
    ("wg64n48", 64, 4, 1, 2, 48, 2, 1, TileKernel::Wgmma),
    ("wg64n32s4", 64, 4, 1, 2, 32, 4, 1, TileKernel::Wgmma),
    ("wg128n32", 128, 8, 1, 2, 32, 2, 1, TileKernel::Wgmma),
    // Dv split between the two warpgroups of one 64-row block instead of
    // between blocks: the first computes S and hands P to the second, K
    // tiles are read once.
    ("wg64d2", 64, 8, 1, 1, 64, 2, 2, TileKernel::Wgmma),
    ("wg64d2n32s3", 64, 8, 1, 1, 32, 3, 2, TileKernel::Wgmma),
    // The same with a producer warpgroup copying K into the ring (the two
    // computing warpgroups then run at their own pace, each computing S).
    ("wg64d2ws", 64, 8, 1, 1, 64, 2, 2, TileKernel::WgmmaProducer),
];

/// Other tiles of the decoding forward (d128 and d192 workloads), as
/// [`MLA_TILES`]: key blocks split between 2 or 4 warps, deeper rings.
const DECODE_TILES: &[DecodeTile] = &[
    ("m16w1n32", 16, 1, 1, 1, 32, 2, 1, TileKernel::Sm80),
    ("m16k2n32", 16, 2, 2, 1, 32, 2, 1, TileKernel::Sm80),
    ("m16k2n32s4", 16, 2, 2, 1, 32, 4, 1, TileKernel::Sm80),
    ("m16k2n64s3", 16, 2, 2, 1, 64, 3, 1, TileKernel::Sm80),
    ("m16k4n64s3", 16, 4, 4, 1, 64, 3, 1, TileKernel::Sm80),
    ("m16k4n64s4", 16, 4, 4, 1, 64, 4, 1, TileKernel::Sm80),
    ("m16k4n128", 16, 4, 4, 1, 128, 2, 1, TileKernel::Sm80),
    ("m16k4n128s3", 16, 4, 4, 1, 128, 3, 1, TileKernel::Sm80),
    // 64 rows on four warps: the sm_80 tile for 64 or more packed rows.
    ("m64w4", 64, 4, 1, 1, 32, 2, 1, TileKernel::Sm80),
];

/// More tiles for MQA at d128 (128 packed rows per KV head): 64 and 128
/// rows, 64- to 128-key blocks, two to six stages, `mma.sync` and `wgmma`,
/// with and without a producer warpgroup, one or two key warpgroups (the
/// default there is two key warpgroups and the producer on 64 rows and
/// 96-key blocks in four stages, `wg64k2n96ws4`; before session 52
/// `wg64n128s3`, then `wg64n128ws3`).
const MQA_TILES: &[DecodeTile] = &[
    ("m64w4s3", 64, 4, 1, 1, 32, 3, 1, TileKernel::Sm80),
    ("m64w4n64s3", 64, 4, 1, 1, 64, 3, 1, TileKernel::Sm80),
    ("m128w8", 128, 8, 1, 1, 32, 2, 1, TileKernel::Sm80),
    ("wg64n64", 64, 4, 1, 1, 64, 2, 1, TileKernel::Wgmma),
    ("wg64n64s3", 64, 4, 1, 1, 64, 3, 1, TileKernel::Wgmma),
    ("wg64n128", 64, 4, 1, 1, 128, 2, 1, TileKernel::Wgmma),
    ("wg128n64", 128, 8, 1, 1, 64, 2, 1, TileKernel::Wgmma),
    ("wg64n128s3", 64, 4, 1, 1, 128, 3, 1, TileKernel::Wgmma),
    ("wg64n96s3", 64, 4, 1, 1, 96, 3, 1, TileKernel::Wgmma),
    ("wg128n128", 128, 8, 1, 1, 128, 2, 1, TileKernel::Wgmma),
    // With a producer warpgroup copying K and V into the ring, so that the
    // computing warpgroups never issue loads.
    (
        "wg64n128ws3",
        64,
        4,
        1,
        1,
        128,
        3,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg128n64ws4",
        128,
        8,
        1,
        1,
        64,
        4,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg128n128ws",
        128,
        8,
        1,
        1,
        128,
        2,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg128n128ws3",
        128,
        8,
        1,
        1,
        128,
        3,
        1,
        TileKernel::WgmmaProducer,
    ),
    // Two key warpgroups over the same 64 rows, taking blocks in turn, and
    // a producer warpgroup.
    (
        "wg64k2ws3",
        64,
        8,
        2,
        1,
        128,
        3,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg64k2n64ws4",
        64,
        8,
        2,
        1,
        64,
        4,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg64k2n96ws4",
        64,
        8,
        2,
        1,
        96,
        4,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg64k2n64ws6",
        64,
        8,
        2,
        1,
        64,
        6,
        1,
        TileKernel::WgmmaProducer,
    ),
    (
        "wg64k2n64ws5",
        64,
        8,
        2,
        1,
        64,
        5,
        1,
        TileKernel::WgmmaProducer,
    ),
];

/// Decoding workloads' (B, H, Hkv, Sq): their default tiles follow the
/// shape as `ParallelKernels::compile_for_shape` picks them untuned
/// (`ForwardConfig::for_decode_shape`), for the 132 multiprocessors of an
/// H100 or H200.
const DECODE_SHAPES: &[(&str, [usize; 4])] = &[
    ("decode-gqa-b64-h32-kv8-kv4096-d128", [64, 32, 8, 1]),
    ("decode-deepseek-b64-h16-kv4096-d192-v128", [64, 16, 16, 1]),
    (DECODE_B1, [1, 32, 8, 1]),
    (DECODE_B8, [8, 32, 8, 1]),
    (DECODE_MLA, [64, 16, 1, 1]),
    (DECODE_MLA_H128, [16, 128, 1, 1]),
    (DECODE_MQA_H128, [16, 128, 1, 1]),
];

/// The examples whose backward the backward sweep times besides the first
/// softmax workload: the causal softmax, GQA and the head dims above 128.
const BWD_SWEEP_EXAMPLES: [&str; 4] = [
    "softmax_causal",
    "softmax_gqa_causal",
    "deepseek",
    "diff_transformer",
];

/// Benchmark kernels: (workload id from workloads.json or the extra ones, example, dqk, dv).
const BENCH: &[(&str, &str, u32, u32)] = &[
    ("softmax-b8-h32-s2048-d128", "softmax", 128, 128),
    ("softmax-b1-h32-s8192-d128", "softmax", 128, 128),
    (
        "softmax-causal-b8-h32-s2048-d128",
        "softmax_causal",
        128,
        128,
    ),
    (
        "softmax-causal-b1-h32-s8192-d128",
        "softmax_causal",
        128,
        128,
    ),
    (
        "softmax-gqa-causal-b8-h32-kv8-s2048-d128",
        "softmax_gqa_causal",
        128,
        128,
    ),
    (
        "deepseek-causal-b8-h16-s2048-d192-v128",
        "deepseek",
        192,
        128,
    ),
    (
        "diff-causal-b8-h12-s2048-d128-v256",
        "diff_transformer",
        128,
        256,
    ),
    ("sigmoid-b8-h32-s2048-d128", "sigmoid", 128, 128),
    (SLIDING_WINDOW, "sliding_window", 128, 128),
    ("decode-gqa-b64-h32-kv8-kv4096-d128", "decode", 128, 128),
    (
        "decode-deepseek-b64-h16-kv4096-d192-v128",
        "decode",
        192,
        128,
    ),
    ("relu-b64-h6-s1024-d64", "relu", 64, 64),
    (DECODE_B1, "decode", 128, 128),
    (DECODE_B8, "decode", 128, 128),
    (DECODE_MLA, "mla_decode", 576, 512),
    (DECODE_MLA_H128, "mla_decode", 576, 512),
    (DECODE_MQA_H128, "decode", 128, 128),
    (
        "retnet-parallel-b2-h32-s2048-d256-v512",
        "retnet_parallel",
        256,
        512,
    ),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // (A flag first, `--help` among them, is not an output directory.)
    let Some(out) = args.first().filter(|a| !a.starts_with('-')) else {
        eprintln!(
            "usage: gpu-cases <out_dir> [--nvrtc | --nvcc <path-to-nvcc>] [-I <include dir>]... [--recurrent-only] [--varlen | --varlen-only] [--decode-tiles] [--fwd-sweep] [--bwd-sweep] [--workloads <id,id,...>] [--forward-tile m<rows>n<keys>s<stages>] [--kv-multicast] [--timeline] [--timeline-tiles <tag,tag,...>]"
        );
        std::process::exit(2);
    };
    let nvrtc = args.iter().any(|a| a == "--nvrtc");
    let compiler = match (flag_values(&args, "--nvcc").into_iter().next(), nvrtc) {
        (Some(_), true) => {
            eprintln!("--nvcc and --nvrtc: pick one compiler");
            std::process::exit(2);
        }
        (Some(path), false) => Some(CubinCompiler::Nvcc(path)),
        (None, true) => Some(CubinCompiler::Nvrtc),
        (None, false) => None,
    };
    let includes = flag_values(&args, "-I");
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out).expect("create output directory");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut index = Vec::new();
    // `--recurrent-only`: only the recurrent cases and kernels;
    // `--sweep-only`: only the tile sweeps asked for (`--fwd-sweep`,
    // `--bwd-sweep`). Either way, and with `--varlen-only`, the parallel
    // cases and benchmark kernels are left out.
    let varlen_only = args.iter().any(|a| a == "--varlen-only");
    let sweep_only = args.iter().any(|a| a == "--sweep-only");
    // `--workloads a,b`: only those benchmark kernels (no cases, no
    // recurrent kernels): a quick build for `gpu_check.py --bench-only`.
    let workloads: Option<Vec<String>> = flag_values(&args, "--workloads")
        .first()
        .map(|list| list.split(',').map(str::to_string).collect());
    if let Some(unknown) = workloads
        .iter()
        .flatten()
        .find(|w| !BENCH.iter().any(|b| b.0 == w.as_str()))
    {
        eprintln!(
            "--workloads: no benchmark workload `{unknown}` (known: {})",
            BENCH.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
        );
        std::process::exit(2);
    }
    let picked = |w: &str| workloads.as_ref().is_none_or(|l| l.iter().any(|x| x == w));
    // `--timeline-tiles a,b`: the timed tiles of those tags built with
    // their marks too (`bench/timeline.py --tile`), as with `--timeline`.
    let timeline_tiles: Vec<String> = flag_values(&args, "--timeline-tiles")
        .first()
        .map(|list| list.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let timeline = args.iter().any(|a| a == "--timeline") || !timeline_tiles.is_empty();
    if timeline && compiler.is_none() {
        eprintln!("--timeline compiles cubins: it needs --nvrtc or --nvcc");
        std::process::exit(2);
    }
    let no_parallel = varlen_only || sweep_only || args.iter().any(|a| a == "--recurrent-only");
    // `--per-block`: the warp-specialised kernels launched with a block per
    // row block instead of persistent (to check and time that form).
    let per_block = args.iter().any(|a| a == "--per-block");
    // `--forward-tile m192n96s2`: the benchmark workloads' warp-specialised
    // forwards on that tile (a warpgroup per 64 rows, Q in shared memory,
    // no late epilogue) instead of their defaults, for `fwd_ab.py`.
    let forward_tile = match flag_values(&args, "--forward-tile")
        .first()
        .map(|t| parse_forward_tile(t))
    {
        Some(Ok(tile)) => Some(tile),
        Some(Err(e)) => {
            eprintln!("--forward-tile: {e}");
            std::process::exit(2);
        }
        None => None,
    };
    // `--kv-multicast`: the benchmark workloads' forwards with the cluster
    // pair's K/V multicast (ForwardConfig::kv_multicast, where it applies).
    let kv_multicast = args.iter().any(|a| a == "--kv-multicast");
    for case in CASES.iter().filter(|_| !no_parallel && workloads.is_none()) {
        eprintln!("case {} …", case.id);
        let v = load(&root, case.example);
        let meta = write_case(&out, case, &v, per_block, compiler.as_ref(), &includes);
        index.push(meta);
    }
    let mut bench = Vec::new();
    // (With `--sweep-only --bwd-sweep`, the forwards whose outputs the
    // backward sweep starts from.)
    let bwd_sweep = args.iter().any(|a| a == "--bwd-sweep");
    let swept_backward = |&&(workload, example, _, _): &&(&str, &str, u32, u32)| {
        sweep_only && bwd_sweep && (workload == BENCH[0].0 || BWD_SWEEP_EXAMPLES.contains(&example))
    };
    for (workload, example, dqk, dv) in BENCH
        .iter()
        .filter(|w| (!no_parallel || swept_backward(w)) && picked(w.0))
    {
        eprintln!("bench kernel {workload} …");
        let v = bench_variant(&root, example);
        let mut cfg = forward_config(&v, *dqk, *dv, per_block);
        if let Some((block_m, block_n, stages)) = forward_tile.filter(|_| cfg.warp_specialized) {
            cfg = ForwardConfig {
                block_m,
                block_n,
                warps: block_m / 16,
                stages,
                q_in_registers: false,
                late_epilogue: false,
                kv_multicast: false,
                ..cfg
            };
        }
        cfg.kv_multicast |= kv_multicast;
        if let Some((_, sizes)) = DECODE_SHAPES.iter().find(|(w, _)| w == workload) {
            cfg = cfg.for_decoding_call(&v, *sizes, 132, *dqk, *dv, Isa::Sm90a);
        }
        let file = format!("bench_{}", workload.replace('-', "_"));
        if *example == "mla_decode" || *example == "decode" {
            // Decoding: other tiles beside the default. The latent cache
            // (V stored in K) has no backward: it is refused with shared
            // storage; decoding's is not timed.
            let mut tiles = Vec::new();
            let list: Vec<DecodeTile> = match (*example, *workload) {
                ("decode", DECODE_MQA_H128) => [DECODE_TILES, MQA_TILES].concat(),
                ("decode", _) => DECODE_TILES.to_vec(),
                _ => MLA_TILES.to_vec(),
            };
            for &(tag, block_m, warps, key_warps, dv_split, block_n, stages, dv_warps, kernel) in
                &list
            {
                let wgmma = kernel != TileKernel::Sm80;
                let cfg = ForwardConfig {
                    block_m,
                    warps,
                    key_warps,
                    dv_split,
                    block_n,
                    stages,
                    dv_warps,
                    wgmma,
                    warp_specialized: kernel == TileKernel::WgmmaProducer,
                    persistent: false,
                    tma_loads: false,
                    fused_combine: cfg.fused_combine && !wgmma,
                    ..cfg
                };
                // (A tile past an H100's shared memory per block cannot launch:
                // recorded as an error, not compiled.)
                let smem_limit = Isa::Sm90a.max_dynamic_smem();
                tiles.push(match parallel_forward(&v, *dqk, *dv, &cfg) {
                    Ok(k) if k.smem_bytes > smem_limit => json!({ "tiles": tag, "error": format!(
                        "{} bytes of shared memory, sm_90a has {smem_limit} per block", k.smem_bytes) }),
                    Ok(k) => json!({ "tiles": tag, "kernel": kernel_meta(&out, &format!("{file}_{tag}"), &k, compiler.as_ref(), &includes) }),
                    Err(e) => json!({ "tiles": tag, "error": e.to_string() }),
                });
            }
            if cfg.split_kv && !cfg.wgmma {
                // The default with the other form of the split-KV combine:
                // in the main kernel (`fc`) or as a second kernel (`ck`;
                // the wgmma tiles have only the second).
                let other = ForwardConfig {
                    fused_combine: !cfg.fused_combine,
                    ..cfg
                };
                let tag = if other.fused_combine { "fc" } else { "ck" };
                tiles.push(match parallel_forward(&v, *dqk, *dv, &other) {
                    Ok(k) => json!({ "tiles": tag, "kernel": kernel_meta(&out, &format!("{file}_{tag}"), &k, compiler.as_ref(), &includes) }),
                    Err(e) => json!({ "tiles": tag, "error": e.to_string() }),
                });
            }
            bench.push(json!({
                "workload": workload,
                "kernel": kernel_meta(&out, &file, &parallel_forward(&v, *dqk, *dv, &cfg).expect("decoding forward"), compiler.as_ref(), &includes),
                "tiles": tiles,
            }));
            continue;
        }
        let mut entry = match parallel_forward(&v, *dqk, *dv, &cfg) {
            Ok(k) => {
                json!({ "workload": workload, "kernel": kernel_meta(&out, &file, &k, compiler.as_ref(), &includes) })
            }
            Err(e) => json!({ "workload": workload, "error": e.to_string() }),
        };
        let bcfg = BackwardConfig::for_variant(&v, *dqk, *dv, Elem::Bf16, Isa::Sm90a);
        entry["backward"] = match parallel_backward(&v, *dqk, *dv, &bcfg) {
            Ok(b) => backward_meta(
                &out,
                &format!("{file}_bwd"),
                &b,
                compiler.as_ref(),
                &includes,
            ),
            Err(e) => json!({ "error": e.to_string() }),
        };
        bench.push(entry);
    }
    // Backward tile sweep: every supported configuration on the first
    // softmax workload, timed alone by `gpu_check.py --bwd-sweep`.
    let mut sweep = Vec::new();
    if bwd_sweep {
        // One sweep row: the backward of `v` for `cfg`, compiled as `file`.
        let sweep_row = |v: &Variant,
                         workload: &str,
                         file: &str,
                         tag: String,
                         (dqk, dv),
                         cfg: BackwardConfig| {
            eprintln!("backward sweep {workload} {tag} …");
            let meta = match parallel_backward(v, dqk, dv, &cfg) {
                Ok(b) => backward_meta(&out, file, &b, compiler.as_ref(), &includes),
                Err(e) => json!({ "error": e.to_string() }),
            };
            json!({ "workload": workload, "config": tag, "backward": meta })
        };
        let v = load(&root, "softmax");
        let tag_of = |cfg: &BackwardConfig| {
            format!(
                "m{}w{}s{}{}{}{}{}",
                cfg.block_m,
                cfg.warps,
                cfg.split_d,
                if cfg.wgmma { "_wgmma" } else { "" },
                if cfg.shared_scores { "_xs" } else { "" },
                if cfg.warp_specialized { "_ws" } else { "" },
                if cfg.warp_specialized && cfg.tma_loads {
                    "_tma"
                } else {
                    ""
                }
            )
        };
        for (bm, warps, wgmma, warp_specialized, tma_loads) in [
            (32, 8, false, false, false),
            (64, 8, false, false, false),
            (64, 8, true, false, false),
            (64, 8, true, true, false),
            (64, 8, true, true, true),
        ] {
            let cfg = BackwardConfig {
                block_m: bm,
                warps,
                split_d: 1,
                elem: Elem::Bf16,
                wgmma,
                kv_groups: 1,
                shared_scores: false,
                warp_specialized,
                tma_loads,
            };
            let tag = tag_of(&cfg);
            let file = format!("sweep_bwd_{tag}");
            sweep.push(sweep_row(&v, BENCH[0].0, &file, tag, (128, 128), cfg));
        }
        // The other swept workloads (causal, GQA, head dims above 128): the
        // sm_80 kernel, and the sm_90a default with and without its producer
        // warpgroup and its TMA loads.
        for &(workload, example, dqk, dv) in
            BENCH.iter().filter(|w| BWD_SWEEP_EXAMPLES.contains(&w.1))
        {
            let v = bench_variant(&root, example);
            let sm90 = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
            // (Both warpgroups on the same keys: also with each computing
            // both Sᵀ and dPᵀ, or the other way round.)
            let shared_toggle = (sm90.split_d == 2).then_some(BackwardConfig {
                shared_scores: !sm90.shared_scores,
                ..sm90
            });
            // (And where the dims allow it, a warpgroup per 64 keys on
            // 32-query steps: half the dQ additions per query of the split
            // kernel's 64-key blocks.)
            let own_keys = (sm90.split_d == 2
                && aec_compiler::cuda::backward::wgmma_own_keys_dims_ok(dqk, dv))
            .then_some(BackwardConfig {
                block_m: 32,
                split_d: 1,
                shared_scores: false,
                ..sm90
            });
            for cfg in [
                BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm80),
                BackwardConfig {
                    warp_specialized: !sm90.warp_specialized,
                    ..sm90
                },
                BackwardConfig {
                    tma_loads: !sm90.tma_loads,
                    ..sm90
                },
            ]
            .into_iter()
            .chain(shared_toggle)
            .chain(own_keys)
            .chain(own_keys.map(|c| BackwardConfig {
                warp_specialized: false,
                tma_loads: false,
                ..c
            }))
            .chain([sm90])
            {
                let tag = tag_of(&cfg);
                let file = format!("sweep_bwd_{example}_{tag}");
                sweep.push(sweep_row(&v, workload, &file, tag, (dqk, dv), cfg));
            }
        }
    }
    let mut extra = json!([{
        "id": SLIDING_WINDOW,
        "variant": "softmax",
        "b": 1, "h": 32, "hkv": 32, "sq": 8192, "skv": 8192, "dqk": 128, "dv": 128,
        "causal": true,
        "window": 256,
        "anchors": ["flex"],
        "passes": ["fwd", "fwd+bwd"],
        "note": "not in shared/reference/workloads.json; FLOPs count the visible (query, key) pairs only"
    }]);
    // Softmax decoding beside cuDNN and FA2 (d128, one query per sequence).
    let decode_workload = |id: &str, b: u32, h: u32, hkv: u32, skv: u32, what: &str| {
        json!({
            "id": id,
            "variant": "softmax",
            "b": b, "h": h, "hkv": hkv, "sq": 1, "skv": skv, "dqk": 128, "dv": 128,
            "causal": false,
            "anchors": ["cudnn", "fa2"],
            "passes": ["fwd"],
            "note": format!("not in shared/reference/workloads.json: {what}")
        })
    };
    extra.as_array_mut().expect("a list").extend([
        decode_workload(
            DECODE_B1,
            1,
            32,
            8,
            32768,
            "one sequence, so the grid has 8 blocks without split-KV",
        ),
        decode_workload(
            DECODE_B8,
            8,
            32,
            8,
            16384,
            "eight long sequences, 64 blocks without split-KV",
        ),
        decode_workload(
            DECODE_MQA_H128,
            16,
            128,
            1,
            4096,
            "multi-query decoding, 128 query heads on one KV head (128 packed rows per block)",
        ),
    ]);
    // MLA decoding: one latent KV head, V the cache's first 512 columns.
    let mla_workload = |id: &str, b: u32, h: u32, heads: &str| {
        json!({
            "id": id,
            "variant": "mla_decode",
            "b": b, "h": h, "hkv": 1, "sq": 1, "skv": 4096, "dqk": 576, "dv": 512,
            "causal": false,
            "v_in_k": true,
            "scale": 1.0 / 192f64.sqrt(),
            "passes": ["fwd"],
            "note": format!("not in shared/reference/workloads.json: DeepSeek-V3 MLA decoding, {heads}, V the first 512 columns of the 576-wide latent cache")
        })
    };
    extra.as_array_mut().expect("a list").extend([
        mla_workload(DECODE_MLA, 64, 16, "16 query heads per GPU (128 over 8)"),
        mla_workload(DECODE_MLA_H128, 16, 128, "all 128 query heads on one GPU"),
    ]);
    // Forward tile sweep (`gpu_check.py --fwd-sweep`, each workload next to
    // cuDNN): wgmma configurations on the d128 softmax workloads,
    // DiffTransformer and DeepSeek.
    let mut fwd_sweep = Vec::new();
    if args.iter().any(|a| a == "--fwd-sweep") {
        // Persistent (one CTA per SM walking the row blocks), TMA loads.
        let wp = |bm, bn, warps, stages| ForwardConfig {
            block_m: bm,
            block_n: bn,
            warps,
            elem: Elem::Bf16,
            pack_gqa: false,
            wgmma: true,
            warp_specialized: true,
            stages,
            q_in_registers: false,
            dv_split: 1,
            split_kv: false,
            fused_combine: false,
            persistent: true,
            v_in_k: false,
            key_warps: 1,
            dv_warps: 1,
            tma_loads: true,
            late_epilogue: false,
            kv_multicast: false,
        };
        // Q in registers.
        let rqp = |bm, bn, warps, stages| ForwardConfig {
            q_in_registers: true,
            ..wp(bm, bn, warps, stages)
        };
        // The epilogue under the next tile's first S GEMM.
        let late = |cfg: ForwardConfig| ForwardConfig {
            late_epilogue: true,
            kv_multicast: false,
            ..cfg
        };
        // (Earlier sessions' rows: `results/*-forward-sweep.json` and notes.)
        for (workload, configs) in [
            (
                "softmax-b8-h32-s2048-d128",
                vec![
                    wp(128, 128, 8, 3),
                    wp(128, 128, 8, 2),
                    rqp(128, 128, 8, 3),
                    late(rqp(128, 128, 8, 3)),
                ],
            ),
            (
                "softmax-b1-h32-s8192-d128",
                vec![
                    wp(128, 128, 8, 3),
                    rqp(128, 128, 8, 3),
                    late(rqp(128, 128, 8, 3)),
                ],
            ),
            (
                "softmax-causal-b8-h32-s2048-d128",
                vec![
                    wp(128, 128, 8, 3),
                    rqp(128, 128, 8, 3),
                    late(rqp(128, 128, 8, 3)),
                ],
            ),
            (
                "softmax-causal-b1-h32-s8192-d128",
                vec![rqp(128, 128, 8, 3), late(rqp(128, 128, 8, 3))],
            ),
            (
                "softmax-gqa-causal-b8-h32-kv8-s2048-d128",
                vec![
                    wp(128, 128, 8, 3),
                    rqp(128, 128, 8, 3),
                    late(rqp(128, 128, 8, 3)),
                ],
            ),
            (
                "diff-causal-b8-h12-s2048-d128-v256",
                vec![wp(128, 64, 8, 4), wp(128, 64, 8, 3), wp(128, 80, 8, 3)],
            ),
            (
                "deepseek-causal-b8-h16-s2048-d192-v128",
                vec![
                    late(rqp(128, 80, 8, 3)),
                    wp(128, 128, 8, 2),
                    late(rqp(128, 128, 8, 2)),
                    late(rqp(128, 112, 8, 2)),
                    wp(128, 112, 8, 2),
                    late(rqp(128, 96, 8, 2)),
                ],
            ),
        ] {
            let &(_, example, dqk, dv) = BENCH
                .iter()
                .find(|w| w.0 == workload)
                .expect("a benchmark workload");
            let v = bench_variant(&root, example);
            for cfg in configs {
                let tag = format!(
                    "m{}n{}w{}_wgmma_ws{}_p{}{}",
                    cfg.block_m,
                    cfg.block_n,
                    cfg.warps,
                    if cfg.q_in_registers { "_rq" } else { "" },
                    if cfg.stages == 2 {
                        String::new()
                    } else {
                        format!("_s{}", cfg.stages)
                    },
                    if cfg.late_epilogue { "_le" } else { "" },
                );
                eprintln!("forward sweep {example} {tag} …");
                let file = format!("sweep_fwd_{example}_{tag}");
                let meta = match parallel_forward(&v, dqk, dv, &cfg) {
                    Ok(k) => kernel_meta(&out, &file, &k, compiler.as_ref(), &includes),
                    Err(e) => json!({ "error": e.to_string() }),
                };
                fwd_sweep.push(json!({ "workload": workload, "config": tag, "kernel": meta }));
            }
        }
    }
    // `--varlen` (`--varlen-only`: nothing else): the variable-length forward of softmax and causal softmax
    // (d128, the sm_90a defaults) and the dense kernel they are compared
    // with on a padded batch, for `bench/varlen_bench.py`.
    let mut varlen = Vec::new();
    if varlen_only || args.iter().any(|a| a == "--varlen") {
        for example in ["softmax", "softmax_causal"] {
            eprintln!("varlen kernels {example} …");
            let v = load(&root, example);
            let cfg = forward_config(&v, 128, 128, per_block);
            let varlen_cfg =
                ForwardConfig::varlen_default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
            let packed =
                parallel_forward_varlen(&v, 128, 128, &varlen_cfg).expect("varlen forward");
            // The dense kernels' persistent walk over the packed batch, to compare.
            let persistent = parallel_forward_varlen(
                &v,
                128,
                128,
                &ForwardConfig {
                    persistent: true,
                    ..varlen_cfg
                },
            )
            .expect("varlen forward");
            let dense = parallel_forward(&v, 128, 128, &cfg).expect("dense forward");
            let backward = parallel_backward_varlen(
                &v,
                128,
                128,
                &BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a),
            )
            .expect("varlen backward");
            varlen.push(json!({
                "example": example,
                "causal": example == "softmax_causal",
                "dqk": 128,
                "dv": 128,
                "varlen": kernel_meta(&out, &format!("varlen_{example}"), &packed, compiler.as_ref(), &includes),
                "varlen_persistent": kernel_meta(
                    &out,
                    &format!("varlen_persistent_{example}"),
                    &persistent,
                    compiler.as_ref(),
                    &includes,
                ),
                "dense": kernel_meta(&out, &format!("varlen_dense_{example}"), &dense, compiler.as_ref(), &includes),
                "backward": backward_meta(&out, &format!("varlen_bwd_{example}"), &backward, compiler.as_ref(), &includes),
            }));
        }
    }
    // With `--varlen`: the decoding forward over a contiguous and a paged
    // KV cache (`bench/paged_bench.py`).
    let mut paged = Vec::new();
    if varlen_only || args.iter().any(|a| a == "--varlen") {
        eprintln!("paged kernels decode …");
        let v = load(&root, "decode");
        let default = forward_config(&v, 128, 128, per_block);
        // The default tile, then (`--decode-tiles`) other key-block sizes
        // and ring depths, and the fat tile `for_few_blocks` gives grids
        // below half the SMs (four key warps on 128-key blocks), at any grid.
        let mut tiles = vec![default];
        if args.iter().any(|a| a == "--decode-tiles") {
            tiles.extend(
                [(32, 3), (32, 4), (64, 2), (64, 3)].map(|(block_n, stages)| ForwardConfig {
                    block_n,
                    stages,
                    ..default
                }),
            );
            tiles.push(
                default
                    .for_few_blocks(1, 132, 128, 128, Isa::Sm90a)
                    .with_combine_for_rows(4, 128),
            );
        }
        for (i, cfg) in tiles.into_iter().enumerate() {
            let tag = format!("n{}s{}k{}", cfg.block_n, cfg.stages, cfg.key_warps);
            let dense = parallel_forward(&v, 128, 128, &cfg).expect("dense forward");
            let pk = parallel_forward_paged(&v, 128, 128, &cfg).expect("paged forward");
            paged.push(json!({
                "example": "decode",
                "tiles": if i == 0 { "default".to_string() } else { tag.clone() },
                "dqk": 128,
                "dv": 128,
                "dense": kernel_meta(&out, &format!("paged_dense_decode_{tag}"), &dense, compiler.as_ref(), &includes),
                "paged": kernel_meta(&out, &format!("paged_decode_{tag}"), &pk, compiler.as_ref(), &includes),
            }));
        }
    }
    // With `--varlen` too: the block-mask builders of a causal and a
    // document mask (`bench/block_mask_bench.py`, against Flex's
    // `create_block_mask`).
    let mut builders = Vec::new();
    if varlen_only || args.iter().any(|a| a == "--varlen") {
        for example in ["softmax_causal", "document_mask"] {
            let v = load(&root, example);
            let b = block_mask_builder(&v, 128, 128).expect("block-mask builder");
            let (cu, cubin, ptxas) = compile_source(
                &out,
                &format!("mask_builder_{example}"),
                &b.source,
                compiler.as_ref(),
                &includes,
            );
            builders.push(json!({
                "example": example,
                "name": b.name,
                "source": cu,
                "cubin": cubin,
                "ptxas": ptxas,
                "per_batch": b.per_batch,
                "per_head": b.per_head,
                "customs": v.customs.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            }));
        }
    }
    // With `--varlen` too: softmax and causal softmax (d128, the sm_90a
    // defaults) dense and under a block-sparse mask
    // (`bench/block_sparse_bench.py`).
    let mut sparse = Vec::new();
    if varlen_only || args.iter().any(|a| a == "--varlen") {
        for example in ["softmax", "softmax_causal"] {
            eprintln!("block-sparse kernels {example} …");
            let v = load(&root, example);
            let cfg = forward_config(&v, 128, 128, per_block);
            let dense = parallel_forward(&v, 128, 128, &cfg).expect("dense forward");
            let sk =
                parallel_forward_block_sparse(&v, 128, 128, &cfg).expect("block-sparse forward");
            // A block per row block (the block scheduler balances rows of
            // uneven lists) against the persistent walk's static stride.
            let per_block_cfg = ForwardConfig {
                persistent: false,
                ..cfg
            };
            let sk_rb = parallel_forward_block_sparse(&v, 128, 128, &per_block_cfg)
                .expect("block-sparse forward");
            // Other tiles of the block-sparse kernel, timed beside the
            // default: Q in registers (frees Q for the next tile's copy at
            // the tile's start) and a shallower K/V ring.
            let tiles: Vec<Value> = [
                (
                    "rq",
                    ForwardConfig {
                        q_in_registers: true,
                        ..cfg
                    },
                ),
                ("s2", ForwardConfig { stages: 2, ..cfg }),
                (
                    "rq_s2",
                    ForwardConfig {
                        q_in_registers: true,
                        stages: 2,
                        ..cfg
                    },
                ),
            ]
            .into_iter()
            .filter(|(_, c)| *c != cfg)
            .filter_map(|(tag, c)| {
                let k = parallel_forward_block_sparse(&v, 128, 128, &c).ok()?;
                let file = format!("sparse_{tag}_{example}");
                Some(json!({ "tag": tag, "kernel": kernel_meta(&out, &file, &k, compiler.as_ref(), &includes) }))
            })
            .collect();
            sparse.push(json!({
                "example": example,
                "dqk": 128,
                "dv": 128,
                "tiles": tiles,
                "dense": kernel_meta(&out, &format!("sparse_dense_{example}"), &dense, compiler.as_ref(), &includes),
                "sparse": kernel_meta(&out, &format!("sparse_{example}"), &sk, compiler.as_ref(), &includes),
                "sparse_per_block": kernel_meta(&out, &format!("sparse_rb_{example}"), &sk_rb, compiler.as_ref(), &includes),
            }));
        }
    }
    // `--timeline`: each benchmark forward also built with its per-block
    // timeline marks, for `bench/timeline.py` (a compiler checked at the start).
    if let (true, Some(compiler)) = (timeline, compiler.as_ref()) {
        for entry in &mut bench {
            if entry["kernel"].is_object() {
                eprintln!("timeline build {} …", entry["workload"]);
                add_timeline_cubin(&out, &mut entry["kernel"], compiler, &includes);
            }
            let workload = entry["workload"].clone();
            if let Some(tiles) = entry["tiles"].as_array_mut() {
                for tile in tiles {
                    let tag = tile["tiles"].as_str().unwrap_or_default().to_string();
                    if tile["kernel"].is_object() && timeline_tiles.contains(&tag) {
                        eprintln!("timeline build {workload} tile {tag} …");
                        add_timeline_cubin(&out, &mut tile["kernel"], compiler, &includes);
                    }
                }
            }
        }
    }
    let (recurrent_cases, recurrent_bench) = if varlen_only || sweep_only || workloads.is_some() {
        (Vec::new(), Vec::new())
    } else {
        recurrent::write_all(&out, &root, compiler.as_ref(), &includes)
    };
    let all = json!({
        "compiler": compiler.as_ref().map(CubinCompiler::describe),
        "cases": index,
        "bench": bench,
        "bwd_sweep": sweep,
        "fwd_sweep": fwd_sweep,
        "extra_workloads": extra,
        "recurrent_cases": recurrent_cases,
        "recurrent_bench": recurrent_bench,
        "varlen": varlen,
        "mask_builders": builders,
        "paged": paged,
        "sparse": sparse,
    });
    std::fs::write(
        out.join("index.json"),
        serde_json::to_string_pretty(&all).expect("json"),
    )
    .expect("write index");
    eprintln!("wrote {}", out.join("index.json").display());
}

/// `m<rows>n<keys>s<stages>` as (block_m, block_n, stages).
fn parse_forward_tile(tag: &str) -> Result<(u32, u32, u32), String> {
    let bad = || format!("`{tag}` is not a tile such as m192n96s2 (rows, keys, stages)");
    let rest = tag.strip_prefix('m').ok_or_else(bad)?;
    let (m, rest) = rest.split_once('n').ok_or_else(bad)?;
    let (n, s) = rest.split_once('s').ok_or_else(bad)?;
    let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
    Ok((num(m)?, num(n)?, num(s)?))
}

fn flag_values(args: &[String], flag: &str) -> Vec<String> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].clone())
        .collect()
}

pub(crate) fn load(root: &Path, example: &str) -> Variant {
    let path = root.join("examples").join(format!("{example}.rs"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A benchmark workload's variant: its example, or for
/// `softmax_gqa_causal` the GQA example with the causal mask (declared here).
fn bench_variant(root: &Path, example: &str) -> Variant {
    match example {
        "softmax_gqa_causal" => gqa_causal(root),
        e => load(root, e),
    }
}

fn gqa_causal(root: &Path) -> Variant {
    let path = root.join("examples/softmax_gqa.rs");
    let src = std::fs::read_to_string(&path).expect("softmax_gqa example");
    let src = src.replacen(
        "modify_q = |q| q * rsqrt(Dqk);",
        "modify_q = |q| q * rsqrt(Dqk);\n        mask = |b, h, i, j| i >= j;",
        1,
    );
    assert!(
        src.contains("mask ="),
        "softmax_gqa.rs changed shape; update gqa_causal()"
    );
    let mut v = parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant");
    v.name = "SoftmaxGqaCausal".into();
    v
}

pub(crate) fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(1e-12..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

pub(crate) fn bf16_round(x: f64) -> f64 {
    half::bf16::from_f64(x).to_f64()
}

/// A tensor's values as little-endian bf16 bytes (what the GPU scripts load).
pub(crate) fn as_bf16(t: &Tensor) -> Vec<u8> {
    t.data
        .iter()
        .flat_map(|x| half::bf16::from_f64(*x).to_bits().to_le_bytes())
        .collect()
}

/// A tensor's values as little-endian f32 bytes.
pub(crate) fn as_f32(t: &Tensor) -> Vec<u8> {
    t.data
        .iter()
        .flat_map(|x| (*x as f32).to_le_bytes())
        .collect()
}

/// The default sm_90a forward configuration; with `--per-block`, the
/// persistent kernels launched with a block per row block instead.
/// The latent-cache example (`mla_decode`) stores V in K: its default
/// sm_80 tiles with `v_in_k`, as `KernelOptions::v_in_k` gives them.
fn forward_config(v: &Variant, dqk: u32, dv: u32, per_block: bool) -> ForwardConfig {
    if v.name == "MlaDecode" {
        return untuned_forward_config(
            ForwardConfig::default_for,
            v,
            dqk,
            dv,
            Elem::Bf16,
            Isa::Sm90a,
            true,
        );
    }
    let mut cfg = ForwardConfig::default_for(v, dqk, dv, Elem::Bf16, Isa::Sm90a);
    cfg.persistent &= !per_block;
    cfg
}

fn write_case(
    out: &Path,
    case: &Case,
    v: &Variant,
    per_block: bool,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let [b, h, hkv, sq, skv, dqk, dv] = case.sizes;
    let mut rng = StdRng::seed_from_u64(case.id.len() as u64 * 977 + 13);
    let size = |a: Axis| match a {
        Axis::B => b,
        Axis::H => h,
        Axis::Hkv => hkv,
        Axis::Sq => sq,
        Axis::Skv => skv,
        Axis::Dqk => dqk,
        Axis::Dv => dv,
        _ => unreachable!("parallel axes only"),
    };
    let shape = |axes: &[Axis]| axes.iter().map(|a| size(*a)).collect::<Vec<_>>();
    let tensor = |axes: &[Axis], rng: &mut StdRng| {
        Tensor::from_fn(&shape(axes), |_| bf16_round(normal(rng)))
    };
    let q = tensor(&v.q.axes, &mut rng);
    let k = tensor(&v.k.axes, &mut rng);
    let cfg = forward_config(v, dqk as u32, dv as u32, per_block);
    let vv = if cfg.v_in_k {
        // V stored in K: each V row is its K row's first Dv columns.
        Tensor::from_fn(&shape(&v.v.axes), |idx| k.get(idx))
    } else {
        tensor(&v.v.axes, &mut rng)
    };
    let mut customs = IndexMap::new();
    for c in &v.customs {
        let t = if c.name.starts_with("doc_") {
            // Document ids: three documents; the last query row sits in a
            // document no key has, so that row is fully masked.
            let n = shape(&c.axes)[1];
            let last_alone = c.name == "doc_q";
            Tensor::from_fn(&shape(&c.axes), |idx| {
                if last_alone && idx[1] == n - 1 {
                    9.0
                } else {
                    (idx[1] * 3 / n) as f64
                }
            })
        } else {
            Tensor::from_fn(&shape(&c.axes), |_| {
                rng.random_range(case.custom_range.0..case.custom_range.1)
            })
        };
        customs.insert(c.name.clone(), t);
    }
    let inputs = Inputs {
        q,
        k,
        v: vv,
        customs,
        initial_state: None,
        initial_normalizer: None,
    };
    let fwd = reference::forward(v, &inputs, Options::default()).expect("reference forward");
    let kernel = parallel_forward(v, dqk as u32, dv as u32, &cfg)
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
    write("o_ref.bin", as_f32(&fwd.o));
    let mut rows = Vec::new();
    for r in &kernel.row_outputs {
        let t = if let Some(s) = r.strip_prefix("scale.") {
            &fwd.scales[s]
        } else {
            &fwd.row_state[r.trim_start_matches("state.")]
        };
        rows.extend(as_f32(t));
    }
    write("rows_ref.bin", rows);
    json!({
        "id": case.id,
        "variant": v.name,
        "sizes": { "B": b, "H": h, "Hkv": hkv, "Sq": sq, "Skv": skv, "Dqk": dqk, "Dv": dv },
        "shapes": { "q": inputs.q.shape, "k": inputs.k.shape, "v": inputs.v.shape },
        "customs": v.customs.iter().map(|c| json!({ "name": c.name, "shape": shape(&c.axes) })).collect::<Vec<_>>(),
        "kernel": km,
    })
}

fn kernel_meta(
    out: &Path,
    file: &str,
    k: &KernelSource,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let (cu, cubin, ptxas) = compile_source(out, file, &k.source, compiler, includes);
    let args = args_meta_with_maps(&k.args, &k.tensor_maps);
    json!({
        "name": k.name,
        "source": cu,
        "cubin": cubin,
        "threads": k.threads,
        "block_m": k.block_m,
        "smem_bytes": k.smem_bytes,
        "args": args,
        "row_outputs": k.row_outputs,
        "packed_gqa": k.packed_gqa,
        "dv_split": k.dv_split,
        "persistent": k.persistent,
        "tile_schedule": k.tile_schedule,
        "cluster_pairs": k.cluster_pairs,
        "split_kv": k.split_kv,
        "combine": k.combine,
        "combine_threads": k.combine_threads(),
        "combine_rows_per_block": k.combine_rows(),
        "block_n": k.block_n,
        "kv_bytes_in_flight": k.kv_bytes_in_flight,
        "split_fixed_work": k.split_fixed_work,
        "split_state_words": k.split_state_words,
        "dqk": k.dqk,
        "dv": k.dv,
        "v_in_k": k.v_in_k,
        "ptxas": ptxas,
    })
}

/// The backward's three kernels (one cubin) and how to launch them.
fn backward_meta(
    out: &Path,
    file: &str,
    b: &BackwardSource,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> Value {
    let (cu, cubin, ptxas) = compile_source(out, file, &b.source, compiler, includes);
    let launch = |l: &aec_compiler::Launch| {
        let grid = match l.grid {
            Grid::Rows { per_block } => json!({ "kind": "rows", "per_block": per_block }),
            Grid::KeyBlocks { block_n, groups } => {
                json!({ "kind": "key_blocks", "block_n": block_n, "groups": groups })
            }
            Grid::Elements { per_block } => json!({ "kind": "elements", "per_block": per_block }),
        };
        json!({ "name": l.name, "threads": l.threads, "smem_bytes": l.smem_bytes, "grid": grid })
    };
    json!({
        "source": cu,
        "cubin": cubin,
        "args": args_meta_with_maps(&b.args, &b.tensor_maps),
        "launches": [launch(&b.pre), launch(&b.main), launch(&b.post)],
        "dqk": b.dqk,
        "dv": b.dv,
        "config": { "block_m": b.config.block_m, "warps": b.config.warps },
        "ptxas": ptxas,
    })
}

/// What builds the cubins (`--nvrtc` or `--nvcc <path>`).
#[derive(Debug, Clone)]
pub(crate) enum CubinCompiler {
    /// NVRTC with the runtime's options: the build the runtime, `aec
    /// compile` and the tuner ship.
    Nvrtc,
    /// nvcc at this path, `-O3`.
    Nvcc(String),
}

impl CubinCompiler {
    /// How `index.json` names it.
    fn describe(&self) -> String {
        match self {
            CubinCompiler::Nvrtc => match aec::runtime::nvrtc_version() {
                Ok((major, minor)) => format!("nvrtc {major}.{minor}"),
                Err(_) => "nvrtc".into(),
            },
            CubinCompiler::Nvcc(path) => format!("nvcc ({path})"),
        }
    }

    /// Compiles `source` (written at `cu`, which nvcc reads) to the sm_90a
    /// cubin `target` with `defines` (`-D…`); returns ptxas's log (panics
    /// with the compiler's log where it fails: a generated kernel that does
    /// not compile is a bug to see at once).
    fn cubin(
        &self,
        includes: &[String],
        cu: &Path,
        source: &str,
        target: &Path,
        defines: &[&str],
    ) -> String {
        match self {
            CubinCompiler::Nvcc(nvcc) => nvcc_cubin(nvcc, includes, cu, target, defines),
            CubinCompiler::Nvrtc => {
                use aec::runtime::{CompileOptions, compile};
                let mut opts = CompileOptions::new("sm_90a");
                opts.include_dirs.extend(includes.iter().map(PathBuf::from));
                opts.flags.push("--ptxas-options=-v".into());
                opts.flags.extend(defines.iter().map(|d| d.to_string()));
                let compiled = compile(source, &opts)
                    .unwrap_or_else(|e| panic!("NVRTC failed on {}:\n{e}", cu.display()));
                std::fs::write(target, &compiled.cubin).expect("write cubin");
                compiled.log
            }
        }
    }
}

/// Writes `<file>.cu` and, with a compiler, compiles it to
/// `<file>.sm_90a.cubin`; returns the source and cubin names and ptxas's
/// resource lines.
pub(crate) fn compile_source(
    out: &Path,
    file: &str,
    source: &str,
    compiler: Option<&CubinCompiler>,
    includes: &[String],
) -> (Value, Value, Value) {
    let cu = out.join(format!("{file}.cu"));
    std::fs::write(&cu, source).expect("write kernel source");
    let mut ptxas = Value::Null;
    let mut cubin = Value::Null;
    if let Some(compiler) = compiler {
        let target = out.join(format!("{file}.sm_90a.cubin"));
        let log = compiler.cubin(includes, &cu, source, &target, &[]);
        ptxas = json!(
            log.lines()
                .filter(|l| l.contains("registers") || l.contains("spill"))
                .collect::<Vec<_>>()
        );
        cubin = json!(target.file_name().and_then(|f| f.to_str()));
    }
    (json!(cu.file_name().and_then(|f| f.to_str())), cubin, ptxas)
}

/// Compiles `cu` to the sm_90a cubin `target` with `extra` flags; returns
/// ptxas's log (panics with it where nvcc fails).
fn nvcc_cubin(nvcc: &str, includes: &[String], cu: &Path, target: &Path, extra: &[&str]) -> String {
    let mut cmd = Command::new(nvcc);
    cmd.args([
        "-arch=sm_90a",
        "-cubin",
        "-O3",
        "-Xptxas",
        "-v",
        "-diag-suppress",
        "177",
    ])
    .args(extra)
    .arg("-o")
    .arg(target)
    .arg(cu);
    for i in includes {
        cmd.arg("-I").arg(i);
    }
    let res = cmd.output().expect("run nvcc");
    let log = String::from_utf8_lossy(&res.stderr).to_string();
    assert!(
        res.status.success(),
        "nvcc failed on {}:\n{log}",
        cu.display()
    );
    log
}

/// `--timeline`: the forward kernel of `meta` (written by [`kernel_meta`])
/// compiled again with `-DAEC_TIMELINE` (per-block `%globaltimer` marks,
/// `templates/cuda/prelude.cu`) as `meta["timeline_cubin"]`, which
/// `bench/timeline.py` loads.
fn add_timeline_cubin(out: &Path, meta: &mut Value, compiler: &CubinCompiler, includes: &[String]) {
    let Some(source) = meta["source"].as_str() else {
        return;
    };
    let cu = out.join(source);
    let stem = source.strip_suffix(".cu").unwrap_or(source);
    let target = out.join(format!("{stem}.timeline.sm_90a.cubin"));
    let text = std::fs::read_to_string(&cu).expect("read kernel source");
    compiler.cubin(includes, &cu, &text, &target, &["-DAEC_TIMELINE"]);
    meta["timeline_cubin"] = json!(target.file_name().and_then(|f| f.to_str()));
}

/// [`args_meta`], with each tensor map's extents (size expressions,
/// innermost first) and box.
fn args_meta_with_maps(args: &[ArgKind], maps: &[TensorMapSpec]) -> Vec<Value> {
    let mut meta = args_meta(args);
    for (a, m) in args.iter().zip(meta.iter_mut()) {
        if let ArgKind::TensorMap(t) = a {
            let spec = maps
                .iter()
                .find(|s| s.tensor == *t)
                .expect("every tensor map has its spec");
            m["dims"] = json!(spec.dims);
            m["box"] = json!(spec.box_dims);
        }
    }
    meta
}

fn args_meta(args: &[ArgKind]) -> Vec<Value> {
    args.iter()
        .map(|a| match a {
            ArgKind::Tensor(t) => json!({ "kind": "tensor", "name": t }),
            ArgKind::RowOut => json!({ "kind": "rowout" }),
            ArgKind::Custom(c) => json!({ "kind": "custom", "name": c }),
            ArgKind::Size(ax) => json!({ "kind": "size", "axis": ax.name() }),
            ArgKind::CustomGrad(c) => json!({ "kind": "custom_grad", "name": c }),
            ArgKind::Workspace(w) => json!({ "kind": "workspace", "name": w }),
            ArgKind::KvSplits => json!({ "kind": "kv_splits" }),
            ArgKind::State(n) => json!({ "kind": "state", "name": n }),
            ArgKind::CuSeqlens => json!({ "kind": "cu_seqlens" }),
            ArgKind::CuSeqlensKv => json!({ "kind": "cu_seqlens_k" }),
            ArgKind::PagedKv(n) => json!({ "kind": "paged", "name": n }),
            ArgKind::BlockMask(n) => json!({ "kind": "block_mask", "name": n }),
            ArgKind::Segments(n) => json!({ "kind": "segments", "name": n }),
            ArgKind::TensorMap(n) => json!({ "kind": "tensor_map", "name": n }),
        })
        .collect()
}
