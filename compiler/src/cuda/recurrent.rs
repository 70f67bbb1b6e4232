//! The recurrent (chunked linear attention) forward kernel: one block per
//! (Dv slice, head, batch) carries its slice of the hidden state across the
//! sequence in registers, chunk by chunk, both chunk GEMMs and the state
//! update on `mma.sync` (templates/cuda/recurrent_fwd.cu).

use super::dialect::{Elem, ElemSpelling, Isa, WARP_SIZE, elem_spelling};
use super::forward::ArgKind;
use crate::CompileError;
use crate::cxx::closures::{check_fixed_head_dims, custom_params, recurrent_closures};
use aec_frontend::Variant;
use aec_frontend::ir::Axis;
use askama::Template;

/// Tile configuration of the recurrent forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecurrentConfig {
    /// Steps per chunk: the intra-chunk score matrix is `chunk × chunk`.
    /// The template takes 64.
    pub chunk: u32,
    /// Dv columns per block (32, 64 or 128): blocks of one head split Dv
    /// and each recomputes the chunk's scores.
    pub dv_tile: u32,
    /// Warps per block (8).
    pub warps: u32,
    /// Chunk buffers in shared memory: 2 (the next chunk loads while one is
    /// computed) or 1 (where two do not fit, e.g. Dk 256 on sm_80).
    pub stages: u32,
    /// Blocks each multiprocessor should hold (1 or 2): with 2 the
    /// compiler keeps to 128 registers per thread and shared memory must
    /// fit twice, so one block's loads and barriers overlap the other's
    /// GEMMs.
    pub blocks_per_sm: u32,
    pub elem: Elem,
}

/// Chunk sizes the template takes.
pub const RECURRENT_CHUNKS: &[u32] = &[64];

/// The largest state slice one thread holds, in f32 registers.
const MAX_STATE_REGS: u32 = 64;

impl RecurrentConfig {
    /// The configuration used when none is tuned: 64-step chunks, 8 warps,
    /// 64 Dv columns per block (32 where Dv is not a multiple of 64), double
    /// buffering where shared memory holds it.
    pub fn default_for(dk: u32, dv: u32, elem: Elem, isa: Isa) -> RecurrentConfig {
        let dv_tile = if dv.is_multiple_of(64) { 64 } else { 32 };
        let mut cfg = RecurrentConfig {
            chunk: 64,
            dv_tile,
            warps: 8,
            stages: 2,
            blocks_per_sm: 1,
            elem,
        };
        if recurrent_smem_bytes(&cfg, dk, false) > isa.max_dynamic_smem() {
            cfg.stages = 1;
        }
        cfg
    }
}

/// Dynamic shared memory of the recurrent forward.
pub fn recurrent_smem_bytes(cfg: &RecurrentConfig, dk: u32, normalize: bool) -> u32 {
    let (c, pad) = (cfg.chunk, 8);
    let elems = cfg.stages * c * (2 * (dk + pad) + cfg.dv_tile + pad) // Q, K, V chunks
        + dk * (cfg.dv_tile + pad) // the state as an MMA operand
        + c * (c + pad) // decayed scores
        + c * (cfg.dv_tile + pad); // decayed V
    let floats = c + if normalize { c + dk } else { 0 };
    elems * cfg.elem.bytes() + floats * 4
}

/// Generated recurrent forward and what launching it needs.
#[derive(Clone, Debug)]
pub struct RecurrentSource {
    pub name: String,
    pub source: String,
    pub threads: u32,
    pub smem_bytes: u32,
    /// Launch order: q, k, v, o, the custom inputs, `state_in`,
    /// `state_out` (f32 `[B, H, Dk, Dv]`; either may be null: start from
    /// zero, do not write), with a normaliser `norm_in` and `norm_out` (f32
    /// `[B, H, Dk]`), then the sizes B, H, S.
    pub args: Vec<ArgKind>,
    pub dk: u32,
    pub dv: u32,
    pub config: RecurrentConfig,
    /// Whether the variant has a normaliser (`normalize`): then the kernel
    /// takes `norm_in` and `norm_out`.
    pub normalized: bool,
}

impl RecurrentSource {
    /// The launch grid for sizes B, H: `(Dv / dv_tile, H, B)`; `None` when a
    /// dimension exceeds what CUDA launches.
    pub fn grid_for(&self, b: usize, h: usize) -> Option<(u32, u32, u32)> {
        let x = self.dv / self.config.dv_tile;
        (h < 65536 && b < 65536).then_some((x, h as u32, b as u32))
    }
}

#[derive(Template)]
#[template(path = "cuda/recurrent_fwd.cu", escape = "none")]
struct RecurrentTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: ElemSpelling,
    chunk: u32,
    dk: u32,
    dv: u32,
    dv_tile: u32,
    warps: u32,
    warp_size: u32,
    stages: u32,
    blocks_per_sm: u32,
    state_warps_m: u32,
    state_m_tiles: u32,
    state_n_tiles: u32,
    params_fields: &'a str,
    params_init: &'a str,
    custom_args: &'a str,
    regions: &'a str,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    decay: bool,
    normalize: bool,
}

