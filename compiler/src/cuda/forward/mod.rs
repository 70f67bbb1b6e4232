//! The parallel forward kernel: the template's fixed skeleton (tiles, copies,
//! `mma.sync`, the online loop) filled with a variant's regions.

use super::dialect::{Elem, ElemSpelling, Isa, WARP_SIZE, elem_spelling};
use super::wgmma::{Form, MAX_N, PANEL_COLS, wgmma_fns};
use crate::CompileError;
use crate::combine::combine_plan;
use crate::cxx::closures::{
    CustomParams, MAX_FORWARD_DQK, custom_params, parallel_inputs, reads, row_output_names,
    scores_read_customs_by_position,
};
use crate::cxx::regions::{forward_regions, implies_causal, is_causal, state_init};
use crate::launch_plan::SizeExpr;
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op};
use askama::Template;

mod config;
mod source;
mod split_kv;

pub use config::*;
pub use source::*;
pub use split_kv::*;

/// The forward template and the preludes it includes, as text: their digest
/// is part of tuning keys, so a changed template never reuses old results.
pub const TEMPLATE_TEXT: &str = concat!(
    include_str!("../../../../templates/cuda/parallel_fwd.cu"),
    include_str!("../../../../templates/cuda/parallel_types.cu"),
    include_str!("../../../../templates/cuda/prelude.cu"),
    include_str!("../../../../templates/cuda/prelude_sm90.cu"),
    include_str!("../../../../templates/cuda/tile_layout.cu"),
    include_str!("../../../../templates/cuda/kv_multicast.cu"),
);

/// The largest Dv one block computes: a warp's 16-row accumulator tile of
/// 256 columns takes 128 registers per thread.
pub const MAX_DV_SLICE: u32 = 256;

/// The fewest slices (1, 2 or 4) of at most [`MAX_DV_SLICE`] columns, each a
/// multiple of 16, that `dv` splits into evenly; 1 if none.
pub fn default_dv_split(dv: u32) -> u32 {
    [1, 2, 4]
        .into_iter()
        .find(|&n| dv.is_multiple_of(n) && dv / n <= MAX_DV_SLICE && (dv / n).is_multiple_of(16))
        .unwrap_or(1)
}

/// Shared memory the driver reserves per resident block (sm_80 and later).
pub const SMEM_RESERVED_PER_BLOCK: u32 = 1024;

#[derive(Template)]
#[template(path = "cuda/parallel_fwd.cu", escape = "none")]
struct ForwardTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: ElemSpelling,
    bm: u32,
    bn: u32,
    warps: u32,
    /// Warps splitting each key block (see [`ForwardConfig::key_warps`]).
    key_warps: u32,
    /// The sm_80 tiles' XOR rows (see [`xor_rows`]).
    xor_rows: bool,
    /// Warps splitting Dv (see [`ForwardConfig::dv_warps`]).
    dv_warps: u32,
    /// Dv warpgroups hand P over ([`shares_p`]).
    share_p: bool,
    /// ... each loading the panels it reads again, without a block-wide
    /// barrier per step ([`warpgroup_loads`]).
    wg_loads: bool,
    m_tiles: u32,
    warp_size: u32,
    dqk: u32,
    dv: u32,
    /// O columns of one warp (with Dv warps, their share of `dv`).
    dvw: u32,
    dv_total: u32,
    dv_split: u32,
    nstate: usize,
    nstate_arr: usize,
    nscales: usize,
    nscales_arr: usize,
    params_fields: String,
    custom_args: String,
    params_init: String,
    state_init: String,
    causal: bool,
    packed: bool,
    mask_reads_head: bool,
    regions: String,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    modify_scores: bool,
    mask: bool,
    clamp: bool,
    wgmma: bool,
    ws: bool,
    persistent: bool,
    stages: u32,
    /// A tile's epilogue runs under the next tile's first S GEMM.
    late_epilogue: bool,
    q_regs: bool,
    /// `setmaxnreg` budgets of the producer and consumer warpgroups
    /// ([`register_split`]).
    producer_regs: u32,
    consumer_regs: u32,
    /// Consumer warpgroups skip the leading steps whose key blocks lie past
    /// their rows under a causal mask (BN < BM leaves such blocks).
    wg_skip: bool,
    split_kv: bool,
    fused_combine: bool,
    /// A packed variable-length batch (`cu_q`, `cu_k`).
    varlen: bool,
    /// K and V in a paged cache (`block_table`, `seqlens_k`).
    paged: bool,
    /// Key blocks from a block-sparse mask's lists.
    sparse: bool,
    /// A persistent block-sparse kernel: tiles come from a ticket counter in
    /// the order `tile_order` gives.
    scheduled: bool,
    /// The producer copies Q, K and V with TMA (tensor maps as parameters).
    tma: bool,
    /// K and V of a TMA ring's stage on barriers of their own (two stages).
    kv_bars: bool,
    /// Clusters of two CTAs sharing K/V blocks by TMA multicast.
    kv_multicast: bool,
    /// V read from the K tiles (shared K/V storage).
    v_in_k: bool,
    /// O is written 16 bytes per lane after a transpose across each quad
    /// (see the template's epilogue).
    quad_stores: bool,
    combine_rows: u32,
    combine_chunk: u32,
    /// Splits the combine in the main kernel loads at once (`fused_chunk_for`).
    fused_chunk: u32,
    wgmma_fns: String,
}

