//! Compile checks without a GPU (design §9, layer 2): the parallel forward
//! and backward kernels of every parallel example, compiled by NVRTC for
//! sm_80 and sm_90a,
//! with its registers and spills read back from `ptxas -v` and tensor-core
//! instructions (HMMA) confirmed in the SASS.
//!
//! Needs the pinned toolchain (`cargo xtask toolchains`; `cargo xtask test`
//! installs it and sets `AEC_REQUIRE_TOOLCHAINS=1`, so in CI a missing piece
//! fails the test instead of skipping it).

mod common;

use aec::compiler::{
    ArgKind, BackwardConfig, BackwardSource, Elem, ForwardConfig, Isa, MAX_DQK, TILE_SCHEDULE_ARGS,
    parallel_backward, parallel_backward_varlen, parallel_forward, parallel_forward_block_sparse,
    parallel_forward_paged, parallel_forward_varlen,
};
use aec::frontend::Variant;
use aec::runtime::{CompileOptions, Compiled, ResourceUsage, compile, ptxas_resources, sass};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pass {
    Forward,
    /// The persistent variant of the warp-specialised forward (sm_90a).
    PersistentForward,
    /// The variable-length forward with its default tiles (a block per row
    /// block).
    VarlenForward,
    /// The forward over a paged KV cache (the dense default tiles).
    PagedForward,
    /// The forward under a block-sparse mask (the dense default tiles).
    SparseForward,
    Backward,
    /// The backward of a packed variable-length batch.
    VarlenBackward,
}

#[test]
fn every_parallel_kernel_compiles_for_sm80_and_sm90a() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let examples = common::parallel_examples();
    assert!(
        examples.len() >= 13,
        "expected the parallel examples, found {}",
        examples.len()
    );
    let jobs: Vec<(String, Variant, &str, Pass)> = examples
        .into_iter()
        .flat_map(|(n, v)| {
            let persistent = (n.clone(), v.clone(), "sm_90a", Pass::PersistentForward);
            let varlen_backward = VARLEN_BACKWARD_EXAMPLES
                .contains(&n.as_str())
                .then(|| {
                    ["sm_80", "sm_90a"].map({
                        let (n, v) = (n.clone(), v.clone());
                        move |a| (n.clone(), v.clone(), a, Pass::VarlenBackward)
                    })
                })
                .into_iter()
                .flatten();
            let paged = PAGED_EXAMPLES
                .contains(&n.as_str())
                .then(|| {
                    ["sm_80", "sm_90a"].into_iter().flat_map({
                        let (n, v) = (n.clone(), v.clone());
                        move |a| {
                            // (Decoding's packed heads take no block mask.)
                            [Pass::PagedForward, Pass::SparseForward]
                                .into_iter()
                                .filter(|&p| !(n == "decode" && p == Pass::SparseForward))
                                .map(|p| (n.clone(), v.clone(), a, p))
                                .collect::<Vec<_>>()
                        }
                    })
                })
                .into_iter()
                .flatten();
            [Pass::Forward, Pass::VarlenForward, Pass::Backward]
                .into_iter()
                .flat_map(move |p| {
                    let (n, v) = (n.clone(), v.clone());
                    ["sm_80", "sm_90a"].map(move |a| (n.clone(), v.clone(), a, p))
                })
                .chain([persistent])
                .chain(paged)
                .chain(varlen_backward)
        })
        .collect();
    // Two workers: CI has two cores, and each NVRTC run is single-threaded.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let reports: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut lines = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some((name, v, arch, pass)) = jobs.get(k) else {
                            break;
                        };
                        lines.push(match pass {
                            Pass::Forward => check_one(name, v, arch, false, Rows::Dense),
                            Pass::PersistentForward => check_one(name, v, arch, true, Rows::Dense),
                            Pass::VarlenForward => check_one(name, v, arch, false, Rows::Varlen),
                            Pass::PagedForward => check_one(name, v, arch, true, Rows::Paged),
                            Pass::SparseForward => check_one(name, v, arch, true, Rows::Sparse),
                            Pass::Backward => check_backward(name, v, arch, false),
                            Pass::VarlenBackward => check_backward(name, v, arch, true),
                        });
                    }
                    lines
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    for line in reports {
        eprintln!("{line}");
    }
}

/// Spill stores allowed per configuration on `arch`. Every forward this
/// file builds for sm_90a compiles without spills (issue 4's compile check;
/// bench/NOTES.md session 73). On sm_80, just above what NVRTC 13.0.88
/// produces today (bench/NOTES.md), so a regression fails: one 16-row tile
/// per warp with Dqk ≤ 128 must not spill; nvcc builds the same sources with
/// fewer registers: its two-tile kernels do not spill at all.
fn spill_budget(arch: &str, cfg: &ForwardConfig, dqk: u32, dv: u32) -> u32 {
    // (The warp-specialised, persistent and wgmma forms are sm_90a's.)
    if arch == "sm_90a" {
        0
    } else if dv > 128 {
        64
    } else if cfg.m_tiles() > 1 {
        192
    } else if dqk > 128 {
        128
    } else {
        0
    }
}

/// The examples whose paged forward is compiled (decoding with packed heads
/// and KV splits, GQA, a custom input, the causal mask).
const PAGED_EXAMPLES: [&str; 4] = ["decode", "softmax_gqa", "alibi", "softmax_causal"];

/// The variable-length backward: a mask, GQA, a custom input, and the split
/// wgmma kernel (DeepSeek) on sm_90a.
const VARLEN_BACKWARD_EXAMPLES: [&str; 4] = ["softmax_causal", "softmax_gqa", "alibi", "deepseek"];

/// Where a forward's rows are.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rows {
    Dense,
    Varlen,
    Paged,
    Sparse,
}

fn check_one(name: &str, v: &Variant, arch: &str, persistent: bool, rows: Rows) -> String {
    let (dqk, dv) = common::head_dims(v);
    // (The runtime's defaults: paged, block-sparse and variable-length rows
    // load by cp.async and take those tiles.)
    let default = if matches!(rows, Rows::Dense) {
        ForwardConfig::default_for
    } else {
        ForwardConfig::cp_async_default_for
    };
    let mut cfg = default(v, dqk, dv, Elem::Bf16, Isa::for_arch(arch));
    cfg.persistent = persistent && cfg.warp_specialized;
    check_config(name, v, arch, &cfg, rows)
}

