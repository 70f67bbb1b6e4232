//! The parallel forward generator on every parallel example: it renders, the
//! variant's regions land in the kernel, configuration errors are clear.

use aec_compiler::cxx::regions::{implies_causal, is_causal};
use aec_compiler::{
    ArgKind, BackwardConfig, Elem, ForwardConfig, Grid, Isa, Residency, parallel_backward,
    parallel_backward_varlen, parallel_forward, parallel_forward_varlen,
};
use aec_frontend::{Variant, parse_file, parse_str};
use std::path::PathBuf;

mod common;
use common::{example, examples};

fn dims(v: &Variant) -> (u32, u32) {
    let fixed = |a: aec_frontend::ir::Axis, d: u32| {
        v.fixed_sizes
            .iter()
            .find(|(x, _)| *x == a)
            .map(|(_, n)| *n as u32)
            .unwrap_or(d)
    };
    (
        fixed(aec_frontend::ir::Axis::Dqk, 128),
        fixed(aec_frontend::ir::Axis::Dv, 128),
    )
}

const CFG: ForwardConfig = ForwardConfig {
    block_m: 64,
    block_n: 64,
    warps: 4,
    elem: Elem::Bf16,
    pack_gqa: false,
    wgmma: false,
    warp_specialized: false,
    stages: 2,
    q_in_registers: false,
    dv_split: 1,
    split_kv: false,
    fused_combine: false,
    persistent: false,
    v_in_k: false,
    key_warps: 1,
    dv_warps: 1,
    tma_loads: false,
    late_epilogue: false,
    kv_multicast: false,
};

/// [`CFG`] with Dv split between blocks where one block cannot hold it
/// (MLA decoding's 512).
fn cfg_for(dv: u32) -> ForwardConfig {
    ForwardConfig {
        dv_split: aec_compiler::cuda::forward::default_dv_split(dv),
        ..CFG
    }
}

#[test]
fn every_parallel_example_generates_a_kernel() {
    let mut n = 0;
    for (name, v) in examples() {
        let Some(par) = v.parallel() else { continue };
        let (dqk, dv) = dims(&v);
        let k =
            parallel_forward(&v, dqk, dv, &cfg_for(dv)).unwrap_or_else(|e| panic!("{name}: {e}"));
        n += 1;
        assert!(
            k.source
                .contains(&format!("void __launch_bounds__(NT, 1) {}(", k.name)),
            "{name}: entry point"
        );
        assert!(
            k.source
                .contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
            "{name}: tensor-core MMA"
        );
        assert!(
            k.source.contains("ldmatrix.sync.aligned.m8n8.x4.trans"),
            "{name}: V through ldmatrix.trans"
        );
        assert!(
            k.source.contains("cp.async.cg.shared.global"),
            "{name}: async copies"
        );
        assert_eq!(
            k.source.contains("modify_scores(s[mt][nt][c]"),
            par.modify_scores.is_some(),
            "{name}: modify_scores call"
        );
        assert_eq!(
            k.source.contains("mask_fn(pt, P)"),
            par.mask.is_some(),
            "{name}: mask call"
        );
        assert_eq!(k.threads, 128);
        // The row outputs: the epilogue's scales, then the final state fields.
        let want: Vec<String> = par
            .online
            .scales
            .iter()
            .map(|s| format!("scale.{s}"))
            .chain(par.online.state.iter().map(|f| format!("state.{}", f.name)))
            .collect();
        assert_eq!(k.row_outputs, want, "{name}");
        let customs: Vec<&ArgKind> = k
            .args
            .iter()
            .filter(|a| matches!(a, ArgKind::Custom(_)))
            .collect();
        assert_eq!(
            customs.len(),
            v.customs.len(),
            "{name}: one argument per custom input"
        );
        // No template placeholder survives rendering.
        assert!(
            !k.source.contains("{{") && !k.source.contains("{%"),
            "{name}: unrendered template syntax"
        );
    }
    assert!(n >= 13, "expected the 13 parallel examples, found {n}");
}

#[test]
fn online_reductions_combine_the_row_lanes_and_skip_masked_keys() {
    let v = examples()
        .into_iter()
        .find(|(n, _)| n == "softmax")
        .expect("softmax example")
        .1;
    let k = parallel_forward(&v, 128, 128, &CFG).expect("softmax kernel");
    let fwd = &k.source[k.source.find("void online_fwd").expect("online_fwd")..];
    let fwd = &fwd[..fwd.find("\n}\n").expect("end of online_fwd")];
    assert!(
        fwd.contains("row_lanes_max("),
        "rowmax → row lanes max:\n{fwd}"
    );
    assert!(
        fwd.contains("row_lanes_sum("),
        "rowsum → row lanes sum:\n{fwd}"
    );
    assert!(
        fwd.contains("if (valid[e])"),
        "reductions fold only visible keys:\n{fwd}"
    );
    assert!(
        fwd.contains("p[e] = valid[e] ?"),
        "masked keys get weight 0:\n{fwd}"
    );
    assert!(
        fwd.contains("alpha = any ?"),
        "a block with no visible key leaves the state alone:\n{fwd}"
    );
}

/// Softmax-like updates get masked scores as −∞ on partially masked blocks
/// (no per-score flags); updates whose weight is the score itself keep them.
#[test]
fn masked_blocks_take_neg_inf_scores_where_the_update_allows() {
    let cfg =
        ForwardConfig::default_for(&example("softmax_causal"), 128, 128, Elem::Bf16, Isa::Sm90a);
    let k = parallel_forward(&example("softmax_causal"), 128, 128, &cfg).expect("causal kernel");
    assert!(
        k.source.contains("#define MASKED_AS_NEG_INF 1"),
        "causal softmax"
    );
    let f = &k.source[k
        .source
        .find("void online_fwd_neg_inf")
        .expect("online_fwd_neg_inf")..];
    let f = &f[..f.find("\n}\n").expect("end of online_fwd_neg_inf")];
    assert!(!f.contains("valid"), "no flags in the −∞ update:\n{f}");
    assert!(
        f.contains("p[e] = any ?"),
        "a row with no visible key gets p = 0:\n{f}"
    );
    assert!(f.contains("alpha = any ?"), "and keeps its state:\n{f}");
    for name in ["sigmoid", "relu"] {
        let v = example(name);
        let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
        let k = parallel_forward(&v, 128, 128, &cfg).expect("kernel");
        assert!(
            k.source.contains("#define MASKED_AS_NEG_INF 0")
                && !k.source.contains("void online_fwd_neg_inf"),
            "{name}"
        );
    }
}

/// Softmax-like kernels with wide O rows hold their row maximum
/// (`held_max`): the held update keeps the true maximum, the epilogue writes
/// the state moved onto it, and O's rescale is skipped where a warp's rows
/// keep theirs. Narrower rows, kernels whose partial rows merge, and updates
/// with no maximum keep their own.
#[test]
fn row_maxima_are_held_where_the_final_state_is_the_blocks_own() {
    let v = example("diff_transformer");
    let cfg = ForwardConfig::default_for(&v, 128, 256, Elem::Bf16, Isa::Sm90a);
    let k = parallel_forward(&v, 128, 256, &cfg).expect("Dv 256 kernel");
    assert!(k.source.contains("#define ROW_MAX_HELD 1"));
    let f = &k.source[k
        .source
        .find("void online_fwd_neg_inf_held")
        .expect("online_fwd_neg_inf_held")..];
    let f = &f[..f.find("\n}\n").expect("end of online_fwd_neg_inf_held")];
    assert!(f.contains("5.54517"), "the hold, 8 ln 2:\n{f}");
    assert!(
        f.contains("mx[0] = any ? fmaxf(mx[0], "),
        "the true maximum:\n{f}"
    );
    assert!(
        k.source.contains("held_final_state(st[r], mx[r], fst, P)")
            && k.source.contains("if (rescale_needed(alpha))"),
        "the state written at the true maximum; the rescale voted"
    );
    // 128 O columns: the variant's own update.
    let v = example("softmax_causal");
    let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    let k = parallel_forward(&v, 128, 128, &cfg).expect("causal kernel");
    assert!(
        k.source.contains("#define ROW_MAX_HELD 0") && !k.source.contains("void online_fwd_held"),
        "Dv 128"
    );
    // Split-KV decoding merges partial states: no hold.
    let d = example("decode");
    let split = ForwardConfig {
        split_kv: true,
        ..ForwardConfig::default_for(&d, 128, 128, Elem::Bf16, Isa::Sm80)
    };
    let k = parallel_forward(&d, 128, 128, &split).expect("split-KV kernel");
    assert!(
        k.source.contains("#define ROW_MAX_HELD 0") && !k.source.contains("void online_fwd_held"),
        "split-KV"
    );
    for name in ["sigmoid", "relu"] {
        let v = example(name);
        let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
        let k = parallel_forward(&v, 128, 128, &cfg).expect("kernel");
        assert!(k.source.contains("#define ROW_MAX_HELD 0"), "{name}");
    }
}

#[test]
fn causal_masks_bound_the_kv_loop() {
    let by_name = |n: &str| {
        examples()
            .into_iter()
            .find(|(x, _)| x == n)
            .expect("example")
            .1
    };
    // (name, implies causality, is exactly causal)
    for (name, causal, plain) in [
        ("softmax_causal", true, true),
        ("sliding_window", true, false),
        ("document_mask", true, false),
        ("alibi", true, true),
        ("softmax", false, false),
        ("decode", false, false),
    ] {
        let v = by_name(name);
        let mask = v.parallel().and_then(|p| p.mask.as_ref());
        assert_eq!(mask.is_some_and(implies_causal), causal, "{name}");
        assert_eq!(mask.is_some_and(is_causal), plain, "{name}: plain causal");
        let (dqk, dv) = dims(&v);
        let k = parallel_forward(&v, dqk, dv, &CFG).expect("kernel");
        assert_eq!(
            k.source.contains("n_end = min(n_end, (i_last + BN) / BN);"),
            causal,
            "{name}: loop bound"
        );
        // Every mask gets the tile classification that trims the loop.
        assert_eq!(
            k.source.contains("int mask_block("),
            v.parallel().unwrap().mask.is_some(),
            "{name}: tile classification"
        );
    }
    // `j <= i` is the same mask written the other way round.
    let v = parse_str(
        "pub struct C: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; mask = |b, h, i, j| j <= i; }",
    )
    .expect("variant");
    assert!(implies_causal(v.parallel().unwrap().mask.as_ref().unwrap()));
    assert!(is_causal(v.parallel().unwrap().mask.as_ref().unwrap()));
    let v = parse_str(
        "pub struct C: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; mask = |b, h, i, j| i >= j || j == 0; }",
    )
    .expect("variant");
    assert!(
        !implies_causal(v.parallel().unwrap().mask.as_ref().unwrap()),
        "a disjunction can see past the diagonal"
    );
}

#[test]
fn unsupported_configurations_are_refused_with_reasons() {
    let v = examples()
        .into_iter()
        .find(|(n, _)| n == "softmax")
        .expect("softmax")
        .1;
    let err = parallel_forward(&v, 72, 128, &CFG).unwrap_err().to_string();
    assert!(
        err.contains("Dqk = 72") && err.contains("multiple of 16"),
        "{err}"
    );
    let err = parallel_forward(&v, 128, 512, &CFG)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Dv = 512"), "{err}");
    let err = parallel_forward(&v, 128, 128, &ForwardConfig { block_m: 96, ..CFG })
        .unwrap_err()
        .to_string();
    assert!(err.contains("block_m must be 16, 32, 64 or 128"), "{err}");
    let ds = examples()
        .into_iter()
        .find(|(n, _)| n == "deepseek")
        .expect("deepseek")
        .1;
    let err = parallel_forward(&ds, 128, 128, &CFG)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fixes Dqk = 192"), "{err}");
    let rec = examples()
        .into_iter()
        .find(|(n, _)| n == "mamba2")
        .expect("mamba2")
        .1;
    let err = parallel_forward(&rec, 128, 128, &CFG)
        .unwrap_err()
        .to_string();
    assert!(err.contains("recurrent"), "{err}");
}

