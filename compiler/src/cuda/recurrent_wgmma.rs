//! The sm_90a recurrent forward (templates/cuda/recurrent_fwd_sm90.cu): a
//! state warpgroup and an output warpgroup (which also loads), so that the
//! state's chain of chunks overlaps the chunk GEMMs, all of them on `wgmma`.

use super::dialect::{WARP_SIZE, elem_spelling};
use super::forward::ArgKind;
use super::recurrent::{BACKWARD_CHUNK, RecurrentConfig, RecurrentSource, forward_args};
use super::wgmma::{Form, wgmma_fns};
use crate::CompileError;
use crate::cxx::closures::{custom_params, recurrent_closures, row_scale_factor, split_reads_fn};
use aec_frontend::Variant;
use aec_frontend::variant::Recurrent;
use askama::Template;

/// Dv columns per block of the wgmma forward: one 128-byte swizzle panel.
const DV_SLICE: u32 = 64;

/// Warps of the wgmma forward: two warpgroups.
const WARPS: u32 = 8;

/// Segments of a split chain are at least this many chunks long: all but
/// the last also run once for the state alone (K and V read twice), which
/// only pays off over a few chunks.
pub const MIN_SEGMENT_CHUNKS: u64 = 4;

/// At most this many segments per chain: the last one folds the states of
/// all the others.
pub const MAX_SEGMENTS: u64 = 16;

/// How the wgmma forward's chains (one per Dv slice, head and sequence, each
/// a walk over the whole sequence) are spread over the GPU.
///
/// One block per multiprocessor fits, so `chains` blocks run in waves of
/// `sms`; a last wave of a few chains would leave most multiprocessors idle
/// for a whole chain's time. Instead the first `whole` chains (full waves)
/// run as they are and each of the last `tail` chains is cut into `segments`
/// pieces of its sequence that run side by side. For that, segments
/// `0 … segments − 2` of each cut chain first run for the state alone (K and
/// V only, from a zero state; blocks taken before the whole chains, so they
/// overlap them) and publish it with its total decay in the `carry`
/// workspace; segment `p` then starts from the initial state with the
/// published segments before it folded on. Blocks take their work in launch
/// order from a counter in the `sched` workspace (which also holds the
/// published flags), so a block only waits on work already taken by a
/// running block.
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

    /// Segments run for the state alone: all but the last of each cut chain.
    fn published(&self) -> u64 {
        u64::from(self.tail) * u64::from(self.segments.saturating_sub(1))
    }

    /// Blocks to launch: one per whole chain, per segment and per segment
    /// run for the state alone.
    pub fn blocks(&self) -> u64 {
        u64::from(self.whole) + u64::from(self.tail) * u64::from(self.segments) + self.published()
    }

    /// i32 elements of the `sched` workspace (zeroed before each launch):
    /// the work counter and one flag per published segment.
    pub fn sched_len(&self) -> usize {
        1 + self.published() as usize
    }

    /// f32 elements of the `carry` workspace: per published segment a
    /// DK × 64 state and its total log2 decay, then per later segment the
    /// DK × 64 state it enters with.
    pub fn carry_len(&self, dk: u32) -> usize {
        self.published() as usize * (2 * dk as usize * DV_SLICE as usize + 1)
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
/// staged states, two chunks of Ṽ decayed (the next visit's is made while
/// this one's update runs), two chunks of the decay's prefix sums and of
/// each row-scale modification's factors, and 1 KiB to align the swizzled
/// panels.
pub fn wgmma_smem_bytes(cfg: &RecurrentConfig, dk: u32, row_scales: u32) -> u32 {
    let c = cfg.chunk;
    let elems = 2 * c * (2 * dk + DV_SLICE) + 2 * dk * DV_SLICE + 2 * c * DV_SLICE;
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
    if cfg.chunk != BACKWARD_CHUNK {
        return Err(CompileError(format!(
            "chunk = {} is not supported by the wgmma recurrent forward: its output warpgroup's 64-row tiles are one chunk of {BACKWARD_CHUNK} steps; set wgmma: false for other chunks",
            cfg.chunk
        )));
    }
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
    // The row factors split into their input reads and their arithmetic
    // like the decay (`recurrent_closures`), so that the reads go out a
    // chunk ahead.
    let mut regions = recurrent_closures(variant);
    let mut row_scale = |m: &Option<aec_frontend::ir::Region>, name: &str| {
        let r = m.as_ref()?;
        let factor = row_scale_factor(r)?;
        regions.push_str(&split_reads_fn(variant, r, factor, &format!("{name}_row")));
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
        args: wgmma_forward_args(variant),
        dk,
        dv,
        config: *cfg,
        normalized: false,
        wgmma: true,
        segments: true,
    })
}

#[cfg(test)]
mod tests {
    use super::SegmentSplit;

    #[test]
    fn segment_split_cuts_only_a_partial_last_wave() {
        // Mamba2's benchmark workload on 132 SMs: 160 chains, 64 chunks.
        let m = SegmentSplit::for_launch(160, 64, 132);
        assert_eq!((m.whole, m.tail, m.segments), (132, 28, 4));
        assert_eq!(m.blocks(), 132 + 28 * 4 + 28 * 3);
        assert_eq!(m.sched_len(), 1 + 28 * 3);
        assert_eq!(m.carry_len(128), 28 * 3 * (2 * 128 * 64 + 1));
        assert_eq!(
            [m.arg("n_whole"), m.arg("n_tail"), m.arg("n_seg")],
            [Some(132), Some(28), Some(4)]
        );
        assert_eq!(m.arg("B"), None);
        // Gated retention: 320 chains, two full waves and 56 left.
        let g = SegmentSplit::for_launch(320, 64, 132);
        assert_eq!((g.whole, g.tail, g.segments), (264, 56, 2));
        // Few chains over a long sequence: as many segments as the cap.
        let few = SegmentSplit::for_launch(4, 1000, 132);
        assert_eq!((few.whole, few.tail, few.segments), (0, 4, 16));
        // Whole waves, short sequences or a nearly full last wave: no cut.
        for (chains, chunks) in [(264, 64), (4, 7), (130, 64)] {
            let s = SegmentSplit::for_launch(chains, chunks, 132);
            assert_eq!(
                (s.whole, s.tail, s.segments),
                (chains as u32, 0, 1),
                "{chains} {chunks}"
            );
            assert_eq!(s.blocks(), chains);
            assert_eq!((s.sched_len(), s.carry_len(256)), (1, 0));
        }
    }
}