/// Deeper K/V rings on the kernels without warp specialisation (sm_80, and
/// wgmma in every warp): they compile within the same budgets, dense and
/// paged.
#[test]
fn deeper_rings_compile_without_spills() {
    // (Four 64-key blocks of the prefill tiles exceed sm_80's shared memory.)
    let rings = [
        ("softmax_causal", "sm_80", 3),
        ("softmax_causal", "sm_90a", 3),
        ("decode", "sm_80", 3),
        ("decode", "sm_80", 4),
        ("decode", "sm_90a", 4),
    ];
    for (name, arch, stages) in rings {
        let v = common::example(name);
        let (dqk, dv) = common::head_dims(&v);
        {
            let cfg = ForwardConfig {
                stages,
                warp_specialized: false,
                persistent: false,
                q_in_registers: false,
                v_in_k: false,
                ..ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::for_arch(arch))
            };
            for rows in [Rows::Dense, Rows::Paged] {
                let line = check_config(name, &v, arch, &cfg, rows);
                assert!(line.contains(&format!("_s{stages}")), "{line}");
                eprintln!("{line}");
            }
        }
    }
}

/// The cluster pair's K/V multicast (`ForwardConfig::kv_multicast`) where
/// it applies — no mask or the plain causal one, TMA loads on dense rows,
/// one Dv slice — compiles within the spill budget with the multicast TMA
/// copy and the arrivals on the peer's barriers in the SASS; elsewhere
/// (another mask, Dv split between blocks, the paged or variable-length
/// rows) the kernel is the one without it.
#[test]
fn kv_multicast_forwards_compile() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let with_multicast = |v: &Variant| {
        let (dqk, dv) = common::head_dims(v);
        ForwardConfig {
            kv_multicast: true,
            ..ForwardConfig::default_for(v, dqk, dv, Elem::Bf16, Isa::Sm90a)
        }
    };
    for name in [
        "deepseek",
        "softmax",
        "softmax_causal",
        "diff_transformer",
        "sigmoid",
    ] {
        let v = common::example(name);
        let cfg = with_multicast(&v);
        let line = check_config(name, &v, "sm_90a", &cfg, Rows::Dense);
        assert!(line.ends_with("_mc"), "{line}");
        let (dqk, dv) = common::head_dims(&v);
        let kernel = parallel_forward(&v, dqk, dv, &cfg).unwrap();
        assert!(
            kernel.cluster_pairs && kernel.source.contains("__cluster_dims__(2, 1, 1)"),
            "{name}: not launched in pairs"
        );
        let compiled = compile(&kernel.source, &CompileOptions::new("sm_90a")).unwrap();
        let text = sass(&compiled.cubin).expect("cuobjdump");
        for op in ["UTMALDG.3D.MULTICAST", "SYNCS.ARRIVE.TRANS64.RED"] {
            assert!(text.contains(op), "{name}: no {op} in the SASS");
        }
        eprintln!("{line}");
    }
    // (RetNet's 256/512: Dv in two slices.)
    for (name, rows, dims) in [
        ("sliding_window", Rows::Dense, None),
        ("retnet_parallel", Rows::Dense, Some((256, 512))),
        ("softmax_causal", Rows::Paged, None),
        ("softmax_causal", Rows::Varlen, None),
    ] {
        let v = common::example(name);
        let (dqk, dv) = dims.unwrap_or_else(|| common::head_dims(&v));
        let cfg = ForwardConfig {
            kv_multicast: true,
            ..ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a)
        };
        assert!(dims.is_none() || cfg.dv_split > 1, "{name}: {cfg:?}");
        let kernel = match rows {
            Rows::Paged => parallel_forward_paged(&v, dqk, dv, &cfg),
            Rows::Varlen => parallel_forward_varlen(&v, dqk, dv, &cfg),
            _ => parallel_forward(&v, dqk, dv, &cfg),
        }
        .unwrap();
        assert!(
            !kernel.cluster_pairs
                && !kernel.name.contains("_mc")
                && !kernel.source.contains("__cluster_dims__"),
            "{name} ({rows:?}): `{}` takes the multicast",
            kernel.name
        );
    }
}

/// Decoding with 64 or more query rows per KV head at d128 (MQA, 128 heads
/// on one KV head) takes the sm_90a wgmma tile — one warpgroup on 128-key
/// blocks in three stages — which compiles dense and paged within the
/// spill budget.
#[test]
fn many_rows_per_kv_head_decode_on_wgmma() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let v = common::example("decode");
    let (dqk, dv) = common::head_dims(&v);
    let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a).for_packed_rows(
        128,
        dqk,
        dv,
        Isa::Sm90a,
    );
    assert_eq!(
        (cfg.wgmma, cfg.block_m, cfg.block_n, cfg.stages, cfg.warps),
        (true, 64, 128, 3, 4),
        "{cfg:?}"
    );
    for rows in [Rows::Dense, Rows::Paged] {
        let line = check_config("decode", &v, "sm_90a", &cfg, rows);
        assert!(line.contains("_gqa_wgmma"), "{line}");
        eprintln!("{line}");
    }
    // The untuned tile takes two key warpgroups and a producer warpgroup
    // (`with_decoding_producer`): the consumers' code compiles within the
    // registers the launch bound leaves (168 at 384 threads), dense and
    // paged.
    let keyed = cfg.with_decoding_producer(&v, dqk, dv, Isa::Sm90a);
    assert_eq!(
        (keyed.key_warps, keyed.warps, keyed.block_n),
        (2, 8, 96),
        "{keyed:?}"
    );
    for rows in [Rows::Dense, Rows::Paged] {
        let line = check_config("decode", &v, "sm_90a", &keyed, rows);
        assert!(line.contains("_gqa_wgmma_ws_s4_k2"), "{line}");
        eprintln!("{line}");
    }
}