/// The `setmaxnreg` budgets (producer, consumer) of a warp-specialised
/// forward with `consumers` computing warpgroups beside the producer, in a
/// 64K-register file of which the CTA, alone on its SM, holds all: two
/// consumers get 232 (with the producer's 40: 64,512), three 160 (with 32:
/// 65,536, as FlashAttention-3's three-warpgroup tiles).
fn register_split(consumers: u32) -> (u32, u32) {
    if consumers >= 3 { (32, 160) } else { (40, 232) }
}

/// Generates the parallel forward kernel of `variant` for head dims `dqk`, `dv`.
pub fn parallel_forward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    generate_forward(variant, dqk, dv, cfg, RowLayout::Dense)
}

/// Generates the parallel forward of `variant` for a packed batch of
/// sequences of different lengths: q is `[1, H, Tq, Dqk]`, k and v `[1,
/// Hkv, Tk, …]` with the sequences one after another, the kernel takes the
/// boundaries `cu_seqlens_q` and `cu_seqlens_k` (`[N + 1]` each) after the
/// sizes, and `B` is `N`, `Sq` and `Skv` the longest sequence's lengths
/// (they size the grid, [`KernelSource::launch_grid`]). Each sequence
/// gives what a call with `B = 1` and its own lengths gives: the closures
/// see `b = 0`, `B = 1` and the sequence's `Sq`, `Skv` and positions.
///
/// The tile configuration is `cfg` with its decoding forms taken out: rows
/// do not pack query heads (a head's rows are not contiguous across
/// sequences) and there are no KV splits; a packed 16-row decoding tile
/// stays 16 rows on one warp.
pub fn parallel_forward_varlen(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    let cfg = ForwardConfig {
        pack_gqa: false,
        split_kv: false,
        fused_combine: false,
        ..*cfg
    };
    generate_forward(variant, dqk, dv, &cfg, RowLayout::Varlen)
}

/// Generates the parallel forward of `variant` over a paged KV cache: q is
/// `[B, H, Sq, Dqk]` as usual, k and v are caches of pages of `2^page_shift`
/// rows, `[pages, Hkv, 2^page_shift, D]`; sequence `b`'s keys are rows `0 …
/// seqlens_k[b] − 1` of the pages `block_table[b][0], block_table[b][1], …`
/// (arguments after the sizes, [`ArgKind::PagedKv`]), and `Skv` is the
/// longest sequence's key count (it sizes the KV splits). The closures see
/// each sequence's own `Skv`. Every tile configuration works, decoding's
/// packed heads and KV splits included; the page size is a launch argument
/// (any power of two).
pub fn parallel_forward_paged(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    generate_forward(variant, dqk, dv, cfg, RowLayout::Paged)
}

