//! The recurrent (chunked linear attention) backward for AMD GPUs:
//! `templates/hip/recurrent_bwd.hip` filled with the same closures and their
//! derived backward as the CUDA recurrent backward, launched alike (the same
//! argument list, kernel order and grids; [`RecurrentBackwardSource`]).

use super::dialect::{Gfx, HipHeader, HipPrelude, MAX_LDS_BYTES, WAVE_SIZE};
use super::recurrent::{HipRecurrentConfig, hip_recurrent_states};
use crate::CompileError;
use crate::cuda::recurrent::{
    ForwardKind, RecurrentBackwardKernel, RecurrentBackwardSource, RecurrentGridX, backward_args,
    backward_extra_params, check_recurrent_dims,
};
use crate::cxx::closures::{
    custom_params, grad_atomics, recurrent_backward_closures, recurrent_closures,
};
use aec_frontend::Variant;
use askama::Template;

/// Waves of the `_dqk`, `_dv` and `_decay` workgroups.
const BWD_WAVES: u32 = 4;

/// The Dk slice of a `_dqk` workgroup and the Dv columns per step of the
/// `_dqk` and `_dv` loops. A decay per key dimension takes 32-key slices: its
/// `_dqk` also keeps the block-rescaled Q̃ᵀ, K̃ᵀ and the decay per step and key.
fn bwd_tiles(dk: u32, kind: ForwardKind) -> (u32, u32) {
    (if kind.per_key { 32 } else { dk.min(64) }, 32)
}

/// LDS of the backward's kernels for chunk `c` (`_dstate`, `_dqk`, `_dv`):
/// rows of Dk elements padded by 8, rows of C elements padded by 4, rows of
/// ET elements padded by 8, and the f32 tables (the decay's prefix sums, per
/// key with a decay per key dimension; the normaliser's dn, z and dz).
pub fn recurrent_bwd_lds_bytes(
    cfg: &HipRecurrentConfig,
    dk: u32,
    kind: ForwardKind,
) -> (u32, u32, u32) {
    let (c, e) = (cfg.chunk, cfg.elem.bytes());
    let (tiles, pairs) = (c / 16, (c / 16) * (c / 16 + 1) / 2);
    let (dkt, et) = bwd_tiles(dk, kind);
    let (rows_dk, rows_c, rows_e) = (dk + 8, c + 4, et + 8);
    let norm = |keys: u32| if kind.normalize { c + keys } else { 0 };
    let (dstate_f, dqk_f, dv_f) = if kind.per_key {
        (
            (c + tiles) * dk,
            (c + tiles + 1) * dkt,
            (tiles + pairs + tiles) * dk,
        )
    } else {
        (c, c, c)
    };
    let dstate = (c * rows_dk + cfg.dv_tile * rows_c) * e + (dstate_f + norm(dk)) * 4;
    let scaled = if kind.per_key { 2 * dkt * rows_c } else { 0 };
    let dqk = (2 * dkt * rows_c + 2 * c * rows_e + 2 * dkt * rows_e + 2 * c * rows_c + scaled) * e
        + (dqk_f + norm(2 * dkt)) * 4;
    // Q̃'s tile takes dSᵀ and dÕᵀ once the scores are made.
    let first = (c * rows_dk).max(et * (rows_dk + rows_c));
    let dv = (first + c * rows_dk + c * rows_c) * e + dv_f * 4;
    (dstate, dqk, dv)
}

#[derive(Template)]
#[template(path = "hip/recurrent_bwd.hip", escape = "none")]
struct HipRecurrentBwdTemplate<'a> {
    h: HipHeader<'a>,
    chunk: u32,
    dk: u32,
    dv: u32,
    dv_tile: u32,
    dk_tile: u32,
    e_tile: u32,
    params_fields: String,
    custom_args: String,
    params_init: String,
    extra_args: String,
    regions: String,
    bwd_regions: String,
    grads_len: usize,
    grads_q: String,
    grads_k: String,
    grads_v: String,
    grads_decay: String,
    grads_norm: String,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    decay: bool,
    per_key: bool,
    normalize: bool,
}

