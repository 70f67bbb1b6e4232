//! The scheduler without a GPU: level 1 enumerates only configurations the
//! templates render, level 2 rejects what cannot fit (with the reason) and
//! places Q where it fits, the cost model ranks hand-checkable cases the
//! right way round, and AMD targets are ranked without hardware; the
//! backward's model follows the work.

use aec_compiler::schedule::{
    DeviceConfig, Engine, KernelConfig, Problem, Target, Tier, VariantFacts, device,
    estimate_backward, forward_space, rank_forward, useful_backward_flops,
};
use aec_compiler::{BackwardConfig, Elem, ForwardConfig, Isa};
use aec_frontend::parse_file;
use std::path::PathBuf;
mod common;
use common::example;

fn problem(b: usize, h: usize, s: usize, dqk: u32, dv: u32) -> Problem {
    Problem {
        b,
        h,
        hkv: h,
        sq: s,
        skv: s,
        dqk,
        dv,
        elem: Elem::Bf16,
    }
}

fn cuda(c: &KernelConfig) -> ForwardConfig {
    match c {
        KernelConfig::Cuda(c) => *c,
        KernelConfig::Hip(_) => panic!("not a CUDA configuration"),
    }
}

#[test]
fn every_candidate_fits_and_every_rejection_says_why() {
    let v = example("softmax");
    for device in device::known() {
        for (dqk, dv) in [(64, 64), (128, 128), (128, 256), (192, 128), (256, 512)] {
            let p = problem(2, 8, 1000, dqk, dv);
            let space = forward_space(&v, &p, &device);
            assert!(!space.candidates.is_empty(), "{} {dqk}x{dv}", device.name);
            for c in &space.candidates {
                // Level 2's figures are within the device's limits.
                assert!(c.placement.shared <= device.smem_per_block, "{c:?}");
                assert!(c.placement.registers <= device.regs_per_thread, "{c:?}");
                assert!(c.plan.blocks_per_sm >= 1);
                // Every candidate renders with its template.
                match c.config {
                    KernelConfig::Cuda(cfg) => {
                        aec_compiler::parallel_forward(&v, dqk, dv, &cfg).unwrap();
                    }
                    KernelConfig::Hip(cfg) => {
                        aec_compiler::hip::forward::hip_parallel_forward(
                            &v,
                            dqk,
                            dv,
                            &cfg,
                            match device.target {
                                Target::Hip(g) => g,
                                Target::Cuda(_) => unreachable!(),
                            },
                            aec_compiler::hip::dialect::HipPrelude::Amdgcn,
                        )
                        .unwrap();
                    }
                }
            }
            for r in &space.rejected {
                assert!(!r.reason.is_empty());
            }
        }
    }
}

#[test]
fn level_two_rejects_what_cannot_fit_and_places_q() {
    let v = example("softmax");
    let h100 = DeviceConfig::named("h100").unwrap();
    // Dv 256 with 128-key blocks: O (128) + S (64) + P (32) registers
    // leave no room in a consumer warpgroup.
    let space = forward_space(&v, &problem(8, 12, 2048, 128, 256), &h100);
    let r = space
        .rejected
        .iter()
        .find(|r| {
            let c = cuda(&r.config);
            c.warp_specialized && c.block_n == 128 && c.dv_split == 1
        })
        .expect("a rejected 128-key wgmma plan");
    assert!(r.reason.contains("registers per thread"), "{}", r.reason);
    // d64: Q fits in registers next to the tiles, so level 2 keeps it there.
    let space = forward_space(&v, &problem(8, 8, 2048, 64, 64), &h100);
    assert!(
        space
            .candidates
            .iter()
            .any(|c| cuda(&c.config).q_in_registers)
    );
    // d128 with 128-key blocks: Q goes to shared memory (the default).
    let space = forward_space(&v, &problem(8, 8, 2048, 128, 128), &h100);
    let c = space
        .candidates
        .iter()
        .find(|c| {
            let c = cuda(&c.config);
            c.warp_specialized && c.block_n == 128 && c.block_m == 128
        })
        .unwrap();
    assert_eq!(c.placement.tier_of("q"), Some(Tier::Shared));
    // The ring is as deep as shared memory allows: d256/v256 at 4
    // stages of 128 keys does not fit.
    let space = forward_space(&v, &problem(1, 8, 4096, 256, 256), &h100);
    assert!(!space.candidates.iter().any(|c| {
        let c = cuda(&c.config);
        c.block_n == 128 && c.stages == 4 && c.dv_split == 1
    }));
}