/// Multi-head latent attention's decoding with V stored in K (Dqk 576, Dv
/// 512, `v_in_k`): dense and paged, the default tiles (two Dv slices) and
/// four slices, compile without loading V (the V tile is the K tile) and
/// within the spill budget.
#[test]
fn latent_cache_decoding_compiles_without_v_tiles() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let v = common::example("mla_decode");
    let default = ForwardConfig {
        v_in_k: true,
        ..ForwardConfig::default_for(&v, 576, 512, Elem::Bf16, Isa::Sm80)
    };
    assert!(
        default.split_kv && default.pack_gqa && !default.wgmma,
        "{default:?}"
    );
    // The untuned tile with shared storage (`with_v_in_k`): Dv split between
    // two warps of one block, which add their halves of the scores; and its
    // 64-row form where a KV head has 64 or more query rows.
    let dv_warps = default.with_v_in_k(576, 512, Isa::Sm80);
    assert_eq!(
        (
            dv_warps.dv_warps,
            dv_warps.dv_split,
            dv_warps.key_warps,
            dv_warps.warps
        ),
        (2, 1, 1, 2),
        "{dv_warps:?}"
    );
    // Its 64-row form (180 KB of shared memory: Hopper's blocks hold it, an
    // sm_80 block not), the sm_80 template's tile for 64 or more rows; on
    // sm_90a those take the wgmma tile: 64 rows, 64-key blocks, Dv split
    // between two warpgroups.
    let dv_warps_64 = ForwardConfig {
        block_m: 64,
        warps: 8,
        ..dv_warps
    };
    assert_eq!(dv_warps.for_packed_rows(128, 576, 512, Isa::Sm80), dv_warps);
    let wgmma = dv_warps.for_packed_rows(128, 576, 512, Isa::Sm90a);
    assert_eq!(
        (
            wgmma.wgmma,
            wgmma.block_m,
            wgmma.block_n,
            wgmma.warps,
            wgmma.dv_warps,
            wgmma.dv_split
        ),
        (true, 64, 64, 8, 2, 1),
        "{wgmma:?}"
    );
    for (cfg, archs, tag) in [
        (dv_warps, &["sm_80", "sm_90a"][..], "_dw2_vk"),
        (dv_warps_64, &["sm_90a"][..], "_dw2_vk"),
        (wgmma, &["sm_90a"][..], "_gqa_wgmma_dw2_vk"),
        // The same with a producer warpgroup (not a default).
        (
            ForwardConfig {
                warp_specialized: true,
                ..wgmma
            },
            &["sm_90a"][..],
            "_gqa_wgmma_ws_dw2_vk",
        ),
    ] {
        for rows in [Rows::Dense, Rows::Paged] {
            for &arch in archs {
                let line = check_config("mla_decode", &v, arch, &cfg, rows);
                assert!(line.contains(tag), "{line}");
                eprintln!("{line}");
            }
        }
        let k = parallel_forward(&v, 576, 512, &cfg).expect("latent forward");
        if cfg.wgmma {
            // Q and two K tiles in 128-byte-swizzled panels, 1 KiB of slack
            // to align them; without the producer warpgroup the second Dv
            // warpgroup takes P (BN / 4 words per thread) and the row
            // rescale (2) from the first through shared memory.
            let hand_over = if cfg.warp_specialized {
                0
            } else {
                128 * (cfg.block_n / 4 + 2) * 4
            };
            assert_eq!(
                k.smem_bytes,
                2 * (cfg.block_m * 576 + cfg.stages * cfg.block_n * 576) + 1024 + hand_over
            );
            assert_eq!(
                k.source
                    .contains("mbar_wait(smem_u32(&bar_p), p_phase & 1)"),
                !cfg.warp_specialized
            );
            // 256 O columns a warpgroup: the row maximum is held, split-KV's
            // partial rows leaving the held form; without the producer each
            // warpgroup loads the K panels it reads again (no block-wide
            // barrier per step).
            assert!(k.source.contains("#define ROW_MAX_HELD 1"), "{}", k.name);
            assert_eq!(
                k.source.contains("mbar_wait(smem_u32(&bar_p_free)"),
                !cfg.warp_specialized,
                "{}",
                k.name
            );
            continue;
        }
        // The pair's partial scores take two buffers after the K ring.
        let exchange = 2 * cfg.warps * 32 * cfg.m_tiles() * (32 / 8) * 4 * 4;
        assert_eq!(
            k.smem_bytes,
            2 * (cfg.block_m * 576 + cfg.stages * 32 * 576) + exchange
        );
    }
    // Dv warps pair up the warps of each row and key range.
    let e = parallel_forward(
        &v,
        576,
        512,
        &ForwardConfig {
            warps: 3,
            ..dv_warps
        },
    )
    .expect_err("three warps in pairs");
    assert!(e.to_string().contains("Dv warps"), "{e}");
    for cfg in [
        default,
        ForwardConfig {
            dv_split: 4,
            ..default
        },
    ] {
        for rows in [Rows::Dense, Rows::Paged] {
            for arch in ["sm_80", "sm_90a"] {
                let line = check_config("mla_decode", &v, arch, &cfg, rows);
                assert!(line.contains("_vk"), "{line}");
                eprintln!("{line}");
            }
        }
        let k = parallel_forward(&v, 576, 512, &cfg).expect("latent forward");
        assert!(
            !k.source.contains("const elem_t* vg = v +")
                && k.source.contains("#define V_BASE smem_u32(sKc)")
                && k.source.contains("dv0 + (col)"),
            "the V tile must be the K tile"
        );
        // No V ring: Q and `stages` K tiles only, in unpadded (XOR) rows of
        // 576 elements.
        assert!(k.source.contains("#define TILE_XOR_ROWS 1"));
        assert_eq!(k.smem_bytes, 2 * (16 * 576 + cfg.stages * 32 * 576));
    }
    // Without shared storage the same tiles load V apart (more shared memory).
    let apart = parallel_forward(
        &v,
        576,
        512,
        &ForwardConfig {
            v_in_k: false,
            ..default
        },
    )
    .expect("separate V");
    assert!(
        apart.smem_bytes > 2 * (16 * 576 + 2 * 32 * 576),
        "{}",
        apart.smem_bytes
    );
}

