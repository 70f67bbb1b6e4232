//! The recurrent (chunked linear attention) forward kernel: one block per
//! (Dv slice, head, batch) carries its slice of the hidden state across the
//! sequence in registers, chunk by chunk, both chunk GEMMs and the state
//! update on `mma.sync` (templates/cuda/recurrent_fwd.cu).

use super::dialect::{Elem, ElemSpelling, Isa, WARP_SIZE, elem_spelling};
use super::forward::ArgKind;
use super::recurrent_wgmma::{wgmma_dims_ok, wgmma_forward};
use crate::CompileError;
use crate::cxx::closures::{
    check_fixed_head_dims, custom_params, grad_atomics, recurrent_backward_closures,
    recurrent_closures, refuse_indexed_inputs,
};
use aec_frontend::Variant;
use aec_frontend::ir::Axis;
use aec_frontend::variant::Recurrent;
use askama::Template;

/// The recurrent forward's templates (both instruction sets) and the
/// preludes they include, as text: their digest is part of the recurrent
/// forward's tuning keys, so a changed template never reuses old results.
pub const TEMPLATE_TEXT: &str = concat!(
    include_str!("../../../templates/cuda/recurrent_fwd.cu"),
    include_str!("../../../templates/cuda/recurrent_fwd_sm90.cu"),
    include_str!("../../../templates/cuda/recurrent_types.cu"),
    include_str!("../../../templates/cuda/recurrent_state.cu"),
    include_str!("../../../templates/cuda/recurrent_segments.cu"),
    include_str!("../../../templates/cuda/recurrent_decay.cu"),
    include_str!("../../../templates/cuda/recurrent_modify.cu"),
    include_str!("../../../templates/cuda/recurrent_per_key.cu"),
    include_str!("../../../templates/cuda/prelude.cu"),
    include_str!("../../../templates/cuda/prelude_sm90.cu"),
);

/// The recurrent backward's template and, for its states pass, the
/// forward's: their digest is part of the recurrent backward's tuning keys.
pub const BACKWARD_TEMPLATE_TEXT: &str = concat!(
    include_str!("../../../templates/cuda/recurrent_bwd.cu"),
    include_str!("../../../templates/cuda/recurrent_fwd.cu"),
    include_str!("../../../templates/cuda/recurrent_types.cu"),
    include_str!("../../../templates/cuda/recurrent_state.cu"),
    include_str!("../../../templates/cuda/recurrent_decay.cu"),
    include_str!("../../../templates/cuda/recurrent_modify.cu"),
    include_str!("../../../templates/cuda/recurrent_per_key.cu"),
    include_str!("../../../templates/cuda/prelude.cu"),
);

/// The `mma.sync` tiles' Dv slices, and their (stages, blocks per
/// multiprocessor): what the forward's and the backward's tile spaces
/// enumerate.
const MMA_SYNC_DV_TILES: [u32; 3] = [32, 64, 128];
const MMA_SYNC_RINGS: [(u32, u32); 4] = [(1, 1), (2, 1), (1, 2), (2, 2)];

/// The `mma.sync` tiles of one chunk: every Dv slice that divides `dv`, with
/// every ring ([`MMA_SYNC_DV_TILES`] × [`MMA_SYNC_RINGS`]), eight warps.
fn mma_sync_tiles(chunk: u32, dv: u32, elem: Elem) -> impl Iterator<Item = RecurrentConfig> {
    MMA_SYNC_DV_TILES
        .into_iter()
        .filter(move |t| dv.is_multiple_of(*t))
        .flat_map(move |dv_tile| {
            MMA_SYNC_RINGS
                .into_iter()
                .map(move |(stages, blocks_per_sm)| RecurrentConfig {
                    chunk,
                    dv_tile,
                    warps: 8,
                    stages,
                    blocks_per_sm,
                    wgmma: false,
                    elem,
                })
        })
}

/// Tile configuration of the recurrent forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RecurrentConfig {
    /// Steps per chunk: the intra-chunk score matrix is `chunk × chunk`.
    /// The `mma.sync` forward takes 32 or 64 ([`RECURRENT_CHUNKS`]); the
    /// wgmma forward and the backward take 64 ([`BACKWARD_CHUNK`]).
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
    /// Prefer the sm_90a forward (templates/cuda/recurrent_fwd_sm90.cu:
    /// warp-specialised, wgmma, a fixed 8 warps and two stages, Dv slices
    /// of 64, Dk 64–256). It covers the forward of variants without a
    /// normaliser or a decay per key dimension; those, and the backward's
    /// states pass, use the `mma.sync` template, which `warps`, `stages` and
    /// `blocks_per_sm` describe.
    pub wgmma: bool,
    pub elem: Elem,
}