/// Key warps (`key_warps`): the tile's warps split each key block and the
/// kernel merges their partial rows with the combine; counts other than 1,
/// 2 or 4, warps they do not divide, fewer than 16 keys per warp, O columns
/// they cannot share evenly, the wgmma template, and variants without a
/// combine are refused with the reason.
#[test]
fn key_warps_split_key_blocks_or_are_refused_with_reasons() {
    let v = example("decode");
    let base = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm80);
    let kw = |key_warps: u32, warps: u32, block_n: u32| ForwardConfig {
        key_warps,
        warps,
        block_n,
        ..base
    };
    let k = parallel_forward(&v, 128, 128, &kw(2, 2, 32)).expect("two key warps");
    assert!(k.name.ends_with("_k2"), "{}", k.name);
    assert_eq!(k.threads, 64);
    assert!(
        k.source.contains("#define KEY_WARPS 2")
            && k.source.contains("combine_rescale(xs[w], m, P)")
            && k.source.contains("kw * EPI_DT + dq")
            && k.source.contains("#define EPI_DT (DVW / 8 / KEY_WARPS)"),
        "the merge of the key warps' rows, each warp its share of the columns"
    );
    // One key warp: the kernel has no merge and writes all its columns.
    let one = parallel_forward(&v, 128, 128, &kw(1, 1, 32)).expect("one warp");
    assert!(
        !one.source.contains("kw * EPI_DT + dq")
            && one.source.contains("#define EPI_DT (DVW / 8)\n")
    );
    // Four key warps share 48 columns unevenly: refused with the sizes.
    let err = parallel_forward(&v, 128, 48, &kw(4, 4, 64))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("48 O columns per warp") && err.contains("multiple of 32"),
        "{err}"
    );
    for (cfg, want) in [
        (kw(3, 3, 96), "key_warps must be 1, 2 or 4"),
        (kw(2, 3, 32), "divide the warps"),
        (kw(4, 4, 32), "multiple of 16 keys"),
    ] {
        let err = parallel_forward(&v, 128, 128, &cfg)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{cfg:?}: {err}");
    }
    let hopper = ForwardConfig::default_for(&example("softmax"), 128, 128, Elem::Bf16, Isa::Sm90a);
    let err = parallel_forward(
        &example("softmax"),
        128,
        128,
        &ForwardConfig {
            key_warps: 2,
            dv_warps: 1,
            warp_specialized: false,
            persistent: false,
            ..hopper
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("sm_80 template"), "{err}");
    let odd = aec_frontend::parse_str(
        "pub struct Odd: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];
         online { state { m = 0.0 }
                  fwd = |s, st| (s, State { m: 0.5 * (st.m + rowmax(s)) }, 1.0)
                  epilogue = |o, st| (o, Scales { z: st.m }) } }",
    )
    .expect("variant");
    let err = parallel_forward(
        &odd,
        64,
        64,
        &ForwardConfig {
            key_warps: 2,
            dv_warps: 1,
            ..CFG
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("key_warps 2") && err.contains("lacks") && err.contains("field `m`"),
        "{err}"
    );
}

#[test]
fn generation_is_deterministic() {
    for (name, v) in examples() {
        if v.parallel().is_none() {
            continue;
        }
        let (dqk, dv) = dims(&v);
        let a = parallel_forward(&v, dqk, dv, &cfg_for(dv))
            .expect("kernel")
            .source;
        let b = parallel_forward(&v, dqk, dv, &cfg_for(dv))
            .expect("kernel")
            .source;
        assert_eq!(a, b, "{name}: two generations differ");
    }
}