/// Decoding tiles whose key blocks are split between warps (`key_warps`):
/// d128 decoding with 2 and 4 key warps and the latent cache with 2, dense
/// and paged, compile within the spill budget, and their partial rows fit
/// the K/V ring they are merged through.
#[test]
fn key_warp_decoding_tiles_compile() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let decode = common::example("decode");
    let base = ForwardConfig::default_for(&decode, 128, 128, Elem::Bf16, Isa::Sm80);
    let mla = common::example("mla_decode");
    let latent = ForwardConfig {
        v_in_k: true,
        ..ForwardConfig::default_for(&mla, 576, 512, Elem::Bf16, Isa::Sm80)
    };
    let tiles = [
        ("decode", &decode, base, 2, 32),
        ("decode", &decode, base, 4, 64),
        ("mla_decode", &mla, latent, 2, 32),
    ];
    for (name, v, cfg, key_warps, block_n) in tiles {
        let cfg = ForwardConfig {
            warps: key_warps,
            key_warps,
            block_n,
            ..cfg
        };
        for rows in [Rows::Dense, Rows::Paged] {
            for arch in ["sm_80", "sm_90a"] {
                let line = check_config(name, v, arch, &cfg, rows);
                assert!(line.contains(&format!("_k{key_warps}")), "{line}");
                eprintln!("{line}");
            }
        }
    }
}

/// The untuned MQA tile's key warpgroups (`with_decoding_producer`: two
/// warpgroups over 64 packed rows taking the key blocks in turn beside a
/// producer, 96-key blocks in four stages) on the decoding forms of
/// variants with a score modification, a bias from custom inputs and a
/// mask: each takes that tile and compiles, dense and paged, within the
/// spill budget of the 168 registers the launch bound leaves.
#[test]
fn key_warpgroup_decoding_tiles_compile() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    for name in ["softmax_gqa", "softcap", "relative_bias", "alibi"] {
        let v = common::decoding_form(name);
        let (dqk, dv) = common::head_dims(&v);
        let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a)
            .for_decode_shape([16, 128, 1, 1], 132, dqk, dv, Isa::Sm90a)
            .with_decoding_producer(&v, dqk, dv, Isa::Sm90a);
        assert_eq!(
            (cfg.key_warps, cfg.warps, cfg.block_n, cfg.stages),
            (2, 8, 96, 4),
            "{name}: {cfg:?}"
        );
        for rows in [Rows::Dense, Rows::Paged] {
            let line = check_config(name, &v, "sm_90a", &cfg, rows);
            assert!(line.contains("_wgmma_ws_s4_k2"), "{line}");
            eprintln!("{line}");
        }
    }
}

/// Split-KV tiles with the combine in the main kernel (`fused_combine`):
/// d128 decoding with one, two and four key warps and with Dv split between
/// blocks, and the latent cache with Dv split between warps, dense and
/// paged, compile within the spill budget as one entry that counts its row
/// block's finished blocks (an atomic in the SASS) and takes the counters
/// right after the number of splits; no combine kernel is generated.
/// The split-KV combine kernel (the decoding tiles without the combine in
/// the main kernel: MQA's packed wgmma tile at d128, the sm_80 tile at Dv
/// 96, the latent cache at Dv 512; dense and paged) compiles without
/// spills within 128 registers, so that four of its blocks (at most 128
/// threads) fit an SM: MQA's 2048 rows then run in one wave (at 188 registers they took
/// two, 1.9 us a call on an H200, bench/NOTES.md session 51).
#[test]
fn split_kv_combine_kernels_fit_four_blocks_per_sm() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let decode = common::example("decode");
    let mla = common::example("mla_decode");
    let mqa = ForwardConfig::default_for(&decode, 128, 128, Elem::Bf16, Isa::Sm90a)
        .for_decode_shape([16, 128, 1, 1], 132, 128, 128, Isa::Sm90a);
    let sm80 = ForwardConfig {
        fused_combine: false,
        ..ForwardConfig::default_for(&decode, 128, 96, Elem::Bf16, Isa::Sm80)
    };
    let latent = ForwardConfig::default_for(&mla, 576, 512, Elem::Bf16, Isa::Sm80).with_v_in_k(
        576,
        512,
        Isa::Sm80,
    );
    for (name, v, dqk, dv, cfg, arch) in [
        ("decode (MQA)", &decode, 128, 128, mqa, "sm_90a"),
        ("decode (Dv 96)", &decode, 128, 96, sm80, "sm_80"),
        ("mla_decode", &mla, 576, 512, latent, "sm_80"),
    ] {
        for rows in [Rows::Dense, Rows::Paged] {
            let kernel = match rows {
                Rows::Dense => parallel_forward(v, dqk, dv, &cfg),
                _ => parallel_forward_paged(v, dqk, dv, &cfg),
            }
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let combine = kernel
                .combine
                .clone()
                .unwrap_or_else(|| panic!("{name}: no combine kernel: {cfg:?}"));
            assert!(kernel.combine_threads() <= 128, "{name}");
            let compiled = compile(&kernel.source, &CompileOptions::new(arch))
                .unwrap_or_else(|e| panic!("{name} ({arch}): {e}"));
            let usage = ptxas_resources(&compiled.ptx, arch)
                .unwrap_or_else(|e| panic!("{name} ({arch}): ptxas: {e}"));
            let entry = usage
                .iter()
                .find(|u| u.function == combine)
                .unwrap_or_else(|| panic!("{name} ({arch}): no entry `{combine}`: {usage:?}"));
            assert_eq!(entry.spill_store_bytes, 0, "{name} ({arch}): {entry:?}");
            assert!(
                entry.registers <= 128,
                "{name} ({arch}): the combine kernel takes {} registers: {entry:?}",
                entry.registers
            );
            eprintln!(
                "{name:16} {rows:?} {arch}: {} {} registers",
                combine, entry.registers
            );
        }
    }
}