#[test]
fn the_model_ranks_sensibly() {
    let v = example("softmax");
    let h100 = DeviceConfig::named("h100").unwrap();
    let big = problem(8, 32, 2048, 128, 128);
    let (ranked, _) = rank_forward(&v, &big, &h100);
    // Hopper: a warp-specialised wgmma plan first, every mma.sync plan
    // below every warp-specialised one with 128-row blocks.
    let best = cuda(&ranked[0].candidate.config);
    assert!(best.wgmma && best.warp_specialized, "{best:?}");
    let t = |pred: &dyn Fn(&ForwardConfig) -> bool| {
        ranked
            .iter()
            .filter(|r| pred(&cuda(&r.candidate.config)))
            .map(|r| r.estimate.micros)
            .fold(f64::NAN, f64::min)
    };
    assert!(t(&|c| c.warp_specialized && c.block_m == 128) < t(&|c| !c.wgmma));
    // Persistent blocks pay one prologue per SM instead of one per row
    // block: the model ranks them ahead of the same tile launched per block.
    let same_tile = |persistent: bool| {
        t(&|c| {
            c.warp_specialized
                && c.block_m == 128
                && c.block_n == 128
                && c.stages == 3
                && !c.q_in_registers
                && c.persistent == persistent
        })
    };
    assert!(same_tile(true) < same_tile(false));
    assert!(ranked.iter().all(|r| {
        let c = cuda(&r.candidate.config);
        !c.persistent || c.warp_specialized
    }));
    // The same problem on an A100: no wgmma candidates at all.
    let a100 = DeviceConfig::named("a100").unwrap();
    let (ranked_a, _) = rank_forward(&v, &big, &a100);
    assert!(ranked_a.iter().all(|r| !cuda(&r.candidate.config).wgmma));
    // The model's FLOP rate stays below the device's peak.
    for r in ranked.iter().chain(&ranked_a) {
        assert!(r.estimate.tflops < 989.0, "{r:?}");
    }
    // Causal: about half the work of the full problem.
    let vc = example("softmax_causal");
    let (ranked_c, _) = rank_forward(&vc, &big, &h100);
    let ratio = ranked_c[0].estimate.micros / ranked[0].estimate.micros;
    assert!((0.45..0.7).contains(&ratio), "causal / full = {ratio}");
    // A grid too small for the GPU: smaller row blocks (more blocks) win.
    let small = problem(1, 4, 512, 128, 128);
    let (ranked_s, _) = rank_forward(&v, &small, &h100);
    assert_eq!(
        cuda(&ranked_s[0].candidate.config).block_m,
        64,
        "{:?}",
        ranked_s[0]
    );
    // Twice the keys, about twice the time.
    let long = problem(8, 32, 4096, 128, 128);
    let long_best = rank_forward(&v, &long, &h100).0[0].estimate.micros;
    let r = long_best / ranked[0].estimate.micros;
    assert!((3.5..4.5).contains(&r), "s4096 / s2048 = {r}");
    // Dv 512 must be split; splitting into four recomputes the scores
    // four times and ranks below splitting into two.
    let wide = problem(2, 32, 2048, 256, 512);
    let (ranked_w, _) = rank_forward(&v, &wide, &h100);
    let split = |n: u32| {
        ranked_w
            .iter()
            .filter(|r| cuda(&r.candidate.config).dv_split == n)
            .map(|r| r.estimate.micros)
            .fold(f64::INFINITY, f64::min)
    };
    assert!(split(2) < split(4));
    assert!(
        ranked_w
            .iter()
            .all(|r| cuda(&r.candidate.config).dv_split > 1)
    );
}