#[test]
fn hopper_picks_the_wgmma_kernel_where_its_tiles_fit() {
    let v = example("softmax");
    // sm_90a, head dims multiples of 64: warp-specialised wgmma, a producer
    // warpgroup on top of the computing ones, swizzled tiles.
    let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.wgmma && cfg.warp_specialized && cfg.stages >= 2);
    let k = parallel_forward(&v, 128, 128, &cfg).expect("wgmma forward");
    assert_eq!(k.threads, (cfg.warps + 4) * 32);
    assert!(
        k.source
            .contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16")
    );
    assert!(k.source.contains("setmaxnreg.dec") && k.source.contains("mbarrier.try_wait"));
    assert!(k.smem_bytes <= 227 * 1024, "{}", k.smem_bytes);
    // Head dims the swizzled panels do not take, and other GPUs: sm_80.
    for (dqk, dv, isa) in [(80, 80, Isa::Sm90a), (128, 128, Isa::Sm80)] {
        let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, isa);
        assert!(!cfg.wgmma && !cfg.warp_specialized, "{dqk}x{dv} {isa:?}");
        let k = parallel_forward(&v, dqk, dv, &cfg).expect("sm_80 forward");
        assert!(!k.source.contains("wgmma") && k.source.contains("mma.sync"));
    }
    // The backward: wgmma for 64 and 128 on sm_90a, a warpgroup per 64 keys,
    // up to Dqk + Dv = 320 on 32-query steps; above, both warpgroups on the
    // same 64 keys while the dK/dV panels fit three per warpgroup; beyond
    // (up to Dqk 256, Dv 512) on 32 queries
    // per step (the panels may be split between blocks of one key block,
    // `backward_key_panels_in_several_blocks`); sm_80 at head dims that are
    // not multiples of 64, and on other GPUs.
    let b128 = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(b128.wgmma && b128.split_d == 1 && b128.block_n() == 128);
    for (dqk, dv) in [(192, 128), (64, 256), (192, 64), (256, 64)] {
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(
            cfg.wgmma && cfg.split_d == 1 && cfg.block_m == 32 && cfg.block_n() == 128,
            "{dqk}x{dv}: {cfg:?}"
        );
        let k = parallel_backward(&v, dqk, dv, &cfg).expect("own keys on 32-query steps");
        assert!(k.main.name.contains("_m32w8_wgmma"), "{}", k.main.name);
        assert!(
            cfg.smem_bytes(dqk, dv, 4) <= Isa::Sm90a.max_dynamic_smem(),
            "{dqk}x{dv}"
        );
    }
    // Those steps pair for dQ under the plain causal mask (DeepSeek's), not
    // under one that could hide one step of a pair (a sliding window).
    let cfg = BackwardConfig::default_for(192, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.pairs_steps());
    let causal = parallel_backward(&example("deepseek"), 192, 128, &cfg).expect("DeepSeek");
    assert!(
        causal.main.name.contains("_dq64") && causal.source.contains("step_closes(it - DQ_BEHIND)")
    );
    let window = parallel_backward(&example("sliding_window"), 192, 128, &cfg).expect("window");
    assert!(!window.main.name.contains("_dq64") && window.source.contains("#define DQ_ROWS BM"));
    assert_eq!(window.main.smem_bytes, causal.main.smem_bytes);
    // Their staged dQ tiles are unpadded and permuted, and go into dq_acc by
    // one bulk reduction each (the element kernel undoing the permutation);
    // a packed variable-length batch adds the same tile with atomics.
    assert!(cfg.permutes_staged_dq() && cfg.adds_dq_in_bulk(false) && !cfg.adds_dq_in_bulk(true));
    for k in [&causal, &window] {
        assert!(
            k.source
                .contains("#define DQ_AT(r, c) ((r) * DQS + ((c) ^ DQ_PERM(r)))")
                && k.source
                    .contains("sdQ + DQ_AT(r, (pnl) * 64 + t * 8 + 2 * t4)")
                && k.source.contains("bulk_reduce_add_f32(dq_acc")
                && !k.source.contains("atomicAdd(reinterpret_cast<float4*>")
                && k.source
                    .contains("const long long src = x0 - c_ + (c_ ^ DQ_PERM(i_));"),
            "{}: dQ tiles by bulk reduction",
            k.main.name
        );
    }
    let varlen =
        parallel_backward_varlen(&example("deepseek"), 192, 128, &cfg).expect("DeepSeek varlen");
    assert!(
        varlen.source.contains("((c) ^ DQ_PERM(r))")
            && varlen
                .source
                .contains("atomicAdd(reinterpret_cast<float4*>")
            && !varlen.source.contains("bulk_reduce_add_f32(dq_acc")
            && varlen.source.contains("const long long src = x0;"),
        "varlen: the permuted tile by atomics"
    );
    // Without a mask the 64-query steps run each dQ at the top of the next
    // step, the dSᵀ tiles handed over by mbarriers instead of a barrier in
    // the step; under a mask (the causal one) and on paired 32-query steps,
    // not.
    assert!(b128.lags_dq() && !cfg.lags_dq());
    let plain = parallel_backward(&v, 128, 128, &b128).expect("softmax d128");
    assert!(
        plain.main.name.ends_with("_dqlag_main"),
        "{}",
        plain.main.name
    );
    assert!(
        plain
            .source
            .contains("mbar_wait(smem_at(bar_ds_full, dbuf)")
            && !plain.source.contains("MMA_SYNC();  // sdS complete")
    );
    let masked =
        parallel_backward(&example("softmax_causal"), 128, 128, &b128).expect("causal d128");
    assert!(!masked.main.name.contains("_dqlag") && !masked.source.contains("bar_ds_full"));
    // (The producer adds a step's tile after the copies of the step after
    // next, lagged or not.)
    for k in [&plain, &masked, &causal] {
        assert!(k.source.contains("#define DQ_BEHIND 2"), "{}", k.main.name);
    }
    assert!(!causal.main.name.contains("_dqlag"));
    // Variants at 128/128 without a mask (or with the plain causal one), a
    // score modification or custom inputs take 80-query steps with dQ
    // computed transposed: dS stored K-major by transposing stores, dQᵀ =
    // Kᵀ·dSᵀ at N = 80, the step's dQ behind a barrier (no lag), within the
    // shared memory. Other masks (a sliding window), softcap's tanh, custom
    // inputs and d64 keep 64-query steps.
    let wide = BackwardConfig::for_variant(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(
        wide.block_m == 80 && wide.transposes_dq() && !wide.lags_dq(),
        "{wide:?}"
    );
    let k80 = parallel_backward(&v, 128, 128, &wide).expect("80-query steps");
    assert!(
        k80.main.name.ends_with("_m80w8_wgmma_ws_tma_main"),
        "{}",
        k80.main.name
    );
    assert!(k80.source.contains("wgmma_ss_n80(sacc") && k80.source.contains("stmatrix_x4_trans("));
    // dQᵀ's panels pipelined over two accumulators: panel 1's GEMM is in
    // flight before panel 0 is waited for and staged.
    let turn_at = k80
        .source
        .find("named_bar_sync(2 + turn, NT)")
        .expect("a dQ turn");
    let turn = &k80.source[turn_at..];
    let issue1 = turn
        .find("wgmma_ssm_n80(dq_b, sw128_desc_at(smem_u32(sK), 1 * (BN * 128)")
        .expect("panel 1 into the second accumulator");
    let wait1 = turn
        .find("wgmma_wait1();")
        .expect("a wait that leaves one group in flight");
    let stage0 = turn
        .find("= dq_a[t][c];")
        .expect("panel 0 staged from the first");
    assert!(
        turn.find("wgmma_ssm_n80(dq_a").unwrap() < issue1 && issue1 < wait1 && wait1 < stage0,
        "pipelined dQ panels"
    );
    // Their warp index comes through a shuffle (tile bases and descriptors
    // on the uniform datapath); the 64-query kernels keep `tid / WARP`
    // (with the shuffle, kernels with custom inputs spilled past the budget).
    let uniform_warp = "warp = __shfl_sync(0xffffffffu, tid / WARP, 0)";
    assert!(k80.source.contains(uniform_warp));
    assert!(!masked.source.contains(uniform_warp) && !plain.source.contains(uniform_warp));
    assert!(
        k80.source
            .contains("sw128_desc_at(kb, (kk / 4) * (BN * 128)")
    );
    // The warpgroups take each step's whole dQ in turns (one syncs on the
    // parity's barrier, the other only arrives), and the producer adds the
    // staged tile with one bulk reduction, the element kernel undoing the
    // tile's column permutation in dq_acc.
    assert!(wide.takes_dq_turns() && wide.adds_dq_in_bulk(false) && !wide.adds_dq_in_bulk(true));
    assert!(
        k80.source.contains("named_bar_sync(2 + turn, NT)")
            && k80.source.contains("named_bar_arrive(2 + turn, NT)")
            && !k80.source.contains("MMA_SYNC();  // sdS complete"),
        "dQ in turns"
    );
    assert!(
        k80.source.contains("bulk_reduce_add_f32(dq_acc")
            && !k80.source.contains("atomicAdd(reinterpret_cast<float4*>")
            && k80
                .source
                .contains("const long long src = x0 - c_ + (c_ ^ DQ_PERM(i_));"),
        "dQ tiles by bulk reduction"
    );
    // A packed variable-length batch keeps the atomics (the element kernel
    // cannot place a packed row in its sequence) and the natural dq_acc.
    let k80v = parallel_backward_varlen(&v, 128, 128, &wide).expect("80-query varlen");
    assert!(
        !k80v.source.contains("bulk_reduce_add_f32(dq_acc")
            && k80v.source.contains("atomicAdd(reinterpret_cast<float4*>")
            && k80v.source.contains("const long long src = x0;")
            && k80v.source.contains("named_bar_sync(2 + turn, NT)"),
        "varlen: atomics, dQ in turns"
    );
    assert!(k80.main.smem_bytes <= Isa::Sm90a.max_dynamic_smem());
    // Kernels without the lag store dS K-major (stmatrix.trans) and read it
    // so in dS·K; the lagged ones keep the dSᵀ tile, read M-major.
    assert!(
        masked.source.contains("wgmma_ssn_n64(dq_part")
            && masked.source.contains("stmatrix_x4_trans(smem_at(sdSc")
            && !masked.source.contains("wgmma_ss_tt_n64(")
    );
    assert!(
        plain.source.contains("wgmma_ss_tt_n64(dq_part")
            && !plain.source.contains("stmatrix_x4_trans(smem_at(sdSc")
    );
    assert!(
        causal.source.contains("wgmma_ssn_n64(dq_part")
            && causal.source.contains("half * 32 + (t + (lane >> 4))")
    );
    // (80-query steps store dS K-major for their dQ GEMM whatever the
    // variant: with custom inputs too, which otherwise keep the dSᵀ tile.)
    let bias = example("relative_bias");
    let bias80 = parallel_backward(&bias, 128, 128, &wide).expect("relative bias at 80");
    assert!(
        bias80.source.contains("stmatrix_x4_trans(smem_at(sdSc")
            && bias80.source.contains("wgmma_ssm_n80(dq_a")
    );
    let bias64 = parallel_backward(&bias, 128, 128, &b128).expect("relative bias at 64");
    assert!(!bias64.source.contains("stmatrix_x4_trans(smem_at(sdSc"));
    for (name, d) in [
        ("sliding_window", 128),
        ("softcap", 128),
        ("relative_bias", 128),
        ("softmax", 64),
    ] {
        let cfg = BackwardConfig::for_variant(&example(name), d, d, Elem::Bf16, Isa::Sm90a);
        assert!(cfg.block_m == 64 && cfg.lags_dq(), "{name} d{d}: {cfg:?}");
    }
    assert!(!BackwardConfig::for_variant(&v, 128, 128, Elem::Bf16, Isa::Sm80).wgmma);
    // Under the causal mask each key block's walk starts at its diagonal row
    // n0 (no multiple of 80): rows n0 + 80·k, not the 80-row blocks holding
    // them; the mask trim's bounds stay in the dynamic allocation (no static
    // shared memory, which would break its 1024-byte alignment).
    let causal_cfg =
        BackwardConfig::for_variant(&example("softmax_causal"), 128, 128, Elem::Bf16, Isa::Sm90a);
    assert_eq!(causal_cfg, wide);
    let causal80 =
        parallel_backward(&example("softmax_causal"), 128, 128, &wide).expect("causal at 80");
    assert!(
        causal80.source.contains("const int m_first = min(n0, Sq);")
            && causal80
                .source
                .contains("m_first + (mb0 + it % per_head) * BM")
            && causal80.source.contains("reinterpret_cast<int*>(bars + 6)")
            && !causal80.source.contains("__shared__ int s_first")
    );
    assert!(
        masked.source.contains("mb0 = min(n0 / BM, mb_end);")
            && masked.source.contains("const int m_first = 0;")
    );
    for (dqk, dv) in [(128, 256), (192, 192), (256, 128)] {
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(
            cfg.wgmma && cfg.split_d == 2 && cfg.block_n() == 64,
            "{dqk}x{dv}: {cfg:?}"
        );
    }
    // 32-query steps with a warpgroup per 64 keys only where its dK and dV
    // fit beside the scores.
    let err = parallel_backward(
        &v,
        128,
        256,
        &BackwardConfig {
            block_m: 32,
            split_d: 1,
            shared_scores: false,
            ..BackwardConfig::default_for(128, 256, Elem::Bf16, Isa::Sm90a)
        },
    )
    .expect_err("dK and dV of 384 columns per warpgroup");
    assert!(err.to_string().contains("block_m 32, split_d 1"), "{err}");
    for (dqk, dv, groups) in [(256, 256, 1), (256, 512, 1), (128, 512, 1), (64, 512, 1)] {
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(
            cfg.wgmma
                && cfg.split_d == 2
                && cfg.block_m == 32
                && cfg.kv_groups == groups
                && cfg.block_n() == 64,
            "{dqk}x{dv}: {cfg:?}"
        );
    }
    for (dqk, dv) in [(96, 96), (192, 160), (256, 576)] {
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(!cfg.wgmma && cfg.kv_groups == 1, "{dqk}x{dv}: {cfg:?}");
    }
    assert!(!BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80).wgmma);
    // The split kernel: each warpgroup's dK/dV panels on m64n64 with the
    // operand fixed per warpgroup (DeepSeek's dims on 64-query steps: dK's
    // three panels on warpgroup 0, dV's two on warpgroup 1).
    let split = parallel_backward(
        &v,
        192,
        128,
        &BackwardConfig {
            block_m: 64,
            split_d: 2,
            shared_scores: true,
            ..BackwardConfig::default_for(192, 128, Elem::Bf16, Isa::Sm90a)
        },
    )
    .expect("split wgmma backward");
    assert!(split.source.contains("wgmma_rs_n64(kv_acc[2], da[kk]"));
    assert!(split.source.contains("wgmma_rs_n64(kv_acc[1], pa[kk]"));
    assert!(!split.source.contains("kv_acc[2], pa[kk]"));
    assert_eq!(
        split.main.grid,
        Grid::KeyBlocks {
            block_n: 64,
            groups: 1
        }
    );
    // A wgmma config at dims it does not take is refused, not miscompiled.
    let bad = BackwardConfig {
        block_m: 64,
        ..BackwardConfig::default_for(192, 128, Elem::Bf16, Isa::Sm90a)
    };
    let err = parallel_backward(&v, 192, 128, &bad).expect_err("split_d 1 at 192 on 64 queries");
    assert!(err.to_string().contains("split_d 2"), "{err}");
    let b = parallel_backward(
        &v,
        64,
        64,
        &BackwardConfig::default_for(64, 64, Elem::Bf16, Isa::Sm90a),
    )
    .expect("wgmma backward");
    assert!(
        b.source.contains("wgmma_ss_tt_n64") && b.main.name.ends_with("_wgmma_ws_tma_dqlag_main")
    );
    // Warp-specialised by default on sm_90a: a producer warpgroup beside the
    // two computing ones (its setmaxnreg budget balances theirs), dQ staged
    // in shared memory and added by the producer, within the shared memory.
    for (dqk, dv) in [(64, 64), (128, 128), (192, 128), (128, 256)] {
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(cfg.warp_specialized, "{dqk}x{dv}: {cfg:?}");
        let k = parallel_backward(&v, dqk, dv, &cfg).expect("ws backward");
        assert_eq!(k.main.threads, 384, "{dqk}x{dv}");
        assert_eq!((k.pre.threads, k.post.threads), (256, 256), "{dqk}x{dv}");
        assert!(
            k.main.smem_bytes <= Isa::Sm90a.max_dynamic_smem(),
            "{dqk}x{dv}"
        );
        let plain = parallel_backward(
            &v,
            dqk,
            dv,
            &BackwardConfig {
                warp_specialized: false,
                ..cfg
            },
        )
        .expect("backward without the producer");
        // Two dSᵀ buffers and the staged f32 dQ tile (rows of Dqk + 8): 64
        // rows where 32-query steps pair for dQ (DeepSeek's dims), then
        // unpadded (rows of Dqk, permuted) for the producer's bulk reduction.
        let staged_rows = if cfg.pairs_steps() { 64 } else { cfg.block_m };
        assert_eq!(cfg.pairs_steps(), cfg.block_m == 32, "{dqk}x{dv}");
        assert_eq!(cfg.pairs_steps(), cfg.permutes_staged_dq(), "{dqk}x{dv}");
        let staged_cols = if cfg.pairs_steps() { dqk } else { dqk + 8 };
        assert_eq!(
            k.main.smem_bytes - plain.main.smem_bytes,
            cfg.block_n() * 64 * 2 + staged_rows * staged_cols * 4,
            "{dqk}x{dv}"
        );
        assert_eq!(
            k.main.name.contains("_dq64") && k.source.contains("#define DQ_ROWS 64"),
            cfg.pairs_steps(),
            "{dqk}x{dv}: {}",
            k.main.name
        );
        assert_eq!(plain.main.threads, 256);
        // The producer adds the staged tiles with vector atomics, or on
        // paired steps with one bulk reduction each.
        let adds = if cfg.adds_dq_in_bulk(false) {
            "bulk_reduce_add_f32(dq_acc"
        } else {
            "atomicAdd(reinterpret_cast<float4*>(dqg"
        };
        assert_eq!(cfg.adds_dq_in_bulk(false), cfg.pairs_steps(), "{dqk}x{dv}");
        for text in [
            "setmaxnreg.dec.sync.aligned.u32 24",
            "setmaxnreg.inc.sync.aligned.u32 240",
            "mbar_wait(smem_u32(&bar_dq_full), drained & 1)",
            adds,
        ] {
            assert!(k.source.contains(text), "{dqk}x{dv}: no `{text}`");
            assert!(!plain.source.contains(text), "{dqk}x{dv}: `{text}`");
        }
    }
    // Only the wgmma kernel has a producer warpgroup.
    let err = parallel_backward(
        &v,
        128,
        128,
        &BackwardConfig {
            warp_specialized: true,
            ..BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80)
        },
    )
    .expect_err("warp-specialised sm_80 backward");
    assert!(err.to_string().contains("needs the wgmma kernel"), "{err}");
    assert!(!BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80).warp_specialized);
}