/// The warp tiling of the `dk × dv_tile` state: (warps along Dk, m16 tiles
/// per warp, n8 tiles per warp), or why the sizes do not tile.
fn state_tiling(dk: u32, dv_tile: u32, warps: u32) -> Result<(u32, u32, u32), String> {
    let m_tiles = dk / 16;
    let warps_m = m_tiles.min(warps);
    let n_tiles = dv_tile / 8;
    let warps_n = warps / warps_m.max(1);
    let tiles_ok = m_tiles.is_multiple_of(warps_m)
        && warps.is_multiple_of(warps_m)
        && n_tiles.is_multiple_of(warps_n)
        && (n_tiles / warps_n).is_multiple_of(2);
    if !tiles_ok {
        return Err(format!(
            "the {dk} × {dv_tile} state does not tile over {warps} warps"
        ));
    }
    let (smt, snt) = (m_tiles / warps_m, n_tiles / warps_n);
    if smt * snt * 4 > MAX_STATE_REGS {
        return Err(format!(
            "a {dk} × {dv_tile} state slice takes {} registers per thread (at most {MAX_STATE_REGS}); use a smaller Dv tile",
            smt * snt * 4
        ));
    }
    Ok((warps_m, smt, snt))
}

/// The largest Dk the recurrent template takes.
pub const MAX_RECURRENT_DK: u32 = 256;

/// The recurrent forward of `variant` for head dims `dk`, `dv`.
pub fn recurrent_forward(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &RecurrentConfig,
) -> Result<RecurrentSource, CompileError> {
    let rec = variant.recurrent().ok_or_else(|| {
        CompileError(format!(
            "`{}` is a parallel variant; the recurrent forward needs a recurrent one",
            variant.name
        ))
    })?;
    check_fixed_head_dims(variant, &[(Axis::Dk, dk), (Axis::Dv, dv)])?;
    if ![16, 32, 64, 128, 256].contains(&dk) {
        return Err(CompileError(format!(
            "head dimension Dk = {dk} is not supported by the recurrent template: it takes 16, 32, 64, 128 or 256"
        )));
    }
    if dv == 0 || !dv.is_multiple_of(32) || dv > 512 {
        return Err(CompileError(format!(
            "head dimension Dv = {dv} is not supported by the recurrent template: it needs a multiple of 32 up to 512"
        )));
    }
    if let Some(d) = &rec.decay
        && d.per_key_dim
    {
        return Err(CompileError(format!(
            "`{}` decays per key dimension (`decay = |b, h, t, d| …`); the chunked kernels take a scalar decay per head and step only so far",
            variant.name
        )));
    }
    if let Some(c) = variant.customs.iter().find(|c| !c.user_axes.is_empty()) {
        return Err(CompileError(format!(
            "custom input `{}` has user axes (read by index); the GPU templates do not support indexed inputs yet",
            c.name
        )));
    }
    if !RECURRENT_CHUNKS.contains(&cfg.chunk) {
        return Err(CompileError(format!(
            "chunk = {} is not supported by the recurrent template: it takes {RECURRENT_CHUNKS:?}",
            cfg.chunk
        )));
    }
    if cfg.warps != 8 || !(1..=2).contains(&cfg.stages) || !(1..=2).contains(&cfg.blocks_per_sm) {
        return Err(CompileError(format!(
            "the recurrent template takes 8 warps, 1 or 2 stages and 1 or 2 blocks per multiprocessor, not {} warps, {} stages and {} blocks",
            cfg.warps, cfg.stages, cfg.blocks_per_sm
        )));
    }
    if ![32, 64, 128].contains(&cfg.dv_tile) || !dv.is_multiple_of(cfg.dv_tile) {
        return Err(CompileError(format!(
            "dv_tile = {} must be 32, 64 or 128 and divide Dv = {dv}",
            cfg.dv_tile
        )));
    }
    let (state_warps_m, state_m_tiles, state_n_tiles) =
        state_tiling(dk, cfg.dv_tile, cfg.warps).map_err(CompileError)?;
    let normalize = rec.normalize.is_some();

    let kernel_name = format!(
        "aec_rec_fwd_{}_{}_d{dk}x{dv}_c{}v{}s{}b{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.chunk,
        cfg.dv_tile,
        cfg.stages,
        cfg.blocks_per_sm
    );
    let customs = custom_params(variant.customs.len(), false);
    let regions = recurrent_closures(variant);
    let template = RecurrentTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(cfg.elem),
        chunk: cfg.chunk,
        dk,
        dv,
        dv_tile: cfg.dv_tile,
        warps: cfg.warps,
        warp_size: WARP_SIZE,
        stages: cfg.stages,
        blocks_per_sm: cfg.blocks_per_sm,
        state_warps_m,
        state_m_tiles,
        state_n_tiles,
        params_fields: &customs.fields,
        params_init: &customs.init,
        custom_args: &customs.args,
        regions: &regions,
        modify_q: rec.modify_q.is_some(),
        modify_k: rec.modify_k.is_some(),
        modify_v: rec.modify_v.is_some(),
        decay: rec.decay.is_some(),
        normalize,
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template: {e}")))?;
    let mut args = vec![
        ArgKind::Tensor("q"),
        ArgKind::Tensor("k"),
        ArgKind::Tensor("v"),
        ArgKind::Tensor("o"),
    ];
    args.extend(
        variant
            .customs
            .iter()
            .map(|c| ArgKind::Custom(c.name.clone())),
    );
    args.extend([ArgKind::State("state_in"), ArgKind::State("state_out")]);
    if normalize {
        args.extend([ArgKind::State("norm_in"), ArgKind::State("norm_out")]);
    }
    args.extend([Axis::B, Axis::H, Axis::S].map(ArgKind::Size));
    Ok(RecurrentSource {
        name: kernel_name,
        source,
        threads: cfg.warps * WARP_SIZE,
        smem_bytes: recurrent_smem_bytes(cfg, dk, normalize),
        args,
        dk,
        dv,
        config: *cfg,
        normalized: normalize,
    })
}