#[test]
fn amd_devices_are_ranked_without_hardware() {
    let v = example("softmax");
    for name in ["mi250", "mi300x"] {
        let d = DeviceConfig::named(name).unwrap();
        let (ranked, rejected) = rank_forward(&v, &problem(8, 32, 2048, 128, 128), &d);
        assert!(ranked.len() >= 4, "{name}");
        assert!(
            ranked
                .iter()
                .all(|r| r.candidate.plan.engine == Engine::Mfma)
        );
        // 128-key blocks of d128 K plus a 128-column Vᵀ exceed 64 KiB? No:
        // they fit (52 KiB); but two-tile waves at Dv 128 exceed 512 - 40
        // registers for none, so nothing is rejected for registers here.
        assert!(rejected.iter().all(|r| !r.reason.is_empty()));
    }
    // MI300X, with three times the CUs and bandwidth, is faster.
    let p = problem(8, 32, 2048, 128, 128);
    let t = |n| {
        rank_forward(&v, &p, &DeviceConfig::named(n).unwrap()).0[0]
            .estimate
            .micros
    };
    assert!(t("mi300x") < t("mi250") / 2.0);
}

#[test]
fn the_default_is_in_the_space() {
    // The hand-written default of each head-dim pair is a candidate, so
    // tuning can only pick it or something measured faster.
    let v = example("softmax_causal");
    let h100 = DeviceConfig::named("h100").unwrap();
    for (dqk, dv) in [(64, 64), (128, 128), (128, 256), (192, 128), (256, 512)] {
        let p = problem(8, 16, 2048, dqk, dv);
        let default = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        let space = forward_space(&v, &p, &h100);
        // Level 2 may place Q differently (and with it the late epilogue);
        // the tile itself is a candidate.
        let tile = |c: &ForwardConfig| ForwardConfig {
            q_in_registers: false,
            late_epilogue: false,
            kv_multicast: false,
            ..*c
        };
        let same_tile = |c: &ForwardConfig| tile(c) == tile(&default);
        assert!(
            space.candidates.iter().any(|c| same_tile(&cuda(&c.config))),
            "{dqk}x{dv}: {default:?} not among the candidates"
        );
    }
}

#[test]
fn the_backward_estimate_follows_the_work() {
    let h100 = DeviceConfig::named("h100").unwrap();
    let cfg = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    let (full, causal) = (
        VariantFacts::of(&example("softmax")),
        VariantFacts::of(&example("softmax_causal")),
    );
    let t = |p: &Problem, f: &VariantFacts| estimate_backward(p, f, &cfg, &h100).micros;
    let short = problem(8, 32, 2048, 128, 128);
    // A causal mask visits a little over half the query steps.
    let ratio = t(&short, &causal) / t(&short, &full);
    assert!((0.5..0.7).contains(&ratio), "{ratio}");
    // Four times the sequence: about sixteen times the work.
    let ratio = t(&problem(8, 32, 8192, 128, 128), &full) / t(&short, &full);
    assert!((12.0..20.0).contains(&ratio), "{ratio}");
    // The useful FLOPs are counted once, whatever the tile.
    let e = estimate_backward(&short, &full, &cfg, &h100);
    let flops = useful_backward_flops(&short, &full);
    assert!((e.tflops * 1e12 * e.micros * 1e-6 / flops - 1.0).abs() < 1e-9);
}

#[test]
fn an_mma_sync_backward_tile_past_its_registers_pays_for_the_spills() {
    // RetNet's 256/512 on four warps of 16 keys: 384 accumulators a thread
    // with Dqk + Dv whole, 192 split between two warps. Measured on an H100
    // (bench/NOTES.md, session 41): 9.26 ms whole, 5.81 ms split in two.
    let h100 = DeviceConfig::named("h100").unwrap();
    let retnet = VariantFacts::of(&example("retnet_parallel"));
    let t = |split_d| {
        let cfg = BackwardConfig {
            block_m: 32,
            warps: 4,
            split_d,
            elem: Elem::Bf16,
            wgmma: false,
            kv_groups: 1,
            shared_scores: false,
            warp_specialized: false,
            tma_loads: false,
        };
        estimate_backward(&problem(2, 32, 2048, 256, 512), &retnet, &cfg, &h100).micros
    };
    assert!(t(1) > 1.1 * t(2), "{} against {}", t(1), t(2));
}

