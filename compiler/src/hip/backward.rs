//! The parallel backward for AMD GPUs: `templates/hip/parallel_bwd.hip` filled
//! with the same regions as the CUDA backward ([`crate::cxx::regions`]).

use super::dialect::{Gfx, HipHeader, HipPrelude, MAX_LDS_BYTES, WAVE_SIZE};
use crate::cuda::backward::{Grid, Launch, backward_args};
use crate::cuda::forward::ArgKind;
use crate::cxx::closures::{
    CustomParams, MAX_DQK, custom_params, parallel_inputs, reads, row_output_names,
    scores_read_customs_by_position,
};
use crate::cxx::regions::{BackwardRegions, backward_regions, implies_causal};
use crate::{CompileError, Elem};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op};
use askama::Template;

/// The largest Dv a wave of the HIP backward holds whole: dV (Dv/4 registers
/// per lane) and its V fragments (Dv/8) for 16 keys; at 512 that spills, so
/// above it waves split the columns ([`HipBackwardConfig::split_d`]).
pub const MAX_WAVE_DV: u32 = 256;

/// The largest Dv of the HIP backward: [`MAX_WAVE_DV`] per wave, two waves
/// sharing each 16 keys.
pub const MAX_BACKWARD_DV: u32 = 2 * MAX_WAVE_DV;

/// Tile configuration of the HIP backward's main kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HipBackwardConfig {
    /// Query rows per step of the loop over query blocks (16, 32 or 64).
    pub block_m: u32,
    /// Wavefronts per workgroup: 16 keys per `split_d` of them.
    pub waves: u32,
    pub elem: Elem,
    /// Waves that share 16 keys (1 or 2): each recomputes their scores,
    /// computes dP over its slice of Dv (the slices' sums exchanged through
    /// LDS) and accumulates its slice of the dK and dV columns. 2 where Dv
    /// is above [`MAX_WAVE_DV`].
    pub split_d: u32,
}

impl HipBackwardConfig {
    /// 32 query rows per step (16 where Dv is split between waves, whose dO
    /// rows are twice as long) and the most waves (4, 2 or 1: 64, 32 or 16
    /// keys per workgroup, halved by a split) whose tiles fit in a
    /// workgroup's LDS.
    pub fn default_for(dqk: u32, dv: u32, elem: Elem) -> HipBackwardConfig {
        let split_d = if dv > MAX_WAVE_DV { 2 } else { 1 };
        let block_m = if split_d > 1 { 16 } else { 32 };
        let waves = [4, 2, 1]
            .into_iter()
            .filter(|&w| w >= split_d)
            .find(|&w| backward_lds_bytes(block_m, w, split_d, dqk, dv, 4) <= MAX_LDS_BYTES)
            .unwrap_or(split_d);
        HipBackwardConfig {
            block_m,
            waves,
            elem,
            split_d,
        }
    }

    /// Keys per workgroup.
    pub fn block_n(&self) -> u32 {
        16 * self.waves / self.split_d.max(1)
    }
}

/// LDS of the main kernel: K (all keys), Q and dO (one query block), dS, the
/// row constants (`nrc` per query row) and, where `split_d` waves share
/// keys, every wave's partial dP.
pub fn backward_lds_bytes(
    block_m: u32,
    waves: u32,
    split_d: u32,
    dqk: u32,
    dv: u32,
    nrc: u32,
) -> u32 {
    let bn = 16 * waves / split_d.max(1);
    let partial_dp = if split_d > 1 {
        4 * waves * block_m * 16
    } else {
        0
    };
    2 * (bn * (dqk + 8) + block_m * (dqk + 8) + block_m * (dv + 8) + block_m * (bn + 4))
        + 4 * nrc.max(1) * block_m
        + partial_dp
}

/// The generated HIP backward and how to launch its three kernels (the
/// argument list and workspaces are the CUDA backward's).
#[derive(Clone, Debug)]
pub struct HipBackwardSource {
    pub source: String,
    pub args: Vec<ArgKind>,
    pub pre: Launch,
    pub main: Launch,
    pub post: Launch,
    pub dqk: u32,
    pub dv: u32,
    pub row_outputs: Vec<String>,
    pub config: HipBackwardConfig,
    /// As [`BackwardSource::modifies_q`](crate::BackwardSource::modifies_q).
    pub modifies_q: bool,
}

impl HipBackwardSource {
    /// What the launch plan takes from these kernels (no tensor maps: the
    /// HIP kernels load through their own loops).
    pub fn kernels(&self) -> crate::launch_plan::BackwardKernels<'_> {
        crate::launch_plan::BackwardKernels {
            launches: [&self.pre, &self.main, &self.post],
            args: &self.args,
            tensor_maps: &[],
            row_outputs: &self.row_outputs,
            modifies_q: self.modifies_q,
        }
    }
}

#[derive(Template)]
#[template(path = "hip/parallel_bwd.hip", escape = "none")]
struct HipBackwardTemplate<'a> {
    h: HipHeader<'a>,
    bm: u32,
    waves: u32,
    split_d: u32,
    dqk: u32,
    dv: u32,
    nstate: usize,
    nscales: usize,
    nstat: usize,
    nstat_arr: usize,
    nrc: usize,
    nrc_arr: usize,
    params_fields: String,
    custom_args: String,
    params_init: String,
    causal: bool,
    mask_trim: bool,
    regions: String,
    grad_decl: String,
    grad_accum: String,
    grad_flush: String,
    grad_k: String,
    grad_v: String,
    grad_q: String,
    uses_dot: bool,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    modify_scores: bool,
    mask: bool,
    clamp: bool,
}

