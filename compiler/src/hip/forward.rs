//! The parallel forward for AMD GPUs: `templates/hip/parallel_fwd.hip` filled
//! with the same regions as the CUDA templates ([`crate::cxx::regions`]).

use super::dialect::{Gfx, HipHeader, HipPrelude, MAX_LDS_BYTES, WAVE_SIZE};
use crate::CompileError;
use crate::Elem;
use crate::combine::combine_plan;
use crate::cuda::forward::{
    KernelSource, SplitTile, check_dv_split, combine_chunk_for, combine_rows_for, default_dv_split,
    forward_args,
};
use crate::cxx::closures::{
    CustomParams, MAX_FORWARD_DQK, custom_params, parallel_inputs, reads, row_output_names,
    scores_read_customs_by_position,
};
use crate::cxx::regions::{forward_regions, implies_causal, state_init};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op};
use askama::Template;

/// Tile configuration of the HIP forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct HipForwardConfig {
    /// Query rows per workgroup.
    pub block_m: u32,
    /// Keys per inner-loop step.
    pub block_n: u32,
    /// Wavefronts per workgroup; each owns `block_m / waves` query rows (16
    /// or 32: one or two MFMA tiles sharing every K and V fragment).
    pub waves: u32,
    pub elem: Elem,
    /// Rows are the (query head, position) pairs of the query heads sharing
    /// a KV head (decoding), as in [`crate::ForwardConfig::pack_gqa`].
    pub pack_gqa: bool,
    /// Workgroups per row block, each computing `Dv / dv_split` columns.
    pub dv_split: u32,
    /// Split-KV with the derived combine kernel, as in
    /// [`crate::ForwardConfig::split_kv`].
    pub split_kv: bool,
    /// V is the first Dv columns of K's rows (multi-head latent attention's
    /// cache), as in [`crate::ForwardConfig::v_in_k`]: the caller passes the
    /// one cache as `k` and `v`, and V's rows are read `Dqk` apart. The K
    /// and Vᵀ tiles stay separate in LDS, so the second read of those
    /// columns comes from the cache hierarchy.
    #[serde(default)]
    pub v_in_k: bool,
}

impl HipForwardConfig {
    /// The configuration used when none is tuned: decoding (`Sq ≤ 16` fixed)
    /// gets one wave of 16 packed rows and split-KV; otherwise four waves of
    /// 16 rows each (two 16-row tiles per wave take 292 registers at d128 on
    /// gfx90a, one wave per SIMD; one takes 180, two waves); 64-key blocks
    /// where the K and Vᵀ tiles stay within 32 KiB of LDS (two workgroups per
    /// CU), else 32.
    pub fn default_for(variant: &Variant, dqk: u32, dv: u32, elem: Elem) -> HipForwardConfig {
        let decode = variant
            .fixed_sizes
            .iter()
            .any(|&(a, n)| a == Axis::Sq && n <= 16);
        let dv_split = default_dv_split(dv);
        let slice = dv / dv_split;
        let (block_m, waves, pack_gqa) = if decode {
            (16, 1, true)
        } else {
            (64, 4, false)
        };
        let block_n = if lds_bytes(64, dqk, slice) <= MAX_LDS_BYTES / 2 {
            64
        } else if dqk <= 256 {
            32
        } else {
            // The next block's K rows are prefetched into registers: at Dqk
            // 576 a 32-key block on one wave would take 144 of them.
            16
        };
        HipForwardConfig {
            block_m,
            block_n,
            waves,
            elem,
            pack_gqa,
            dv_split,
            split_kv: decode
                && variant
                    .parallel()
                    .is_some_and(|p| combine_plan(&p.online).is_ok()),
            v_in_k: false,
        }
    }

    /// 16-row MFMA tiles per wave.
    pub fn q_tiles(&self) -> u32 {
        self.block_m / (16 * self.waves)
    }
}

/// LDS of one workgroup: a K tile (rows padded to 16 bytes) and a Vᵀ tile.
pub fn lds_bytes(block_n: u32, dqk: u32, dv_slice: u32) -> u32 {
    2 * (block_n * (dqk + 8) + dv_slice * (block_n + 4))
}

#[derive(Template)]
#[template(path = "hip/parallel_fwd.hip", escape = "none")]
struct HipForwardTemplate<'a> {
    h: HipHeader<'a>,
    bm: u32,
    bn: u32,
    waves: u32,
    q_tiles: u32,
    dqk: u32,
    dv: u32,
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
    split_kv: bool,
    combine_rows: u32,
    combine_chunk: u32,
    v_in_k: bool,
}