#[test]
fn fused_combine_decoding_tiles_compile() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let decode = common::example("decode");
    let base = ForwardConfig {
        fused_combine: true,
        ..ForwardConfig::default_for(&decode, 128, 128, Elem::Bf16, Isa::Sm80)
    };
    let mla = common::example("mla_decode");
    let latent = ForwardConfig {
        v_in_k: true,
        fused_combine: true,
        dv_split: 1,
        warps: 2,
        key_warps: 1,
        dv_warps: 2,
        ..ForwardConfig::default_for(&mla, 576, 512, Elem::Bf16, Isa::Sm80)
    };
    let with = |warps, key_warps, block_n, dv_split| ForwardConfig {
        warps,
        key_warps,
        block_n,
        dv_split,
        ..base
    };
    let tiles = [
        ("decode", &decode, with(1, 1, 32, 1)),
        ("decode", &decode, with(2, 2, 32, 1)),
        ("decode", &decode, with(4, 4, 128, 1)),
        ("decode", &decode, with(2, 2, 32, 2)),
        ("mla_decode", &mla, latent),
    ];
    for (name, v, cfg) in tiles {
        let (dqk, dv) = common::head_dims(v);
        for rows in [Rows::Dense, Rows::Paged] {
            let kernel = match rows {
                Rows::Dense => parallel_forward(v, dqk, dv, &cfg),
                _ => parallel_forward_paged(v, dqk, dv, &cfg),
            }
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                kernel.split_kv && kernel.combine.is_none(),
                "{name}: {kernel:?}"
            );
            assert!(
                !kernel.source.contains("_combine("),
                "{name}: a combine kernel"
            );
            let at = kernel.args.iter().position(|a| *a == ArgKind::KvSplits);
            assert_eq!(
                at.map(|i| &kernel.args[i + 1]),
                Some(&ArgKind::Workspace("split_count")),
                "{name}: {:?}",
                kernel.args
            );
            for arch in ["sm_80", "sm_90a"] {
                let line = check_config(name, v, arch, &cfg, rows);
                assert!(line.contains("_fc"), "{line}");
                let compiled = compile(&kernel.source, &CompileOptions::new(arch))
                    .unwrap_or_else(|e| panic!("{name} ({arch}): {e}"));
                let text = sass(&compiled.cubin)
                    .unwrap_or_else(|e| panic!("{name} ({arch}): cuobjdump: {e}"));
                assert!(
                    text.contains("ATOMG"),
                    "{name} ({arch}): no counter atomic in the SASS"
                );
                eprintln!("{line}");
            }
        }
    }
}

fn check_config(name: &str, v: &Variant, arch: &str, cfg: &ForwardConfig, rows: Rows) -> String {
    check_config_at(name, v, common::head_dims(v), arch, cfg, rows)
}

/// [`check_config`] at head dims other than the example's own.
fn check_config_at(
    name: &str,
    v: &Variant,
    (dqk, dv): (u32, u32),
    arch: &str,
    cfg: &ForwardConfig,
    rows: Rows,
) -> String {
    let cfg = *cfg;
    let generated = match rows {
        Rows::Dense => parallel_forward(v, dqk, dv, &cfg),
        Rows::Varlen => parallel_forward_varlen(v, dqk, dv, &cfg),
        Rows::Paged => parallel_forward_paged(v, dqk, dv, &cfg),
        Rows::Sparse => parallel_forward_block_sparse(v, dqk, dv, &cfg),
    };
    let kernel = generated.unwrap_or_else(|e| panic!("{name}: {e}"));
    let (suffix, marker) = match rows {
        Rows::Dense => ("", "q_row0"),
        Rows::Varlen => ("_varlen", "cu_q[bz]"),
        Rows::Paged => ("_paged", "seqlens_k[b]"),
        Rows::Sparse => ("_sparse", "full_kv_indices + mrow * mask_cols"),
    };
    assert!(
        kernel.name.ends_with(suffix) && kernel.source.contains(marker),
        "{name}: `{}` is not a {rows:?} kernel",
        kernel.name
    );
    // Persistent block-sparse kernels take their row blocks from the ticket
    // counter; every other kernel walks its grid or a static stride.
    let scheduled = matches!(rows, Rows::Sparse) && cfg.persistent;
    assert_eq!(kernel.tile_schedule, scheduled, "{name}: tile schedule");
    assert_eq!(
        kernel.source.contains("TAKE_TICKET()"),
        scheduled,
        "{name}: ticket taking in the source"
    );
    assert_eq!(
        kernel.args.ends_with(&TILE_SCHEDULE_ARGS),
        scheduled,
        "{name}: the schedule's arguments: {:?}",
        kernel.args
    );
    let compiled = compile(&kernel.source, &CompileOptions::new(arch))
        .unwrap_or_else(|e| panic!("{name} ({arch}): {e}"));
    assert!(!compiled.cubin.is_empty(), "{name} ({arch}): empty CUBIN");
    let (ptx_mma, sass_mma) = if cfg.wgmma {
        ("wgmma.mma_async.sync.aligned.m64n", "HGMMA")
    } else {
        ("mma.sync.aligned.m16n8k16", "HMMA")
    };
    assert!(
        compiled.ptx.contains(ptx_mma),
        "{name} ({arch}): no {ptx_mma} in the PTX"
    );
    let usage = ptxas_resources(&compiled.ptx, arch)
        .unwrap_or_else(|e| panic!("{name} ({arch}): ptxas: {e}"));
    let entry = usage
        .iter()
        .find(|u| u.function == kernel.name)
        .unwrap_or_else(|| {
            panic!(
                "{name} ({arch}): ptxas reported no entry `{}`: {usage:?}",
                kernel.name
            )
        });
    // The sm_80 tiles start at the dynamic shared memory's base, which is
    // 128-byte aligned only with no static shared memory before it: 16
    // static bytes made decoding 8-18% slower (bench/NOTES.md).
    if !cfg.wgmma {
        assert_eq!(
            entry.shared_bytes, 0,
            "{name} ({arch}): static shared memory shifts the tiles"
        );
    }
    let allowed = spill_budget(arch, &cfg, dqk, dv);
    assert!(
        entry.performance_warnings.is_empty(),
        "{name} ({arch}): ptxas reports a performance loss: {:?}",
        entry.performance_warnings
    );
    assert!(
        entry.spill_store_bytes <= allowed,
        "{name} ({arch}): {} bytes of spill stores (allowed {allowed}): {entry:?}",
        entry.spill_store_bytes
    );
    assert!(
        entry.registers <= 255,
        "{name} ({arch}): {} registers",
        entry.registers
    );
    let smem_limit = Isa::for_arch(arch).max_dynamic_smem();
    assert!(
        kernel.smem_bytes <= smem_limit,
        "{name} ({arch}): {} bytes of shared memory",
        kernel.smem_bytes
    );
    let text = sass(&compiled.cubin).unwrap_or_else(|e| panic!("{name} ({arch}): cuobjdump: {e}"));
    assert!(
        text.contains(sass_mma),
        "{name} ({arch}): no {sass_mma} in the SASS"
    );
    format!(
        "{name:18} {arch:7} {:>3} regs, {:>3} B spilled, {:>6} B smem, {}",
        entry.registers, entry.spill_store_bytes, kernel.smem_bytes, kernel.name
    )
}