/// Chunk sizes the `mma.sync` forward takes. Shorter chunks halve the
/// score tile and the shared memory of each stage and double the chain of
/// state updates. 128 is not offered: at Dk 128 it fits one stage only and
/// its score and output tiles spill (255 registers, 208 bytes at Mamba2's
/// dims), and at Dk 256 it does not fit at all.
pub const RECURRENT_CHUNKS: &[u32] = &[32, 64];

/// The chunk of the wgmma forward (its output warpgroup's 64-row wgmma
/// tiles are one chunk) and of the backward (its `_decay` scan spans a
/// chunk with two warps).
pub const BACKWARD_CHUNK: u32 = 64;

/// The largest state slice one thread holds, in f32 registers.
const MAX_STATE_REGS: u32 = 64;

impl RecurrentConfig {
    /// The configuration used when none is tuned: 64-step chunks, 8 warps,
    /// 64 Dv columns per block (32 where Dv is not a multiple of 64), double
    /// buffering where shared memory holds it; on sm_90a the wgmma forward
    /// where the head dims allow it.
    pub fn default_for(dk: u32, dv: u32, elem: Elem, isa: Isa) -> RecurrentConfig {
        let dv_tile = if dv.is_multiple_of(64) { 64 } else { 32 };
        let mut cfg = RecurrentConfig {
            chunk: 64,
            dv_tile,
            warps: 8,
            stages: 2,
            blocks_per_sm: 1,
            wgmma: isa == Isa::Sm90a && wgmma_dims_ok(dk, dv_tile),
            elem,
        };
        if recurrent_smem_bytes(&cfg, dk, ForwardKind::default()) > isa.max_dynamic_smem() {
            cfg.stages = 1;
        }
        cfg
    }