/// RetNet's 256/512 (twelve 64-column dK/dV panels) on the wgmma backward:
/// by default six panels per warpgroup on 32-query steps; split between
/// blocks of one key block on request (`kv_groups`): each block's slots, its
/// share of dQ's panels (and of the producer's atomics), the grid, and the
/// refusals.
#[test]
fn backward_key_panels_in_several_blocks() {
    let retnet = example("retnet_parallel");
    let default = BackwardConfig::default_for(256, 512, Elem::Bf16, Isa::Sm90a);
    let k1 = parallel_backward(&retnet, 256, 512, &default).expect("default");
    assert!(
        k1.main.name.ends_with("_m32w8s2_wgmma_xs_main"),
        "{}",
        k1.main.name
    );
    assert!(k1.source.contains("#define NKV 6") && !k1.source.contains("slot_ == 2"));
    // K, V and two stages of 32 query rows fill the shared memory: no
    // producer warpgroup (its staged dQ tile would not fit).
    assert!(
        !default.warp_specialized && k1.main.threads == 256,
        "{default:?}"
    );
    assert!(k1.main.smem_bytes <= Isa::Sm90a.max_dynamic_smem());
    let cfg = BackwardConfig {
        kv_groups: 2,
        ..default
    };
    let k = parallel_backward(&retnet, 256, 512, &cfg).expect("grouped backward");
    assert!(
        k.main.name.ends_with("_m32w8s2g2_wgmma_xs_main"),
        "{}",
        k.main.name
    );
    assert_eq!(
        k.main.grid,
        Grid::KeyBlocks {
            block_n: 64,
            groups: 2
        }
    );
    assert_eq!(
        k.main.grid_for([2, 32, 32, 100, 100], 256),
        Some((4, 32, 2))
    );
    for text in [
        "#define KV_GROUPS 2",
        "#define NKV 3",
        "const int slot_ = grp * 2 + slice;",
        "} else if (slot_ == 2) {",
        // Slot 3 holds [dK | dV]'s last three panels: dV's 5, 6 and 7.
        "wgmma_rs_n64(kv_acc[2], pa[kk], sw128_desc_at(smem_u32(sdOc), 7 * (BM * 128)",
        "const bool key_owner = slice == SCORE_SLICE && grp == 0;",
        "pnl = 2 * KV_GROUPS - 1 - (grp * 2 + slice); pnl < DQK / 64; pnl += 2 * KV_GROUPS",
        "const int gp = (grp * 2 + slice) * NKV + s;",
        // dS·K runs on 64 query rows: the rows past BM are neither added
        // nor read from the dSᵀ tile's unwritten columns (zeroed).
        "if ((BM >= 64 || r < BM) && m0 + r < Sq) atomicAdd(",
        "reinterpret_cast<unsigned*>(sdS)[x] = 0u;",
    ] {
        assert!(k.source.contains(text), "no `{text}`");
    }
    assert_eq!(k.source.matches("wgmma_rs_n64(kv_acc[").count(), 12);
    // Ten panels on four slots, the last holding one; with the producer
    // warpgroup (which fits at 128/512) each block adds only the dQ panels
    // it staged.
    let uneven = parallel_backward(
        &retnet,
        128,
        512,
        &BackwardConfig {
            kv_groups: 2,
            ..BackwardConfig::default_for(128, 512, Elem::Bf16, Isa::Sm90a)
        },
    )
    .expect("uneven slots");
    assert!(uneven.config.warp_specialized);
    assert_eq!(uneven.source.matches("wgmma_rs_n64(kv_acc[").count(), 10);
    assert!(
        uneven.source.contains(
            "wgmma_rs_n64(kv_acc[0], pa[kk], sw128_desc_at(smem_u32(sdOc), 7 * (BM * 128)"
        )
    );
    assert!(uneven.source.contains("if (slot_of / 2 != grp) continue;"));
    assert!(!k1.source.contains("slot_of"));
    // More slots than panels, more than six panels per warpgroup, or
    // groups on the mma.sync kernel are refused.
    for (bad, what) in [
        (
            BackwardConfig {
                kv_groups: 7,
                ..cfg
            },
            "kv_groups 7",
        ),
        (
            BackwardConfig {
                block_m: 128,
                ..cfg
            },
            "block_m 128",
        ),
        (
            BackwardConfig {
                split_d: 1,
                shared_scores: false,
                ..cfg
            },
            "split_d 1",
        ),
    ] {
        let err = parallel_backward(&retnet, 256, 512, &bad).expect_err(what);
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
    let err = parallel_backward(
        &retnet,
        128,
        128,
        &BackwardConfig {
            kv_groups: 2,
            ..BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80)
        },
    )
    .expect_err("groups on mma.sync");
    assert!(
        err.to_string().contains("needs the wgmma backward"),
        "{err}"
    );
}

/// Both warpgroups on the same keys share the scores by default: warpgroup
/// 0 computes Sᵀ, warpgroup 1 dPᵀ, Pᵀ and dSᵀ (and stores the dSᵀ tile and
/// adds the custom-input gradients), exchanged through `256 · block_m`
/// bytes of shared memory; a config may turn it off, and only the split
/// kernel takes it.
#[test]
fn split_backward_shares_the_scores_between_its_warpgroups() {
    let v = example("diff_transformer");
    let cfg = BackwardConfig::default_for(128, 256, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.shared_scores && cfg.warp_specialized, "{cfg:?}");
    let shared = parallel_backward(&v, 128, 256, &cfg).expect("shared scores");
    let both = parallel_backward(
        &v,
        128,
        256,
        &BackwardConfig {
            shared_scores: false,
            ..cfg
        },
    )
    .expect("both scores on both warpgroups");
    assert!(
        shared.main.name.ends_with("_wgmma_xs_ws_tma_main"),
        "{}",
        shared.main.name
    );
    // The exchange, and the row constants' buffers: without the exchange
    // the weights are formed first, with fewer constants (see
    // `wgmma_backward_forms_the_weights_while_dp_runs`).
    assert_eq!(
        shared.main.smem_bytes - both.main.smem_bytes,
        256 * 64
            + (row_constants(&shared.source) - row_constants(&both.source)) as u32
                * 2
                * 4
                * cfg.block_m
    );
    for text in [
        "#define SCORE_SLICE 1",
        "EXCHANGE_SYNC();",
        "if (slice != SCORE_SLICE) break;",
        "const bool key_owner = slice == SCORE_SLICE && grp == 0;",
        "xs[(t * 4 + c) * 128] = sacc[t][c];",
        "pa[kk][c] = xu[(kk * 8 + c) * 128];",
    ] {
        assert!(shared.source.contains(text), "no `{text}`");
    }
    assert!(
        both.source.contains("#define SCORE_SLICE 0") && !both.source.contains("EXCHANGE_SYNC")
    );
    // The shared-memory fallback keeps it where the producer does not fit
    // (RetNet's 256/512); a warpgroup per 64 keys has nothing to share.
    let retnet = BackwardConfig::default_for(256, 512, Elem::Bf16, Isa::Sm90a);
    assert!(
        retnet.shared_scores && !retnet.warp_specialized,
        "{retnet:?}"
    );
    let one_wg = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(!one_wg.shared_scores);
    let err = parallel_backward(
        &example("softmax"),
        128,
        128,
        &BackwardConfig {
            shared_scores: true,
            ..one_wg
        },
    )
    .expect_err("shared scores without split_d 2");
    assert!(err.to_string().contains("shared_scores needs"), "{err}");
}

/// The backward's element step: a block inside both lengths whose mask
/// class is full runs a copy of the loop without per-score tests; variants
/// whose score closure runs per score keep one loop (two copies spill).
#[test]
fn backward_full_blocks_skip_the_per_score_tests() {
    let full_test = "const bool full = cls == 2 && m0 + BM <= Sq && n0 + BN <= Skv;";
    for (name, dqk, dv, split) in [
        ("softmax", 128, 128, true),
        ("softmax_causal", 128, 128, true),
        ("deepseek", 192, 128, true),
        ("sigmoid", 128, 128, false),
        ("relative_bias", 128, 128, false),
    ] {
        let v = example(name);
        for isa in [Isa::Sm90a, Isa::Sm80] {
            let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, isa);
            let b = parallel_backward(&v, dqk, dv, &cfg).expect("backward");
            // (The weights formed first have their copy in `weight_pass`.)
            let one_loop = if b.source.contains("float weight(float s") {
                "sacc[t][c] = weight(sacc[t][c], rc, P);"
            } else {
                "const bool ok = true;"
            };
            assert_eq!(b.source.contains(one_loop), split, "{name} {isa:?}");
            assert_eq!(b.source.contains(full_test), split, "{name} {isa:?}");
            assert_eq!(b.source.contains("if (full) {"), split, "{name} {isa:?}");
            // The checked loop is always there: partial blocks and padding.
            assert!(
                b.source.contains("bool ok = i < Sq && j < Skv;"),
                "{name} {isa:?}"
            );
        }
    }
}

/// Dv above 256: the forward splits it between blocks (the grid's x grows
/// by the split, each block loads and writes its slice of v and o with the
/// whole Dv as row stride, only the first slice writes the row outputs);
/// the backward between four warps per key tile. Splits that do not cut Dv
/// into slices of at most 256 columns are refused.
#[test]
fn dv_above_256_is_split_into_slices() {
    let v = example("retnet_parallel");
    for (isa, wgmma) in [(Isa::Sm90a, true), (Isa::Sm80, false)] {
        let cfg = ForwardConfig::default_for(&v, 256, 512, Elem::Bf16, isa);
        assert_eq!((cfg.dv_split, cfg.wgmma), (2, wgmma), "{isa:?}");
        let k = parallel_forward(&v, 256, 512, &cfg).expect("split forward");
        assert_eq!((k.dv, k.dv_split), (512, 2));
        assert!(
            k.name.contains("d256x512") && k.name.contains("_v2"),
            "{}",
            k.name
        );
        assert!(k.source.contains("#define DV 256") && k.source.contains("#define DVG 512"));
        assert_eq!(
            k.grid_for([2, 3, 3, 1000]),
            Some((2 * 1000usize.div_ceil(cfg.block_m as usize) as u32, 3, 2))
        );
    }
    assert_eq!(
        ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a).dv_split,
        1
    );
    let cfg = ForwardConfig::default_for(&v, 128, 384, Elem::Bf16, Isa::Sm80);
    let k = parallel_forward(&v, 128, 384, &ForwardConfig { dv_split: 3, ..cfg }).unwrap_err();
    assert!(
        k.to_string().contains("dv_split 3 does not fit Dv = 384")
            && k.to_string().contains("(dv_split 2 does)"),
        "{k}"
    );
    let k = parallel_forward(&v, 128, 512, &ForwardConfig { dv_split: 1, ..cfg }).unwrap_err();
    assert!(k.to_string().contains("at most 256 columns"), "{k}");
    let err = parallel_forward(&v, 128, 528, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Dv = 528") && err.contains("up to 512"),
        "{err}"
    );
    // (sm_90a splits the panels between blocks instead:
    // `backward_key_panels_in_several_blocks`.)
    let b = BackwardConfig::default_for(256, 512, Elem::Bf16, Isa::Sm80);
    assert_eq!((b.split_d, b.wgmma), (4, false));
    let src = parallel_backward(&v, 256, 512, &b).expect("split backward");
    assert!(src.source.contains("#define KSPLIT 4"));
}

/// O goes out 16 bytes per lane after a transpose across the quad where the
/// extra live values cost nothing: at Dqk <= 128, and at DeepSeek's 192/128
/// (H200: 4% faster, bench/NOTES.md session 61), not at RetNet's 256/512
/// (there it moved spills into the key loop).
#[test]
fn the_epilogue_stores_by_quads_except_beside_wide_scores_and_wide_o() {
    let quads = |name: &str, dqk: u32, dv: u32| {
        let v = example(name);
        let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        let src = parallel_forward(&v, dqk, dv, &cfg).expect("forward").source;
        assert!(
            src.contains("#define QUAD_GROUPS (DVW / 32)") != src.contains("#define QUAD_GROUPS 0"),
            "{name}: one QUAD_GROUPS definition"
        );
        src.contains("#define QUAD_GROUPS (DVW / 32)")
    };
    assert!(quads("softmax", 128, 128));
    assert!(quads("deepseek", 192, 128));
    assert!(!quads("retnet_parallel", 256, 512));
    assert!(!quads("softmax", 256, 256));
}

/// Decoding kernels take a number of KV splits at launch and carry the
/// combine kernel; the launch rule splits only grids that leave the GPU idle.
/// An H100 multiprocessor's shared memory, bytes and as the split rule's cap.
const H100_SMEM_PER_SM: u32 = 228 * 1024;
const H100: Residency = Residency::SharedMemory(H100_SMEM_PER_SM as u64);