/// No ptxas performance note on a backward main kernel. (The split-key
/// kernels had C7520, wgmma serialised for a "WG.AR in divergent path",
/// until session 55: bench/NOTES.md.)
fn assert_backward_notes(main: &ResourceUsage, what: &str) {
    assert!(
        main.performance_warnings.is_empty(),
        "{what} ({}): ptxas reports a performance loss: {:?}",
        main.function,
        main.performance_warnings
    );
}

/// The sm_90a main kernel of `b` compiled by NVRTC, checked for ptxas's
/// performance notes (`assert_backward_notes`) and spills (none in a wgmma
/// kernel, issue 4's compile check): its usage and the compiled module.
fn sm90a_main(b: &BackwardSource, what: &str) -> (ResourceUsage, Compiled) {
    let c = compile(&b.source, &CompileOptions::new("sm_90a"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let usage = ptxas_resources(&c.ptx, "sm_90a").expect("ptxas");
    let main = usage
        .iter()
        .find(|u| u.function == b.main.name)
        .unwrap_or_else(|| panic!("{what}: no main entry"))
        .clone();
    // (The mma.sync kernels that sm_90a builds where wgmma does not take the
    // head dims keep the sm_80 budget.)
    let allowed = if b.source.contains("wgmma.mma_async") {
        0
    } else {
        BACKWARD_SPILL_BUDGET
    };
    assert!(
        main.spill_store_bytes <= allowed,
        "{what}: {} bytes of spill stores (allowed {allowed}): {main:?}",
        main.spill_store_bytes
    );
    assert_backward_notes(&main, what);
    (main, c)
}

/// Spill stores allowed in the main kernel of an `mma.sync` backward, just
/// above what NVRTC 13.0.88 produces today (bench/NOTES.md): the sm_80
/// kernels spill up to 52 bytes, their sm_90a builds at head dims 80 and 96
/// (no wgmma there) 56 and 108. The row and element kernels must not spill.
const BACKWARD_SPILL_BUDGET: u32 = 96;

/// Spill stores allowed in the main kernel of an example's default backward
/// on `arch`: none on sm_90a (issue 4's compile check; bench/NOTES.md
/// sessions 73 and 75); the sm_80 kernels within [`BACKWARD_SPILL_BUDGET`].
fn backward_spill_budget(arch: &str) -> u32 {
    if arch == "sm_90a" {
        0
    } else {
        BACKWARD_SPILL_BUDGET
    }
}

fn check_backward(name: &str, v: &Variant, arch: &str, varlen: bool) -> String {
    let (dqk, dv) = common::head_dims(v);
    let cfg = BackwardConfig::for_variant(v, dqk, dv, Elem::Bf16, Isa::for_arch(arch));
    let generate = if varlen {
        parallel_backward_varlen
    } else {
        parallel_backward
    };
    if dqk > MAX_DQK {
        // The forward-only head dims (MLA decoding's 576): a clear refusal.
        let err = generate(v, dqk, dv, &cfg).expect_err("backward above the largest Dqk");
        assert!(
            err.to_string().contains(&format!(
                "Dqk = {dqk} is not supported by the parallel backward"
            )),
            "{name}: {err}"
        );
        return format!("{name:18} {arch:7} backward refused at Dqk {dqk}: {err}");
    }
    let b = generate(v, dqk, dv, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        b.main.name.ends_with("_varlen_main"),
        varlen,
        "{}",
        b.main.name
    );
    assert_eq!(
        b.source.contains("cu_q[bz]"),
        varlen,
        "{name}: the sequence's rows"
    );
    let compiled = compile(&b.source, &CompileOptions::new(arch))
        .unwrap_or_else(|e| panic!("{name} backward ({arch}): {e}"));
    let usage = ptxas_resources(&compiled.ptx, arch)
        .unwrap_or_else(|e| panic!("{name} backward ({arch}): ptxas: {e}"));
    let entry = |kernel: &str| {
        usage
            .iter()
            .find(|u| u.function == kernel)
            .unwrap_or_else(|| panic!("{name} ({arch}): no entry `{kernel}`: {usage:?}"))
            .clone()
    };
    let main = entry(&b.main.name);
    assert_backward_notes(&main, &format!("{name} backward ({arch})"));
    for small in [&b.pre.name, &b.post.name] {
        let u = entry(small);
        assert_eq!(
            u.spill_store_bytes, 0,
            "{name} ({arch}): `{small}` spills: {u:?}"
        );
    }
    let allowed = backward_spill_budget(arch);
    assert!(
        main.spill_store_bytes <= allowed,
        "{name} ({arch}): backward main kernel spills {} bytes (allowed {allowed}): {main:?}",
        main.spill_store_bytes
    );
    let smem_limit = Isa::for_arch(arch).max_dynamic_smem();
    assert!(
        b.main.smem_bytes <= smem_limit,
        "{name} ({arch}): backward needs {} bytes of shared memory",
        b.main.smem_bytes
    );
    let text = sass(&compiled.cubin).unwrap_or_else(|e| panic!("{name} ({arch}): cuobjdump: {e}"));
    let mma = if cfg.wgmma { "HGMMA" } else { "HMMA" };
    assert!(
        text.contains(mma),
        "{name} backward ({arch}): no {mma} in the SASS"
    );
    format!(
        "{name:18} {arch:7} {:>3} regs, {:>3} B spilled, {:>6} B smem, {} (backward main, m{}w{})",
        main.registers,
        main.spill_store_bytes,
        b.main.smem_bytes,
        b.main.name,
        cfg.block_m,
        cfg.warps
    )
}

/// The sm_90a backward on 32-query steps for head dims whose dK/dV panels
/// fill the warpgroups' registers (RetNet's 256/512, six panels per
/// warpgroup; softmax's 128/512, five, with the producer warpgroup): HGMMA
/// in the SASS, no spills, no serialised wgmma, within the shared memory.
#[test]
fn wide_key_panels_compile_without_spills() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    for (name, dqk, dv) in [("retnet_parallel", 256, 512), ("softmax", 128, 512)] {
        let v = common::example(name);
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(cfg.wgmma && cfg.block_m == 32, "{name}: {cfg:?}");
        let b = parallel_backward(&v, dqk, dv, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (main, c) = sm90a_main(&b, &format!("{name} {dqk}x{dv}"));
        assert!(b.main.smem_bytes <= Isa::Sm90a.max_dynamic_smem());
        assert!(
            sass(&c.cubin).expect("cuobjdump").contains("HGMMA"),
            "{name}"
        );
        eprintln!(
            "{name} {dqk}x{dv}: {} regs, {} B spilled, {} B smem ({})",
            main.registers, main.spill_store_bytes, b.main.smem_bytes, b.main.name
        );
    }
}

/// The block-mask builder of every example with a mask compiles for sm_80
/// and sm_90a without spills.
#[test]
fn block_mask_builders_compile() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let mut built = 0;
    for (name, v) in common::parallel_examples() {
        let has_mask = v.parallel().is_some_and(|p| p.mask.is_some());
        let builder = aec::compiler::block_mask_builder(&v, 64, 64);
        assert_eq!(builder.is_ok(), has_mask, "{name}: {builder:?}");
        let Ok(b) = builder else { continue };
        for arch in ["sm_80", "sm_90a"] {
            let c = compile(&b.source, &CompileOptions::new(arch))
                .unwrap_or_else(|e| panic!("{name} block mask ({arch}): {e}"));
            let usage = ptxas_resources(&c.ptx, arch).expect("ptxas");
            let u = usage.iter().find(|u| u.function == b.name).expect("entry");
            assert_eq!(u.spill_store_bytes, 0, "{name} ({arch}): {u:?}");
        }
        built += 1;
    }
    assert!(built >= 4, "{built} examples with a mask");
}

/// Every head dim the issue names (64, 80, 96, 128, 192, 256, Dv up to 512;
/// Dqk ≠ Dv both ways) generates, compiles for sm_90a and uses tensor cores, forward and
/// backward, with at most 128 bytes of spills; f16 operands too (d128, sm_80).
#[test]
fn every_head_dim_compiles_forward_and_backward() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let v = aec::frontend::parse_file(
        &std::fs::read_to_string(common::examples_dir().join("softmax.rs")).expect("softmax"),
    )
    .expect("rust")
    .remove(0)
    .variant
    .expect("valid");
    let dims = [
        (64, 64, Elem::Bf16, "sm_90a"),
        (80, 80, Elem::Bf16, "sm_90a"),
        (96, 96, Elem::Bf16, "sm_90a"),
        (192, 192, Elem::Bf16, "sm_90a"),
        (256, 256, Elem::Bf16, "sm_90a"),
        (64, 128, Elem::Bf16, "sm_90a"),
        (128, 256, Elem::Bf16, "sm_90a"),
        // Dv above 256: the forward splits it between blocks, the backward
        // between the warps that share keys.
        (256, 512, Elem::Bf16, "sm_90a"),
        (128, 384, Elem::Bf16, "sm_80"),
        (128, 128, Elem::F16, "sm_80"),
    ];
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(&(dqk, dv, elem, arch)) = dims.get(k) else {
                        break;
                    };
                    let f = parallel_forward(
                        &v,
                        dqk,
                        dv,
                        &ForwardConfig::default_for(&v, dqk, dv, elem, Isa::for_arch(arch)),
                    )
                    .unwrap_or_else(|e| panic!("forward d{dqk}x{dv}: {e}"));
                    let b = parallel_backward(
                        &v,
                        dqk,
                        dv,
                        &BackwardConfig::default_for(dqk, dv, elem, Isa::for_arch(arch)),
                    )
                    .unwrap_or_else(|e| panic!("backward d{dqk}x{dv}: {e}"));
                    for (what, src, names) in [
                        ("forward", &f.source, vec![f.name.clone()]),
                        (
                            "backward",
                            &b.source,
                            vec![b.pre.name.clone(), b.main.name.clone(), b.post.name.clone()],
                        ),
                    ] {
                        let c = compile(src, &CompileOptions::new(arch))
                            .unwrap_or_else(|e| panic!("{what} d{dqk}x{dv}: {e}"));
                        let usage = ptxas_resources(&c.ptx, arch).expect("ptxas");
                        let mut spilled = Vec::new();
                        for n in &names {
                            let u = usage.iter().find(|u| &u.function == n).expect("entry");
                            assert!(
                                u.spill_store_bytes <= 128,
                                "{what} d{dqk}x{dv}: {} bytes spilled: {u:?}",
                                u.spill_store_bytes
                            );
                            spilled.push(u.spill_store_bytes);
                        }
                        let text = sass(&c.cubin).expect("cuobjdump");
                        let mma = if src.contains("wgmma.mma_async") {
                            "HGMMA"
                        } else {
                            "HMMA"
                        };
                        assert!(text.contains(mma), "{what} d{dqk}x{dv}: no {mma}");
                        eprintln!(
                            "{what} d{dqk}x{dv} {elem:?} {arch}: ok ({}; {spilled:?} B spilled)",
                            names.join(", ")
                        );
                    }
                }
            });
        }
    });
}

