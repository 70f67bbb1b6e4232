//! The recurrent (chunked linear attention) forward for AMD GPUs:
//! `templates/hip/recurrent_fwd.hip` filled with the same closures as the
//! CUDA recurrent templates ([`crate::cxx::closures::recurrent_closures`]).

use super::dialect::{Gfx, HipHeader, HipPrelude, MAX_LDS_BYTES, WAVE_SIZE};
use crate::cuda::recurrent::{
    ForwardKind, RecurrentConfig, RecurrentSource, check_recurrent_dims, forward_args,
};
use crate::cxx::closures::{CustomParams, custom_params, recurrent_closures};
use crate::{CompileError, Elem};
use aec_frontend::Variant;
use askama::Template;

/// Tile configuration of the HIP recurrent forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HipRecurrentConfig {
    /// Steps per chunk, 32 or 64 (at most a wave: the decay scan gives each
    /// step one lane).
    pub chunk: u32,
    /// Dv columns per workgroup, 32 or 64: one wave per 16 columns.
    pub dv_tile: u32,
    pub elem: Elem,
}

impl HipRecurrentConfig {
    /// The configuration used when none is given: 64-column slices where Dv
    /// allows (four waves), else 32; 64-step chunks where the tiles fit in
    /// LDS, else 32 (Dk 256), and 32-column slices as the last resort.
    pub fn default_for(dk: u32, dv: u32, kind: ForwardKind, elem: Elem) -> HipRecurrentConfig {
        let widest = if dv.is_multiple_of(64) { 64 } else { 32 };
        let candidates = [(64, widest), (32, widest), (64, 32), (32, 32)];
        let fits = |&&(chunk, dv_tile): &&(u32, u32)| {
            let cfg = HipRecurrentConfig {
                chunk,
                dv_tile,
                elem,
            };
            recurrent_lds_bytes(&cfg, dk, kind) <= MAX_LDS_BYTES
        };
        let (chunk, dv_tile) = *candidates.iter().find(fits).unwrap_or(&(32, 32));
        HipRecurrentConfig {
            chunk,
            dv_tile,
            elem,
        }
    }

    /// Waves per workgroup: one per 16 columns of the slice.
    pub fn waves(&self) -> u32 {
        self.dv_tile / 16
    }

    /// The configuration the shared launch code reads (the CUDA recurrent
    /// one): waves in place of warps, one buffer stage, no wgmma.
    pub fn launch_config(&self) -> RecurrentConfig {
        RecurrentConfig {
            chunk: self.chunk,
            dv_tile: self.dv_tile,
            warps: self.waves(),
            stages: 1,
            blocks_per_sm: 1,
            wgmma: false,
            elem: self.elem,
        }
    }
}

/// LDS of one workgroup: the Q̃ and K̃ tiles (rows padded by 8 elements), Ṽᵀ
/// and the scores (rows padded by 4), and the f32 tables: the decay's
/// prefix sums, or with a decay per key dimension its factor tables (block
/// totals, tile pairs, the state's share, the update's), and with a
/// normaliser the key sum and the rows' shares.
pub fn recurrent_lds_bytes(cfg: &HipRecurrentConfig, dk: u32, kind: ForwardKind) -> u32 {
    let c = cfg.chunk;
    let (tiles, pairs) = (c / 16, (c / 16) * (c / 16 + 1) / 2);
    let elems = 2 * c * (dk + 8) + cfg.dv_tile * (c + 4) + c * (c + 4);
    let mut floats = if kind.per_key {
        (tiles + pairs + (tiles + 1) + tiles) * dk
    } else {
        c
    };
    if kind.normalize {
        floats += dk + c + pairs * 16;
    }
    elems * cfg.elem.bytes() + floats * 4
}

#[derive(Template)]
#[template(path = "hip/recurrent_fwd.hip", escape = "none")]
struct HipRecurrentTemplate<'a> {
    h: HipHeader<'a>,
    chunk: u32,
    dk: u32,
    dv: u32,
    dv_tile: u32,
    params_fields: String,
    custom_args: String,
    params_init: String,
    regions: String,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    decay: bool,
    per_key: bool,
    normalize: bool,
    /// The backward's states pass: write the state before each chunk.
    save_states: bool,
    /// Whether the kernel computes the output (the states pass only with a
    /// normaliser, and then before normalisation).
    emit_o: bool,
}

/// Generates the HIP recurrent forward of `variant` for head dims `dk`, `dv`
/// and architecture `gfx`, rendered with `prelude` (the real target, or the
/// CPU emulation used by the tests). Launch it as the CUDA recurrent forward
/// ([`RecurrentSource::grid_for`], [`RecurrentSource::args`]); its LDS is
/// static (`smem_bytes` 0).
pub fn hip_recurrent_forward(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &HipRecurrentConfig,
    gfx: Gfx,
    prelude: HipPrelude,
) -> Result<RecurrentSource, CompileError> {
    chunked_forward(variant, dk, dv, cfg, gfx, prelude, false)
}