#[test]
fn decoding_kernels_split_the_keys_where_the_grid_is_small() {
    let v = example("decode");
    let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.split_kv && !cfg.warp_specialized);
    let k = parallel_forward(&v, 128, 128, &cfg).expect("decode forward");
    assert_eq!(k.combine.as_deref(), Some(&*format!("{}_combine", k.name)));
    assert!(k.source.contains("combine_rescale") && k.source.contains("fmaxf(m[0], x[0])"));
    assert_eq!(k.args.last(), Some(&ArgKind::KvSplits));
    // 64 sequences × 8 KV heads: 512 blocks, no split on 132 SMs.
    assert_eq!(k.kv_splits([64, 32, 8, 1, 4096], 132, H100), 1);
    // One sequence: 8 blocks of 1024 key blocks. 49 splits of 21 key
    // blocks put three blocks on most SMs, 48 KiB of K/V in flight (16 KiB
    // a block, 1% short of full speed); 64 (four of 16) stream 68 key
    // blocks against 66, 32 (two of 32) 8% slower with half the bytes.
    assert_eq!(k.kv_bytes_in_flight, 16 * 1024);
    assert_eq!(k.kv_splits([1, 32, 8, 1, 32768], 132, H100), 49);
    // Short contexts keep at least four key blocks per split.
    assert_eq!(k.kv_splits([1, 32, 8, 1, 300], 132, H100), 2);
    assert_eq!(k.split_grid_for([1, 32, 8, 1], 32), Some((32, 8, 1)));
    // Without the shared-memory figure, no wave cap: the same splits.
    assert_eq!(
        k.kv_splits([1, 32, 8, 1, 32768], 132, Residency::Unknown),
        49
    );
    // MLA decoding: 128 blocks of 93 KB (two fit an H100 SM): 2 splits, two
    // blocks on each SM. 3 would start a second wave (the old rule's
    // ceil(264 / 128)); without the wave cap they are no better: three
    // blocks of a third of the keys on some SMs stream as many key blocks
    // as two halves and pay a block's fixed work once more.
    let mla = example("mla_decode");
    let cfg = ForwardConfig {
        v_in_k: true,
        ..ForwardConfig::default_for(&mla, 576, 512, Elem::Bf16, Isa::Sm80)
    };
    let k = parallel_forward(&mla, 576, 512, &cfg).expect("latent forward");
    assert_eq!(k.resident_blocks(H100_SMEM_PER_SM), Some(2));
    assert_eq!(k.kv_splits([64, 16, 1, 1, 4096], 132, H100), 2);
    assert_eq!(
        k.kv_splits([64, 16, 1, 1, 4096], 132, Residency::Unknown),
        2
    );
    // All 128 heads: 256 blocks, one wave of 264: no split.
    assert_eq!(k.kv_splits([16, 128, 1, 1, 4096], 132, H100), 1);
    // With 64 or more packed rows per KV head, 64-row blocks on four warps
    // (where shared memory holds them); fewer rows keep the 16-row tile.
    let wide = cfg.for_packed_rows(128, 576, 512, Isa::Sm80);
    assert_eq!(
        (wide.block_m, wide.warps, wide.wgmma),
        (64, 4, false),
        "{wide:?}"
    );
    // On sm_90a at Dqk 576: 64-row wgmma blocks on 64-key blocks, Dv split
    // between two warpgroups; 217 KB, one block per SM, so the 32 blocks of
    // 16 sequences take 4 splits.
    let hopper = cfg.for_packed_rows(128, 576, 512, Isa::Sm90a);
    assert_eq!(
        (
            hopper.block_m,
            hopper.block_n,
            hopper.warps,
            hopper.wgmma,
            hopper.warp_specialized,
            hopper.dv_split,
            hopper.dv_warps,
            hopper.v_in_k
        ),
        (64, 64, 8, true, false, 1, 2, true),
        "{hopper:?}"
    );
    assert_eq!(cfg.for_packed_rows(64, 576, 512, Isa::Sm90a), hopper);
    let k = parallel_forward(&mla, 576, 512, &hopper).expect("wgmma latent forward");
    assert!(k.name.contains("_gqa_wgmma"), "{}", k.name);
    assert!(k.source.contains("wgmma_ss_n64(") && k.source.contains("wgmma_rs_n256("));
    // V is read from K's tile at the warpgroup's first column: no V tile.
    assert!(
        !k.source.contains("sV + ") && !k.source.contains("smem_at(sV,"),
        "no V ring"
    );
    assert_eq!(k.resident_blocks(H100_SMEM_PER_SM), Some(1));
    assert!(k.name.contains("_dw2"), "{}", k.name);
    // The first warpgroup computes S and hands P and the row rescale to the
    // second (an mbarrier phase per block), and the row state at the end.
    assert!(
        k.source.contains("mbar_arrive(smem_u32(&bar_p))")
            && k.source
                .contains("mbar_wait(smem_u32(&bar_p), p_phase & 1)")
            && k.source.contains("if (dw == 0) {"),
        "S once per block"
    );
    assert!(k.source.contains("((dv0 + DW_COL) / 64) * (BN * 128)"));
    assert_eq!(k.grid_for([16, 128, 1, 1]), Some((2, 1, 16)));
    assert_eq!(k.kv_splits([16, 128, 1, 1, 4096], 132, H100), 4);

    // MQA at d128, 128 query heads on one KV head, 16 sequences: 32 blocks
    // of a 64-row tile. The sm_80 one (four warps), three of which fit an
    // SM, takes 8 splits, two blocks on every SM; the old rule's ceil(2 ·
    // 132 / 32) = 9 put three on some (0.0346 ms against 0.0302 on an
    // H100), 4 one with twice the keys (0.0348).
    let decode = example("decode");
    let base = ForwardConfig::default_for(&decode, 128, 128, Elem::Bf16, Isa::Sm90a);
    let sm80 = base.for_packed_rows(128, 128, 128, Isa::Sm80);
    assert_eq!((sm80.block_m, sm80.warps, sm80.wgmma), (64, 4, false));
    let k = parallel_forward(&decode, 128, 128, &sm80).expect("MQA decoding forward");
    assert_eq!(k.grid_for([16, 128, 1, 1]), Some((2, 1, 16)));
    for r in [H100, Residency::Blocks(2), Residency::Blocks(3)] {
        assert_eq!(k.kv_splits([16, 128, 1, 1, 4096], 132, r), 8, "{r:?}");
    }
    assert_eq!(
        k.kv_splits([16, 128, 1, 1, 4096], 132, Residency::Blocks(1)),
        4
    );
    // On sm_90a: one warpgroup on 128-key blocks in three stages (208 KB,
    // one block per SM: 4 splits), 0.023 ms on an H100.
    let hopper = base.for_packed_rows(128, 128, 128, Isa::Sm90a);
    assert_eq!(
        (
            hopper.block_m,
            hopper.block_n,
            hopper.warps,
            hopper.stages,
            hopper.wgmma,
            hopper.warp_specialized,
            hopper.dv_warps,
            hopper.dv_split
        ),
        (64, 128, 4, 3, true, false, 1, 1),
        "{hopper:?}"
    );
    let k = parallel_forward(&decode, 128, 128, &hopper).expect("wgmma MQA decoding forward");
    assert!(
        k.name.contains("_gqa_wgmma") && k.source.contains("wgmma_ss_n128("),
        "{}",
        k.name
    );
    assert_eq!(k.resident_blocks(H100_SMEM_PER_SM), Some(1));
    assert_eq!(k.kv_splits([16, 128, 1, 1, 4096], 132, H100), 4);
    // Where 128-key blocks do not fit (Dqk, Dv 256: 288 KB in two stages),
    // 64-key blocks in three (225 KB).
    let wide_dims = base.for_packed_rows(128, 256, 256, Isa::Sm90a);
    assert_eq!(
        (wide_dims.wgmma, wide_dims.block_n, wide_dims.stages),
        (true, 64, 3),
        "{wide_dims:?}"
    );
    // Fewer than 64 rows per KV head keep the 16-row tile.
    assert_eq!(base.for_packed_rows(32, 128, 128, Isa::Sm90a), base);

    // The persistent warp-specialised kernel takes neither packed rows, V in
    // K nor Dqk above 256: each is refused, naming what is missing.
    let softmax = example("softmax");
    let ws = ForwardConfig::default_for(&softmax, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(ws.warp_specialized);
    let latent_ws = ForwardConfig {
        dv_split: 2,
        tma_loads: false,
        ..ws
    };
    for (variant, bad, dqk, dv, words) in [
        (
            &softmax,
            ForwardConfig {
                pack_gqa: true,
                ..ws
            },
            128,
            128,
            "with a block per row block (set persistent: false)",
        ),
        (
            &mla,
            ForwardConfig {
                v_in_k: true,
                ..latent_ws
            },
            576,
            512,
            "with a block per row block (set persistent: false)",
        ),
        (&mla, latent_ws, 576, 512, "Dqk above 256 are implemented"),
    ] {
        let e = parallel_forward(variant, dqk, dv, &bad).expect_err("refused");
        assert!(e.to_string().contains(words), "{e}");
        // With a block per row block it generates (cp.async loads, no maps).
        let k = parallel_forward(
            variant,
            dqk,
            dv,
            &ForwardConfig {
                persistent: false,
                ..bad
            },
        )
        .expect("a block per row block");
        assert_eq!(
            k.tensor_maps.is_empty(),
            !bad.tma_loads || bad.pack_gqa || bad.v_in_k,
            "{}",
            k.name
        );
    }
    // A modify_q (one that is not a uniform scale, which moves onto the
    // scores) with Dv warpgroups under warp specialisation is refused: each
    // warpgroup modifies its own rows.
    let scaled_q = aec_frontend::parse_str(
        "pub struct Wq: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; w: [Dqk]; modify_q = |q| q * w; }",
    )
    .expect("variant");
    let dv_warpgroups = ForwardConfig {
        warps: 8,
        dv_warps: 2,
        block_m: 64,
        persistent: false,
        tma_loads: false,
        late_epilogue: false,
        kv_multicast: false,
        q_in_registers: false,
        ..ws
    };
    let e = parallel_forward(&scaled_q, 128, 128, &dv_warpgroups).expect_err("refused");
    assert!(e.to_string().contains("modifies q"), "{e}");
    parallel_forward(&softmax, 128, 128, &dv_warpgroups).expect("Dv warpgroups, softmax");
    assert_eq!(cfg.for_packed_rows(16, 576, 512, Isa::Sm90a), cfg);
    let deep = ForwardConfig { stages: 4, ..cfg };
    assert_eq!(
        deep.for_packed_rows(128, 576, 512, Isa::Sm80),
        deep,
        "224 KB > sm_80's 163 KB"
    );
    let k = parallel_forward(&mla, 576, 512, &wide).expect("64-row latent forward");
    assert_eq!(k.grid_for([16, 128, 1, 1]), Some((4, 1, 16)));
    let gqa = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert_eq!(gqa.for_packed_rows(4, 128, 128, Isa::Sm90a), gqa);
    // Decoding splits each key block between two warps by default.
    assert_eq!(
        (gqa.block_n, gqa.warps, gqa.key_warps),
        (32, 2, 2),
        "{gqa:?}"
    );
    // Few blocks (one sequence, 8 KV heads, 132 SMs): four key warps on
    // 128-key blocks where they fit; many blocks, or V stored in K, keep
    // the default.
    let fat = gqa.for_few_blocks(8, 132, 128, 128, Isa::Sm90a);
    assert_eq!(
        (fat.block_n, fat.warps, fat.key_warps, fat.stages),
        (128, 4, 4, 3),
        "{fat:?}"
    );
    // Three 64 KB stages exceed sm_80's shared memory: two there.
    let fat80 = gqa.for_few_blocks(8, 108, 128, 128, Isa::Sm80);
    assert_eq!((fat80.key_warps, fat80.stages), (4, 2), "{fat80:?}");
    assert_eq!(gqa.for_few_blocks(512, 132, 128, 128, Isa::Sm90a), gqa);
    // A grid filling three quarters to all of the SMs, one block each (B16
    // × 8 KV heads on 132): fat too; between half and three quarters, or
    // past one block per SM, the default.
    assert_eq!(gqa.for_few_blocks(128, 132, 128, 128, Isa::Sm90a), fat);
    assert_eq!(gqa.for_few_blocks(100, 132, 128, 128, Isa::Sm90a), fat);
    assert_eq!(gqa.for_few_blocks(132, 132, 128, 128, Isa::Sm90a), fat);
    assert_eq!(gqa.for_few_blocks(99, 132, 128, 128, Isa::Sm90a), gqa);
    assert_eq!(gqa.for_few_blocks(66, 132, 128, 128, Isa::Sm90a), gqa);
    assert_eq!(gqa.for_few_blocks(65, 132, 128, 128, Isa::Sm90a), fat);
    assert_eq!(gqa.for_few_blocks(133, 132, 128, 128, Isa::Sm90a), gqa);
    assert_eq!(cfg.for_few_blocks(8, 132, 576, 512, Isa::Sm90a), cfg);
    // DeepSeek's 192/128 at 128 keys: 178 KB, beyond sm_80's 163 KB.
    let ds = ForwardConfig::default_for(&v, 192, 128, Elem::Bf16, Isa::Sm80);
    assert_eq!(ds.for_few_blocks(8, 108, 192, 128, Isa::Sm80), ds);
    let ds90 = ds.for_few_blocks(8, 132, 192, 128, Isa::Sm90a);
    assert_eq!((ds90.key_warps, ds90.stages), (4, 2), "{ds90:?}");
    // The rules from the call's sizes: one sequence, 32 heads on 8 KV heads;
    // its 4 rows of 32 column quads on 128 threads merge in the main kernel.
    assert_eq!(
        gqa.for_decode_shape([1, 32, 8, 1], 132, 128, 128, Isa::Sm90a),
        ForwardConfig {
            fused_combine: true,
            ..fat
        }
    );
    // 16 rows of MLA's 128 column quads on 64 threads: the combine kernel.
    let mla_shape = cfg.for_decode_shape([64, 16, 1, 1], 132, 576, 512, Isa::Sm90a);
    assert!(
        mla_shape.split_kv && !mla_shape.fused_combine,
        "{mla_shape:?}"
    );
    // 4 rows per KV head on the default 64 threads: 128 quads, two each.
    assert!(gqa.with_combine_for_rows(4, 128).fused_combine);
    assert!(!gqa.with_combine_for_rows(5, 128).fused_combine);
    // Prefill kernels and Hopper's wgmma tiles have no KV splits to merge.
    let prefill = ForwardConfig::default_for(&example("softmax"), 128, 128, Elem::Bf16, Isa::Sm90a);
    assert_eq!(prefill.with_combine_for_rows(1, 128), prefill);
    // Four key warps share a warp's O columns in quarters: not with 48.
    assert_eq!(gqa.for_few_blocks(8, 132, 128, 48, Isa::Sm90a), gqa);
    let k = parallel_forward(&v, 128, 128, &fat).expect("fat decoding forward");
    assert_eq!(k.threads, 128);
    // The in-kernel merge loads all 16 splits at once where the tile has
    // four key warps (alone on its SM), 8 at a time with two.
    let fused = |cfg: ForwardConfig| {
        parallel_forward(
            &v,
            128,
            128,
            &ForwardConfig {
                fused_combine: true,
                ..cfg
            },
        )
        .expect("fused decoding forward")
        .source
    };
    assert!(fused(fat).contains("#define FUSED_CHUNK 16\n"));
    assert!(fused(gqa).contains("#define FUSED_CHUNK 8\n"));
    // One block per H100 SM (139 KB): 132 / 8 = 16 splits fill one wave.
    assert_eq!(k.kv_splits([1, 32, 8, 1, 32768], 132, H100), 16);
    // Prefill kernels have no combine.
    let p = example("softmax");
    let cfg = ForwardConfig::default_for(&p, 128, 128, Elem::Bf16, Isa::Sm80);
    assert!(!cfg.split_kv);
    let k = parallel_forward(&p, 128, 128, &cfg).expect("forward");
    assert_eq!(k.kv_splits([1, 1, 1, 16, 100_000], 132, H100), 1);
    let err = parallel_forward(
        &p,
        128,
        128,
        &ForwardConfig {
            split_kv: true,
            ..ForwardConfig::default_for(&p, 128, 128, Elem::Bf16, Isa::Sm90a)
        },
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("with a block per row block (set persistent: false)"),
        "{err}"
    );
    // The combine in the main kernel needs KV splits on the sm_80 template.
    for cfg in [
        ForwardConfig {
            fused_combine: true,
            ..ForwardConfig::default_for(&p, 128, 128, Elem::Bf16, Isa::Sm80)
        },
        ForwardConfig {
            fused_combine: true,
            split_kv: true,
            warp_specialized: false,
            persistent: false,
            ..ForwardConfig::default_for(&p, 128, 128, Elem::Bf16, Isa::Sm90a)
        },
    ] {
        let err = parallel_forward(&p, 128, 128, &cfg).unwrap_err();
        assert!(
            err.to_string().contains("fused_combine") && err.to_string().contains("split_kv"),
            "{err}"
        );
    }
}

