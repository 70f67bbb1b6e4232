//! The sm_90a recurrent forward (templates/cuda/recurrent_fwd_sm90.cu): a
//! state warpgroup and an output warpgroup (which also loads), so that the
//! state's chain of chunks overlaps the chunk GEMMs, all of them on `wgmma`.

use super::dialect::{WARP_SIZE, elem_spelling};
use super::forward::ArgKind;
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

/// The largest Dk whose kernel runs segments: at Dk 256 the state warpgroup
/// already holds 128 f32 registers of state per thread and ptxas spills the
/// segment bookkeeping.
const SEGMENTS_MAX_DK: u32 = 128;

/// Segments of a split chain are at least this many chunks long: each
/// segment after the first re-reads its predecessor's K and V to find its
/// entering state, which only pays off over a few chunks.
const MIN_SEGMENT_CHUNKS: u64 = 4;

/// At most this many segments per chain: their entering states are chained
/// one after another through global memory.
const MAX_SEGMENTS: u64 = 16;

/// How the wgmma forward's chains (one per Dv slice, head and sequence, each
/// a walk over the whole sequence) are spread over the GPU.
///
/// One block per multiprocessor fits, so `chains` blocks run in waves of
/// `sms`; a last wave of a few chains would leave most multiprocessors idle
/// for a whole chain's time. Instead the first `whole` chains (full waves)
/// run as they are and each of the last `tail` chains is cut into `segments`
/// pieces of its sequence that run side by side. Segment `p > 0` first runs
/// the state recurrence alone over segment `p − 1` (K and V only), combines
/// it with the state entering segment `p − 1` — the initial state for
/// `p = 1`, otherwise published by that segment's block through the `carry`
/// workspace — publishes its own entering state for segment `p + 1` and then
/// runs the full chunked forward over its steps. Blocks take their work in
/// launch order from a counter in the `sched` workspace, so a block only
/// waits on work already taken by a running block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSplit {
    /// Chains run whole (the first ones, in (slice, head, sequence) order).
    pub whole: u32,
    /// Chains cut into segments (the rest).
    pub tail: u32,
    /// Segments per cut chain (1: nothing is cut).
    pub segments: u32,
}

impl SegmentSplit {
    /// The split for `chains` chains of at most `chunks` chunks on `sms`
    /// multiprocessors: no cut when the chains fill whole waves, or when
    /// too few chunks or too many tail chains leave fewer than two segments
    /// of at least [`MIN_SEGMENT_CHUNKS`] chunks each; otherwise the tail
    /// chains get as many segments (at most [`MAX_SEGMENTS`]) as fit into
    /// one wave.
    pub fn for_launch(chains: u64, chunks: u64, sms: u32) -> SegmentSplit {
        let whole_only = SegmentSplit {
            whole: u32::try_from(chains).unwrap_or(u32::MAX),
            tail: 0,
            segments: 1,
        };
        let sms = u64::from(sms.max(1));
        let tail = chains % sms;
        if tail == 0 {
            return whole_only;
        }
        let segments = (sms / tail)
            .min(chunks / MIN_SEGMENT_CHUNKS)
            .min(MAX_SEGMENTS);
        if segments < 2 {
            return whole_only;
        }
        SegmentSplit {
            whole: u32::try_from(chains - tail).unwrap_or(u32::MAX),
            tail: tail as u32, // < sms
            segments: segments as u32,
        }
    }

    /// Blocks to launch: one per whole chain and per segment.
    pub fn blocks(&self) -> u64 {
        u64::from(self.whole) + u64::from(self.tail) * u64::from(self.segments)
    }

    /// i32 elements of the `sched` workspace (zeroed before each launch):
    /// the work counter and one ready flag per segment.
    pub fn sched_len(&self) -> usize {
        1 + self.tail as usize * self.segments as usize
    }

    /// f32 elements of the `carry` workspace: one DK × 64 entering state per
    /// segment.
    pub fn carry_len(&self, dk: u32) -> usize {
        self.tail as usize * self.segments as usize * dk as usize * DV_SLICE as usize
    }

    /// The value of kernel argument [`ArgKind::Segments`]`(name)`.
    pub fn arg(&self, name: &str) -> Option<u32> {
        match name {
            "n_whole" => Some(self.whole),
            "n_tail" => Some(self.tail),
            "n_seg" => Some(self.segments),
            _ => None,
        }
    }
}

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
    /// 1: the kernel can run a segment schedule (`SEGMENTS`).
    segments: u32,
}

/// The wgmma forward's arguments: the forward's (see
/// [`RecurrentSource::args`]) with the segment schedule — the `sched` and
/// `carry` workspaces before the sizes, `n_whole`, `n_tail`, `n_seg` after
/// them ([`SegmentSplit`]).
fn wgmma_forward_args(variant: &Variant) -> Vec<ArgKind> {
    let mut args = forward_args(variant, true, false, false);
    let sizes = args
        .iter()
        .position(|a| matches!(a, ArgKind::Size(_)))
        .unwrap_or(args.len());
    args.splice(
        sizes..sizes,
        [ArgKind::Workspace("sched"), ArgKind::Workspace("carry")],
    );
    args.extend(["n_whole", "n_tail", "n_seg"].map(ArgKind::Segments));
    args
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
    let segments = dk <= SEGMENTS_MAX_DK;
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
        segments: u32::from(segments),
    };
    let source = template
        .render()
        .map_err(|e| CompileError(format!("template: {e}")))?;
    Ok(RecurrentSource {
        name: kernel_name,
        source,
        threads: WARPS * WARP_SIZE,
        smem_bytes: wgmma_smem_bytes(cfg, dk, u32::from(q_row) + u32::from(v_row)),
        args: wgmma_forward_args(variant),
        dk,
        dv,
        config: *cfg,
        normalized: false,
        wgmma: true,
        segments,
    })
}