/// Generates the HIP parallel forward of `variant` for head dims `dqk`, `dv`
/// and architecture `gfx`, rendered with `prelude` (the real target, or the
/// CPU emulation used by the tests).
pub fn hip_parallel_forward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &HipForwardConfig,
    gfx: Gfx,
    prelude: HipPrelude,
) -> Result<KernelSource, CompileError> {
    // A uniform Q scale is applied to the scores instead (`q_scale`).
    let folded = crate::q_scale::fold_q_scale(variant, dqk, dv);
    let variant = folded.as_ref().unwrap_or(variant);
    let par = parallel_inputs(variant, dqk, dv, "forward", MAX_FORWARD_DQK)?;
    check_config(cfg, dqk, dv)?;
    let dv_total = dv;
    let dv = dv_total / cfg.dv_split;
    let online = &par.online;
    let nstate = online.state.len();
    let nscales = online.scales.len();
    // (The HIP template keeps the variant's own update: no held maxima.)
    let regions = forward_regions(variant, cfg.split_kv, false)?;
    let CustomParams {
        fields: params_fields,
        args: custom_args,
        init: params_init,
    } = custom_params(variant.customs.len(), false);
    let kernel_name = format!(
        "aec_fwd_{}_{}_d{dqk}x{dv_total}_m{}n{}w{}{}{}{}_{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.block_m,
        cfg.block_n,
        cfg.waves,
        if cfg.pack_gqa { "_gqa" } else { "" },
        if cfg.dv_split > 1 {
            format!("_v{}", cfg.dv_split)
        } else {
            String::new()
        },
        if cfg.v_in_k { "_vk" } else { "" },
        gfx.name(),
    );
    let t = HipForwardTemplate {
        h: HipHeader::new(&variant.name, &kernel_name, cfg.elem, gfx, prelude),
        bm: cfg.block_m,
        bn: cfg.block_n,
        waves: cfg.waves,
        q_tiles: cfg.q_tiles(),
        dqk,
        dv,
        dv_total,
        dv_split: cfg.dv_split,
        nstate,
        nstate_arr: nstate.max(1),
        nscales,
        nscales_arr: nscales.max(1),
        params_fields,
        custom_args,
        params_init,
        state_init: state_init(online),
        causal: par.mask.as_ref().is_some_and(implies_causal),
        packed: cfg.pack_gqa,
        mask_reads_head: reads(par.mask.as_ref(), |op| *op == Op::Index(Axis::H)),
        regions,
        modify_q: par.modify_q.is_some(),
        modify_k: par.modify_k.is_some(),
        modify_v: par.modify_v.is_some(),
        modify_scores: par.modify_scores.is_some(),
        mask: par.mask.is_some(),
        clamp: scores_read_customs_by_position(variant),
        split_kv: cfg.split_kv,
        combine_rows: combine_rows_for(dv_total),
        combine_chunk: combine_chunk_for(dv_total),
        v_in_k: cfg.v_in_k,
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;
    let args = forward_args(variant, cfg.split_kv);
    // One key block ahead: the next block's K rows are prefetched into
    // registers while this one is computed.
    let split_tile = SplitTile {
        block_m: cfg.block_m,
        block_n: cfg.block_n,
        stages: 2,
        dqk,
        dv_slice: dv,
        v_in_k: cfg.v_in_k,
        elem_bytes: cfg.elem.bytes(),
    };
    Ok(KernelSource {
        tensor_maps: Vec::new(),
        combine: cfg.split_kv.then(|| format!("{kernel_name}_combine")),
        split_kv: cfg.split_kv,
        name: kernel_name,
        source,
        threads: cfg.waves * WAVE_SIZE,
        block_m: cfg.block_m,
        // Static LDS only (see `lds_bytes`): nothing to pass at launch.
        smem_bytes: 0,
        args,
        row_outputs: row_output_names(online),
        packed_gqa: cfg.pack_gqa,
        dv_split: cfg.dv_split,
        elem: cfg.elem,
        persistent: false,
        dqk,
        dv: dv_total,
        block_n: cfg.block_n,
        kv_bytes_in_flight: split_tile.kv_bytes_in_flight(),
        split_fixed_work: split_tile.split_fixed_work(),
        split_state_words: nstate as u32 + 1,
        v_in_k: cfg.v_in_k,
        tile_schedule: false,
        cluster_pairs: false,
    })
}

pub(crate) fn check_config(
    cfg: &HipForwardConfig,
    dqk: u32,
    dv_total: u32,
) -> Result<(), CompileError> {
    let split = cfg.dv_split;
    check_dv_split(split, dv_total)?;
    if cfg.v_in_k && dv_total > dqk {
        return Err(CompileError(format!(
            "v_in_k (V stored in the first Dv columns of K's rows) needs Dv <= Dqk; got Dqk {dqk}, Dv {dv_total}"
        )));
    }
    if !matches!(cfg.block_m, 16 | 32 | 64 | 128)
        || !matches!(cfg.block_n, 16 | 32 | 64 | 128)
        || cfg.waves == 0
        || !cfg.block_m.is_multiple_of(cfg.waves)
        || !matches!(cfg.block_m / cfg.waves, 16 | 32)
    {
        return Err(CompileError(format!(
            "HIP tile {}x{} with {} waves is not supported: block_m must be 16, 32, 64 or 128, block_n 16, 32, 64 or 128, and each wave must own 16 or 32 rows",
            cfg.block_m, cfg.block_n, cfg.waves
        )));
    }
    let lds = lds_bytes(cfg.block_n, dqk, dv_total / split);
    if lds > MAX_LDS_BYTES {
        return Err(CompileError(format!(
            "HIP tile {}x{} needs {lds} bytes of LDS for Dqk {dqk} and a Dv slice of {}; a workgroup has {MAX_LDS_BYTES}: use a smaller block_n",
            cfg.block_m,
            cfg.block_n,
            dv_total / split
        )));
    }
    Ok(())
}