/// Generates the HIP recurrent backward of `variant` for head dims `dk`,
/// `dv` with the forward's configuration `cfg` (the states pass shares its
/// chunks) for `gfx`, rendered with `prelude`. Launch it as the CUDA
/// recurrent backward: the states pass, then [`RecurrentBackwardSource::kernels`]
/// in order, every one with [`RecurrentBackwardSource::args`]; its LDS is
/// static (`smem_bytes` 0).
pub fn hip_recurrent_backward(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &HipRecurrentConfig,
    gfx: Gfx,
    prelude: HipPrelude,
) -> Result<RecurrentBackwardSource, CompileError> {
    let rec = check_recurrent_dims(variant, dk, dv)?;
    let kind = ForwardKind::of(variant);
    if dk < 32 {
        return Err(CompileError(format!(
            "head dimension Dk = {dk} is not supported by the HIP recurrent backward: it takes 32, 64, 128 or 256"
        )));
    }
    let states = hip_recurrent_states(variant, dk, dv, cfg, gfx, prelude)?;
    let (dk_tile, e_tile) = bwd_tiles(dk, kind);
    let (lds_dstate, lds_dqk, lds_dv) = recurrent_bwd_lds_bytes(cfg, dk, kind);
    if let Some(over) = [lds_dstate, lds_dqk, lds_dv]
        .into_iter()
        .find(|&b| b > MAX_LDS_BYTES)
    {
        return Err(CompileError(format!(
            "the HIP recurrent backward with chunks of {} for Dk = {dk} needs {over} bytes of LDS per workgroup, more than the {MAX_LDS_BYTES} a workgroup has: use 32-step chunks",
            cfg.chunk
        )));
    }
    let decay = rec.decay.is_some();
    let kernel_name = format!(
        "aec_rec_bwd_{}_{}_d{dk}x{dv}_c{}v{}_{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.chunk,
        cfg.dv_tile,
        gfx.name()
    );
    let customs = custom_params(variant.customs.len(), true);
    let (bwd_regions, grads_len) = recurrent_backward_closures(variant);
    let bwd = &rec.backward;
    let atomics = |r: &Option<aec_frontend::ir::Region>, indent: &str| {
        r.as_ref()
            .map(|r| grad_atomics(variant, r, "true", indent).replace("atomicAdd(", "grad_add("))
            .unwrap_or_default()
    };
    let template = HipRecurrentBwdTemplate {
        h: HipHeader::new(&variant.name, &kernel_name, cfg.elem, gfx, prelude),
        chunk: cfg.chunk,
        dk,
        dv,
        dv_tile: cfg.dv_tile,
        dk_tile,
        e_tile,
        params_fields: customs.fields,
        custom_args: customs.args,
        params_init: customs.init,
        extra_args: backward_extra_params(kind.normalize, decay),
        regions: recurrent_closures(variant),
        bwd_regions,
        grads_len,
        grads_q: atomics(&bwd.modify_q, "            "),
        grads_k: atomics(&bwd.modify_k, "            "),
        grads_v: atomics(&bwd.modify_v, "                "),
        grads_decay: atomics(&bwd.decay, "            "),
        grads_norm: atomics(&bwd.normalize, "        "),
        modify_q: rec.modify_q.is_some(),
        modify_k: rec.modify_k.is_some(),
        modify_v: rec.modify_v.is_some(),
        decay,
        per_key: kind.per_key,
        normalize: kind.normalize,
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;

    let threads = BWD_WAVES * WAVE_SIZE;
    let kernel = |suffix: &str, threads: u32, grid_x: RecurrentGridX| RecurrentBackwardKernel {
        name: format!("{kernel_name}_{suffix}"),
        threads,
        smem_bytes: 0,
        grid_x,
    };
    let mut kernels = Vec::new();
    if kind.normalize {
        kernels.push(kernel("pre", threads, RecurrentGridX::Rows(BWD_WAVES)));
    }
    kernels.extend([
        kernel(
            "dstate",
            cfg.waves() * WAVE_SIZE,
            RecurrentGridX::DvSlices(cfg.dv_tile),
        ),
        kernel("dqk", threads, RecurrentGridX::Chunks(dk / dk_tile)),
        kernel("dv", threads, RecurrentGridX::Chunks(1)),
    ]);
    if decay {
        // A decay per key dimension: a workgroup per chunk, a work-item per key.
        let grid = if kind.per_key {
            RecurrentGridX::Chunks(1)
        } else {
            RecurrentGridX::One
        };
        kernels.push(kernel("decay", threads, grid));
    }
    Ok(RecurrentBackwardSource {
        states,
        name: kernel_name,
        source,
        kernels,
        args: backward_args(variant, kind.normalize, decay),
        dk,
        dv,
        config: cfg.launch_config(),
        normalized: kind.normalize,
        decay,
        per_key: kind.per_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Elem;

    #[test]
    fn backward_lds_fits_with_the_forward_default_chunks() {
        let plain = ForwardKind::default();
        let per_key = ForwardKind {
            per_key: true,
            normalize: false,
        };
        let normalize = ForwardKind {
            per_key: false,
            normalize: true,
        };
        for kind in [plain, per_key, normalize] {
            for dk in [32, 64, 128, 256] {
                for dv in [64, 96, 128, 512] {
                    let cfg = HipRecurrentConfig::default_for(dk, dv, kind, Elem::Bf16);
                    let (a, b, c) = recurrent_bwd_lds_bytes(&cfg, dk, kind);
                    assert!(
                        a.max(b).max(c) <= MAX_LDS_BYTES,
                        "{kind:?} Dk {dk} Dv {dv}: {a} {b} {c}"
                    );
                }
            }
        }
        // Dk 128, chunk 64: Q̃ (64 × 136, later dSᵀ 32 × 136 and dÕᵀ 32 × 68), K̃, Aᵀ (64 × 68), sL.
        let cfg = HipRecurrentConfig::default_for(128, 128, plain, Elem::Bf16);
        assert_eq!(
            recurrent_bwd_lds_bytes(&cfg, 128, plain).2,
            2 * (2 * 64 * 136 + 64 * 68) + 64 * 4
        );
        // Per key: _dstate keeps the decay per step and key (64 × 128 f32) and block totals.
        let cfg = HipRecurrentConfig::default_for(128, 128, per_key, Elem::Bf16);
        assert_eq!(
            recurrent_bwd_lds_bytes(&cfg, 128, per_key).0,
            2 * (64 * 136 + 64 * 68) + (64 + 4) * 128 * 4
        );
        // Dk 256 at 64-step chunks does not fit: the error names the fix.
        let wide = HipRecurrentConfig {
            chunk: 64,
            ..HipRecurrentConfig::default_for(256, 256, plain, Elem::Bf16)
        };
        assert!(recurrent_bwd_lds_bytes(&wide, 256, plain).2 > MAX_LDS_BYTES);
    }
}