#[test]
fn wgmma_configurations_out_of_range_are_refused_with_reasons() {
    let v = example("softmax");
    let hopper = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    let refused = |d: u32, cfg: ForwardConfig, reason: &str| {
        let err = parallel_forward(&v, d, d, &cfg).unwrap_err().to_string();
        assert!(err.contains(reason), "expected `{reason}` in: {err}");
    };
    refused(80, hopper, "multiples of 64");
    refused(80, hopper, "Dqk 80");
    refused(
        128,
        ForwardConfig { warps: 4, ..hopper },
        "each warpgroup of 4 warps owns 64 rows",
    );
    refused(
        128,
        ForwardConfig {
            wgmma: false,
            ..hopper
        },
        "warp specialisation is implemented for the wgmma forward only",
    );
    refused(
        128,
        ForwardConfig {
            stages: 5,
            ..hopper
        },
        "5 K/V stages",
    );
    let err = parallel_backward(
        &v,
        192,
        128,
        &BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("Dqk, Dv of 64 or 128") && err.contains("Dqk 192"),
        "{err}"
    );
}

/// The persistent warp-specialised forward (the default on Hopper): one
/// block per multiprocessor walks units of two row blocks (ranks x and
/// n - 1 - x).
#[test]
fn persistent_kernels_walk_pairs_of_row_blocks() {
    let v = example("softmax_causal");
    let mut cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.warp_specialized && cfg.persistent, "{cfg:?}");
    // Not where the kernel cannot be warp-specialised (sm_80, decoding).
    let sm80 = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm80);
    assert!(!sm80.persistent, "{sm80:?}");
    let decode = ForwardConfig::default_for(&example("decode"), 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(!decode.persistent && decode.split_kv, "{decode:?}");
    let k = parallel_forward(&v, 128, 128, &cfg).expect("persistent kernel");
    assert!(k.persistent && k.name.contains("_p_"), "{}", k.name);
    assert!(k.source.contains("bar_q_free") && k.source.contains("n_units"));
    // Sq 2048 in 128-row blocks: 16 row blocks, 8 pairs per head; 8 × 32 heads
    // × 8 batches = 2048 units, launched on at most one block per SM.
    assert_eq!(k.persistent_units([8, 32, 32, 2048]), 2048);
    assert_eq!(k.launch_grid([8, 32, 32, 2048], 132, 1), Some((132, 1, 1)));
    // An odd count pairs all but the middle block: 250 rows = 2 blocks → 1
    // unit; 300 rows = 3 blocks → 2 units (blocks 0 and 2, block 1 alone).
    assert_eq!(k.persistent_units([1, 2, 2, 250]), 2);
    assert_eq!(k.persistent_units([1, 2, 2, 300]), 4);
    assert_eq!(k.launch_grid([1, 2, 2, 300], 132, 1), Some((4, 1, 1)));
    // The same tile without persistence launches the whole grid.
    cfg.persistent = false;
    let plain = parallel_forward(&v, 128, 128, &cfg).expect("kernel");
    assert_eq!(plain.launch_grid([1, 2, 2, 300], 132, 1), Some((3, 2, 1)));
    assert_ne!(plain.name, k.name);
}

#[test]
fn persistence_needs_the_warp_specialised_kernel() {
    let v = example("softmax");
    let cfg = ForwardConfig {
        persistent: true,
        ..CFG
    };
    let err = parallel_forward(&v, 128, 128, &cfg)
        .expect_err("persistent sm_80 kernel")
        .to_string();
    assert!(
        err.contains("persistent") && err.contains("warp_specialized"),
        "{err}"
    );
}

#[test]
fn warp_specialised_dense_forwards_load_by_tma_with_three_tensor_maps() {
    use aec_compiler::launch_plan::SizeExpr;
    use aec_compiler::{
        parallel_forward_block_sparse, parallel_forward_paged, parallel_forward_varlen,
    };
    // DiffTransformer's 128/256: K's and V's maps differ in columns.
    let v = example("softmax_causal");
    let cfg = ForwardConfig::default_for(&v, 128, 256, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.warp_specialized && cfg.tma_loads, "{cfg:?}");
    let k = parallel_forward(&v, 128, 256, &cfg).expect("TMA forward");
    assert!(k.name.ends_with("_tma"), "{}", k.name);
    // The three maps are the last arguments, in the source's order.
    let n = k.args.len();
    assert_eq!(
        k.args[n - 3..],
        [
            ArgKind::TensorMap("q"),
            ArgKind::TensorMap("k"),
            ArgKind::TensorMap("v")
        ]
    );
    assert!(
        k.source
            .contains("const __grid_constant__ TmaMap tm_q, const __grid_constant__ TmaMap tm_k, const __grid_constant__ TmaMap tm_v) {"),
        "the kernel's last parameters are the maps"
    );
    let var = |s: &str| SizeExpr::var(s);
    let names: Vec<_> = k.tensor_maps.iter().map(|m| m.tensor).collect();
    assert_eq!(names, ["q", "k", "v"]);
    let (q, key, val) = (&k.tensor_maps[0], &k.tensor_maps[1], &k.tensor_maps[2]);
    assert_eq!(q.dims[0], SizeExpr::Const(128));
    assert_eq!(q.dims[1], var("Sq"));
    assert_eq!(q.dims[2], SizeExpr::mul([var("B"), var("H")]));
    assert_eq!(q.box_dims, [64, cfg.block_m, 1]);
    assert_eq!(key.dims[1], var("Skv"));
    assert_eq!(key.dims[2], SizeExpr::mul([var("B"), var("Hkv")]));
    assert_eq!(key.box_dims, [64, cfg.block_n, 1]);
    assert_eq!(val.dims[0], SizeExpr::Const(256));
    // One arrival per phase with the boxes' bytes: Q's 128 x 128, K's and
    // V's block_n x (128 + 256) of 2-byte elements.
    assert!(k.source.contains("mbar_init(smem_u32(&bar_q), 1);"));
    assert!(
        k.source
            .contains("mbar_arrive_expect_tx(smem_u32(&bar_q), BM * DQK * (int)sizeof(elem_t));")
    );
    assert!(
        k.source
            .contains("KV_BOX(smem_at(sV, st * BN * SVS + p * BN * 64), tm_v, dv0 + p * 64")
    );
    // (Each box a plain TMA copy: no cluster pair's multicast here.)
    assert!(k.source.contains(
        "#define KV_BOX(dst, map, c0, n0, c2, bar, j) tma_load_3d(dst, map, c0, n0, c2, bar)"
    ));
    assert!(!k.source.contains("__cluster_dims__") && !k.cluster_pairs);
    assert!(
        !k.source
            .contains("load_tile_sw128<BN, DQK, NPWARPS * WARP>(sK")
    );

    // cp.async where the rows are not one head's dense matrix, or without a
    // producer warpgroup.
    let mut others = vec![
        parallel_forward_varlen(&v, 128, 128, &cfg).expect("varlen"),
        parallel_forward_paged(&v, 128, 128, &cfg).expect("paged"),
        parallel_forward_block_sparse(&v, 128, 128, &cfg).expect("block-sparse"),
    ];
    let plain = ForwardConfig {
        warp_specialized: false,
        persistent: false,
        ..cfg
    };
    others.push(parallel_forward(&v, 128, 128, &plain).expect("wgmma without a producer"));
    others.push(
        parallel_forward(
            &v,
            128,
            128,
            &ForwardConfig {
                tma_loads: false,
                late_epilogue: false,
                kv_multicast: false,
                ..cfg
            },
        )
        .expect("cp.async producer"),
    );
    for o in &others {
        assert!(o.tensor_maps.is_empty(), "{}", o.name);
        assert!(!o.name.contains("_tma"), "{}", o.name);
        assert!(!o.args.iter().any(|a| matches!(a, ArgKind::TensorMap(_))));
        assert!(!o.source.contains("tm_q"), "{}", o.name);
    }
}

/// The sm_90a default of example `name` at Dqk = Dv = `d`.
fn hopper_default(name: &str, d: u32) -> ForwardConfig {
    ForwardConfig::default_for(&example(name), d, d, Elem::Bf16, Isa::Sm90a)
}