/// The states pass of the HIP recurrent backward: the forward template
/// writing the state before each chunk (`states`, `[B, H, chunks, Dk, Dv]`
/// in the element type) and the final state; with a normaliser also the key
/// sum before each chunk (`norm_states`), the output before normalisation
/// (`o`) and the rows' normalisers (`row_n`), else computing no output. Its
/// arguments are the CUDA states pass's ([`crate::recurrent_states`]).
pub fn hip_recurrent_states(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &HipRecurrentConfig,
    gfx: Gfx,
    prelude: HipPrelude,
) -> Result<RecurrentSource, CompileError> {
    chunked_forward(variant, dk, dv, cfg, gfx, prelude, true)
}

fn chunked_forward(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &HipRecurrentConfig,
    gfx: Gfx,
    prelude: HipPrelude,
    save_states: bool,
) -> Result<RecurrentSource, CompileError> {
    let rec = check_recurrent_dims(variant, dk, dv)?;
    let kind = ForwardKind::of(variant);
    if kind.per_key && kind.normalize {
        return Err(CompileError(format!(
            "`{}` decays per key dimension (`decay = |b, h, t, d| …`) and has a normaliser: the chunked kernels take a normaliser with a scalar decay per head and step only so far",
            variant.name
        )));
    }
    if !matches!(cfg.chunk, 32 | 64) || !matches!(cfg.dv_tile, 32 | 64) {
        return Err(CompileError(format!(
            "HIP recurrent tile: chunk {} and Dv slice {} are not supported: both must be 32 or 64",
            cfg.chunk, cfg.dv_tile
        )));
    }
    if !dv.is_multiple_of(cfg.dv_tile) {
        return Err(CompileError(format!(
            "HIP recurrent tile: the Dv slice {} does not divide Dv = {dv}",
            cfg.dv_tile
        )));
    }
    let lds = recurrent_lds_bytes(cfg, dk, kind);
    if lds > MAX_LDS_BYTES {
        return Err(CompileError(format!(
            "HIP recurrent tile: chunk {} with a Dv slice of {} needs {lds} bytes of LDS for Dk {dk}; a workgroup has {MAX_LDS_BYTES}: use 32-step chunks or 32-column slices",
            cfg.chunk, cfg.dv_tile
        )));
    }
    // The states pass of a normalised variant also writes the output before
    // normalisation and the rows' normalisers (the backward's `_pre` needs them).
    let emit_o = !save_states || kind.normalize;
    let kernel_name = format!(
        "aec_rec_{}_{}_{}_d{dk}x{dv}_c{}v{}_{}",
        if save_states { "states" } else { "fwd" },
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.chunk,
        cfg.dv_tile,
        gfx.name()
    );
    let CustomParams {
        fields: params_fields,
        args: custom_args,
        init: params_init,
    } = custom_params(variant.customs.len(), false);
    let t = HipRecurrentTemplate {
        h: HipHeader::new(&variant.name, &kernel_name, cfg.elem, gfx, prelude),
        chunk: cfg.chunk,
        dk,
        dv,
        dv_tile: cfg.dv_tile,
        params_fields,
        custom_args,
        params_init,
        regions: recurrent_closures(variant),
        modify_q: rec.modify_q.is_some(),
        modify_k: rec.modify_k.is_some(),
        modify_v: rec.modify_v.is_some(),
        decay: rec.decay.is_some(),
        per_key: kind.per_key,
        normalize: kind.normalize,
        save_states,
        emit_o,
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;
    Ok(RecurrentSource {
        name: kernel_name,
        source,
        threads: cfg.waves() * WAVE_SIZE,
        smem_bytes: 0,
        args: forward_args(variant, emit_o, kind.normalize, save_states),
        dk,
        dv,
        config: cfg.launch_config(),
        normalized: kind.normalize,
        wgmma: false,
        segments: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tiles_fit_lds_and_take_the_widest_that_does() {
        let plain = ForwardKind::default();
        let per_key = ForwardKind {
            per_key: true,
            normalize: false,
        };
        let cfg = |dk, dv, kind| HipRecurrentConfig::default_for(dk, dv, kind, Elem::Bf16);
        // Dk 128: 64-step chunks and 64-column slices fit (52 KiB).
        assert_eq!(
            (cfg(128, 128, plain).chunk, cfg(128, 128, plain).dv_tile),
            (64, 64)
        );
        // Dk 256: two 64 × 264 tiles alone are 66 KiB, so 32-step chunks.
        assert_eq!(
            (cfg(256, 512, plain).chunk, cfg(256, 512, plain).dv_tile),
            (32, 64)
        );
        // Dv not a multiple of 64: 32-column slices (two waves).
        assert_eq!(cfg(64, 96, plain).dv_tile, 32);
        assert_eq!(cfg(64, 96, plain).waves(), 2);
        // A decay per key dimension at Dk 128 still fits 64-step chunks (62.5 KiB).
        assert_eq!(cfg(128, 128, per_key).chunk, 64);
        for dk in [16, 32, 64, 128, 256] {
            for kind in [plain, per_key] {
                let c = cfg(dk, 64, kind);
                assert!(
                    recurrent_lds_bytes(&c, dk, kind) <= MAX_LDS_BYTES,
                    "{dk} {kind:?}"
                );
            }
        }
        assert_eq!(
            recurrent_lds_bytes(&cfg(128, 128, plain), 128, plain),
            2 * (2 * 64 * 136 + 64 * 68 + 64 * 68) + 64 * 4
        );
    }
}