/// `source` compiled for sm_90a with `flags`: how many times its SASS reads
/// `%globaltimer`, and whether its PTX holds the marks' array `array`.
fn timer_reads(source: &str, flags: &[&str], array: &str) -> (usize, bool) {
    let mut opts = CompileOptions::new("sm_90a");
    opts.flags.extend(flags.iter().map(|f| f.to_string()));
    let compiled = compile(source, &opts).expect("compiles");
    let text = sass(&compiled.cubin).expect("cuobjdump");
    (
        text.matches("SR_GLOBALTIMER").count(),
        compiled.ptx.contains(array),
    )
}

/// Per-block timeline marks (`bench/timeline.py`): the decoding tile that
/// merges its splits in the kernel, built with `-DAEC_TIMELINE`, reads
/// `%globaltimer` at each of its six marks (start, key loop, key-warp
/// merge, epilogue, arrival, end) into the `aec_timeline` array; built as
/// usual it reads no timer at all and has no such array.
#[test]
fn timeline_marks_compile_only_when_asked() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let v = common::example("decode");
    let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a).for_decode_shape(
        [1, 32, 8, 1],
        132,
        128,
        128,
        Isa::Sm90a,
    );
    assert!(cfg.fused_combine && cfg.key_warps > 1, "{cfg:?}");
    let kernel = parallel_forward(&v, 128, 128, &cfg).expect("decoding forward");
    let timer_reads = |flags: &[&str]| timer_reads(&kernel.source, flags, "aec_timeline");
    let (marked, array) = timer_reads(&["-DAEC_TIMELINE"]);
    assert!(marked >= 6 && array, "{marked} timer reads, array {array}");
    assert_eq!(timer_reads(&[]), (0, false));
}