#[test]
fn packed_decoding_rows_get_64_and_128_row_tiles() {
    // MQA (128 query heads on one KV head): the decoding space holds the
    // untuned default's packed wgmma tile and the same rows with a
    // producer warpgroup, each rendering; four rows per KV head get none.
    let v = example("decode");
    let h200 = DeviceConfig::named("h200").unwrap();
    let mqa = Problem {
        b: 16,
        h: 128,
        hkv: 1,
        sq: 1,
        skv: 4096,
        dqk: 128,
        dv: 128,
        elem: Elem::Bf16,
    };
    let space = forward_space(&v, &mqa, &h200);
    let default = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a)
        .for_decode_shape([16, 128, 1, 1], h200.sms, 128, 128, Isa::Sm90a);
    assert!(default.wgmma && default.block_m == 64, "{default:?}");
    let packed: Vec<ForwardConfig> = space
        .candidates
        .iter()
        .map(|c| cuda(&c.config))
        .filter(|c| c.block_m >= 64)
        .collect();
    assert!(
        packed.contains(&default),
        "{default:?} not among {packed:?}"
    );
    // The untuned tile is that tile with a producer warpgroup
    // (`with_decoding_producer`): at d128 two key warpgroups on 96-key
    // blocks in four stages; at Dqk 256, where key warpgroups are not taken
    // and three 128-key stages do not fit, none.
    let producer = default.with_decoding_producer(&v, 128, 128, Isa::Sm90a);
    assert!(
        producer.warp_specialized
            && !producer.persistent
            && !producer.tma_loads
            && (producer.block_m, producer.warps, producer.key_warps) == (64, 8, 2)
            && (producer.block_n, producer.stages) == (96, 4),
        "{producer:?}"
    );
    let wide = ForwardConfig::default_for(&v, 256, 128, Elem::Bf16, Isa::Sm90a).for_decode_shape(
        [16, 128, 1, 1],
        h200.sms,
        256,
        128,
        Isa::Sm90a,
    );
    assert!(wide.wgmma, "{wide:?}");
    assert_eq!(wide.with_decoding_producer(&v, 256, 128, Isa::Sm90a), wide);
    assert!(
        packed.contains(&producer),
        "{producer:?} not among {packed:?}"
    );
    assert_eq!(
        default.with_decoding_producer(&v, 128, 128, Isa::Sm80),
        default,
        "a producer off sm_90a"
    );
    for cfg in &packed {
        aec_compiler::parallel_forward(&v, 128, 128, cfg)
            .unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
    }
    // The model puts them first: a 16-row tile reads each K/V tile once per
    // 16 of the 128 rows.
    let (ranked, _) = rank_forward(&v, &mqa, &h200);
    assert!(
        cuda(&ranked[0].candidate.config).block_m >= 64,
        "{:?}",
        ranked[0].candidate.config
    );
    // Key warpgroups read each block's K and V once (one of them takes it):
    // the model ranks the key-warpgroup tiles among the eight `aec tune`
    // profiles by default (before it counted their shared-memory reads
    // twice and put them 10th to 19th).
    let keyed: Vec<usize> = ranked
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            cuda(&r.candidate.config).key_warps == 2 && cuda(&r.candidate.config).wgmma
        })
        .map(|(i, _)| i)
        .collect();
    assert!(
        keyed.len() >= 3 && keyed[..3].iter().all(|&i| i < 8),
        "{keyed:?}"
    );
    let gqa = Problem {
        h: 32,
        hkv: 8,
        ..mqa
    };
    let space = forward_space(&v, &gqa, &h200);
    assert!(
        space
            .candidates
            .iter()
            .all(|c| cuda(&c.config).block_m == 16),
        "4 rows per KV head took a 64-row tile"
    );
    // A variant that modifies k in shared memory gets no producer.
    let src = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/decode.rs"),
    )
    .unwrap()
    .replace(
        "modify_q = |q| q * rsqrt(Dqk);",
        "modify_q = |q| q * rsqrt(Dqk);\n        modify_k = |k| k * 0.5;",
    );
    let modifies_k = parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant");
    let space = forward_space(&modifies_k, &mqa, &h200);
    assert!(space.candidates.iter().any(|c| cuda(&c.config).wgmma));
    assert!(
        space
            .candidates
            .iter()
            .all(|c| !cuda(&c.config).warp_specialized),
        "a producer warpgroup for a variant that modifies k"
    );
    let untuned = ForwardConfig::default_for(&modifies_k, 128, 128, Elem::Bf16, Isa::Sm90a)
        .for_decode_shape([16, 128, 1, 1], h200.sms, 128, 128, Isa::Sm90a);
    assert!(untuned.wgmma, "{untuned:?}");
    assert_eq!(
        untuned.with_decoding_producer(&modifies_k, 128, 128, Isa::Sm90a),
        untuned,
        "an untuned producer for a variant that modifies k"
    );
}