/// Generates the parallel forward of `variant` under a block-sparse mask
/// (FlexAttention's `BlockMask`, arguments [`ArgKind::BlockMask`] after the
/// sizes): rows and tensors are dense, and each row block visits only the
/// key blocks its mask row lists — the partial ones, where the variant's
/// mask (if any) decides per score, then the full ones, where every key in
/// bounds is seen and the mask is not evaluated. One head per row block:
/// packed GQA rows and KV splits (the decoding tiles) are refused.
pub fn parallel_forward_block_sparse(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    if cfg.pack_gqa || cfg.split_kv {
        return Err(CompileError(
            "a block-sparse mask needs one head per row block and no KV splits: set pack_gqa \
             and split_kv to false (the decoding tiles set them)"
                .into(),
        ));
    }
    generate_forward(variant, dqk, dv, cfg, RowLayout::BlockSparse)
}

fn generate_forward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
    layout: RowLayout,
) -> Result<KernelSource, CompileError> {
    let varlen = layout == RowLayout::Varlen;
    // A uniform Q scale is applied to the scores instead (`q_scale`).
    let folded = crate::q_scale::fold_q_scale(variant, dqk, dv);
    let variant = folded.as_ref().unwrap_or(variant);
    let par = parallel_inputs(variant, dqk, dv, "forward", MAX_FORWARD_DQK)?;
    check_config(cfg, dqk, dv)?;
    // From here on `dv` is the slice one block computes, `dvw` one (Dv)
    // warp's or warpgroup's share of it.
    let dv_total = dv;
    let dv = cfg.dv_slice(dv_total);
    let dvw = dv / cfg.dv_warps.max(1);
    if cfg.v_in_k && (par.modify_k.is_some() || par.modify_v.is_some()) {
        return Err(CompileError(format!(
            "`{}` modifies k or v in shared memory, but with v_in_k they are one tile (V is the first Dv columns of K): modifying one would change the other; use separate k and v (v_in_k: false)",
            variant.name
        )));
    }
    if cfg.warp_specialized && cfg.dv_warps > 1 && par.modify_q.is_some() {
        return Err(CompileError(format!(
            "`{}` modifies q in shared memory, which the warp-specialised forward does per warpgroup: with Dv warps two warpgroups share the rows; use dv_warps: 1 or warp_specialized: false",
            variant.name
        )));
    }
    if cfg.warp_specialized && (par.modify_k.is_some() || par.modify_v.is_some()) {
        return Err(CompileError(format!(
            "`{}` modifies k or v in shared memory, which the warp-specialised forward cannot do; use warp_specialized: false",
            variant.name
        )));
    }
    let online = &par.online;
    let nstate = online.state.len();
    // The row maxima are held where a warpgroup has enough O columns for
    // the skipped rescales to pay, and no key warps merge partial rows in
    // the kernel (split-KV's partial rows leave the held form as written).
    let hold_row_max = cfg.wgmma && dvw >= HELD_MAX_MIN_O_COLUMNS && cfg.key_warps <= 1;
    // (With held maxima the hand-over also carries them: at most one a
    // state field.)
    let held_words = if hold_row_max { nstate as u32 } else { 0 };
    if shares_p(cfg) && 2 * (nstate.max(1) as u32 + 1 + held_words) > p_exchange_words(cfg) {
        return Err(CompileError(format!(
            "`{}`: Dv warpgroups hand the row state over through {} words per thread, too few for {nstate} state values per row; use dv_warps: 1",
            variant.name,
            p_exchange_words(cfg)
        )));
    }
    let nscales = online.scales.len();
    let tile_schedule = cfg.persistent && layout == RowLayout::BlockSparse;
    // TMA boxes address rows of one head's dense matrix: the other layouts
    // (sequences packed into one matrix, pages, block lists) keep cp.async.
    let tma = cfg.tma_loads
        && cfg.warp_specialized
        && layout == RowLayout::Dense
        && !cfg.pack_gqa
        && !cfg.v_in_k;
    let late_epilogue = cfg.late_epilogue && tma && cfg.persistent;
    let causal = par.mask.as_ref().is_some_and(implies_causal);
    // The cluster pair's K/V multicast: the pairs' key walks line up only
    // without a mask or under the plain causal one, whose extra diagonal
    // blocks are whole key blocks where BN divides BM.
    let kv_multicast = cfg.kv_multicast
        && tma
        && cfg.persistent
        && cfg.dv_split == 1
        && cfg.key_warps == 1
        && par.mask.as_ref().is_none_or(is_causal)
        && (!causal || cfg.block_m.is_multiple_of(cfg.block_n));
    if cfg.key_warps > 1 {
        combine_plan(online).map_err(|e| {
            CompileError(format!(
                "key_warps {} merges the key warps' partial rows with the split-KV combine, which `{}` lacks: {e}",
                cfg.key_warps, variant.name
            ))
        })?;
        let scratch = key_warp_scratch_bytes(cfg, dv, nstate);
        let ring = ring_bytes(cfg, dqk, dv);
        if scratch > ring {
            return Err(CompileError(format!(
                "key_warps {}: the key warps' partial rows ({scratch} bytes) do not fit the K/V ring they reuse ({ring} bytes); use fewer key warps or more stages",
                cfg.key_warps
            )));
        }
    }
    let regions = forward_regions(variant, cfg.split_kv || cfg.key_warps > 1, hold_row_max)?;

    let CustomParams {
        fields: params_fields,
        args: custom_args,
        init: params_init,
    } = custom_params(variant.customs.len(), false);
    let state_init = state_init(online);
    let (producer_regs, consumer_regs) = register_split(cfg.warps / 4);
    let kernel_name = format!(
        "aec_fwd_{}_{}_d{dqk}x{dv_total}_m{}n{}w{}{}{}{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.block_m,
        cfg.block_n,
        cfg.warps,
        match (cfg.pack_gqa, cfg.wgmma) {
            (true, true) if cfg.warp_specialized => "_gqa_wgmma_ws",
            (true, true) => "_gqa_wgmma",
            (true, false) => "_gqa",
            (false, true) if cfg.q_in_registers => "_wgmma_ws_rq",
            (false, true) if cfg.warp_specialized => "_wgmma_ws",
            (false, true) => "_wgmma",
            (false, false) => "",
        },
        if cfg.persistent { "_p" } else { "" },
        if cfg.stages == 2 {
            String::new()
        } else {
            format!("_s{}", cfg.stages)
        }
    ) + &if cfg.key_warps > 1 {
        format!("_k{}", cfg.key_warps)
    } else {
        String::new()
    } + &if cfg.dv_warps > 1 {
        format!("_dw{}", cfg.dv_warps)
    } else {
        String::new()
    } + if cfg.fused_combine { "_fc" } else { "" }
        + &if cfg.dv_split > 1 {
            format!("_v{}", cfg.dv_split)
        } else {
            String::new()
        }
        + if cfg.v_in_k { "_vk" } else { "" }
        + if tma { "_tma" } else { "" }
        + if late_epilogue { "_le" } else { "" }
        + if kv_multicast { "_mc" } else { "" }
        + match layout {
            RowLayout::Dense => "",
            RowLayout::Varlen => "_varlen",
            RowLayout::Paged => "_paged",
            RowLayout::BlockSparse => "_sparse",
        };
    let t = ForwardTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(cfg.elem),
        bm: cfg.block_m,
        bn: cfg.block_n,
        warps: cfg.warps(),
        key_warps: cfg.key_warps,
        dv_warps: cfg.dv_warps,
        share_p: shares_p(cfg),
        wg_loads: warpgroup_loads(cfg, par.modify_k.is_some() || par.modify_v.is_some()),
        m_tiles: cfg.m_tiles(),
        warp_size: WARP_SIZE,
        dqk,
        dv,
        dvw,
        dv_total,
        dv_split: cfg.dv_split,
        nstate,
        nstate_arr: nstate.max(1),
        nscales,
        nscales_arr: nscales.max(1),
        params_fields,
        custom_args,
        params_init,
        state_init,
        causal,
        packed: cfg.pack_gqa,
        mask_reads_head: reads(par.mask.as_ref(), |op| *op == Op::Index(Axis::H)),
        regions,
        modify_q: par.modify_q.is_some(),
        modify_k: par.modify_k.is_some(),
        modify_v: par.modify_v.is_some(),
        modify_scores: par.modify_scores.is_some(),
        mask: par.mask.is_some(),
        clamp: scores_read_customs_by_position(variant),
        wgmma: cfg.wgmma,
        ws: cfg.warp_specialized,
        persistent: cfg.persistent,
        stages: cfg.stages,
        late_epilogue,
        q_regs: cfg.q_in_registers,
        producer_regs,
        consumer_regs,
        // (Not with the late epilogue: a warpgroup holds the last tile's V
        // stage into the next tile's first computed block, and skipping two
        // blocks of a two-stage ring would wait for that stage's reload.)
        wg_skip: cfg.wgmma
            && cfg.warp_specialized
            && cfg.key_warps == 1
            && !cfg.pack_gqa
            && !late_epilogue
            && !kv_multicast
            && layout != RowLayout::BlockSparse
            && par.mask.as_ref().is_some_and(implies_causal),
        split_kv: cfg.split_kv,
        fused_combine: cfg.fused_combine,
        varlen,
        paged: layout == RowLayout::Paged,
        sparse: layout == RowLayout::BlockSparse,
        scheduled: tile_schedule,
        tma,
        // (Measured faster with two stages only: bench/NOTES.md session 44.)
        kv_bars: tma && cfg.stages == 2,
        kv_multicast,
        v_in_k: cfg.v_in_k,
        xor_rows: xor_rows(cfg, dv),
        // The transpose keeps a few more values live in the epilogue: at
        // Dqk <= 128 it made the forward 1.5-9% faster (H100: softmax,
        // causal, DiffTransformer), at Dqk 192 with Dv 128 (DeepSeek) 4%
        // (H200: the epilogue 1.02 -> 0.48 us a tile), at Dqk = 256 (RetNet,
        // Dv 512) it moved spills into the main loop and cost 6%
        // (bench/NOTES.md sessions 16 and 61).
        quad_stores: dqk <= 128 || dv_total <= 128,
        combine_rows: combine_rows_for(dv_total),
        combine_chunk: combine_chunk_for(dv_total),
        fused_chunk: fused_chunk_for(cfg, dv_total),
        wgmma_fns: if cfg.wgmma {
            wgmma_fns(
                cfg.elem,
                &[
                    // S = Q·Kᵀ with Q from shared memory or from registers.
                    if cfg.q_in_registers {
                        (cfg.block_n, Form::RsKMajor)
                    } else {
                        (cfg.block_n, Form::Ss)
                    },
                    (dvw, Form::RsNMajor),
                ],
            )
        } else {
            String::new()
        },
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;
    let mut args = forward_args_with(variant, cfg.split_kv, layout);
    if cfg.fused_combine {
        // The template takes the row blocks' counters after n_splits.
        let at = args
            .iter()
            .position(|a| *a == ArgKind::KvSplits)
            .map_or(args.len(), |i| i + 1);
        args.insert(at, ArgKind::Workspace("split_count"));
    }
    if tile_schedule {
        args.extend(TILE_SCHEDULE_ARGS);
    }
    let tensor_maps = if tma {
        tma_maps(cfg, dqk, dv, dv_total)
    } else {
        Vec::new()
    };
    args.extend(tensor_maps.iter().map(|m| ArgKind::TensorMap(m.tensor)));
    let row_outputs = row_output_names(online);
    let split_tile = SplitTile {
        block_m: cfg.block_m,
        block_n: cfg.block_n,
        stages: cfg.stages,
        dqk,
        dv_slice: dv,
        v_in_k: cfg.v_in_k,
        elem_bytes: cfg.elem.bytes(),
    };
    Ok(KernelSource {
        combine: (cfg.split_kv && !cfg.fused_combine).then(|| format!("{kernel_name}_combine")),
        split_kv: cfg.split_kv,
        name: kernel_name,
        source,
        threads: (cfg.warps() + if cfg.warp_specialized { 4 } else { 0 }) * WARP_SIZE,
        block_m: cfg.block_m,
        smem_bytes: smem_bytes(cfg, dqk, dv),
        args,
        row_outputs,
        packed_gqa: cfg.pack_gqa,
        dv_split: cfg.dv_split,
        elem: cfg.elem,
        persistent: cfg.persistent,
        dqk,
        dv: dv_total,
        block_n: cfg.block_n,
        kv_bytes_in_flight: split_tile.kv_bytes_in_flight(),
        split_fixed_work: split_tile.split_fixed_work(),
        split_state_words: nstate as u32 + 1,
        v_in_k: cfg.v_in_k,
        tile_schedule,
        cluster_pairs: kv_multicast,
        tensor_maps,
    })
}

