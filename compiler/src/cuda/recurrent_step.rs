//! The recurrent step kernel for decoding (templates/cuda/recurrent_step.cu):
//! a few steps (usually one) of the recurrence applied to a state in place,
//! without chunks or tensor cores. It is bound by the state's traffic, so it
//! splits the state's columns over blocks and its rows over warps.

use super::dialect::{Elem, WARP_SIZE, elem_spelling};
use super::forward::ArgKind;
use super::recurrent::leading_args;
use crate::CompileError;
use crate::cxx::closures::{
    check_fixed_head_dims, custom_params, recurrent_closures, refuse_indexed_inputs,
};
use aec_frontend::Variant;
use aec_frontend::ir::Axis;
use askama::Template;

/// Warps per block: each holds `Dk / STEP_WARPS` state rows per lane.
pub const STEP_WARPS: u32 = 4;

/// The most state rows one lane holds in registers.
const MAX_ROWS_PER_LANE: u32 = 64;

/// The generated step kernel and what launching it needs.
#[derive(Clone, Debug)]
pub struct RecurrentStepSource {
    pub name: String,
    pub source: String,
    pub threads: u32,
    /// Launch order: q, k, v, o, the custom inputs, `state` (f32
    /// `[B, H, Dk, Dv]`, read and written), for a variant with a normaliser
    /// `norm` (f32 `[B, H, Dk]`, read and written), then the sizes B, H, S.
    pub args: Vec<ArgKind>,
    pub dk: u32,
    pub dv: u32,
    pub elem: Elem,
    pub normalized: bool,
    /// Column slices of 32 per block: 1, or all of Dv for a variant with a
    /// normaliser (one block per head then owns the key sum).
    pub slices_per_block: u32,
}

impl RecurrentStepSource {
    /// The launch grid for sizes B, H: `(Dv / 32 / slices_per_block, H, B)`;
    /// `None` when a dimension exceeds what CUDA launches.
    pub fn grid_for(&self, b: usize, h: usize) -> Option<(u32, u32, u32)> {
        let x = self.dv / WARP_SIZE / self.slices_per_block;
        (h < 65536 && b < 65536).then_some((x, h as u32, b as u32))
    }
}

#[derive(Template)]
#[template(path = "cuda/recurrent_step.cu", escape = "none")]
struct RecurrentStepTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: super::dialect::ElemSpelling,
    dk: u32,
    dv: u32,
    warps: u32,
    warp_size: u32,
    slices: u32,
    params_fields: &'a str,
    params_init: &'a str,
    custom_args: &'a str,
    regions: &'a str,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    decay: bool,
    per_key_decay: bool,
    normalize: bool,
}

/// The step kernel of recurrent `variant` for head dims `dk` (a multiple of
/// 4 up to 256) and `dv` (a multiple of 32 up to 512). Unlike the chunked
/// kernels it takes a decay per key dimension.
pub fn recurrent_step(
    variant: &Variant,
    dk: u32,
    dv: u32,
    elem: Elem,
) -> Result<RecurrentStepSource, CompileError> {
    let rec = variant.recurrent().ok_or_else(|| {
        CompileError(format!(
            "`{}` is a parallel variant; the recurrent step kernel needs a recurrent one",
            variant.name
        ))
    })?;
    check_fixed_head_dims(variant, &[(Axis::Dk, dk), (Axis::Dv, dv)])?;
    if dk == 0 || !dk.is_multiple_of(STEP_WARPS) || dk / STEP_WARPS > MAX_ROWS_PER_LANE {
        return Err(CompileError(format!(
            "head dimension Dk = {dk} is not supported by the recurrent step kernel: it takes a multiple of {STEP_WARPS} up to {}",
            STEP_WARPS * MAX_ROWS_PER_LANE
        )));
    }
    if dv == 0 || !dv.is_multiple_of(WARP_SIZE) || dv > 512 {
        return Err(CompileError(format!(
            "head dimension Dv = {dv} is not supported by the recurrent step kernel: it needs a multiple of {WARP_SIZE} up to 512"
        )));
    }
    refuse_indexed_inputs(variant)?;
    let normalize = rec.normalize.is_some();
    let slices = if normalize { dv / WARP_SIZE } else { 1 };
    let kernel_name = format!(
        "aec_rec_step_{}_{}_d{dk}x{dv}",
        variant.name.to_lowercase(),
        elem.name()
    );
    let customs = custom_params(variant.customs.len(), false);
    let regions = recurrent_closures(variant);
    let template = RecurrentStepTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(elem),
        dk,
        dv,
        warps: STEP_WARPS,
        warp_size: WARP_SIZE,
        slices,
        params_fields: &customs.fields,
        params_init: &customs.init,
        custom_args: &customs.args,
        regions: &regions,
        modify_q: rec.modify_q.is_some(),
        modify_k: rec.modify_k.is_some(),
        modify_v: rec.modify_v.is_some(),
        decay: rec.decay.is_some(),
        per_key_decay: super::recurrent::per_key_decay(rec),
        normalize,
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template: {e}")))?;
    let mut args = leading_args(variant, Some("o"));
    args.push(ArgKind::State("state"));
    if normalize {
        args.push(ArgKind::State("norm"));
    }
    args.extend([Axis::B, Axis::H, Axis::S].map(ArgKind::Size));
    Ok(RecurrentStepSource {
        name: kernel_name,
        source,
        threads: STEP_WARPS * WARP_SIZE,
        args,
        dk,
        dv,
        elem,
        normalized: normalize,
        slices_per_block: slices,
    })
}