/// Per-tile marks (`bench/timeline.py --tiles`): the persistent
/// warp-specialised causal forward built with `-DAEC_TIMELINE` records each
/// tile's phases in `aec_tile_timeline` (the block marks 0, 6 and 5, and the
/// tile slots 0–4 and 7 read the timer); built as usual it reads none.
#[test]
fn tile_marks_compile_only_when_asked() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    let v = common::example("softmax_causal");
    let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.persistent && cfg.warp_specialized, "{cfg:?}");
    let kernel = parallel_forward(&v, 128, 128, &cfg).expect("causal forward");
    let timer_reads = |flags: &[&str]| timer_reads(&kernel.source, flags, "aec_tile_timeline");
    let (marked, array) = timer_reads(&["-DAEC_TIMELINE"]);
    assert!(marked >= 8 && array, "{marked} timer reads, array {array}");
    assert_eq!(timer_reads(&[]), (0, false));
}

/// The benchmark workloads' (prefill) sm_90a forwards at their head dims,
/// as the benchmark generates them (`ForwardConfig::default_for`): HGMMA in
/// the SASS and no spills (RetNet's 256/512, a Dv slice of 256 columns per
/// warpgroup, spilled 8 B before session 75).
#[test]
fn benchmark_forward_kernels_compile_without_spills() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    for (name, dqk, dv) in BENCHMARK_HEAD_DIMS {
        let v = common::example(name);
        let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(cfg.wgmma, "{name}: {cfg:?}");
        let line = check_config_at(
            &format!("{name} {dqk}x{dv}"),
            &v,
            (dqk, dv),
            "sm_90a",
            &cfg,
            Rows::Dense,
        );
        eprintln!("{line}");
    }
}

/// The benchmark's parallel workloads: example and head dims
/// (`shared/reference/workloads.json`).
const BENCHMARK_HEAD_DIMS: [(&str, u32, u32); 8] = [
    ("softmax", 128, 128),
    ("softmax_causal", 128, 128),
    ("softmax_gqa", 128, 128),
    ("deepseek", 192, 128),
    ("diff_transformer", 128, 256),
    ("sigmoid", 128, 128),
    ("relu", 64, 64),
    ("retnet_parallel", 256, 512),
];

/// The sm_90a backward of each benchmark workload's variant at the
/// workload's head dims (`shared/reference/workloads.json`), as the
/// benchmark generates it (`BackwardConfig::for_variant`): no ptxas
/// performance note, no spills.
#[test]
fn benchmark_backward_kernels_report_no_performance_loss() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    for (name, dqk, dv) in BENCHMARK_HEAD_DIMS {
        let v = common::example(name);
        let cfg = BackwardConfig::for_variant(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        let b = parallel_backward(&v, dqk, dv, &cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        sm90a_main(&b, &format!("{name} {dqk}x{dv}"));
    }
}

/// Every wgmma tile of the backward's tuning space (`BackwardConfig::space`)
/// that generates, for softmax and DeepSeek at their benchmark head dims:
/// no ptxas performance note (a tile whose wgmma ptxas serialises would
/// lose in the tuner for that reason alone) and no spills.
#[test]
fn backward_tuning_space_reports_no_performance_loss() {
    if !common::cuda_toolchain_ready() {
        return;
    }
    for (name, dqk, dv) in [("softmax", 128, 128), ("deepseek", 192, 128)] {
        let v = common::example(name);
        let tiles: Vec<BackwardConfig> = BackwardConfig::space(dqk, dv, Elem::Bf16, Isa::Sm90a)
            .into_iter()
            .filter(|c| c.wgmma)
            .collect();
        assert!(tiles.len() >= 10, "{name}: {} wgmma tiles", tiles.len());
        let mut compiled = 0;
        for cfg in &tiles {
            // (Tiles that do not fit the head dims are refused with a reason:
            // the tuner reports those.)
            if let Ok(b) = parallel_backward(&v, dqk, dv, cfg) {
                sm90a_main(&b, &format!("{name} {dqk}x{dv} {cfg:?}"));
                compiled += 1;
            }
        }
        assert!(
            compiled * 2 >= tiles.len(),
            "{name}: {compiled} of {} tiles generate",
            tiles.len()
        );
    }
}