#[test]
fn causal_d128_keeps_q_in_registers_on_hopper() {
    // Measured faster under a causal mask with TMA loads, slower without a
    // mask (bench/NOTES.md session 35).
    for name in ["softmax_causal", "sliding_window"] {
        let c = hopper_default(name, 128);
        assert!(
            c.q_in_registers && c.tma_loads && c.block_n == 128,
            "{name}: {c:?}"
        );
        let k = parallel_forward(&example(name), 128, 128, &c).expect("forward");
        assert!(k.name.contains("_ws_rq_"), "{}", k.name);
    }
    assert!(!hopper_default("softmax", 128).q_in_registers);
    // Not for the rows that keep cp.async (paged, block-sparse, varlen).
    let v = example("softmax_causal");
    assert!(
        !ForwardConfig::cp_async_default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a).q_in_registers
    );
    assert!(
        !ForwardConfig::varlen_default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a).q_in_registers
    );
    // (A mask reading custom inputs spills with Q in registers.)
    assert!(!hopper_default("document_mask", 128).q_in_registers);
    assert!(!hopper_default("softmax_causal", 64).q_in_registers);
    assert!(
        !ForwardConfig::default_for(&example("softmax_causal"), 128, 128, Elem::Bf16, Isa::Sm80)
            .q_in_registers
    );
}

#[test]
fn variants_without_an_online_block_keep_q_in_registers_at_d64() {
    // ReLU and sigmoid at Dqk 64: Q in registers on the 128-key ring (ReLU
    // measured 3.6-7.3% faster on both Hopper GPUs, bench/NOTES.md session 70).
    for name in ["relu", "sigmoid"] {
        let c = hopper_default(name, 64);
        assert!(
            c.q_in_registers && c.tma_loads && c.persistent && c.block_n == 128,
            "{name}: {c:?}"
        );
        assert!(!c.late_epilogue, "{name}: a per-score closure: {c:?}");
        let k = parallel_forward(&example(name), 64, 64, &c).expect("forward");
        assert!(k.name.contains("_ws_rq_"), "{}", k.name);
    }
    // Not at Dqk 128 (sigmoid 7% slower there), not with an online block,
    // not on the rows that keep cp.async, not on sm_80.
    assert!(!hopper_default("sigmoid", 128).q_in_registers);
    assert!(!hopper_default("relu", 128).q_in_registers);
    assert!(!hopper_default("softmax", 64).q_in_registers);
    assert!(!hopper_default("retnet_parallel", 64).q_in_registers);
    let relu = example("relu");
    assert!(
        !ForwardConfig::cp_async_default_for(&relu, 64, 64, Elem::Bf16, Isa::Sm90a).q_in_registers
    );
    assert!(!ForwardConfig::default_for(&relu, 64, 64, Elem::Bf16, Isa::Sm80).q_in_registers);
}

#[test]
fn q_register_tiles_finish_a_tile_beside_the_next_s_gemm() {
    let v = example("softmax_causal");
    let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.late_epilogue && cfg.q_in_registers, "{cfg:?}");
    // Not under the sliding window's two-sided mask (3% slower there).
    let window =
        ForwardConfig::default_for(&example("sliding_window"), 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(window.q_in_registers && !window.late_epilogue, "{window:?}");
    // Nor with a per-score closure (not measured).
    let alibi = ForwardConfig::default_for(&example("alibi"), 128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(alibi.q_in_registers && !alibi.late_epilogue, "{alibi:?}");
    // DeepSeek's dims: with TMA loads 128 keys with Q in shared memory on a
    // two-stage ring whose K and V have barriers of their own; with cp.async
    // (paged, variable-length, block-sparse rows) 80 keys with Q in
    // registers.
    let deepseek = ForwardConfig::default_for(&v, 192, 128, Elem::Bf16, Isa::Sm90a);
    assert_eq!(
        (deepseek.block_n, deepseek.stages, deepseek.q_in_registers),
        (128, 2, false),
        "{deepseek:?}"
    );
    let two_stage = parallel_forward(&v, 192, 128, &deepseek)
        .expect("forward")
        .source;
    assert!(two_stage.contains("bar_full_v[STAGES], bar_empty_v[STAGES]"));
    assert!(two_stage.contains("ISSUE_V(gi, n0);"));
    let three_stage = parallel_forward(&v, 128, 128, &cfg)
        .expect("forward")
        .source;
    assert_eq!(cfg.stages, 3);
    assert!(!three_stage.contains("bar_full_v"));
    let paged = ForwardConfig::cp_async_default_for(&v, 192, 128, Elem::Bf16, Isa::Sm90a);
    assert!(
        paged.late_epilogue && paged.q_in_registers && paged.block_n == 80,
        "{paged:?}"
    );
    let k = parallel_forward(&v, 128, 128, &cfg).expect("forward");
    assert!(k.name.ends_with("_tma_le"), "{}", k.name);
    // The previous tile's last P·V is its own group just before the next
    // tile's first S GEMM; once it is done (wait 1) the rows are packed and
    // stored while the S GEMM runs (wait 0 after them); the last tile's after
    // the tile loop.
    let src = &k.source;
    let pv = src
        .find("The previous tile's last P·V, in its own group")
        .expect("the late P·V");
    let hook = src
        .find("The previous tile's epilogue while this S GEMM runs")
        .expect("the late stores");
    assert!(pv < hook);
    assert!(src[pv..hook].contains("pv_gemm(acc[0], pa,"));
    assert_eq!(src[pv..hook].matches("wgmma_commit();").count(), 2);
    assert!(!src[pv..hook].contains("wgmma_wait"), "a GEMM waited on");
    let wait = hook + src[hook..].find("wgmma_wait0();").expect("its wait");
    let late = &src[hook..wait];
    assert!(late.contains("wgmma_wait1();") && late.contains("if (has_prev)"));
    assert!(late.find("wgmma_wait1();") < late.find("*reinterpret_cast<uint4*>(orow"));
    assert!(src.contains("// The last tile's last P·V and epilogue."));
    // Without it the rows are stored where the tile ends.
    let early = parallel_forward(
        &v,
        128,
        128,
        &ForwardConfig {
            late_epilogue: false,
            kv_multicast: false,
            ..cfg
        },
    )
    .expect("forward");
    assert!(!early.source.contains("has_prev") && !early.name.ends_with("_le"));
    // Q in registers loads the next tile's Q at the tile's start; in shared
    // memory, where it loads only after the last S GEMM, the producer first
    // brings it into L2.
    assert!(!k.source.contains("tma_prefetch_3d(tm_q"));
    let plain = parallel_forward(
        &example("softmax"),
        128,
        128,
        &ForwardConfig::default_for(&example("softmax"), 128, 128, Elem::Bf16, Isa::Sm90a),
    )
    .expect("forward");
    assert!(plain.source.contains("tma_prefetch_3d(tm_q, p * 64, nm0,"));
    // Q in shared memory (loaded only once the last tile's S GEMMs end) keeps
    // the stores in the tile: 5% slower late (bench/NOTES.md session 36).
    assert!(
        !ForwardConfig::default_for(&example("softmax"), 128, 128, Elem::Bf16, Isa::Sm90a)
            .late_epilogue
    );
    // Rows `cp.async` loads ignore it (their loaders differ per layout).
    let varlen = parallel_forward_varlen(
        &v,
        128,
        128,
        &ForwardConfig {
            late_epilogue: true,
            kv_multicast: false,
            ..ForwardConfig::varlen_default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a)
        },
    )
    .expect("varlen forward");
    assert!(!varlen.source.contains("has_prev"));
}

#[test]
fn warp_specialised_backward_loads_q_and_do_by_tma() {
    let v = example("softmax_causal");
    let cfg = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.warp_specialized && cfg.tma_loads, "{cfg:?}");
    let b = parallel_backward(&v, 128, 128, &cfg).expect("TMA backward");
    assert!(b.main.name.ends_with("_tma_main"), "{}", b.main.name);
    let n = b.args.len();
    assert_eq!(
        b.args[n - 2..],
        [ArgKind::TensorMap("q"), ArgKind::TensorMap("dout")]
    );
    let names: Vec<_> = b
        .tensor_maps
        .iter()
        .map(|m| (m.tensor, m.box_dims))
        .collect();
    assert_eq!(names, [("q", [64, 64, 1]), ("dout", [64, 64, 1])]);
    // One arrival with the boxes' bytes, then the row constants' BM.
    assert!(
        b.source
            .contains("mbar_init(smem_at(bar_q_full, st), 1 + BM);")
    );
    assert!(
        b.source
            .contains("tma_load_3d(smem_at(sdO, st * BM * SVS + p * BM * 64), tm_dout")
    );
    // cp.async where rows are packed sequences, or without the producer.
    let varlen = aec_compiler::parallel_backward_varlen(&v, 128, 128, &cfg).expect("varlen");
    let plain = parallel_backward(
        &v,
        128,
        128,
        &BackwardConfig {
            warp_specialized: false,
            ..cfg
        },
    )
    .expect("no producer");
    for b in [varlen, plain] {
        assert!(
            b.tensor_maps.is_empty() && !b.source.contains("tm_q"),
            "{}",
            b.main.name
        );
        assert!(!b.args.iter().any(|a| matches!(a, ArgKind::TensorMap(_))));
    }
}

#[test]
fn causal_backward_starts_the_longest_key_blocks_first() {
    let cfg = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    let causal = parallel_backward(&example("softmax_causal"), 128, 128, &cfg).expect("causal");
    assert!(
        causal.source.contains("in_win / wh") && causal.source.contains("#define CAUSAL_HEADS 8"),
        "key blocks numbered longest first within windows of heads"
    );
    // Launch order elsewhere: without a mask every walk is as long, and a
    // packed batch's blocks index their sequence.
    let dense = parallel_backward(&example("softmax"), 128, 128, &cfg).expect("dense");
    let varlen = aec_compiler::parallel_backward_varlen(&example("softmax_causal"), 128, 128, &cfg)
        .expect("varlen");
    for b in [dense, varlen] {
        assert!(
            !b.source.contains("in_win / wh")
                && b.source
                    .contains("const int bx = blockIdx.x / KV_GROUPS, grp = blockIdx.x % KV_GROUPS, by = blockIdx.y, bz = blockIdx.z;"),
            "{}",
            b.main.name
        );
    }
}

/// At the head dims whose dK and dV fill a warpgroup's registers (DeepSeek
/// 192/128), variants without a mask (or with the plain causal one), score
/// modification or custom inputs take 48-query steps with dQ computed
/// transposed (N = 48: each step's dQ alone, in turns, added in bulk)
/// instead of the paired 32-query steps; a sliding window keeps those.
#[test]
fn own_keys_backward_takes_48_query_steps_with_dq_transposed() {
    let deepseek = example("deepseek");
    let cfg = BackwardConfig::for_variant(&deepseek, 192, 128, Elem::Bf16, Isa::Sm90a);
    assert!(
        cfg.block_m == 48
            && cfg.transposes_dq()
            && cfg.takes_dq_turns()
            && cfg.adds_dq_in_bulk(false)
            && !cfg.pairs_steps(),
        "{cfg:?}"
    );
    let k = parallel_backward(&deepseek, 192, 128, &cfg).expect("DeepSeek on 48-query steps");
    assert!(
        k.main.name.ends_with("_m48w8_wgmma_ws_tma_main"),
        "{}",
        k.main.name
    );
    for text in [
        "wgmma_ss_n48(sacc",
        "wgmma_ssm_n48(dq_a",
        "wgmma_ssm_n48(dq_b",
        "#define DS_ROWS BM",
        "const int m_first = min(n0, Sq);",
        "named_bar_sync(2 + turn, NT)",
        "bulk_reduce_add_f32(dq_acc",
    ] {
        assert!(k.source.contains(text), "no `{text}`");
    }
    assert!(
        !k.source.contains("step_closes(")
            && !k.source.contains("atomicAdd(reinterpret_cast<float4*>")
    );
    assert!(k.main.smem_bytes <= Isa::Sm90a.max_dynamic_smem());
    assert_eq!(k.main.smem_bytes, cfg.smem_bytes(192, 128, 2));
    // (The staged tile is the step's 48 rows, unpadded.)
    assert!(k.source.contains("#define DQ_ROWS BM") && k.source.contains("#define DQS DQK"));
    let window =
        BackwardConfig::for_variant(&example("sliding_window"), 192, 128, Elem::Bf16, Isa::Sm90a);
    assert!(window.block_m == 32 && window.pairs_steps(), "{window:?}");
    // The tuner's space holds both forms, the 48-query one with the
    // producer only.
    let space = BackwardConfig::space(192, 128, Elem::Bf16, Isa::Sm90a);
    assert!(space.iter().any(|c| c.block_m == 48 && c.warp_specialized));
    assert!(!space.iter().any(|c| c.block_m == 48 && !c.warp_specialized));
    assert!(space.iter().any(|c| c.pairs_steps()));
}