/// Generates the HIP backward kernels of `variant` for head dims `dqk`, `dv`.
pub fn hip_parallel_backward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &HipBackwardConfig,
    gfx: Gfx,
    prelude: HipPrelude,
) -> Result<HipBackwardSource, CompileError> {
    // A uniform Q scale is applied to the scores instead (`q_scale`).
    let folded = crate::q_scale::backward_variant(variant, dqk, dv, true);
    let variant = folded.as_ref().unwrap_or(variant);
    let par = parallel_inputs(variant, dqk, dv, "backward", MAX_DQK)?;
    if dv > MAX_BACKWARD_DV {
        return Err(CompileError(format!(
            "the HIP backward takes Dv up to {MAX_BACKWARD_DV}, got {dv}: a wave keeps its keys' dV and V slice in registers, up to {MAX_WAVE_DV} columns, and at most two waves share keys"
        )));
    }
    if !matches!(cfg.block_m, 16 | 32 | 64)
        || !matches!(cfg.waves, 1 | 2 | 4 | 8)
        || !matches!(cfg.split_d, 1 | 2)
        || !cfg.waves.is_multiple_of(cfg.split_d)
    {
        return Err(CompileError(format!(
            "HIP backward tile block_m {} with {} waves, {} per 16 keys, is not supported: block_m must be 16, 32 or 64, waves 1, 2, 4 or 8, and split_d 1 or 2 dividing the waves",
            cfg.block_m, cfg.waves, cfg.split_d
        )));
    }
    if dv / cfg.split_d > MAX_WAVE_DV
        || !dv.is_multiple_of(16 * cfg.split_d)
        || !dqk.is_multiple_of(16 * cfg.split_d)
    {
        return Err(CompileError(format!(
            "HIP backward with Dqk {dqk}, Dv {dv} split between {} waves: each wave's slice must be a multiple of 16 columns and hold at most {MAX_WAVE_DV} of Dv (split_d 2 above that)",
            cfg.split_d
        )));
    }
    let BackwardRegions {
        regions,
        nstate,
        nstat,
        nrc,
        uses_dot,
        grad_decl,
        grad_accum,
        grad_flush,
        grad_k,
        grad_v,
        grad_q,
        ..
    } = backward_regions(variant, "            x = wave_sum(x);\n", false)?;
    let lds = backward_lds_bytes(cfg.block_m, cfg.waves, cfg.split_d, dqk, dv, nrc as u32);
    if lds > MAX_LDS_BYTES {
        return Err(CompileError(format!(
            "HIP backward tile block_m {} with {} waves needs {lds} bytes of LDS for Dqk {dqk}, Dv {dv}; a workgroup has {MAX_LDS_BYTES}: use fewer waves or a smaller block_m",
            cfg.block_m, cfg.waves
        )));
    }
    let online = &par.online;
    let CustomParams {
        fields: params_fields,
        args: custom_args,
        init: params_init,
    } = custom_params(variant.customs.len(), true);
    let kernel_name = format!(
        "aec_bwd_{}_{}_d{dqk}x{dv}_m{}w{}{}_{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.block_m,
        cfg.waves,
        if cfg.split_d > 1 {
            format!("sd{}", cfg.split_d)
        } else {
            String::new()
        },
        gfx.name()
    );
    let t = HipBackwardTemplate {
        h: HipHeader::new(&variant.name, &kernel_name, cfg.elem, gfx, prelude),
        bm: cfg.block_m,
        waves: cfg.waves,
        split_d: cfg.split_d,
        dqk,
        dv,
        nstate,
        nscales: online.scales.len(),
        nstat,
        nstat_arr: nstat.max(1),
        nrc,
        nrc_arr: nrc.max(1),
        params_fields,
        custom_args,
        params_init,
        causal: par.mask.as_ref().is_some_and(implies_causal),
        mask_trim: par.mask.is_some() && !reads(par.mask.as_ref(), |op| *op == Op::Index(Axis::H)),
        regions,
        grad_decl,
        grad_accum,
        grad_flush,
        grad_k,
        grad_v,
        grad_q,
        uses_dot,
        modify_q: par.modify_q.is_some(),
        modify_k: par.modify_k.is_some(),
        modify_v: par.modify_v.is_some(),
        modify_scores: par.modify_scores.is_some(),
        mask: par.mask.is_some(),
        clamp: scores_read_customs_by_position(variant),
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;
    let args = backward_args(variant);
    let threads = cfg.waves * WAVE_SIZE;
    Ok(HipBackwardSource {
        source,
        args,
        pre: Launch {
            name: format!("{kernel_name}_pre"),
            threads,
            smem_bytes: 0,
            grid: Grid::Rows {
                per_block: cfg.waves,
            },
        },
        main: Launch {
            name: format!("{kernel_name}_main"),
            threads,
            smem_bytes: 0,
            grid: Grid::KeyBlocks {
                block_n: cfg.block_n(),
                groups: 1,
            },
        },
        post: Launch {
            name: format!("{kernel_name}_post"),
            threads,
            smem_bytes: 0,
            grid: Grid::Elements { per_block: threads },
        },
        dqk,
        dv,
        row_outputs: row_output_names(online),
        config: *cfg,
        modifies_q: par.modify_q.is_some(),
    })
}