    /// The configuration used for `variant` when none is tuned:
    /// [`default_for`](Self::default_for), except that a decay per key
    /// dimension takes the `mma.sync` forward (the wgmma one scales no
    /// operands per key) and, where its factor tables do not fit beside two
    /// stages, one stage and then Dv slices of 32.
    pub fn for_variant(
        variant: &Variant,
        dk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> RecurrentConfig {
        let mut cfg = RecurrentConfig::default_for(dk, dv, elem, isa);
        let kind = ForwardKind::of(variant);
        if kind.per_key {
            cfg.wgmma = false;
            let tiles = [(2, cfg.dv_tile), (1, cfg.dv_tile), (1, 32)];
            if let Some(&(stages, dv_tile)) = tiles.iter().find(|&&(stages, dv_tile)| {
                let c = RecurrentConfig {
                    stages,
                    dv_tile,
                    ..cfg
                };
                recurrent_smem_bytes(&c, dk, kind) <= isa.max_dynamic_smem()
            }) {
                cfg.stages = stages;
                cfg.dv_tile = dv_tile;
            }
        }
        cfg
    }

    /// The backward's configuration for a forward run with `self`: the same
    /// where it has the backward's chunk, else the variant's default. (The
    /// backward recomputes the states itself, so it does not depend on the
    /// forward's chunking.)
    pub fn backward_for(&self, variant: &Variant, dk: u32, dv: u32, isa: Isa) -> RecurrentConfig {
        if self.chunk == BACKWARD_CHUNK {
            *self
        } else {
            RecurrentConfig::for_variant(variant, dk, dv, self.elem, isa)
        }
    }

    /// The recurrent backward's tile space on `isa` for `variant` at head
    /// dims `dk` × `dv`: what `aec tune --backward` profiles. The backward
    /// of the variant's default forward first ([`backward_for`](Self::backward_for)),
    /// then every other `mma.sync` tile of its chunk ([`BACKWARD_CHUNK`]):
    /// Dv slices of 32, 64 and 128 that divide Dv, one or two stages of the
    /// state gradient's ring, one or two states-pass blocks per
    /// multiprocessor. (Its kernels run on `mma.sync` whatever the forward's
    /// instruction set, so the default's `wgmma` flag marks no other tile.)
    /// Candidates the shared memory does not take are in the list: the
    /// generator refuses them with the reason ([`recurrent_backward`]).
    pub fn backward_space(
        variant: &Variant,
        dk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> Vec<RecurrentConfig> {
        let default = RecurrentConfig::for_variant(variant, dk, dv, elem, isa)
            .backward_for(variant, dk, dv, isa);
        let same_kernels = |a: &RecurrentConfig, b: &RecurrentConfig| {
            RecurrentConfig { wgmma: false, ..*a } == RecurrentConfig { wgmma: false, ..*b }
        };
        let mut space = vec![default];
        for cfg in mma_sync_tiles(BACKWARD_CHUNK, dv, elem) {
            if !space.iter().any(|c| same_kernels(c, &cfg)) {
                space.push(cfg);
            }
        }
        space
    }

    /// The backward's name for reports: chunk, Dv slice, the state
    /// gradient's ring depth, states-pass blocks per multiprocessor (`c64
    /// dv64 s2 b1`).
    pub fn backward_label(&self) -> String {
        format!(
            "c{} dv{} s{} b{}",
            self.chunk, self.dv_tile, self.stages, self.blocks_per_sm
        )
    }

    /// A short name for reports: chunk, Dv slice, warps, ring depth, blocks
    /// per multiprocessor and the instruction set (`c64 dv64 w8 s2 b1
    /// wgmma`; the wgmma forward's fixed warps, stages and blocks are
    /// printed as configured).
    pub fn label(&self) -> String {
        format!(
            "c{} dv{} w{} s{} b{} {}",
            self.chunk,
            self.dv_tile,
            self.warps,
            self.stages,
            self.blocks_per_sm,
            if self.wgmma { "wgmma" } else { "mma.sync" }
        )
    }

    /// The recurrent forward's tile space on `isa` for `variant` at head
    /// dims `dk` × `dv`: what the tuner profiles. The variant's default
    /// ([`for_variant`](Self::for_variant)) first — on sm_90a the wgmma
    /// forward where it takes the variant — then the `mma.sync` space
    /// ([`mma_sync_space`](Self::mma_sync_space)).
    pub fn space(
        variant: &Variant,
        dk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> Vec<RecurrentConfig> {
        let default = RecurrentConfig::for_variant(variant, dk, dv, elem, isa);
        std::iter::once(default)
            .chain(
                RecurrentConfig::mma_sync_space(variant, dk, dv, elem, isa)
                    .into_iter()
                    .filter(|c| *c != default),
            )
            .collect()
    }

    /// The `mma.sync` forward's tile space on `isa` for `variant` at head
    /// dims `dk` × `dv`: every chunk ([`RECURRENT_CHUNKS`]), Dv slice (32,
    /// 64, 128 dividing Dv), ring depth (1, 2) and blocks per
    /// multiprocessor (1, 2) whose source generates and whose shared memory
    /// fits that many blocks. Registers are not judged here: two blocks per
    /// SM cap them at 128, and ptxas says what spills. The wgmma forward
    /// has one point per head dims ([`default_for`](Self::default_for)).
    pub fn mma_sync_space(
        variant: &Variant,
        dk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> Vec<RecurrentConfig> {
        let kind = ForwardKind::of(variant);
        let mut space = Vec::new();
        for &chunk in RECURRENT_CHUNKS {
            for cfg in mma_sync_tiles(chunk, dv, elem) {
                let smem = recurrent_smem_bytes(&cfg, dk, kind);
                if check_recurrent_inputs(variant, dk, dv, &cfg).is_ok()
                    && smem <= isa.max_dynamic_smem()
                    && smem * cfg.blocks_per_sm <= isa.smem_per_sm(cfg.blocks_per_sm)
                {
                    space.push(cfg);
                }
            }
        }
        space
    }
}

/// What of a recurrent variant changes the forward's shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardKind {
    /// A normaliser: the rows' normalisers and the key sum.
    pub normalize: bool,
    /// A decay per key dimension: the decayed K̃ instead of the decayed Ṽ,
    /// and the factor tables.
    pub per_key: bool,
}

impl ForwardKind {
    /// The kind of `variant` (a parallel variant's is the default).
    pub fn of(variant: &Variant) -> ForwardKind {
        let rec = variant.recurrent();
        ForwardKind {
            normalize: rec.is_some_and(|r| r.normalize.is_some()),
            per_key: rec.is_some_and(per_key_decay),
        }
    }
}

/// Whether the variant's decay is per key dimension (GLA's).
pub(crate) fn per_key_decay(rec: &Recurrent) -> bool {
    rec.decay.as_ref().is_some_and(|d| d.per_key_dim)
}

/// 16-step blocks per chunk and (block, earlier block) pairs of a chunk's
/// scores: the per-key factor tables have NB + PAIRS + (NB + 1) + NB rows.
fn per_key_table_rows(chunk: u32) -> u32 {
    let nb = chunk / 16;
    nb + nb * (nb + 1) / 2 + (nb + 1) + nb
}

/// Dynamic shared memory of the recurrent forward.
pub fn recurrent_smem_bytes(cfg: &RecurrentConfig, dk: u32, kind: ForwardKind) -> u32 {
    let (c, pad) = (cfg.chunk, 8);
    let decayed = if kind.per_key {
        c * (dk + pad) // decayed K
    } else {
        c * (cfg.dv_tile + pad) // decayed V
    };
    let elems = cfg.stages * c * (2 * (dk + pad) + cfg.dv_tile + pad) // Q, K, V chunks
        + dk * (cfg.dv_tile + pad) // the state as an MMA operand
        + c * (c + pad) // decayed scores
        + decayed;
    let mut floats = c;
    if kind.normalize {
        floats += c + dk;
    }
    if kind.per_key {
        floats += per_key_table_rows(c) * dk;
    }
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
    /// `[B, H, Dk]`), `cu_seqlens` (i32, may be null: see
    /// [`ArgKind::CuSeqlens`]), then the sizes B, H, S. The backward's states pass
    /// ([`recurrent_states`]) has no `o` without a normaliser and takes the
    /// workspaces `states` (and `norm_states`, `row_n`) before the sizes.
    pub args: Vec<ArgKind>,
    pub dk: u32,
    pub dv: u32,
    pub config: RecurrentConfig,
    /// Whether the variant has a normaliser (`normalize`): then the kernel
    /// takes `norm_in` and `norm_out`.
    pub normalized: bool,
    /// Whether this is the sm_90a wgmma kernel (else the `mma.sync` one).
    pub wgmma: bool,
    /// Whether the kernel can run chains in sequence segments
    /// ([`SegmentSplit`](super::recurrent_wgmma::SegmentSplit)): the wgmma
    /// kernel (which then takes the schedule's arguments).
    pub segments: bool,
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
    /// The decay is per key dimension (GLA's).
    per_key: bool,
    normalize: bool,
    /// The backward's states pass: write the state before each chunk.
    save_states: bool,
    /// Whether the kernel computes the output (the states pass of a variant
    /// without normaliser does not).
    emit_o: bool,
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
    chunked_forward(variant, dk, dv, cfg, false)
}

/// The states pass of the recurrent backward: the forward template writing
/// the state before each chunk (`states`, `[B, H, chunks, Dk, Dv]` in the
/// element type) and the final state; for a variant with a normaliser also
/// the key sum before each chunk (`norm_states`, f32 `[B, H, chunks, Dk]`),
/// the output before normalisation (`o`) and the rows' normalisers (`row_n`,
/// f32 `[B, H, S]`). Without a normaliser it computes no output.
pub fn recurrent_states(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &RecurrentConfig,
) -> Result<RecurrentSource, CompileError> {
    chunked_forward(variant, dk, dv, cfg, true)
}

/// What every recurrent template (CUDA and HIP) requires of a variant and
/// its head dims: the recurrent pattern, head dims matching the variant's
/// fixed sizes, Dk a power of two from 16 to 256, Dv a multiple of 32 up to
/// 512, and no custom input read by index.
pub(crate) fn check_recurrent_dims(
    variant: &Variant,
    dk: u32,
    dv: u32,
) -> Result<&Recurrent, CompileError> {
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
    refuse_indexed_inputs(variant)?;
    Ok(rec)
}

/// What the recurrent templates require of a variant, its head dims and the
/// configuration; returns the variant's recurrent body and the state tiling.
fn check_recurrent_inputs<'v>(
    variant: &'v Variant,
    dk: u32,
    dv: u32,
    cfg: &RecurrentConfig,
) -> Result<(&'v Recurrent, (u32, u32, u32)), CompileError> {
    let rec = check_recurrent_dims(variant, dk, dv)?;
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
    let tiling = state_tiling(dk, cfg.dv_tile, cfg.warps).map_err(CompileError)?;
    Ok((rec, tiling))
}

fn chunked_forward(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &RecurrentConfig,
    save_states: bool,
) -> Result<RecurrentSource, CompileError> {
    let (rec, (state_warps_m, state_m_tiles, state_n_tiles)) =
        check_recurrent_inputs(variant, dk, dv, cfg)?;
    let normalize = rec.normalize.is_some();
    let per_key = per_key_decay(rec);
    if per_key && normalize {
        return Err(CompileError(format!(
            "`{}` decays per key dimension (`decay = |b, h, t, d| …`) and has a normaliser: the chunked kernels take a normaliser with a scalar decay per head and step only so far",
            variant.name
        )));
    }
    if cfg.wgmma && !save_states && !normalize && !per_key {
        return wgmma_forward(variant, rec, dk, dv, cfg);
    }
    let emit_o = !save_states || normalize;

    let kernel_name = format!(
        "aec_rec_{}_{}_{}_d{dk}x{dv}_c{}v{}s{}b{}",
        if save_states { "states" } else { "fwd" },
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
        per_key,
        normalize,
        save_states,
        emit_o,
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template: {e}")))?;
    let args = forward_args(variant, emit_o, normalize, save_states);
    Ok(RecurrentSource {
        name: kernel_name,
        source,
        threads: cfg.warps * WARP_SIZE,
        smem_bytes: recurrent_smem_bytes(cfg, dk, ForwardKind { normalize, per_key }),
        args,
        dk,
        dv,
        config: *cfg,
        normalized: normalize,
        wgmma: false,
        segments: false,
    })
}

/// The arguments every recurrent kernel starts with: q, k, v, then `fourth`
/// (the output `o`, or the backward's `do`) where given, then the custom
/// inputs.
pub(crate) fn leading_args(variant: &Variant, fourth: Option<&'static str>) -> Vec<ArgKind> {
    let mut args = vec![
        ArgKind::Tensor("q"),
        ArgKind::Tensor("k"),
        ArgKind::Tensor("v"),
    ];
    args.extend(fourth.map(ArgKind::Tensor));
    args.extend(
        variant
            .customs
            .iter()
            .map(|c| ArgKind::Custom(c.name.clone())),
    );
    args
}

/// The forward's arguments in launch order (see [`RecurrentSource::args`]).
pub(crate) fn forward_args(
    variant: &Variant,
    emit_o: bool,
    normalize: bool,
    save_states: bool,
) -> Vec<ArgKind> {
    let mut args = leading_args(variant, emit_o.then_some("o"));
    args.extend([ArgKind::State("state_in"), ArgKind::State("state_out")]);
    if normalize {
        args.extend([ArgKind::State("norm_in"), ArgKind::State("norm_out")]);
    }
    if save_states {
        args.push(ArgKind::Workspace("states"));
        if normalize {
            args.extend([
                ArgKind::Workspace("norm_states"),
                ArgKind::Workspace("row_n"),
            ]);
        }
    }
    args.push(ArgKind::CuSeqlens);
    args.extend([Axis::B, Axis::H, Axis::S].map(ArgKind::Size));
    args
}

/// One kernel of the recurrent backward.
#[derive(Clone, Debug)]
pub struct RecurrentBackwardKernel {
    pub name: String,
    pub threads: u32,
    pub smem_bytes: u32,
    /// The grid's x extent (y is H, z is B).
    pub grid_x: RecurrentGridX,
}

/// How a recurrent backward kernel's grid x extent follows from the sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecurrentGridX {
    /// `Dv / n`: Dv slices.
    DvSlices(u32),
    /// `ceil(S / chunk) · n`: chunks, each split in `n`.
    Chunks(u32),
    /// `ceil(S / n)`: row groups.
    Rows(u32),
    /// 1.
    One,
}

impl RecurrentGridX {
    /// The x extent for `dv` and `s` steps with chunks of `chunk`.
    pub fn extent(self, dv: u32, s: usize, chunk: u32) -> usize {
        match self {
            RecurrentGridX::DvSlices(n) => (dv / n) as usize,
            RecurrentGridX::Chunks(n) => s.div_ceil(chunk as usize) * n as usize,
            RecurrentGridX::Rows(n) => s.div_ceil(n as usize),
            RecurrentGridX::One => 1,
        }
    }
}

/// The generated recurrent backward: the states pass (a forward writing the
/// state before each chunk) and, in one more source, the kernels that take
/// the same argument list ([`args`](Self::args)), launched in the order of
/// [`kernels`](Self::kernels): `_pre` (with a normaliser), `_dstate`,
/// `_dqk`, `_dv`, `_decay` (with a decay).
#[derive(Clone, Debug)]
pub struct RecurrentBackwardSource {
    pub states: RecurrentSource,
    pub name: String,
    pub source: String,
    pub kernels: Vec<RecurrentBackwardKernel>,
    /// Launch order of every backward kernel: q, k, v, `do`, the custom
    /// inputs and their gradients (f32, added to: zero them), `d_state_out`
    /// (the final state's gradient, f32 `[B, H, Dk, Dv]`, may be null),
    /// `d_state_in` (the initial state's gradient, written, may be null),
    /// the workspaces `states` and `dstates` (`[B, H, chunks, Dk, Dv]`, the
    /// element type); with a normaliser `d_norm_out`, `d_norm_in` (f32
    /// `[B, H, Dk]`, may be null), `norm_states`, `dnorm_states` (f32
    /// `[B, H, chunks, Dk]`), `o_raw` (the element type, `[B, H, S, Dv]`),
    /// `row_n` (f32 `[B, H, S]`), `dob` (like `o_raw`), `dn` (like `row_n`);
    /// with a decay `dlog` (f32 `[B, H, S]`, or `[B, H, S, Dk]` for a decay
    /// per key dimension; zeroed); then dq, dk, dv,
    /// `cu_seqlens` (null, or a packed batch's N + 1 boundaries followed by
    /// its N + 1 chunk offsets, which place each sequence's chunks in the
    /// per-chunk workspaces) and the sizes B, H, S. The states pass takes the forward's arguments (its
    /// `state_out` and `norm_out` may be null) and the workspaces `states`
    /// (and `norm_states`, `row_n`, and `o` for `o_raw`).
    pub args: Vec<ArgKind>,
    pub dk: u32,
    pub dv: u32,
    pub config: RecurrentConfig,
    pub normalized: bool,
    pub decay: bool,
    /// The decay is per key dimension: `dlog` is f32 `[B, H, S, Dk]` and
    /// the `_decay` kernel runs one block per chunk.
    pub per_key: bool,
}

#[derive(Template)]
#[template(path = "cuda/recurrent_bwd.cu", escape = "none")]
struct RecurrentBwdTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: ElemSpelling,
    chunk: u32,
    dk: u32,
    dv: u32,
    dv_tile: u32,
    dk_tile: u32,
    e_tile: u32,
    warps: u32,
    warp_size: u32,
    stages: u32,
    dv_stages: u32,
    /// Blocks per multiprocessor the `_dqk` kernel asks for (1 or 2).
    dqk_blocks: u32,
    state_warps_m: u32,
    state_m_tiles: u32,
    state_n_tiles: u32,
    params_fields: &'a str,
    params_init: &'a str,
    custom_args: &'a str,
    extra_args: &'a str,
    regions: &'a str,
    bwd_regions: &'a str,
    grads_len: usize,
    norm_grads: usize,
    grads_q: &'a str,
    grads_k: &'a str,
    grads_v: &'a str,
    grads_decay: &'a str,
    norm_grad_atomics: &'a str,
    modify_q: bool,
    modify_k: bool,
    modify_v: bool,
    decay: bool,
    per_key: bool,
    normalize: bool,
}

/// Shared memory of the backward's kernels: (`_dstate`, `_dqk`, `_dv` with
/// `dv_stages` Dv-step buffers).
fn recurrent_bwd_smem(
    cfg: &RecurrentConfig,
    dk: u32,
    tiles: (u32, u32),
    dv_stages: u32,
    kind: ForwardKind,
) -> (u32, u32, u32) {
    let (c, pad, e) = (cfg.chunk, 8, cfg.elem.bytes());
    let (dkt, et) = tiles;
    let normalize = kind.normalize;
    // A decay per key dimension: cumulative log decays per key (`_dstate`,
    // `_dqk`), block-relative copies of Q̃ and K̃ (`_dqk`), the forward's
    // factor tables (`_dv`).
    let nb = c / 16;
    let (key_dstate, key_dqk_elems, key_dqk, key_dv) = if kind.per_key {
        (
            (c + nb) * dk,
            2 * c * (dkt + pad),
            (c + nb + 1) * dkt,
            per_key_table_rows(c) * dk,
        )
    } else {
        (0, 0, 0, 0)
    };
    // dÕ's buffers, and without a per-key decay dÕ decayed to the chunk's start.
    let do_tiles = cfg.stages + u32::from(!kind.per_key);
    let dstate = (cfg.stages * c * (dk + pad)
        + do_tiles * c * (cfg.dv_tile + pad)
        + dk * (cfg.dv_tile + pad))
        * e
        + (c + if normalize { c + dk } else { 0 } + key_dstate) * 4;
    let dqk = (2 * c * (dkt + pad)
        + 4 * c * (et + pad)
        + 4 * dkt * (et + pad)
        + c * (c + pad)
        + key_dqk_elems)
        * e
        + (c + if normalize { c + 2 * dkt } else { 0 } + key_dqk) * 4;
    let dv = (2 * c * (dk + pad) + c * (c + pad) + dv_stages * (c + dk) * (et + pad)) * e
        + (c + key_dv) * 4;
    (dstate, dqk, dv)
}

/// The backward kernels' parameters between `dstates` and `dq` (see
/// [`RecurrentBackwardSource::args`]), as C parameter declarations.
pub(crate) fn backward_extra_params(normalize: bool, decay: bool) -> String {
    let mut extra = String::new();
    if normalize {
        extra.push_str(
            "const float* __restrict__ d_norm_out, float* __restrict__ d_norm_in, \
             const float* __restrict__ norm_states, float* __restrict__ dnorm_states, \
             const elem_t* __restrict__ o_raw, const float* __restrict__ row_n, \
             elem_t* __restrict__ dob, float* __restrict__ dn, ",
        );
    }
    if decay {
        extra.push_str("float* __restrict__ dlog, ");
    }
    extra
}

/// The backward kernels' arguments in launch order (see
/// [`RecurrentBackwardSource::args`]).
pub(crate) fn backward_args(variant: &Variant, normalize: bool, decay: bool) -> Vec<ArgKind> {
    let mut args = leading_args(variant, Some("do"));
    for c in &variant.customs {
        args.push(ArgKind::CustomGrad(c.name.clone()));
    }
    args.extend([
        ArgKind::State("d_state_out"),
        ArgKind::State("d_state_in"),
        ArgKind::Workspace("states"),
        ArgKind::Workspace("dstates"),
    ]);
    if normalize {
        args.extend([
            ArgKind::State("d_norm_out"),
            ArgKind::State("d_norm_in"),
            ArgKind::Workspace("norm_states"),
            ArgKind::Workspace("dnorm_states"),
            ArgKind::Workspace("o_raw"),
            ArgKind::Workspace("row_n"),
            ArgKind::Workspace("dob"),
            ArgKind::Workspace("dn"),
        ]);
    }
    if decay {
        args.push(ArgKind::Workspace("dlog"));
    }
    args.extend([
        ArgKind::Tensor("dq"),
        ArgKind::Tensor("dk"),
        ArgKind::Tensor("dv"),
        ArgKind::CuSeqlens,
    ]);
    args.extend([Axis::B, Axis::H, Axis::S].map(ArgKind::Size));
    args
}

/// The recurrent backward of `variant` for head dims `dk`, `dv` on `isa`
/// (whose shared memory decides how many buffers the `_dv` kernel gets).
pub fn recurrent_backward(
    variant: &Variant,
    dk: u32,
    dv: u32,
    cfg: &RecurrentConfig,
    isa: Isa,
) -> Result<RecurrentBackwardSource, CompileError> {
    if dk < 32 {
        return Err(CompileError(format!(
            "head dimension Dk = {dk} is not supported by the recurrent backward template: it takes 32, 64, 128 or 256"
        )));
    }
    if cfg.chunk != BACKWARD_CHUNK {
        return Err(CompileError(format!(
            "chunk = {} is not supported by the recurrent backward: it takes {BACKWARD_CHUNK}-step chunks (RecurrentConfig::backward_for gives its configuration for any forward's)",
            cfg.chunk
        )));
    }
    let (rec, (state_warps_m, state_m_tiles, state_n_tiles)) =
        check_recurrent_inputs(variant, dk, dv, cfg)?;
    let states = recurrent_states(variant, dk, dv, cfg)?;
    let normalize = rec.normalize.is_some();
    let decay = rec.decay.is_some();
    let per_key = per_key_decay(rec);
    let kind = ForwardKind { normalize, per_key };
    let dk_tile = dk.min(64);
    let e_tile = if dv.is_multiple_of(64) { 64 } else { 32 };
    let limit = isa.max_dynamic_smem();
    let dv_stages = if recurrent_bwd_smem(cfg, dk, (dk_tile, e_tile), 2, kind).2 <= limit {
        2
    } else {
        1
    };
    let (smem_dstate, smem_dqk, smem_dv) =
        recurrent_bwd_smem(cfg, dk, (dk_tile, e_tile), dv_stages, kind);
    if let Some(over) = [smem_dstate, smem_dqk, smem_dv]
        .into_iter()
        .find(|&b| b > limit)
    {
        return Err(CompileError(format!(
            "the recurrent backward for Dk = {dk}, Dv = {dv} needs {over} bytes of shared memory per block, more than the {limit} an {isa:?} block may use: use `stages: 1` or a smaller `dv_tile`"
        )));
    }

    // Two `_dqk` blocks per multiprocessor where their shared memory fits:
    // one block's loads and barriers then overlap the other's GEMMs.
    let dqk_blocks = if 2 * smem_dqk <= isa.smem_per_sm(2) {
        2
    } else {
        1
    };
    let kernel_name = format!(
        "aec_rec_bwd_{}_{}_d{dk}x{dv}_c{}v{}s{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.chunk,
        cfg.dv_tile,
        cfg.stages,
    );
    let customs = custom_params(variant.customs.len(), true);
    let regions = recurrent_closures(variant);
    let (bwd_regions, grads_len) = recurrent_backward_closures(variant);
    let bwd = &rec.backward;
    // Custom gradients go through the template's `grad_add` (one atomic per
    // warp where all its lanes add to one element, as Mamba2's `a[h]` from
    // every step).
    let atomics = |r: &Option<aec_frontend::ir::Region>, indent: &str| {
        r.as_ref()
            .map(|r| grad_atomics(variant, r, "true", indent).replace("atomicAdd(", "grad_add("))
            .unwrap_or_default()
    };
    let extra = backward_extra_params(normalize, decay);
    let template = RecurrentBwdTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(cfg.elem),
        chunk: cfg.chunk,
        dk,
        dv,
        dv_tile: cfg.dv_tile,
        dk_tile,
        e_tile,
        warps: cfg.warps,
        warp_size: WARP_SIZE,
        stages: cfg.stages,
        dv_stages,
        dqk_blocks,
        state_warps_m,
        state_m_tiles,
        state_n_tiles,
        params_fields: &customs.fields,
        params_init: &customs.init,
        custom_args: &customs.args,
        extra_args: &extra,
        regions: &regions,
        bwd_regions: &bwd_regions,
        grads_len,
        norm_grads: grads_len,
        grads_q: &atomics(&bwd.modify_q, "            "),
        grads_k: &atomics(&bwd.modify_k, "            "),
        grads_v: &atomics(&bwd.modify_v, "                "),
        grads_decay: &atomics(&bwd.decay, "            "),
        norm_grad_atomics: &atomics(&bwd.normalize, "        "),
        modify_q: rec.modify_q.is_some(),
        modify_k: rec.modify_k.is_some(),
        modify_v: rec.modify_v.is_some(),
        decay,
        per_key,
        normalize,
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template: {e}")))?;

    let args = backward_args(variant, normalize, decay);

    let threads = cfg.warps * WARP_SIZE;
    let kernel = |suffix: &str, smem_bytes: u32, grid_x: RecurrentGridX| RecurrentBackwardKernel {
        name: format!("{kernel_name}_{suffix}"),
        threads,
        smem_bytes,
        grid_x,
    };
    let mut kernels = Vec::new();
    if normalize {
        kernels.push(kernel("pre", 0, RecurrentGridX::Rows(cfg.warps)));
    }
    kernels.push(kernel(
        "dstate",
        smem_dstate,
        RecurrentGridX::DvSlices(cfg.dv_tile),
    ));
    kernels.push(kernel(
        "dqk",
        smem_dqk,
        RecurrentGridX::Chunks(dk / dk_tile),
    ));
    kernels.push(kernel("dv", smem_dv, RecurrentGridX::Chunks(1)));
    if decay {
        let grid = if per_key {
            RecurrentGridX::Chunks(1)
        } else {
            RecurrentGridX::One
        };
        kernels.push(kernel("decay", 0, grid));
    }
    Ok(RecurrentBackwardSource {
        states,
        name: kernel_name,
        source,
        kernels,
        args,
        dk,
        dv,
        config: *cfg,
        normalized: normalize,
        decay,
        per_key,
    })
}