/// The tensor maps of a dense forward with TMA loads: Q's boxes are a row
/// block's `block_m` rows, K's and V's a key block's `block_n`, each 64
/// columns wide (a Dv slice starts at a multiple of 64 columns of the whole
/// Dv).
fn tma_maps(cfg: &ForwardConfig, dqk: u32, dv_slice: u32, dv_total: u32) -> Vec<TensorMapSpec> {
    debug_assert!(dqk.is_multiple_of(64) && dv_slice.is_multiple_of(64));
    vec![
        TensorMapSpec::dense("q", dqk, "Sq", "H", cfg.block_m),
        TensorMapSpec::dense("k", dqk, "Skv", "Hkv", cfg.block_n),
        TensorMapSpec::dense("v", dv_total, "Skv", "Hkv", cfg.block_n),
    ]
}

/// The instruction set whose default tiles a forward takes on `isa`: shared
/// K/V storage (`v_in_k`) is refused by the warp-specialised prefill
/// kernel, so its kernels start from the sm_80 tiles on every GPU (on
/// sm_90a, [`ForwardConfig::for_packed_rows`] then takes `wgmma` where a KV
/// head has 64 or more query rows).
pub fn forward_default_isa(isa: Isa, v_in_k: bool) -> Isa {
    if v_in_k { Isa::Sm80 } else { isa }
}

/// The untuned forward configuration on `isa`: `default` (a dense, varlen…
/// rule such as [`ForwardConfig::default_for`]) on the instruction set whose
/// tiles the forward takes, then, with shared K/V storage,
/// [`ForwardConfig::with_v_in_k`]. The runtime, `aec compile` and the
/// benchmark all build it here.
pub fn untuned_forward_config(
    default: fn(&Variant, u32, u32, Elem, Isa) -> ForwardConfig,
    variant: &Variant,
    dqk: u32,
    dv: u32,
    elem: Elem,
    isa: Isa,
    v_in_k: bool,
) -> ForwardConfig {
    let isa = forward_default_isa(isa, v_in_k);
    let cfg = default(variant, dqk, dv, elem, isa);
    if v_in_k {
        cfg.with_v_in_k(dqk, dv, isa)
    } else {
        cfg
    }
}
