//! The sm_90a recurrent forward (templates/cuda/recurrent_fwd_sm90.cu): a
//! state warpgroup and an output warpgroup (which also loads), so that the
//! state's chain of chunks overlaps the chunk GEMMs, all of them on `wgmma`.

use super::dialect::{WARP_SIZE, elem_spelling};
use super::recurrent::{RecurrentConfig, RecurrentSource, forward_args};
use super::wgmma::{Form, wgmma_fns};
use crate::CompileError;
use crate::cxx::closures::{custom_params, recurrent_closures, row_scale_factor, row_scale_fn};
use aec_frontend::Variant;
use aec_frontend::variant::Recurrent;
use askama::Template;

/// Dv columns per block of the wgmma forward: one 128-byte swizzle panel.
const DV_SLICE: u32 = 64;

/// Warps of the wgmma forward: two warpgroups.
const WARPS: u32 = 8;

/// Whether the wgmma forward takes head dim `dk` with Dv slices of
/// `dv_tile`: Dk a whole number of 64-column panels, at most 256 (the state
/// warpgroup holds DK / 64 × 32 f32 registers per thread).
pub fn wgmma_dims_ok(dk: u32, dv_tile: u32) -> bool {
    [64, 128, 256].contains(&dk) && dv_tile == DV_SLICE
}

/// Dynamic shared memory of the wgmma forward: two stages of Q̃, K̃, Ṽ, two
/// staged states, Ṽ decayed, two chunks of the decay's prefix sums and of
/// each row-scale modification's factors, and 1 KiB to align the swizzled
/// panels.
pub fn wgmma_smem_bytes(cfg: &RecurrentConfig, dk: u32, row_scales: u32) -> u32 {
    let c = cfg.chunk;
    let elems = 2 * c * (2 * dk + DV_SLICE) + 2 * dk * DV_SLICE + c * DV_SLICE;
    elems * cfg.elem.bytes() + 2 * c * 4 * (1 + row_scales) + 1024
}

#[derive(Template)]
#[template(path = "cuda/recurrent_fwd_sm90.cu", escape = "none")]
struct RecurrentWgmmaTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: super::dialect::ElemSpelling,
    chunk: u32,
    dk: u32,
    dv: u32,
    warp_size: u32,
    params_fields: &'a str,
    params_init: &'a str,
    custom_args: &'a str,
    regions: &'a str,
    wgmma_fns: &'a str,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    /// modify_q scales rows: `modify_q_row` gives the factor.
    q_row: bool,
    /// modify_v scales rows: `modify_v_row` gives the factor.
    v_row: bool,
    /// Read the per-step values a chunk ahead (they come from custom inputs).
    prefetch_steps: bool,
    decay: bool,
}

/// The wgmma forward of a recurrent variant without normaliser; the caller
/// has checked the variant and the head dims against the `mma.sync`
/// template's rules, this checks its own.
pub(super) fn wgmma_forward(
    variant: &Variant,
    rec: &Recurrent,
    dk: u32,
    dv: u32,
    cfg: &RecurrentConfig,
) -> Result<RecurrentSource, CompileError> {
    if !wgmma_dims_ok(dk, cfg.dv_tile) || !dv.is_multiple_of(DV_SLICE) {
        return Err(CompileError(format!(
            "the wgmma recurrent forward takes Dk 64, 128 or 256 and Dv slices of {DV_SLICE} (Dv a multiple of {DV_SLICE}), not Dk = {dk}, Dv = {dv}, dv_tile = {}; set wgmma: false",
            cfg.dv_tile
        )));
    }
    let kernel_name = format!(
        "aec_rec_fwd_{}_{}_d{dk}x{dv}_c{}w",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.chunk,
    );
    let customs = custom_params(variant.customs.len(), false);
    let mut regions = recurrent_closures(variant);
    let mut row_scale = |m: &Option<aec_frontend::ir::Region>, name: &str| {
        let r = m.as_ref()?;
        let factor = row_scale_factor(r)?;
        regions.push_str(&row_scale_fn(variant, r, name, factor));
        Some(())
    };
    let q_row = row_scale(&rec.modify_q, "modify_q").is_some();
    let v_row = row_scale(&rec.modify_v, "modify_v").is_some();
    let fns = wgmma_fns(
        cfg.elem,
        &[
            (DV_SLICE, Form::Ss),
            (DV_SLICE, Form::SsNMajor),
            (DV_SLICE, Form::SsTransposed),
            (DV_SLICE, Form::RsNMajor),
        ],
    );
    let template = RecurrentWgmmaTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(cfg.elem),
        chunk: cfg.chunk,
        dk,
        dv,
        warp_size: WARP_SIZE,
        params_fields: &customs.fields,
        params_init: &customs.init,
        custom_args: &customs.args,
        regions: &regions,
        wgmma_fns: &fns,
        modify_q: rec.modify_q.is_some(),
        modify_k: rec.modify_k.is_some(),
        modify_v: rec.modify_v.is_some(),
        q_row,
        v_row,
        prefetch_steps: !variant.customs.is_empty(),
        decay: rec.decay.is_some(),
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template: {e}")))?;
    Ok(RecurrentSource {
        name: kernel_name,
        source,
        threads: WARPS * WARP_SIZE,
        smem_bytes: wgmma_smem_bytes(cfg, dk, u32::from(q_row) + u32::from(v_row)),
        args: forward_args(variant, true, false, false),
        dk,
        dv,
        config: *cfg,
        normalized: false,
        wgmma: true,
    })
}