/// The wgmma backward with a warpgroup per 64 keys stores dK and dV 16
/// bytes per lane after a transpose across each quad; the split-key kernels
/// (panels per warpgroup) keep their 4-byte stores.
#[test]
fn wgmma_backward_stores_dk_and_dv_by_quads() {
    let softmax = example("softmax");
    let cfg = BackwardConfig::for_variant(&softmax, 128, 128, Elem::Bf16, Isa::Sm90a);
    let deepseek = example("deepseek");
    let own_keys = BackwardConfig::for_variant(&deepseek, 192, 128, Elem::Bf16, Isa::Sm90a);
    assert!(
        !own_keys.shared_scores && own_keys.split_d == 1,
        "{own_keys:?}"
    );
    for b in [
        parallel_backward(&softmax, 128, 128, &cfg).expect("softmax"),
        parallel_backward(&deepseek, 192, 128, &own_keys).expect("deepseek"),
    ] {
        for text in [
            "quad_transpose(w, t4);",
            "if (row_ok) store16(dk + krow * DQK + ck0 + (4 * q + t4) * 8,",
            "if (row_ok) store16(dv + krow * DV + cv0 + (4 * q + t4) * 8,",
        ] {
            assert!(b.source.contains(text), "{}: {text}", b.main.name);
        }
    }
    let diff = example("diff_transformer");
    let split = BackwardConfig::for_variant(&diff, 128, 256, Elem::Bf16, Isa::Sm90a);
    assert_eq!(split.split_d, 2, "{split:?}");
    let b = parallel_backward(&diff, 128, 256, &split).expect("diff");
    assert!(!b.source.contains("store16(dk"), "{}", b.main.name);
}

/// Every parallel example made a decoding variant (`Sq = 1` on its q, its k
/// and v on `Hkv` heads) generates on the sm_90a tile for 64 or more packed
/// rows per KV head (`ForwardConfig::for_packed_rows`), dense and paged:
/// what a variant's closures need, the `wgmma` decoding kernel has, as the
/// sm_80 one does.
#[test]
fn decoding_forms_of_the_examples_generate_on_the_packed_wgmma_tile() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = Vec::new();
    for (name, _) in examples() {
        let src = std::fs::read_to_string(dir.join(format!("{name}.rs"))).expect("read example");
        let Some(q_line) = src
            .lines()
            .find(|l| l.trim_start().starts_with("q: [B, H, Sq"))
        else {
            continue; // recurrent examples (q over S) and the decoding ones
        };
        if q_line.contains("Sq =") {
            continue;
        }
        let decoding = src
            .replace(q_line, &q_line.replacen("Sq", "Sq = 1", 1))
            .replace("k: [B, H, Skv", "k: [B, Hkv, Skv")
            .replace("v: [B, H, Skv", "v: [B, Hkv, Skv");
        let v = parse_file(&decoding)
            .expect("rust file")
            .into_iter()
            .next()
            .and_then(|inv| inv.variant.ok())
            .unwrap_or_else(|| panic!("{name} as a decoding variant"));
        let (dqk, dv) = dims(&v);
        let base = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        assert!(base.pack_gqa, "{name}: Sq = 1 packs the query heads");
        let tile = base.for_packed_rows(128, dqk, dv, Isa::Sm90a);
        if !tile.wgmma {
            // Head dims the wgmma tile does not take keep the sm_80 tile.
            assert!(
                !dqk.is_multiple_of(64) || !dv.is_multiple_of(64),
                "{name}: {tile:?}"
            );
            continue;
        }
        parallel_forward(&v, dqk, dv, &tile).unwrap_or_else(|e| panic!("{name}: {e}"));
        aec_compiler::parallel_forward_paged(&v, dqk, dv, &tile)
            .unwrap_or_else(|e| panic!("{name}, paged: {e}"));
        checked.push(name);
    }
    assert!(checked.len() >= 10, "{checked:?}");
}

/// Key warpgroups (`key_warps: 2` on wgmma): two warpgroups over the same 64
/// packed rows take the key blocks in turn beside a producer warpgroup, and
/// merge their halves of O through the ring slots of their last blocks. The
/// generator takes them only with the producer, a block per row block, one
/// Dv warpgroup and a ring deeper than the two stages they hold.
#[test]
fn key_warpgroups_need_the_producer_and_a_deep_ring() {
    let v = example("decode");
    let keyed = ForwardConfig {
        block_m: 64,
        block_n: 96,
        warps: 8,
        key_warps: 2,
        stages: 4,
        wgmma: true,
        dv_warps: 1,
        ..ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a).for_packed_rows(
            128,
            128,
            128,
            Isa::Sm90a,
        )
    }
    .with_producer_warpgroup();
    let k = parallel_forward(&v, 128, 128, &keyed).expect("key warpgroups");
    assert!(k.name.ends_with("_ws_s4_k2"), "{}", k.name);
    // Both warpgroups walk every other block, each releasing its own stages
    // (an empty barrier counts one warpgroup), and merge once.
    assert!(k.source.contains("for (int it = kw; it < n_iter;)"));
    assert!(
        k.source
            .contains("mbar_init(smem_at(bar_empty, st), EMPTY_ARRIVALS)")
            && k.source
                .contains("#define EMPTY_ARRIVALS (NWARPS / KEY_WARPS * WARP)")
    );
    assert_eq!(k.source.matches("KEY_MERGE_SYNC();").count(), 1);
    for (what, cfg) in [
        (
            "no producer",
            ForwardConfig {
                warp_specialized: false,
                ..keyed
            },
        ),
        ("two stages", ForwardConfig { stages: 2, ..keyed }),
        ("seven stages", ForwardConfig { stages: 7, ..keyed }),
        (
            "four key warpgroups",
            ForwardConfig {
                key_warps: 4,
                warps: 16,
                ..keyed
            },
        ),
    ] {
        let e = parallel_forward(&v, 128, 128, &cfg)
            .expect_err(what)
            .to_string();
        assert!(
            e.contains("key warp") || e.contains("stages"),
            "{what}: {e}"
        );
    }
}

/// On the wgmma backward of the softmax family the weights P are formed
/// between the Sᵀ GEMM's completion and the dPᵀ GEMM's (`wgmma_wait1`),
/// and dS from P after: the derived dS reads the score only through P.
/// The row sum, provably ≥ 0 (a sum of exponentials), goes into P's
/// exponent: two row constants (the exponent's offset, dO·O) where the joint
/// form reads four. dS of a zeroed weight is zero: one dS loop, no mask test.
/// The mma.sync kernel, shared scores and score closures keep the joint form.
#[test]
fn wgmma_backward_forms_the_weights_while_dp_runs() {
    let weight_first = "            wgmma_wait1();\n            wgmma_fence_operands_n";
    let source = |name: &str, dqk: u32, dv: u32, isa: Isa| -> String {
        let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, isa);
        parallel_backward(&example(name), dqk, dv, &cfg)
            .unwrap_or_else(|e| panic!("{name} {isa:?}: {e}"))
            .source
    };
    for (name, dqk, dv) in [
        ("softmax", 128, 128),
        ("softmax_causal", 128, 128),
        ("softmax_gqa", 128, 128),
        ("deepseek", 192, 128),
        ("sliding_window", 128, 128),
        ("document_mask", 128, 128),
    ] {
        let src = &source(name, dqk, dv, Isa::Sm90a);
        assert!(src.contains(weight_first), "{name}");
        assert!(src.contains("float weight(float s"), "{name}");
        assert!(
            src.contains("grad_of_weight(sacc[t][c], pacc[t][c], rc, P)"),
            "{name}"
        );
        assert_eq!(row_constants(src), 2, "{name}");
        assert!(
            src.contains("__log2f("),
            "{name}: the row sum in the exponent"
        );
        // One dS loop (no `ok` in it).
        assert!(src.contains("hence dS = 0"), "{name}");
        let joint = &source(name, dqk, dv, Isa::Sm80);
        assert!(!joint.contains("float weight(float s"), "{name} sm80");
        assert_eq!(row_constants(joint), 4, "{name} sm80");
        assert_eq!(exponentials(joint), 1, "{name} sm80");
    }
    // Score closures (the weight's backward reads the raw score) and shared
    // scores keep the joint form.
    for (name, dqk, dv) in [
        ("softcap", 128, 128),
        ("alibi", 128, 128),
        ("relative_bias", 128, 128),
        ("diff_transformer", 128, 256),
    ] {
        let src = &source(name, dqk, dv, Isa::Sm90a);
        assert!(!src.contains(weight_first), "{name}");
        assert!(!src.contains("float weight(float s"), "{name}");
        // P and dS share one exponential: the rule that moves a row factor
        // into the exponent runs only for P alone (jointly, dS took a
        // second exponential of its own).
        assert_eq!(exponentials(src), 1, "{name}");
    }
    // Sigmoid has no normalisation: its weight is the score closure's.
    assert!(!source("sigmoid", 128, 128, Isa::Sm90a).contains(weight_first));
}

/// The backward's row constants per query row (`NRC`).
fn row_constants(src: &str) -> usize {
    let line = src
        .lines()
        .find(|l| l.starts_with("#define NRC "))
        .expect("NRC");
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// Exponentials per score in the joint `weight_and_grad`.
fn exponentials(src: &str) -> usize {
    let start = src.find("void weight_and_grad(").expect("weight_and_grad");
    let body = &src[start..start + src[start..].find("\n}\n").expect("end")];
    body.matches("fast_exp2(").count()
}

/// Under a causal mask, a warpgroup skips the leading steps whose key
/// blocks lie past its rows (there are such blocks where they are narrower
/// than the tile: DiffTransformer's 64 keys under 128 rows; with DeepSeek's
/// 128 the count is always 0); not without a mask, nor where the late
/// epilogue holds the last tile's V stage into the next.
#[test]
fn warpgroups_skip_key_blocks_past_their_rows_under_causal_masks() {
    let skips = |name: &str, dqk: u32, dv: u32| {
        let v = example(name);
        let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        let k = parallel_forward(&v, dqk, dv, &cfg).expect("kernel");
        (k.source.contains("const int wg_row0 ="), cfg.late_epilogue)
    };
    assert_eq!(skips("diff_transformer", 128, 256), (true, false));
    assert_eq!(skips("deepseek", 192, 128), (true, false));
    assert_eq!(skips("softmax", 128, 128), (false, false));
    assert_eq!(skips("softmax_causal", 128, 128), (false, true));
}

/// The 192-row tile: three consumer warpgroups on 160 registers beside a
/// producer on 32 (two consumers keep 232 and 40); refused, with what it
/// needs, off the warp-specialised wgmma forward.
#[test]
fn three_consumer_warpgroups_split_the_register_file() {
    let v = example("deepseek");
    let base = ForwardConfig::default_for(&v, 192, 128, Elem::Bf16, Isa::Sm90a);
    let k = parallel_forward(&v, 192, 128, &base).expect("default kernel");
    assert!(
        k.source.contains("setmaxnreg.inc.sync.aligned.u32 232;")
            && k.source.contains("setmaxnreg.dec.sync.aligned.u32 40;")
    );
    let wide = ForwardConfig {
        block_m: 192,
        block_n: 96,
        warps: 12,
        ..base
    };
    let k = parallel_forward(&v, 192, 128, &wide).expect("192-row kernel");
    assert_eq!(k.threads, 512);
    assert!(
        k.source.contains("setmaxnreg.inc.sync.aligned.u32 160;")
            && k.source.contains("setmaxnreg.dec.sync.aligned.u32 32;")
    );
    let err = parallel_forward(
        &v,
        192,
        128,
        &ForwardConfig {
            warp_specialized: false,
            persistent: false,
            tma_loads: false,
            ..wide
        },
    )
    .expect_err("192 rows without a producer warpgroup");
    assert!(
        err.to_string().contains("three consumer warpgroups"),
        "{err}"
    );
}
