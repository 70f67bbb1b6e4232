//! The parallel forward kernel: the template's fixed skeleton (tiles, copies,
//! `mma.sync`, the online loop) filled with a variant's regions.

use super::dialect::{Elem, ElemSpelling, Isa, WARP_SIZE, elem_spelling};
use super::wgmma::{Form, MAX_N, PANEL_COLS, wgmma_fns};
use crate::CompileError;
use crate::combine::combine_plan;
use crate::cxx::closures::{
    CustomParams, MAX_FORWARD_DQK, custom_params, parallel_inputs, reads, row_output_names,
    scores_read_customs_by_position,
};
use crate::cxx::regions::{forward_regions, implies_causal, is_causal, state_init};
use crate::launch_plan::SizeExpr;
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op};
use askama::Template;

/// Tile configuration of the forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ForwardConfig {
    /// Query rows per thread block: 16, 32, 64 or 128, or on the
    /// warp-specialised `wgmma` forward 192 (three consumer warpgroups on
    /// 160 registers each, 12 warps; H200: 15-20% slower than 128 rows for
    /// DeepSeek and d128 softmax, bench/NOTES.md session 65, so no default).
    pub block_m: u32,
    /// Keys per inner-loop step.
    pub block_n: u32,
    /// Warps per block; each owns `block_m / warps` rows (16 or 32: one or
    /// two MMA row tiles sharing every K and V fragment).
    pub warps: u32,
    pub elem: Elem,
    /// Rows are the (query head, position) pairs of all query heads that
    /// share a KV head (grid `(ceil(H/Hkv · Sq / block_m), Hkv, B)`): every
    /// K/V tile serves the whole group. For decoding, where `Sq` is tiny.
    pub pack_gqa: bool,
    /// Both GEMMs on Hopper's warpgroup MMA (`wgmma`, sm_90a only): one
    /// warpgroup (4 warps) per 64 rows, each warp 16 rows, K and V read by
    /// the tensor cores from 128-byte-swizzled shared memory. Needs Dqk and
    /// Dv to be multiples of 64, Dv ≤ 256 (one block's slice) and Dqk ≤ 256
    /// with warp specialisation, ≤ 576 without (the decoding tile of
    /// [`for_packed_rows`](Self::for_packed_rows), which also packs query
    /// heads into its rows).
    pub wgmma: bool,
    /// With `wgmma`: one more warpgroup only copies (Q once, K/V blocks into
    /// a ring of `stages` buffers signalled through mbarriers) and gives its registers
    /// to the computing warpgroups (`setmaxnreg`), which then run unsynchronised
    /// so one's softmax overlaps the other's GEMMs. Not with `modify_k` or
    /// `modify_v` (they rewrite the shared K/V tiles).
    pub warp_specialized: bool,
    /// K/V buffers in shared memory, 2 to 4: the blocks being read and
    /// those loading ahead (a deeper ring hides more load latency where
    /// shared memory allows).
    pub stages: u32,
    /// Warp-specialised kernels: each warp keeps its Q rows in registers
    /// as wgmma A fragments, so the S GEMM reads only K from shared memory
    /// (halves its shared-memory traffic; costs Dqk / 4 registers).
    pub q_in_registers: bool,
    /// Blocks that share a row block, each computing `Dv / dv_split` columns
    /// of O (and recomputing the scores): 1, or 2 or 4 where a warp cannot
    /// hold a row tile's accumulators for all of Dv (Dv above 256). The
    /// tile configuration applies to one slice.
    pub dv_split: u32,
    /// Split-KV: the kernel takes a number of KV splits at launch
    /// (`n_splits`, see [`KernelSource::kv_splits`]); with more than one,
    /// blocks write partial rows (unnormalised output, state) that a second
    /// kernel merges with the variant's derived combine
    /// ([`crate::combine`]). For decoding, where few query rows leave the
    /// GPU idle. With warp specialisation not persistent, and merged by the
    /// combine kernel.
    pub split_kv: bool,
    /// Split-KV with the combine in the main kernel (the sm_80 template): the
    /// last of a row block's blocks to finish merges its partial rows, read
    /// back from L2, instead of a second kernel launched after the main one;
    /// a zeroed `split_count` workspace (an i32 per row block, which the
    /// kernel leaves zero) counts the finished blocks. Worth it where the
    /// merge is short for one block: few rows per block against its threads
    /// ([`ForwardConfig::for_decode_shape`] sets it there).
    #[serde(default)]
    pub fused_combine: bool,
    /// With warp specialisation: one CTA per multiprocessor walks the row
    /// blocks (grid `(min(units, SMs), 1, 1)`, see
    /// [`KernelSource::launch_grid`]), so the producer loads the next tile's
    /// Q and K/V while the consumers finish the last one (the pipeline never
    /// drains between tiles). Each unit of work pairs row blocks `x` and
    /// `n - 1 - x` of one head, which under a causal mask cost about the same
    /// together.
    #[serde(default)]
    pub persistent: bool,
    /// V is stored in K: the first `Dv` columns of every K row are V's row
    /// (multi-head latent attention's compressed KV cache, Dqk 576 / Dv 512,
    /// where K and V share storage). The kernel loads only K tiles and reads
    /// P·V's operand from them; the `v` argument is not read. Needs Dv ≤
    /// Dqk and a kernel without warp specialisation (the sm_80 template, or
    /// the `wgmma` decoding tile, which reads V's panels from K's tile).
    #[serde(default)]
    pub v_in_k: bool,
    /// Warps that split every key block between them (1, 2 or 4; the sm_80
    /// template, with a variant whose online state has a split-KV combine):
    /// each takes `block_n / key_warps` keys of each block for all of its
    /// rows, with its own online state, and at the end the partial rows
    /// merge through shared memory (the K/V ring, free by then) with the
    /// variant's derived combine, each key warp merging and writing an
    /// equal share of the O columns (so a warp's columns must be a multiple
    /// of `8 * key_warps`). More warps then share one K/V ring
    /// without more shared memory: decoding's one-warp block issues too
    /// little to keep the memory busy (bench/NOTES.md). `warps` counts
    /// them all: `warps / key_warps` row warps. On `wgmma` with a producer
    /// warpgroup, 2 key warps are two warpgroups over the same 64 rows that
    /// take the key blocks in turn, each block whole (its online step then
    /// runs beside the other warpgroup's GEMMs), in a ring of 3 to 6 stages;
    /// at the end each merges and writes half of the O columns.
    #[serde(default = "one_warp")]
    pub key_warps: u32,
    /// Warps that split Dv between them for the same rows and keys (1 or 2).
    /// On the sm_80 template each computes S over part of Dqk, the pair adds
    /// the parts through shared memory (one barrier of the pair per block),
    /// then each runs the online step and P·V for its half of the columns.
    /// On `wgmma` they are warpgroups: without warp specialisation the first
    /// computes S and the online step and hands P and the row rescale (and
    /// at the end the row state) to the second through shared memory behind
    /// an mbarrier; with it each computes all of S. Either way S is computed
    /// once per block instead of once per Dv slice of `dv_split` — for V
    /// stored in K (MLA's 576-column scores) where the scores are most of
    /// the work. `warps` counts them all.
    #[serde(default = "one_warp")]
    pub dv_warps: u32,
    /// With warp specialisation (ignored without): the producer loads Q, K and V with TMA
    /// tensor copies (`cp.async.bulk.tensor`, one thread issuing a whole
    /// box per 64 columns) instead of 16-byte `cp.async` copies from every
    /// producer thread. The kernel then takes three tensor maps
    /// ([`ArgKind::TensorMap`]) that the launcher encodes per call. Only
    /// where rows are dense and one head's: the variable-length, paged and
    /// block-sparse forwards, packed query heads and V in K keep `cp.async`
    /// ([`KernelSource::tensor_maps`] is empty there). (H100, d128: softmax
    /// 6% faster, causal at 8192 keys 3.6%, DiffTransformer 2.5%;
    /// bench/NOTES.md session 34.)
    #[serde(default)]
    pub tma_loads: bool,
    /// Persistent kernels on rows TMA loads (ignored elsewhere): a tile's
    /// last P·V and epilogue run in the next tile, beside its first S GEMM
    /// (the P·V issued just before it, the rows packed and stored while it
    /// runs), so the tensor cores compute through what was the tile's
    /// drain. Pays where the next tile's Q is ready by then, i.e. in
    /// registers ([`q_in_registers`](Self::q_in_registers)): H100, causal
    /// d128 2-3% and DeepSeek 1.5% faster; with Q in shared memory, loaded
    /// only once the last tile's S GEMMs are done, the stores alone made it
    /// 5% slower; under the sliding window's two-sided mask 3% slower
    /// (bench/NOTES.md session 36).
    #[serde(default)]
    pub late_epilogue: bool,
    /// Persistent kernels on rows TMA loads, without a mask or under a plain
    /// causal one, with one Dv slice and one key warp (ignored elsewhere):
    /// CTAs run in clusters of two (`__cluster_dims__(2, 1, 1)`, grid
    /// `2 · min(⌈units / 2⌉, ⌈SMs / 2⌉)`) that walk adjacent row-block pairs of one
    /// head in step, and each key block both read comes from L2 once: each
    /// CTA copies half its boxes into both CTAs' shared memory (TMA
    /// multicast). Under a causal mask the extra diagonal block of one CTA
    /// is placed so the pair's steps stay aligned, which needs `block_m` a
    /// multiple of `block_n`. Sizes the pairing does not fit (row blocks per
    /// head not a multiple of 4; under a causal mask `Sq ≠ Skv`) run
    /// with each CTA loading its own blocks.
    #[serde(default)]
    pub kv_multicast: bool,
}

/// Whether [`ForwardConfig::late_epilogue`] pays for `variant` where Q is in
/// registers: its mask, if any, is plain causal and no score closure runs
/// per score, as measured (H100: causal d128 2-3%, DeepSeek 1.5% faster;
/// under the sliding window's two-sided mask 3% slower; bench/NOTES.md
/// session 36). The default and the tuner's space both follow it.
pub(crate) fn late_epilogue_pays(variant: &Variant) -> bool {
    variant
        .parallel()
        .is_some_and(|p| p.mask.as_ref().is_none_or(is_causal) && p.modify_scores.is_none())
}

fn one_warp() -> u32 {
    1
}

impl ForwardConfig {
    /// The configuration used when none is tuned. A variant that fixes
    /// `Sq ≤ 16` (decoding) gets one 16-row tile with the query heads of a
    /// group packed into its rows, and 32-key blocks (small blocks let more
    /// of them share an SM, which keeps more loads in flight), split between
    /// two key warps where the online state has a combine (one warp
    /// otherwise; H100: MLA decoding 9% faster, d128/d192 decoding 0.3-1.4%).
    /// Otherwise two 16-row tiles per warp (K/V fragments reused twice) for
    /// Dqk, Dv ≤ 128 — measured 17% faster on causal softmax despite ~120 B
    /// of spills (bench/NOTES.md) — except where the mask reads custom inputs
    /// (270 B of spills); one tile per warp otherwise.
    ///
    /// On sm_90a, prefill shapes whose head dims the swizzled tiles take
    /// (multiples of 64, Dv ≤ 256) use `wgmma`: 128 rows on two warpgroups,
    /// 128-key blocks (64 when Dqk + Dv > 256, to stay within shared memory
    /// and registers; 80 for Dqk up to 192 with Dv ≤ 128, there with Q in
    /// registers: H100, DeepSeek 192/128 causal 0.440 → 0.416 ms,
    /// bench/NOTES.md session 32). Causal masks at Dqk 128 also keep Q in
    /// registers (H100, with TMA loads: 3-6% faster; 6% slower without a
    /// mask, bench/NOTES.md session 35). So do unmasked variants without an
    /// online block at Dqk 64 (ReLU d64: 3.6-7.3% faster on both Hopper
    /// GPUs, bench/NOTES.md session 70). Tiles with Q in registers, no mask
    /// or a plain causal one and no per-score closure run a tile's last P·V
    /// and epilogue beside the next tile's first S GEMM
    /// ([`late_epilogue`](Self::late_epilogue)).
    pub fn default_for(
        variant: &Variant,
        dqk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> ForwardConfig {
        ForwardConfig::default_with(variant, dqk, dv, elem, isa, true)
    }

    /// The default tiles of the forwards whose rows are not one head's dense
    /// matrix (paged, block-sparse; the variable-length one builds on it),
    /// which keep `cp.async` loads: [`default_for`](Self::default_for)'s
    /// without Q in registers under causal masks, which gained nothing
    /// without TMA loads (bench/NOTES.md session 34 item 6) and spilled 36 B
    /// in the variable-length kernel.
    pub fn cp_async_default_for(
        variant: &Variant,
        dqk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> ForwardConfig {
        ForwardConfig::default_with(variant, dqk, dv, elem, isa, false)
    }

    /// [`default_for`](Self::default_for) for rows that TMA loads
    /// (`tma_rows`) or not ([`cp_async_default_for`](Self::cp_async_default_for)).
    fn default_with(
        variant: &Variant,
        dqk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
        tma_rows: bool,
    ) -> ForwardConfig {
        let mask_reads_inputs = variant.parallel().is_some_and(|p| {
            reads(p.mask.as_ref(), |op| {
                matches!(op, Op::Custom(_) | Op::Gather(_))
            })
        });
        let decode = variant
            .fixed_sizes
            .iter()
            .any(|&(a, n)| a == Axis::Sq && n <= 16);
        // Dv above what one block's accumulators hold is split between blocks.
        let dv_split = default_dv_split(dv);
        let dv = dv / dv_split;
        let hopper = isa == Isa::Sm90a && wgmma_dims_ok(dqk, dv);
        let modifies_kv = modifies_kv(variant);
        let combinable = variant
            .parallel()
            .is_some_and(|p| combine_plan(&p.online).is_ok());
        let key_warps = if decode && combinable { 2 } else { 1 };
        // Dqk above 128 with Dv ≤ 128 (DeepSeek's 192/128): S's GEMM on Q
        // from registers (Dqk / 4 of them) halves its shared-memory reads,
        // which otherwise run at the pipe's full rate, and 80 keys fit
        // beside Q's fragments.
        let wide_qk = hopper && dqk > 128 && dqk <= 192 && dv <= 128;
        let q_regs_tile = wide_qk && !tma_rows;
        // With TMA loads the same dims take FlashAttention-3's hdim-192 tile
        // instead: 128 keys with Q in shared memory, which leaves room for
        // two stages only, on K and V barriers of their own (H100, DeepSeek
        // causal: 3.7-5% faster than 80 keys with Q in registers in three
        // rounds, bench/NOTES.md session 44).
        let wide_qk_tile = wide_qk && tma_rows;
        // A causal mask at Dqk 128: Q in registers too (128-key blocks), as
        // measured rather than derived (H100, TMA loads: causal 0.612 →
        // 0.590 ms, s8192 0.987 → 0.955, GQA causal 0.611 → 0.573; without
        // a mask 0.962 → 1.021, so not there). Not where the mask reads
        // custom inputs (the document mask spilled 52 B).
        let causal_q_regs = hopper
            && tma_rows
            && dqk == 128
            && dv <= 128
            && !mask_reads_inputs
            && variant
                .parallel()
                .is_some_and(|p| p.mask.as_ref().is_some_and(implies_causal));
        // Variants without an online block (ReLU, sigmoid: the weights are
        // the modified scores, no row state between the GEMMs) at Dqk 64
        // keep Q in registers too (16 registers), on the same 128-key ring:
        // ReLU d64 1.073x (H100, tuner) and 1.036-1.038x (H200, tuner and
        // interleaved rounds) the tile with Q in shared memory. Not at Dqk
        // 128, where Q's fragments need 96-key blocks: sigmoid d128 ran 7%
        // slower so in interleaved rounds on the H200 (bench/NOTES.md
        // session 70). Unmasked ones only: no masked one was measured.
        let stateless_q_regs = hopper
            && tma_rows
            && dqk <= 64
            && dv <= 64
            && variant
                .parallel()
                .is_some_and(|p| p.online.implicit && p.mask.is_none());
        let (block_m, block_n, warps, pack_gqa) = if decode {
            (16, 32, key_warps, true)
        } else if hopper {
            let block_n = if dqk + dv <= 256 || wide_qk_tile {
                128
            } else if q_regs_tile {
                // Q in registers: 80 keys fit beside them (H100, DeepSeek:
                // 2.5% faster than 64 keys in 4 stages).
                80
            } else {
                // Dv = 256 (DiffTransformer) among others: 64 keys in 4
                // stages, 5% faster than 80 in 3 (H100, three interleaved
                // rounds, bench/NOTES.md session 34; session 16's kernel
                // had measured the opposite).
                64
            };
            (128, block_n, 8, false)
        } else if dv > 128 {
            (64, 32, 4, false)
        } else if dqk <= 128 && !mask_reads_inputs {
            (128, 64, 4, false)
        } else {
            (128, 64, 8, false)
        };
        let warp_specialized = hopper && !decode && !modifies_kv;
        let q_in_registers = warp_specialized && (q_regs_tile || causal_q_regs || stateless_q_regs);
        let mut cfg = ForwardConfig {
            block_m,
            block_n,
            warps,
            elem,
            pack_gqa,
            wgmma: hopper && !decode,
            warp_specialized,
            stages: 2,
            q_in_registers,
            dv_split,
            split_kv: decode && combinable,
            fused_combine: false,
            // Every warp-specialised kernel is persistent: one block per
            // multiprocessor walking pairs of row blocks, whose prologue and
            // epilogue overlap the next tile's loads (H100: 2-11% faster
            // than a block per row block).
            persistent: warp_specialized,
            v_in_k: false,
            key_warps,
            dv_warps: 1,
            tma_loads: warp_specialized,
            late_epilogue: q_in_registers && late_epilogue_pays(variant),
            kv_multicast: false,
        };
        if cfg.warp_specialized {
            // As deep a ring as shared memory holds (up to 4): the pipelined
            // loop keeps two stages busy, the rest hide load latency.
            cfg.stages = (2..=4)
                .rev()
                .find(|&stages| {
                    smem_bytes(&ForwardConfig { stages, ..cfg }, dqk, dv)
                        <= isa.max_dynamic_smem() - WS_STATIC_SMEM
                })
                .unwrap_or(2);
        }
        cfg
    }

    /// The default tiles of the variable-length forward
    /// ([`parallel_forward_varlen`]): [`cp_async_default_for`](Self::cp_async_default_for)'s,
    /// with a block per row block instead of a persistent walk. The
    /// persistent kernel's static stride balances units of one length, not
    /// sequences of many: on an H100 (d128, 16 heads) 16 sequences of
    /// 256–4096 rows took 1.45 ms per block against 1.77 ms persistent, 64
    /// of 64–1024 rows 0.65 against 0.85 ms
    /// (`bench/results/2026-11-23-nvidia-h100-varlen.json`).
    pub fn varlen_default_for(
        variant: &Variant,
        dqk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> ForwardConfig {
        ForwardConfig {
            persistent: false,
            ..ForwardConfig::cp_async_default_for(variant, dqk, dv, elem, isa)
        }
    }

    pub fn warps(&self) -> u32 {
        self.warps
    }

    /// This decoding tile for `rows` packed rows per KV head (`H / Hkv ·
    /// Sq`): with 64 or more, 64-row blocks, which share each K/V tile
    /// instead of four 16-row blocks reading it apiece — on sm_90a `wgmma`
    /// ([`wgmma_packed_tile`](Self::wgmma_packed_tile)), elsewhere four
    /// warps where shared memory holds them (`isa`); otherwise unchanged.
    /// (MLA decoding, 128 heads on one latent KV head, H100: 0.29 → 0.167
    /// ms with the sm_80 tile; bench/NOTES.md.)
    pub fn for_packed_rows(self, rows: usize, dqk: u32, dv: u32, isa: Isa) -> ForwardConfig {
        if !self.pack_gqa || self.wgmma || rows < 64 || self.block_m >= 64 {
            return self;
        }
        if let Some(tile) = self.wgmma_packed_tile(dqk, dv, isa) {
            return tile;
        }
        self.or_if_it_fits(
            ForwardConfig {
                block_m: 64,
                warps: 4 * self.dv_warps.max(1),
                key_warps: 1,
                ..self
            },
            dqk,
            dv,
            isa,
        )
    }

    /// The sm_90a decoding tile for 64 or more packed rows per KV head:
    /// `wgmma` on 64 rows, where the scores are most of the work and
    /// `mma.sync` on four warps per SM cannot keep up.
    ///
    /// - Dqk above 256 (MLA's latent cache, 576): 64-key blocks in two
    ///   stages, Dv split between two warpgroups (in 256-column slices
    ///   between blocks where Dv is wider): the first computes S and the
    ///   online step and hands P and the row rescale to the second through
    ///   shared memory, so S is computed once per block and a K tile feeds
    ///   both (226 KB at Dqk 576, one block per SM); each loads the K
    ///   panels it reads again ([`warpgroup_loads`]: 3% faster on an H200,
    ///   bench/NOTES.md session 68). (H100, 16 sequences ×
    ///   128 heads on one latent KV head: 0.089 → 0.053 ms; both warpgroups
    ///   computing S 0.062, Dv split between blocks 0.069, 128-row blocks on
    ///   32-key blocks, whose S GEMM is bound by shared memory, 0.075;
    ///   bench/NOTES.md session 38.)
    /// - Dqk up to 256: one warpgroup on 128-key blocks in three stages
    ///   where they fit, else two, else 64-key blocks. (H100, MQA d128, 16
    ///   sequences × 128 heads on one KV head: 0.031 → 0.023 ms; 64-key
    ///   blocks 0.026, 128-row blocks 0.026, the sm_80 64-row tile with
    ///   64-key blocks 0.028; bench/NOTES.md session 39.)
    ///
    /// `None` elsewhere, or where the dims or shared memory do not allow it.
    /// ([`for_packed_rows`](Self::for_packed_rows) has checked the rows.)
    fn wgmma_packed_tile(self, dqk: u32, dv: u32, isa: Isa) -> Option<ForwardConfig> {
        // Dv in slices of at most two warpgroups' N (the latent tile splits
        // them between its two warpgroups), else one's.
        let latent = dqk > 256;
        let widest = if latent { 2 * MAX_N } else { MAX_N };
        let dv_split = [1, 2, 4]
            .into_iter()
            .find(|&n| dv.is_multiple_of(n) && dv / n <= widest)?;
        let slice = dv / dv_split;
        let dv_warps = if latent && slice.is_multiple_of(2 * PANEL_COLS) {
            2
        } else {
            1
        };
        if isa != Isa::Sm90a || !wgmma_decoding_dims_ok(dqk, slice / dv_warps) {
            return None;
        }
        let rings: &[(u32, u32)] = if latent {
            &[(64, 2)]
        } else {
            &[(128, 3), (128, 2), (64, 3), (64, 2)]
        };
        rings.iter().find_map(|&(block_n, stages)| {
            let tile = ForwardConfig {
                block_m: 64,
                block_n,
                warps: 4 * dv_warps,
                wgmma: true,
                stages,
                dv_split,
                key_warps: 1,
                dv_warps,
                fused_combine: false,
                ..self
            };
            tile_fits(&tile, dqk, dv, isa).then_some(tile)
        })
    }

    /// This tile with a producer warpgroup in the form decoding takes it:
    /// warp-specialised, without the persistent walk, TMA loads, Q in
    /// registers, the late epilogue or the fused combine (the producer
    /// copies K/V by `cp.async`, one row block per block).
    pub fn with_producer_warpgroup(self) -> ForwardConfig {
        ForwardConfig {
            warp_specialized: true,
            persistent: false,
            tma_loads: false,
            q_in_registers: false,
            late_epilogue: false,
            fused_combine: false,
            ..self
        }
    }

    /// This decoding tile with a producer warpgroup where it is
    /// [`wgmma_packed_tile`](Self::wgmma_packed_tile)'s one warpgroup on
    /// Dqk up to 256: the producer copies K/V (`cp.async`) into the ring.
    /// At Dqk and Dv up to 128, two key warpgroups take the 64 rows' key
    /// blocks in turn (`key_warps: 2`; each one's online step runs beside
    /// the other's GEMMs) on 96-key blocks in four stages; otherwise, or
    /// where those do not fit, one warpgroup issuing each block's S GEMM
    /// with the previous block's P·V on 128-key blocks in three stages.
    /// Not for `variant`s that modify k or v (they rewrite the shared
    /// tiles, which the producer's ring does not allow), and not with two
    /// stages, where the producer measured slower. (H200, MQA d128, 16
    /// sequences × 128 heads on one KV head, interleaved rounds: 20.07 →
    /// 18.05 µs with the producer, then 18.10 → 16.82 with key warpgroups;
    /// bench/NOTES.md session 52.) Otherwise unchanged.
    pub fn with_decoding_producer(
        self,
        variant: &Variant,
        dqk: u32,
        dv: u32,
        isa: Isa,
    ) -> ForwardConfig {
        if isa != Isa::Sm90a
            || modifies_kv(variant)
            || !self.wgmma
            || !self.pack_gqa
            || self.warp_specialized
            || self.v_in_k
            || self.block_m != 64
            || self.dv_warps != 1
            || dqk > 256
        {
            return self;
        }
        let producer = self.with_producer_warpgroup();
        let keyed = ForwardConfig {
            warps: 8,
            key_warps: 2,
            block_n: 96,
            stages: 4,
            ..producer
        };
        let single = ForwardConfig {
            block_n: 128,
            stages: 3,
            ..producer
        };
        // (Key warpgroups merge with the split-KV combine, which split_kv
        // says the variant has.)
        let narrow = dqk <= 128 && self.dv_slice(dv) <= 128 && self.split_kv;
        [keyed, single]
            .into_iter()
            .filter(|t| narrow || t.key_warps == 1)
            .find(|t| tile_fits(t, dqk, dv, isa))
            .unwrap_or(self)
    }

    /// This decoding tile for a grid of `blocks` blocks (before KV splits)
    /// on `sms` multiprocessors: with fewer blocks than half the
    /// multiprocessors (a long context over few sequences and KV heads,
    /// which KV splits spread over the GPU), four key warps on 128-key
    /// blocks where shared memory holds them: fatter blocks leave fewer
    /// partial rows to combine (H100, one sequence of 32768 keys, d128:
    /// 78.1 → 71.8 µs; bench/NOTES.md), in three stages where those fit
    /// (one block per multiprocessor either way; 2% faster on an H100 and
    /// in two H200 runs). The same where the grid fills three quarters to
    /// all of the multiprocessors, one fat block on each: 128 KiB in flight
    /// per SM against the 32-key tile's splits (H200, d128: B16 × 4096 67.5
    /// → 64.0 µs, B14 × 4096 61.0 → 58.9, B16 × 8192 125.6 → 123.2, and
    /// over a paged cache 68.1 → 65.8, 61.2 → 59.4, 127.6 → 125.4; between
    /// half and three quarters the paged kernel measured up to 33% slower
    /// with the fat tile; bench/NOTES.md session 67). Otherwise, and with V
    /// stored in K (latent decoding measured slower with 64-key blocks),
    /// unchanged.
    pub fn for_few_blocks(
        self,
        blocks: usize,
        sms: u32,
        dqk: u32,
        dv: u32,
        isa: Isa,
    ) -> ForwardConfig {
        if !self.pack_gqa
            || self.wgmma
            || self.v_in_k
            || self.block_m != 16
            || self.key_warps < 2
            || !few_or_one_per_sm(blocks, sms)
        {
            return self;
        }
        let fat = ForwardConfig {
            block_n: 128,
            warps: 4,
            key_warps: 4,
            dv_warps: 1,
            ..self
        };
        if !key_warps_share_columns(&fat, dv) {
            return self;
        }
        let deep = ForwardConfig {
            stages: self.stages.max(3),
            ..fat
        };
        self.or_if_it_fits(fat, dqk, dv, isa)
            .or_if_it_fits(deep, dqk, dv, isa)
    }

    /// This split-KV tile with the combine in the main kernel
    /// ([`fused_combine`](Self::fused_combine)) where a block of `rows`
    /// query rows (packed rows per KV head, `H / Hkv · Sq`) merges them with
    /// at most two column quads per thread: `min(block_m, rows) · Dv / 4 ≤ 2
    /// · threads`. Beyond that the last block's merge queues behind itself
    /// and the combine kernel, spread over the GPU, is faster (MLA's 16 rows
    /// of 512 columns on 64 threads, 32 quads each: 0.108 ms merged in the
    /// kernel against 0.080; one sequence × 32768 keys, 4 rows on 128
    /// threads: 38.6 µs against 39.4; H200, bench/NOTES.md). Otherwise,
    /// and on `wgmma` tiles, unchanged: their 64-row blocks leave each
    /// row block's merge to one block's eight warps, where the combine
    /// kernel spreads it over every SM (MQA at 128 heads, 4 splits: 20.0 µs
    /// a call merged in the kernel, its loads batched or not, against 16.7
    /// with the combine kernel; MLA at 128 heads 63.6 against 46.8; H200,
    /// bench/NOTES.md session 69).
    pub fn with_combine_for_rows(self, rows: usize, dv: u32) -> ForwardConfig {
        if !self.split_kv || self.wgmma || self.warp_specialized {
            return self;
        }
        let quads = (self.block_m as usize).min(rows) * (dv / 4) as usize;
        ForwardConfig {
            fused_combine: quads <= 2 * (self.warps() * WARP_SIZE) as usize,
            ..self
        }
    }

    /// The untuned decoding tile for sizes `[B, H, Hkv, Sq]` on `sms`
    /// multiprocessors: [`for_packed_rows`](Self::for_packed_rows), then
    /// [`for_few_blocks`](Self::for_few_blocks) on the grid that leaves,
    /// then [`with_combine_for_rows`](Self::with_combine_for_rows).
    pub fn for_decode_shape(
        self,
        [b, h, hkv, sq]: [usize; 4],
        sms: u32,
        dqk: u32,
        dv: u32,
        isa: Isa,
    ) -> ForwardConfig {
        let rows = h / hkv.max(1) * sq;
        let packed = self.for_packed_rows(rows, dqk, dv, isa);
        let blocks = b * hkv * rows.div_ceil(packed.block_m as usize) * packed.dv_split as usize;
        packed
            .for_few_blocks(blocks, sms, dqk, dv, isa)
            .with_combine_for_rows(rows, dv)
    }

    /// The untuned decoding tile of `variant` for a call of sizes `[B, H,
    /// Hkv, Sq]`: [`for_decode_shape`](Self::for_decode_shape), then
    /// [`with_decoding_producer`](Self::with_decoding_producer). What the
    /// runtime, the benchmark and `emit_forward` take.
    pub fn for_decoding_call(
        self,
        variant: &Variant,
        shape: [usize; 4],
        sms: u32,
        dqk: u32,
        dv: u32,
        isa: Isa,
    ) -> ForwardConfig {
        self.for_decode_shape(shape, sms, dqk, dv, isa)
            .with_decoding_producer(variant, dqk, dv, isa)
    }

    /// This configuration reading V from K ([`v_in_k`](Self::v_in_k)). The
    /// untuned decoding tile then splits Dv between two warps of one block
    /// instead of between blocks, so the scores — over 576 columns for MLA,
    /// most of the work — are computed once per block, not once per Dv
    /// slice (H200, MLA B 64 × 16 heads: 0.107 → 0.091 ms; bench/NOTES.md,
    /// session 29).
    pub fn with_v_in_k(self, dqk: u32, dv: u32, isa: Isa) -> ForwardConfig {
        let cfg = ForwardConfig {
            v_in_k: true,
            ..self
        };
        if !cfg.pack_gqa || cfg.wgmma || cfg.dv_warps != 1 || cfg.block_m != 16 {
            return cfg;
        }
        let candidate = ForwardConfig {
            warps: cfg.row_warps() * 2,
            key_warps: 1,
            dv_warps: 2,
            dv_split: 1,
            ..cfg
        };
        if check_config(&candidate, dqk, dv).is_err() {
            return cfg;
        }
        cfg.or_if_it_fits(candidate, dqk, dv, isa)
    }

    /// `candidate` where its shared memory fits `isa`, else `self`.
    fn or_if_it_fits(self, candidate: ForwardConfig, dqk: u32, dv: u32, isa: Isa) -> ForwardConfig {
        if smem_bytes(&candidate, dqk, candidate.dv_slice(dv)) <= isa.max_dynamic_smem() {
            candidate
        } else {
            self
        }
    }

    /// Dv columns of one block.
    pub fn dv_slice(&self, dv: u32) -> u32 {
        dv / self.dv_split.max(1)
    }

    /// O columns of one warp (its block's Dv slice over the Dv warps).
    fn warp_columns(&self, dv: u32) -> u32 {
        self.dv_slice(dv) / self.dv_warps.max(1)
    }

    /// Warps that own rows (each row warp's rows are shared by
    /// `key_warps` warps splitting the keys).
    pub fn row_warps(&self) -> u32 {
        self.warps / self.key_warps.max(1) / self.dv_warps.max(1)
    }

    /// 16-row MMA tiles per warp.
    pub fn m_tiles(&self) -> u32 {
        self.block_m / (16 * self.row_warps())
    }
}

/// One kernel argument, in launch order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// q, k, v, o, dout, dq, dk, dv in the element type, `[B, heads, S, D]`
    /// contiguous: the forward writes o; the backward reads q, k, v, o, dout
    /// and writes dq, dk, dv.
    Tensor(&'static str),
    /// `rowout`: `[row_outputs.len(), B, H, Sq]` f32.
    RowOut,
    /// A custom input, f32, contiguous in its declared axis order.
    Custom(String),
    /// The gradient of a custom input (backward): f32, shaped like the input,
    /// added to.
    CustomGrad(String),
    /// Scratch memory of the backward (`dot`, `qmod`, `dq_acc`).
    Workspace(&'static str),
    /// An `i32` size: B, H, Hkv, Sq or Skv.
    Size(Axis),
    /// The `i32` number of KV splits of a split-KV forward
    /// ([`KernelSource::kv_splits`]).
    KvSplits,
    /// A recurrent kernel's state in or out (`state_in`, `state_out`: f32
    /// `[B, H, Dk, Dv]`; `norm_in`, `norm_out`: f32 `[B, H, Dk]`). May be
    /// null: an absent initial state is zero, an absent output is not written.
    State(&'static str),
    /// The sequence boundaries of a packed variable-length batch (recurrent
    /// forward): i32 `[N + 1]`, increasing from 0 to the total steps `S`;
    /// sequence `n` is steps `cu_seqlens[n] … cu_seqlens[n + 1] − 1` of
    /// batch 0 and the grid's z (`B`) is `N`. Null: B sequences of S steps.
    /// In a variable-length parallel forward ([`parallel_forward_varlen`]):
    /// the query rows' boundaries, never null.
    CuSeqlens,
    /// The key rows' boundaries of a variable-length parallel forward
    /// ([`parallel_forward_varlen`]): i32 `[N + 1]`, increasing from 0 to
    /// the total keys; sequence `n`'s keys are rows `cu_seqlens_k[n] …
    /// cu_seqlens_k[n + 1] − 1`.
    CuSeqlensKv,
    /// An argument of a forward over a paged KV cache
    /// ([`parallel_forward_paged`]): `block_table` (i32 `[B,
    /// pages_per_seq]`, the pages of each sequence in order), `seqlens_k`
    /// (i32 `[B]`, each sequence's keys), `pages_per_seq` and `page_shift`
    /// (i32: pages hold `2^page_shift` rows).
    PagedKv(&'static str),
    /// An argument of a forward under a block-sparse mask
    /// ([`parallel_forward_block_sparse`]), FlexAttention's `BlockMask`
    /// layout: `kv_num_blocks` and `full_kv_num_blocks` (i32 `[mask_batches,
    /// mask_heads, mask_rows]`: how many partial and full key blocks each
    /// mask row visits), `kv_indices` and `full_kv_indices` (i32
    /// `[mask_batches, mask_heads, mask_rows, mask_cols]`: which, in their
    /// first entries), then the i32 extents `mask_batches` and `mask_heads`
    /// (1, shared by all, or B and H), `mask_rows`, `mask_cols`, and the
    /// mask's block sizes `mask_block_m` and `mask_block_n` (multiples of
    /// the kernel's `block_m` and `block_n`).
    BlockMask(&'static str),
    /// An `i32` of the sequence-segment schedule of the sm_90a recurrent
    /// forward (`n_whole`, `n_tail`, `n_seg`; see
    /// [`SegmentSplit`](super::recurrent_wgmma::SegmentSplit)). Ignored when
    /// its `sched` workspace is null.
    Segments(&'static str),
    /// A CUDA tensor map (`CUtensorMap`, 128 bytes passed by value) of `q`,
    /// `k` or `v` for the TMA copies of a forward with
    /// [`ForwardConfig::tma_loads`]: [`KernelSource::tensor_maps`] gives its
    /// extents and box.
    TensorMap(&'static str),
}

/// How a launcher encodes one [`ArgKind::TensorMap`] with
/// `cuTensorMapEncodeTiled`: a rank-3 map over the tensor's contiguous
/// elements (its element type; strides `dims[0]` and `dims[0] · dims[1]`
/// elements), boxes of `box_dims` elements, 128-byte swizzle, no
/// interleave, 128-byte L2 promotion, elements outside the tensor read as
/// zero. Extents are size expressions over `B`, `H`, `Hkv`, `Sq`, `Skv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// `q`, `k`, `v` (the forward) or `q`, `dout` (the backward).
    pub tensor: &'static str,
    /// Extents, innermost first: columns, rows, then the `B · heads` matrices.
    pub dims: [SizeExpr; 3],
    /// The box a copy moves, innermost first (64 columns: one swizzle span).
    pub box_dims: [u32; 3],
}

impl TensorMapSpec {
    /// A map over `tensor`'s dense rows `[B · heads, rows, cols]` whose boxes
    /// are `box_rows` rows of 64 columns (one swizzle span).
    pub(crate) fn dense(
        tensor: &'static str,
        cols: u32,
        rows: &str,
        heads: &str,
        box_rows: u32,
    ) -> TensorMapSpec {
        TensorMapSpec {
            tensor,
            dims: [
                SizeExpr::Const(u64::from(cols)),
                SizeExpr::var(rows),
                SizeExpr::mul([SizeExpr::var("B"), SizeExpr::var(heads)]),
            ],
            box_dims: [PANEL_COLS, box_rows, 1],
        }
    }
}

/// The forward's arguments in launch order (every target's forward takes
/// these): q, k, v, o, the row outputs, the custom inputs, the sizes and, for
/// split-KV kernels, the two workspaces and the number of splits.
pub fn forward_args(variant: &Variant, split_kv: bool) -> Vec<ArgKind> {
    forward_args_with(variant, split_kv, RowLayout::Dense)
}

/// How a forward kernel finds its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowLayout {
    /// `[B, heads, S, D]`.
    Dense,
    /// Packed sequences (`cu_seqlens_q`, `cu_seqlens_k`).
    Varlen,
    /// Dense queries, keys and values in a paged cache.
    Paged,
    /// Dense rows; each row block visits the key blocks a block-sparse mask
    /// lists.
    BlockSparse,
}

/// The arguments of a block-sparse forward after the sizes, in order.
pub const BLOCK_MASK_ARGS: [&str; 10] = [
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "mask_batches",
    "mask_heads",
    "mask_rows",
    "mask_cols",
    "mask_block_m",
    "mask_block_n",
];

/// The arguments a persistent block-sparse forward takes after
/// [`BLOCK_MASK_ARGS`] ([`KernelSource::tile_schedule`]): `tile_order` (i32
/// `[B · H · ceil(Sq / block_m)]`, every row block `(b · H + h) · R + r`
/// once, in the order CTAs take them; [`tile_order`](crate::tile_order::tile_order)
/// makes it) and the workspace `tile_counter` (one i32: zero at launch, and
/// the kernel leaves it zero, so one counter serves launches that follow
/// each other on a stream, not concurrent ones).
pub const TILE_SCHEDULE_ARGS: [ArgKind; 2] = [
    ArgKind::BlockMask("tile_order"),
    ArgKind::Workspace("tile_counter"),
];

/// [`forward_args`], then for a variable-length forward the two boundary
/// arrays, for a paged one the block table and its sizes.
fn forward_args_with(variant: &Variant, split_kv: bool, layout: RowLayout) -> Vec<ArgKind> {
    let mut args = vec![
        ArgKind::Tensor("q"),
        ArgKind::Tensor("k"),
        ArgKind::Tensor("v"),
        ArgKind::Tensor("o"),
        ArgKind::RowOut,
    ];
    args.extend(
        variant
            .customs
            .iter()
            .map(|c| ArgKind::Custom(c.name.clone())),
    );
    args.extend([Axis::B, Axis::H, Axis::Hkv, Axis::Sq, Axis::Skv].map(ArgKind::Size));
    if split_kv {
        args.extend([
            ArgKind::Workspace("opart"),
            ArgKind::Workspace("spart"),
            ArgKind::KvSplits,
        ]);
    }
    match layout {
        RowLayout::Dense => {}
        RowLayout::Varlen => args.extend([ArgKind::CuSeqlens, ArgKind::CuSeqlensKv]),
        RowLayout::Paged => args.extend(
            ["block_table", "seqlens_k", "pages_per_seq", "page_shift"].map(ArgKind::PagedKv),
        ),
        RowLayout::BlockSparse => args.extend(BLOCK_MASK_ARGS.map(ArgKind::BlockMask)),
    }
    args
}

/// Generated source and everything needed to launch it.
#[derive(Clone, Debug)]
pub struct KernelSource {
    pub name: String,
    pub source: String,
    /// Threads per block.
    pub threads: u32,
    pub block_m: u32,
    pub smem_bytes: u32,
    pub args: Vec<ArgKind>,
    /// What `rowout` holds, in order: `scale.<name>` then `state.<field>`.
    pub row_outputs: Vec<String>,
    /// Rows pack the query heads of a group: the grid is
    /// `(ceil(H/Hkv · Sq / block_m), Hkv, B)` instead of `(ceil(Sq / block_m), H, B)`.
    pub packed_gqa: bool,
    /// Blocks per row block, each writing `dv / dv_split` columns of O: the
    /// grid's `x` is multiplied by it (see [`KernelSource::grid_for`]).
    pub dv_split: u32,
    /// The element type of q, k, v and o.
    pub elem: Elem,
    /// A persistent kernel: launched with [`KernelSource::launch_grid`]
    /// (at most one block per multiprocessor), not [`KernelSource::grid_for`].
    pub persistent: bool,
    pub dqk: u32,
    /// The whole Dv of v and o (a block computes `dv / dv_split` columns).
    pub dv: u32,
    /// The kernel takes KV splits at launch (`opart`, `spart`, `n_splits`):
    /// [`KernelSource::kv_splits`] says how many.
    pub split_kv: bool,
    /// With split-KV: the kernel that merges the partial rows (entry name),
    /// launched after the main one with the same arguments
    /// ([`KernelSource::combine_grid`], [`KernelSource::combine_threads`]
    /// threads). `None` where the main kernel merges them itself
    /// ([`ForwardConfig::fused_combine`]: the arguments then hold the
    /// `split_count` workspace, [`KernelSource::split_count_len`]).
    pub combine: Option<String>,
    /// Keys per block step (the unit a KV split is made of).
    pub block_n: u32,
    /// K/V bytes one block keeps loading ahead
    /// ([`SplitTile::kv_bytes_in_flight`]):
    /// what the KV-split rule counts in flight per resident block.
    pub kv_bytes_in_flight: u64,
    /// A block's fixed work for the KV-split rule
    /// ([`SplitTile::split_fixed_work`]).
    pub split_fixed_work: u64,
    /// Words per query row and split of the `spart` workspace: the state
    /// fields and a flag for "saw a key".
    pub split_state_words: u32,
    /// V is read from K's rows (their first `dv` columns): the caller passes
    /// the one K/V cache as `k` (and `v`, which is not read).
    pub v_in_k: bool,
    /// A persistent block-sparse kernel whose CTAs take row blocks from a
    /// ticket counter in a given order ([`TILE_SCHEDULE_ARGS`]) instead of
    /// a static stride over pairs: its units are single row blocks
    /// ([`KernelSource::persistent_units`]).
    pub tile_schedule: bool,
    /// A persistent kernel launched in clusters of two CTAs
    /// ([`ForwardConfig::kv_multicast`]): its grid is even, at most one
    /// cluster per two multiprocessors.
    pub cluster_pairs: bool,
    /// The tensor maps the kernel takes ([`ArgKind::TensorMap`], in
    /// argument order); empty without TMA loads.
    pub tensor_maps: Vec<TensorMapSpec>,
}

/// Threads per block the split-KV combine kernels (CUDA and HIP) aim at.
const COMBINE_BLOCK_THREADS: u32 = 128;

/// Rows per block of the split-KV combine kernel for a Dv of `dv`: each row
/// takes `dv / 4` threads (four columns each), and a block as many rows as
/// fit in [`COMBINE_BLOCK_THREADS`] (at least one).
pub fn combine_rows_for(dv: u32) -> u32 {
    (COMBINE_BLOCK_THREADS / (dv / 4).max(1)).max(1)
}

/// Splits whose partial outputs a combine thread loads at once for a Dv of
/// `dv`: 16 at Dv 128, 4 at Dv 512. Each costs a thread four registers (a
/// float4); at Dv 512 (one row per 128 threads, as many blocks as rows) 16,
/// when the chunk's states were held as well, took 168 registers and made
/// MLA's combine twice as slow (H200).
pub fn combine_chunk_for(dv: u32) -> u32 {
    (2048 / dv.max(1)).clamp(4, 16)
}

/// Splits the combine in the main kernel ([`ForwardConfig::fused_combine`])
/// loads at once: the combine kernel's chunk, at most 8 where the kernel
/// may share a multiprocessor. The first chunk's outputs stay in registers
/// until the rescale (with the merge that held the chunk's state words as
/// well, 16 raised the B 64 × 4096 decoding kernel's registers from 127 to
/// 204 at d128). The tile with four key warps runs alone on its
/// multiprocessor (grids below half the SMs), where 16 costs no occupancy
/// and saves the last block a second round of L2 reads at 16 splits.
fn fused_chunk_for(cfg: &ForwardConfig, dv: u32) -> u32 {
    let chunk = combine_chunk_for(dv);
    if cfg.key_warps >= 4 {
        chunk
    } else {
        chunk.min(8)
    }
}

impl KernelSource {
    /// The launch grid for sizes `B, H, Hkv, Sq`: `(ceil(Sq / block_m) ·
    /// dv_split, H, B)`, or with packed heads `(ceil(H/Hkv · Sq / block_m) ·
    /// dv_split, Hkv, B)`; `None` when a dimension exceeds what CUDA launches.
    pub fn grid_for(&self, [b, h, hkv, sq]: [usize; 4]) -> Option<(u32, u32, u32)> {
        let bm = self.block_m as usize;
        let (rows, y) = if self.packed_gqa {
            ((h / hkv.max(1)) * sq, hkv)
        } else {
            (sq, h)
        };
        let x = rows.div_ceil(bm) * self.dv_split.max(1) as usize;
        let fits = x < (1 << 31) && y < 65536 && b < 65536;
        fits.then_some((x as u32, y as u32, b as u32))
    }

    /// Units of work of a persistent kernel for sizes `B, H, Hkv, Sq`: the
    /// row blocks of a head and Dv slice in pairs (`x`, `n - 1 - x`), over
    /// every head and batch; with a tile schedule, each row block alone.
    pub fn persistent_units(&self, [b, h, hkv, sq]: [usize; 4]) -> usize {
        let (rows, y) = if self.packed_gqa {
            ((h / hkv.max(1)) * sq, hkv)
        } else {
            (sq, h)
        };
        let row_blocks = rows.div_ceil(self.block_m as usize);
        let units = if self.tile_schedule {
            row_blocks
        } else {
            row_blocks.div_ceil(2)
        };
        units * self.dv_split.max(1) as usize * y * b
    }

    /// The grid to launch with on a GPU with `sms` multiprocessors and
    /// `n_splits` KV splits: [`KernelSource::split_grid_for`], or for a
    /// persistent kernel `(min(units, sms), 1, 1)` (every block walks units
    /// `blockIdx.x, blockIdx.x + gridDim.x, …`), in clusters of two
    /// ([`KernelSource::cluster_pairs`]) `(2 · min(⌈units / 2⌉, ⌈sms / 2⌉), 1,
    /// 1)`. `None` when it exceeds what CUDA launches.
    pub fn launch_grid(
        &self,
        sizes: [usize; 4],
        sms: u32,
        n_splits: u32,
    ) -> Option<(u32, u32, u32)> {
        let grid = self.split_grid_for(sizes, n_splits)?;
        if !self.persistent {
            return Some(grid);
        }
        let units = self.persistent_units(sizes);
        let blocks = if self.cluster_pairs {
            2 * units.div_ceil(2).min((sms.max(1) as usize).div_ceil(2))
        } else {
            units.min(sms.max(1) as usize)
        };
        Some((blocks as u32, 1, 1))
    }

    /// How many KV splits to launch with for sizes `B, H, Hkv, Sq, Skv` on a
    /// GPU with `sms` multiprocessors: 1 without split-KV or when the grid
    /// already has two blocks per multiprocessor; otherwise the splits, each
    /// at least four key blocks long, at most 128 and no more than one wave
    /// of the blocks that `residency` says a multiprocessor holds at once
    /// ([`Residency`]), for which the busiest multiprocessor finishes first
    /// ([`kv_split_rule`]). (H100, one sequence of 32768 keys, 8 KV heads:
    /// 1 split 1264 µs, 16 splits 111 µs, 33 splits 86 µs, 66 splits 96 µs,
    /// 128 splits 175 µs; MLA decoding, 128 blocks of 93 KB, two per SM: 3
    /// splits 0.239 ms, 2 splits 0.179 ms; MQA d128, 32 blocks: 9 splits
    /// 0.0346 ms, 8 splits 0.0302; bench/NOTES.md.)
    pub fn kv_splits(
        &self,
        [b, h, hkv, sq, skv]: [usize; 5],
        sms: u32,
        residency: Residency,
    ) -> u32 {
        let Some((x, y, z)) = self.grid_for([b, h, hkv, sq]) else {
            return 1;
        };
        if !self.split_kv {
            return 1;
        }
        kv_split_rule(KvSplitInputs {
            blocks: u64::from(x) * u64::from(y) * u64::from(z),
            key_blocks: skv.div_ceil(self.block_n as usize) as u64,
            max_splits: MAX_KV_SPLITS,
            block_smem: u64::from(self.smem_bytes),
            block_bytes_in_flight: self.kv_bytes_in_flight,
            block_fixed_work: self.split_fixed_work,
            sms: u64::from(sms),
            residency,
        }) as u32
    }

    /// Blocks of this kernel that fit in `smem_per_sm` bytes of shared
    /// memory at once (each also reserves 1 KiB); `None` when that does not
    /// bound them (no dynamic shared memory, or `smem_per_sm` 0).
    pub fn resident_blocks(&self, smem_per_sm: u32) -> Option<u32> {
        Residency::SharedMemory(u64::from(smem_per_sm))
            .per_sm(u64::from(self.smem_bytes))
            .map(|n| n as u32)
    }

    /// Query rows per block of the combine kernel ([`combine_rows_for`]).
    pub fn combine_rows(&self) -> u32 {
        combine_rows_for(self.dv)
    }

    /// Threads per block of the combine kernel: `dv / 4` per row.
    pub fn combine_threads(&self) -> u32 {
        self.combine_rows() * (self.dv / 4)
    }

    /// The combine kernel's grid ([`combine_threads`](Self::combine_threads)
    /// threads per block) for `rows = B·H·Sq` query rows; `None` when it
    /// exceeds what CUDA launches.
    pub fn combine_grid(&self, rows: usize) -> Option<(u32, u32, u32)> {
        let x = rows.div_ceil(self.combine_rows() as usize);
        (x < (1 << 31)).then_some((x as u32, 1, 1))
    }

    /// The main kernel's grid with `n_splits` KV splits.
    pub fn split_grid_for(&self, sizes: [usize; 4], n_splits: u32) -> Option<(u32, u32, u32)> {
        let (x, y, z) = self.grid_for(sizes)?;
        let x = x as u64 * n_splits.max(1) as u64;
        (x < (1 << 31)).then_some((x as u32, y, z))
    }

    /// Split-KV whose main kernel merges the splits itself
    /// ([`ForwardConfig::fused_combine`]): no combine kernel, and a
    /// `split_count` workspace among the arguments.
    pub fn merges_splits_in_kernel(&self) -> bool {
        self.split_kv && self.combine.is_none()
    }

    /// Counters of the `split_count` workspace (one per row block of the
    /// grid without splits) for sizes `B, H, Hkv, Sq`: 0 without one.
    pub fn split_count_len(&self, sizes: [usize; 4]) -> usize {
        if !self.merges_splits_in_kernel() {
            return 0;
        }
        self.grid_for(sizes)
            .map_or(0, |(x, y, z)| x as usize * y as usize * z as usize)
    }

    /// Elements of a split-KV workspace (`opart` or `spart`) for `rows =
    /// B·H·Sq` query rows and `n_splits` splits.
    pub fn workspace_len(&self, name: &str, rows: usize, n_splits: u32) -> usize {
        let per_row = match name {
            "opart" => self.dv as usize,
            "spart" => self.split_state_words as usize,
            other => unreachable!("unknown forward workspace `{other}`"),
        };
        rows * n_splits.max(1) as usize * per_row
    }
}

/// The forward template and the preludes it includes, as text: their digest
/// is part of tuning keys, so a changed template never reuses old results.
pub const TEMPLATE_TEXT: &str = concat!(
    include_str!("../../../templates/cuda/parallel_fwd.cu"),
    include_str!("../../../templates/cuda/parallel_types.cu"),
    include_str!("../../../templates/cuda/prelude.cu"),
    include_str!("../../../templates/cuda/prelude_sm90.cu"),
    include_str!("../../../templates/cuda/tile_layout.cu"),
    include_str!("../../../templates/cuda/kv_multicast.cu"),
);

/// The largest Dv one block computes: a warp's 16-row accumulator tile of
/// 256 columns takes 128 registers per thread.
pub const MAX_DV_SLICE: u32 = 256;

/// The fewest slices (1, 2 or 4) of at most [`MAX_DV_SLICE`] columns, each a
/// multiple of 16, that `dv` splits into evenly; 1 if none.
pub fn default_dv_split(dv: u32) -> u32 {
    [1, 2, 4]
        .into_iter()
        .find(|&n| dv.is_multiple_of(n) && dv / n <= MAX_DV_SLICE && (dv / n).is_multiple_of(16))
        .unwrap_or(1)
}

/// Shared memory the driver reserves per resident block (sm_80 and later).
pub const SMEM_RESERVED_PER_BLOCK: u32 = 1024;

/// The most KV splits a split-KV forward launches with.
pub const MAX_KV_SPLITS: u64 = 128;

/// How many blocks of one kernel a multiprocessor holds at once, as far as
/// the caller knows: the KV-split rule's wave cap ([`kv_split_rule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Not known: no wave cap.
    Unknown,
    /// Only the multiprocessor's shared memory, in bytes, is known: the cap
    /// counts the blocks it fits (each with 1 KiB the driver reserves). An
    /// upper bound of [`Blocks`](Self::Blocks): registers are not counted.
    SharedMemory(u64),
    /// The driver's count for this kernel, its threads and its dynamic
    /// shared memory (`cuOccupancyMaxActiveBlocksPerMultiprocessor`), which
    /// also counts registers.
    Blocks(u64),
}

impl Residency {
    /// Blocks of `block_smem` bytes of dynamic shared memory that one
    /// multiprocessor holds, where known (the shared-memory bound needs both
    /// figures).
    pub fn per_sm(self, block_smem: u64) -> Option<u64> {
        match self {
            Residency::Unknown => None,
            Residency::SharedMemory(bytes) => (block_smem > 0 && bytes > 0)
                .then(|| bytes / (block_smem + u64::from(SMEM_RESERVED_PER_BLOCK))),
            Residency::Blocks(n) => Some(n),
        }
    }
}

/// Whether a decoding grid of `blocks` blocks takes the fat tile
/// ([`ForwardConfig::for_few_blocks`]): fewer than half the `sms`
/// multiprocessors, or more than three quarters of them and at most one
/// each.
fn few_or_one_per_sm(blocks: usize, sms: u32) -> bool {
    let sms = sms as usize;
    blocks * 2 < sms || (blocks * 4 > sms * 3 && blocks <= sms)
}

/// Bytes of K and V a multiprocessor needs in flight for the DRAM to run at
/// full speed: the KV-split rule ([`split_cost`]) prices fewer as a slower
/// stream. (H200, d128 decoding tile of 16 KB in flight per block, B16 ×
/// 4096: one block per SM 103.5 µs, two 73.4, three to five 66.9–67.4;
/// B32 × 4096: two per SM 133.4, four 123.0. 64 KiB is where the rule's
/// choices match the fastest of 1 to 16 splits on eight shapes within 2%,
/// bench/NOTES.md session 67.)
pub const KV_BYTES_IN_FLIGHT_PER_SM: u64 = 64 * 1024;

/// What the KV-split rule reads of a split-KV tile: its shape, ring depth,
/// head dims (`dv_slice`: the Dv columns one block computes) and element
/// size.
#[derive(Clone, Copy, Debug)]
pub struct SplitTile {
    pub block_m: u32,
    pub block_n: u32,
    pub stages: u32,
    pub dqk: u32,
    pub dv_slice: u32,
    pub v_in_k: bool,
    pub elem_bytes: u32,
}

impl SplitTile {
    /// Bytes of K and V one block of a key block's rows: Dqk elements of K
    /// and, unless V is read from K's rows, the block's Dv slice of V.
    fn key_block_bytes(&self) -> u64 {
        let row = u64::from(self.dqk)
            + if self.v_in_k {
                0
            } else {
                u64::from(self.dv_slice)
            };
        u64::from(self.block_n) * row * u64::from(self.elem_bytes)
    }

    /// Bytes of K and V one block keeps loading ahead of its compute:
    /// `stages - 1` key blocks (at least one).
    pub fn kv_bytes_in_flight(&self) -> u64 {
        u64::from(self.stages.saturating_sub(1).max(1)) * self.key_block_bytes()
    }

    /// A block's work besides its key blocks, in 1024ths of a key block, for
    /// the KV-split rule ([`split_cost`]): one key block's worth (the start
    /// and the end of a block) plus the bytes it moves once per split — its
    /// Q rows and its partial output rows (f32), `block_m` of each at most —
    /// counted in key blocks. A 64-row tile's partial rows are twice a
    /// 32-key block's K and V: splitting it finer costs more than the keys
    /// show.
    pub fn split_fixed_work(&self) -> u64 {
        let once = u64::from(self.block_m)
            * (u64::from(self.dqk) * u64::from(self.elem_bytes) + u64::from(self.dv_slice) * 4);
        1024 + once * 1024 / self.key_block_bytes().max(1)
    }
}

/// What the KV-split rule ([`kv_split_rule`]) reads.
#[derive(Clone, Copy, Debug)]
pub struct KvSplitInputs {
    /// Blocks of the grid without splits.
    pub blocks: u64,
    /// Key blocks of the longest sequence.
    pub key_blocks: u64,
    pub max_splits: u64,
    /// Dynamic shared memory of one block (with [`Residency::SharedMemory`]
    /// 0 means no wave cap).
    pub block_smem: u64,
    /// K/V bytes one block keeps in flight
    /// ([`SplitTile::kv_bytes_in_flight`]); 0 when
    /// not known ([`split_cost`]).
    pub block_bytes_in_flight: u64,
    /// A block's fixed work in 1024ths of a key block
    /// ([`SplitTile::split_fixed_work`]); 0 when not known (one key block).
    pub block_fixed_work: u64,
    pub sms: u64,
    pub residency: Residency,
}

/// The KV-split rule that [`KernelSource::kv_splits`] and the launch plans'
/// `KvSplitPlan::splits` share. 1 when the grid already has two blocks per
/// multiprocessor. Otherwise the splits `s` from 1 to `min(clamp(key_blocks
/// / 4, 1, max_splits), max(1, resident · SMs / blocks))` (each split at
/// least four key blocks; at most one wave of the blocks a multiprocessor
/// holds, where `resident` is known: [`Residency`]) for which the busiest
/// multiprocessor finishes first ([`split_cost`]); ties go to fewer splits.
pub fn kv_split_rule(i: KvSplitInputs) -> u64 {
    let sms = i.sms.max(1);
    if i.blocks >= 2 * sms || i.blocks == 0 {
        return 1;
    }
    let most = (i.key_blocks / 4).clamp(1, i.max_splits.max(1));
    let resident = i.residency.per_sm(i.block_smem);
    let top = resident.map_or(most, |r| most.min((r * sms / i.blocks).max(1)));
    (1..=top)
        .min_by_key(|&s| {
            let cost = split_cost(
                i.blocks,
                i.key_blocks,
                s,
                sms,
                resident,
                i.block_bytes_in_flight,
                i.block_fixed_work,
            );
            (cost, s)
        })
        .unwrap_or(1)
}

/// The busiest multiprocessor's time with `splits` KV splits, in key blocks
/// × 1024: it runs `n = ceil(blocks · splits / SMs)` blocks of
/// `ceil(key_blocks / splits)` key blocks each plus the block's fixed work
/// (`block_fixed_work` 1024ths of a key block, [`SplitTile::split_fixed_work`]; 0: one
/// key block), streamed at full speed when the blocks resident at once
/// (`resident`: how many fit; `None`: all) keep
/// [`KV_BYTES_IN_FLIGHT_PER_SM`] in flight between them
/// (`block_bytes_in_flight` each), and slower with less: by `1 + 0.078 ·
/// (KV_BYTES_IN_FLIGHT_PER_SM / in_flight − 1)²`, the curve of the H200
/// sweep (a quarter of the bytes 1.70× the time, half 1.08×, three quarters
/// 1.01×; bench/NOTES.md session 67). With `block_bytes_in_flight` 0 (not
/// known) a block counts as half that figure.
pub fn split_cost(
    blocks: u64,
    key_blocks: u64,
    splits: u64,
    sms: u64,
    resident: Option<u64>,
    block_bytes_in_flight: u64,
    block_fixed_work: u64,
) -> u64 {
    let n = (blocks * splits).div_ceil(sms.max(1));
    let fixed = if block_fixed_work == 0 {
        1024
    } else {
        block_fixed_work
    };
    let per_block = (key_blocks.div_ceil(splits.max(1)) * 1024).saturating_add(fixed);
    let together = resident.map_or(n, |r| n.min(r)).max(1);
    let per_block_bytes = if block_bytes_in_flight == 0 {
        KV_BYTES_IN_FLIGHT_PER_SM / 2
    } else {
        block_bytes_in_flight
    };
    let in_flight = together.saturating_mul(per_block_bytes);
    // The shortfall (need / in flight − 1) in 1024ths, and the factor in
    // 2^20ths: 80 / 1024 ≈ 0.078.
    let short = (KV_BYTES_IN_FLIGHT_PER_SM * 1024 / in_flight).saturating_sub(1024);
    let factor = (1u64 << 20).saturating_add(short.saturating_mul(short).saturating_mul(80) / 1024);
    (n.saturating_mul(per_block) / 1024).saturating_mul(factor) / 1024
}

/// Static shared memory of the warp-specialised kernel (its mbarriers),
/// rounded up: it shares the per-block limit with the dynamic allocation.
pub(crate) const WS_STATIC_SMEM: u32 = 128;

/// Dynamic shared memory of the forward kernel: Q, and `stages` K and V
/// tiles (rows padded by 8 elements for `ldmatrix` on sm_80; swizzled tiles
/// unpadded plus 1 KiB to align them to 1024 bytes).
/// Whether `variant` rewrites the K or V tiles in shared memory (`modify_k`,
/// `modify_v`), which a producer warpgroup's ring does not allow.
pub(crate) fn modifies_kv(variant: &Variant) -> bool {
    variant
        .parallel()
        .is_some_and(|p| p.modify_k.is_some() || p.modify_v.is_some())
}

/// Whether `tile` is a valid configuration whose shared memory (with the
/// producer's barriers where it has one) fits a block on `isa`.
fn tile_fits(tile: &ForwardConfig, dqk: u32, dv: u32, isa: Isa) -> bool {
    let barriers = if tile.warp_specialized {
        WS_STATIC_SMEM
    } else {
        0
    };
    check_config(tile, dqk, dv).is_ok()
        && smem_bytes(tile, dqk, tile.dv_slice(dv)) + barriers <= isa.max_dynamic_smem()
}

pub(crate) fn smem_bytes(cfg: &ForwardConfig, dqk: u32, dv: u32) -> u32 {
    let align_slack = if cfg.wgmma { 1024 } else { 0 };
    cfg.block_m * tile_stride(cfg, dv, dqk) * 2
        + ring_bytes(cfg, dqk, dv)
        + dv_warp_exchange_bytes(cfg)
        + align_slack
}

/// The Dv warps' partial scores ([`ForwardConfig::dv_warps`]): two buffers of
/// every warp's S fragment, a word per lane. Dv warpgroups on `wgmma` without
/// warp specialisation ([`shares_p`]) hand over P and the row rescale instead
/// (then the row state): a word per value and thread of one warpgroup. With
/// warp specialisation each computes all of S: none.
fn dv_warp_exchange_bytes(cfg: &ForwardConfig) -> u32 {
    if shares_p(cfg) {
        return 128 * p_exchange_words(cfg) * 4;
    }
    if cfg.dv_warps < 2 || cfg.wgmma {
        return 0;
    }
    let keys = cfg.block_n / cfg.key_warps.max(1);
    2 * cfg.warps * WARP_SIZE * cfg.m_tiles() * (keys / 8) * 4 * 4
}

/// Whether the first of two Dv warpgroups computes S and hands P to the
/// second (`wgmma` without warp specialisation): S once per block.
fn shares_p(cfg: &ForwardConfig) -> bool {
    cfg.wgmma && cfg.dv_warps > 1 && !cfg.warp_specialized
}

/// Whether the Dv warpgroups that hand P over ([`shares_p`]) each load the
/// K/V panels they read again (`wg_loads_loop` in the template): the first
/// its V columns and the rest of K, the second its V columns, each
/// refilling them once its P·V is done, so no barrier of the whole block
/// separates the steps and the first's next S GEMM runs beside the
/// second's P·V. Not where the variant modifies K or V in shared memory
/// (all threads rewrite the tiles) or V is a slice of K's columns
/// (`dv_split`), whose panels the two would share.
fn warpgroup_loads(cfg: &ForwardConfig, modifies_kv: bool) -> bool {
    shares_p(cfg) && !modifies_kv && cfg.key_warps == 1 && !(cfg.v_in_k && cfg.dv_split > 1)
}

/// Words per thread of the P hand-over ([`shares_p`]): P's fragments (BN / 4)
/// and the two rows' rescale; the row state handed over at the end must fit
/// too.
fn p_exchange_words(cfg: &ForwardConfig) -> u32 {
    cfg.block_n / 4 + 2
}

/// Whether the sm_80 template's tiles use XOR rows (`TILE_XOR_ROWS` in
/// `templates/cuda/prelude.cu`: 128-byte-aligned rows, so `cp.async` reads
/// each L2 sector once; bench/NOTES.md): always, except for V read from K
/// in slices (`dv`, one block's) that are not 64 columns wide.
fn xor_rows(cfg: &ForwardConfig, dv: u32) -> bool {
    !cfg.wgmma && (!cfg.v_in_k || dv.is_multiple_of(64))
}

/// Elements from one row of a shared-memory tile of `cols` columns to the
/// next (`tile_stride` in the prelude): swizzled panels on wgmma; on sm_80
/// unpadded rows with XOR-permuted chunks where `cols` is a multiple of 64
/// ([`xor_rows`]), else rows padded by 8 elements.
pub(crate) fn tile_stride(cfg: &ForwardConfig, dv: u32, cols: u32) -> u32 {
    if cfg.wgmma || (xor_rows(cfg, dv) && cols.is_multiple_of(64)) {
        cols
    } else {
        cols + 8
    }
}

/// The K/V ring's part of [`smem_bytes`]: `stages` K and V tiles.
fn ring_bytes(cfg: &ForwardConfig, dqk: u32, dv: u32) -> u32 {
    // With V stored in K the K tiles are the V tiles.
    let v_cols = if cfg.v_in_k {
        0
    } else {
        tile_stride(cfg, dv, dv)
    };
    cfg.stages * cfg.block_n * (tile_stride(cfg, dv, dqk) + v_cols) * 2
}

/// Shared memory the key warps' partial rows take at the end (every key
/// warp's accumulators, state and "saw a key", a word per lane each: each
/// warp then merges its share of the columns from all of them); they reuse
/// the K/V ring.
fn key_warp_scratch_bytes(cfg: &ForwardConfig, dv: u32, nstate: usize) -> u32 {
    let rows = 2 * cfg.m_tiles();
    let words = cfg.m_tiles() * (dv / cfg.dv_warps.max(1)) / 2 + rows * (nstate.max(1) as u32 + 1);
    cfg.key_warps * cfg.row_warps() * cfg.dv_warps * WARP_SIZE * words * 4
}

/// Whether each of the key warps can merge and write an equal share of a
/// warp's 8-column O groups (`merge_key_warps` in the template).
fn key_warps_share_columns(cfg: &ForwardConfig, dv_total: u32) -> bool {
    cfg.warp_columns(dv_total)
        .is_multiple_of(8 * cfg.key_warps.max(1))
}

/// Whether the `wgmma` forward takes these head dims (`dv` one block's
/// slice).
pub fn wgmma_dims_ok(dqk: u32, dv: u32) -> bool {
    wgmma_dims_within(dqk, dv, WS_PERSISTENT_MAX_DQK)
}

/// The largest Dqk of the persistent warp-specialised forward (and of the
/// prefill defaults, [`wgmma_dims_ok`]).
const WS_PERSISTENT_MAX_DQK: u32 = 256;

/// Whether a `wgmma` kernel with a block per row block (the decoding tile of
/// [`ForwardConfig::for_packed_rows`]) takes these head dims: Dqk up to
/// [`MAX_FORWARD_DQK`] (MLA's latent cache, 576), `dv` one warpgroup's
/// columns.
fn wgmma_decoding_dims_ok(dqk: u32, dv: u32) -> bool {
    wgmma_dims_within(dqk, dv, MAX_FORWARD_DQK)
}

/// Head dims in 64-column panels, `dv` within one instruction's N and Dqk
/// at most `max_dqk`.
fn wgmma_dims_within(dqk: u32, dv: u32, max_dqk: u32) -> bool {
    dqk.is_multiple_of(PANEL_COLS) && dv.is_multiple_of(PANEL_COLS) && dv <= MAX_N && dqk <= max_dqk
}

/// The O columns per warpgroup from which the `wgmma` forward holds its row
/// maxima (`crate::held_max`): the rescale it skips costs a multiply per O
/// column and block, the hold a few instructions per row and block beside
/// it. On an H200 (bench/NOTES.md, session 64, rotated rounds)
/// DiffTransformer's 256 columns ran 3.0–3.9% faster held; at 128 columns
/// non-causal softmax ran 1.5–3.5% slower and the causal ones within the
/// rounds' spread; MLA decoding's latent tile (two warpgroups of 256
/// columns, split-KV) 1.9% faster. (The sm_80 template is not measured
/// held: it keeps the variant's own update.)
pub const HELD_MAX_MIN_O_COLUMNS: u32 = 256;

/// The warp-specialised forward's tile of three consumer warpgroups.
pub const THREE_WARPGROUP_ROWS: u32 = 192;

#[derive(Template)]
#[template(path = "cuda/parallel_fwd.cu", escape = "none")]
struct ForwardTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: ElemSpelling,
    bm: u32,
    bn: u32,
    warps: u32,
    /// Warps splitting each key block (see [`ForwardConfig::key_warps`]).
    key_warps: u32,
    /// The sm_80 tiles' XOR rows (see [`xor_rows`]).
    xor_rows: bool,
    /// Warps splitting Dv (see [`ForwardConfig::dv_warps`]).
    dv_warps: u32,
    /// Dv warpgroups hand P over ([`shares_p`]).
    share_p: bool,
    /// ... each loading the panels it reads again, without a block-wide
    /// barrier per step ([`warpgroup_loads`]).
    wg_loads: bool,
    m_tiles: u32,
    warp_size: u32,
    dqk: u32,
    dv: u32,
    /// O columns of one warp (with Dv warps, their share of `dv`).
    dvw: u32,
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
    wgmma: bool,
    ws: bool,
    persistent: bool,
    stages: u32,
    /// A tile's epilogue runs under the next tile's first S GEMM.
    late_epilogue: bool,
    q_regs: bool,
    /// `setmaxnreg` budgets of the producer and consumer warpgroups
    /// ([`register_split`]).
    producer_regs: u32,
    consumer_regs: u32,
    /// Consumer warpgroups skip the leading steps whose key blocks lie past
    /// their rows under a causal mask (BN < BM leaves such blocks).
    wg_skip: bool,
    split_kv: bool,
    fused_combine: bool,
    /// A packed variable-length batch (`cu_q`, `cu_k`).
    varlen: bool,
    /// K and V in a paged cache (`block_table`, `seqlens_k`).
    paged: bool,
    /// Key blocks from a block-sparse mask's lists.
    sparse: bool,
    /// A persistent block-sparse kernel: tiles come from a ticket counter in
    /// the order `tile_order` gives.
    scheduled: bool,
    /// The producer copies Q, K and V with TMA (tensor maps as parameters).
    tma: bool,
    /// K and V of a TMA ring's stage on barriers of their own (two stages).
    kv_bars: bool,
    /// Clusters of two CTAs sharing K/V blocks by TMA multicast.
    kv_multicast: bool,
    /// V read from the K tiles (shared K/V storage).
    v_in_k: bool,
    /// O is written 16 bytes per lane after a transpose across each quad
    /// (see the template's epilogue).
    quad_stores: bool,
    combine_rows: u32,
    combine_chunk: u32,
    /// Splits the combine in the main kernel loads at once (`fused_chunk_for`).
    fused_chunk: u32,
    wgmma_fns: String,
}

/// The `setmaxnreg` budgets (producer, consumer) of a warp-specialised
/// forward with `consumers` computing warpgroups beside the producer, in a
/// 64K-register file of which the CTA, alone on its SM, holds all: two
/// consumers get 232 (with the producer's 40: 64,512), three 160 (with 32:
/// 65,536, as FlashAttention-3's three-warpgroup tiles).
fn register_split(consumers: u32) -> (u32, u32) {
    if consumers >= 3 { (32, 160) } else { (40, 232) }
}

/// Generates the parallel forward kernel of `variant` for head dims `dqk`, `dv`.
pub fn parallel_forward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    generate_forward(variant, dqk, dv, cfg, RowLayout::Dense)
}

/// Generates the parallel forward of `variant` for a packed batch of
/// sequences of different lengths: q is `[1, H, Tq, Dqk]`, k and v `[1,
/// Hkv, Tk, …]` with the sequences one after another, the kernel takes the
/// boundaries `cu_seqlens_q` and `cu_seqlens_k` (`[N + 1]` each) after the
/// sizes, and `B` is `N`, `Sq` and `Skv` the longest sequence's lengths
/// (they size the grid, [`KernelSource::launch_grid`]). Each sequence
/// gives what a call with `B = 1` and its own lengths gives: the closures
/// see `b = 0`, `B = 1` and the sequence's `Sq`, `Skv` and positions.
///
/// The tile configuration is `cfg` with its decoding forms taken out: rows
/// do not pack query heads (a head's rows are not contiguous across
/// sequences) and there are no KV splits; a packed 16-row decoding tile
/// stays 16 rows on one warp.
pub fn parallel_forward_varlen(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    let cfg = ForwardConfig {
        pack_gqa: false,
        split_kv: false,
        fused_combine: false,
        ..*cfg
    };
    generate_forward(variant, dqk, dv, &cfg, RowLayout::Varlen)
}

/// Generates the parallel forward of `variant` over a paged KV cache: q is
/// `[B, H, Sq, Dqk]` as usual, k and v are caches of pages of `2^page_shift`
/// rows, `[pages, Hkv, 2^page_shift, D]`; sequence `b`'s keys are rows `0 …
/// seqlens_k[b] − 1` of the pages `block_table[b][0], block_table[b][1], …`
/// (arguments after the sizes, [`ArgKind::PagedKv`]), and `Skv` is the
/// longest sequence's key count (it sizes the KV splits). The closures see
/// each sequence's own `Skv`. Every tile configuration works, decoding's
/// packed heads and KV splits included; the page size is a launch argument
/// (any power of two).
pub fn parallel_forward_paged(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    generate_forward(variant, dqk, dv, cfg, RowLayout::Paged)
}

/// Generates the parallel forward of `variant` under a block-sparse mask
/// (FlexAttention's `BlockMask`, arguments [`ArgKind::BlockMask`] after the
/// sizes): rows and tensors are dense, and each row block visits only the
/// key blocks its mask row lists — the partial ones, where the variant's
/// mask (if any) decides per score, then the full ones, where every key in
/// bounds is seen and the mask is not evaluated. One head per row block:
/// packed GQA rows and KV splits (the decoding tiles) are refused.
pub fn parallel_forward_block_sparse(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
) -> Result<KernelSource, CompileError> {
    if cfg.pack_gqa || cfg.split_kv {
        return Err(CompileError(
            "a block-sparse mask needs one head per row block and no KV splits: set pack_gqa \
             and split_kv to false (the decoding tiles set them)"
                .into(),
        ));
    }
    generate_forward(variant, dqk, dv, cfg, RowLayout::BlockSparse)
}

fn generate_forward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &ForwardConfig,
    layout: RowLayout,
) -> Result<KernelSource, CompileError> {
    let varlen = layout == RowLayout::Varlen;
    // A uniform Q scale is applied to the scores instead (`q_scale`).
    let folded = crate::q_scale::fold_q_scale(variant, dqk, dv);
    let variant = folded.as_ref().unwrap_or(variant);
    let par = parallel_inputs(variant, dqk, dv, "forward", MAX_FORWARD_DQK)?;
    check_config(cfg, dqk, dv)?;
    // From here on `dv` is the slice one block computes, `dvw` one (Dv)
    // warp's or warpgroup's share of it.
    let dv_total = dv;
    let dv = cfg.dv_slice(dv_total);
    let dvw = dv / cfg.dv_warps.max(1);
    if cfg.v_in_k && (par.modify_k.is_some() || par.modify_v.is_some()) {
        return Err(CompileError(format!(
            "`{}` modifies k or v in shared memory, but with v_in_k they are one tile (V is the first Dv columns of K): modifying one would change the other; use separate k and v (v_in_k: false)",
            variant.name
        )));
    }
    if cfg.warp_specialized && cfg.dv_warps > 1 && par.modify_q.is_some() {
        return Err(CompileError(format!(
            "`{}` modifies q in shared memory, which the warp-specialised forward does per warpgroup: with Dv warps two warpgroups share the rows; use dv_warps: 1 or warp_specialized: false",
            variant.name
        )));
    }
    if cfg.warp_specialized && (par.modify_k.is_some() || par.modify_v.is_some()) {
        return Err(CompileError(format!(
            "`{}` modifies k or v in shared memory, which the warp-specialised forward cannot do; use warp_specialized: false",
            variant.name
        )));
    }
    let online = &par.online;
    let nstate = online.state.len();
    // The row maxima are held where a warpgroup has enough O columns for
    // the skipped rescales to pay, and no key warps merge partial rows in
    // the kernel (split-KV's partial rows leave the held form as written).
    let hold_row_max = cfg.wgmma && dvw >= HELD_MAX_MIN_O_COLUMNS && cfg.key_warps <= 1;
    // (With held maxima the hand-over also carries them: at most one a
    // state field.)
    let held_words = if hold_row_max { nstate as u32 } else { 0 };
    if shares_p(cfg) && 2 * (nstate.max(1) as u32 + 1 + held_words) > p_exchange_words(cfg) {
        return Err(CompileError(format!(
            "`{}`: Dv warpgroups hand the row state over through {} words per thread, too few for {nstate} state values per row; use dv_warps: 1",
            variant.name,
            p_exchange_words(cfg)
        )));
    }
    let nscales = online.scales.len();
    let tile_schedule = cfg.persistent && layout == RowLayout::BlockSparse;
    // TMA boxes address rows of one head's dense matrix: the other layouts
    // (sequences packed into one matrix, pages, block lists) keep cp.async.
    let tma = cfg.tma_loads
        && cfg.warp_specialized
        && layout == RowLayout::Dense
        && !cfg.pack_gqa
        && !cfg.v_in_k;
    let late_epilogue = cfg.late_epilogue && tma && cfg.persistent;
    let causal = par.mask.as_ref().is_some_and(implies_causal);
    // The cluster pair's K/V multicast: the pairs' key walks line up only
    // without a mask or under the plain causal one, whose extra diagonal
    // blocks are whole key blocks where BN divides BM.
    let kv_multicast = cfg.kv_multicast
        && tma
        && cfg.persistent
        && cfg.dv_split == 1
        && cfg.key_warps == 1
        && par.mask.as_ref().is_none_or(is_causal)
        && (!causal || cfg.block_m.is_multiple_of(cfg.block_n));
    if cfg.key_warps > 1 {
        combine_plan(online).map_err(|e| {
            CompileError(format!(
                "key_warps {} merges the key warps' partial rows with the split-KV combine, which `{}` lacks: {e}",
                cfg.key_warps, variant.name
            ))
        })?;
        let scratch = key_warp_scratch_bytes(cfg, dv, nstate);
        let ring = ring_bytes(cfg, dqk, dv);
        if scratch > ring {
            return Err(CompileError(format!(
                "key_warps {}: the key warps' partial rows ({scratch} bytes) do not fit the K/V ring they reuse ({ring} bytes); use fewer key warps or more stages",
                cfg.key_warps
            )));
        }
    }
    let regions = forward_regions(variant, cfg.split_kv || cfg.key_warps > 1, hold_row_max)?;

    let CustomParams {
        fields: params_fields,
        args: custom_args,
        init: params_init,
    } = custom_params(variant.customs.len(), false);
    let state_init = state_init(online);
    let (producer_regs, consumer_regs) = register_split(cfg.warps / 4);
    let kernel_name = format!(
        "aec_fwd_{}_{}_d{dqk}x{dv_total}_m{}n{}w{}{}{}{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.block_m,
        cfg.block_n,
        cfg.warps,
        match (cfg.pack_gqa, cfg.wgmma) {
            (true, true) if cfg.warp_specialized => "_gqa_wgmma_ws",
            (true, true) => "_gqa_wgmma",
            (true, false) => "_gqa",
            (false, true) if cfg.q_in_registers => "_wgmma_ws_rq",
            (false, true) if cfg.warp_specialized => "_wgmma_ws",
            (false, true) => "_wgmma",
            (false, false) => "",
        },
        if cfg.persistent { "_p" } else { "" },
        if cfg.stages == 2 {
            String::new()
        } else {
            format!("_s{}", cfg.stages)
        }
    ) + &if cfg.key_warps > 1 {
        format!("_k{}", cfg.key_warps)
    } else {
        String::new()
    } + &if cfg.dv_warps > 1 {
        format!("_dw{}", cfg.dv_warps)
    } else {
        String::new()
    } + if cfg.fused_combine { "_fc" } else { "" }
        + &if cfg.dv_split > 1 {
            format!("_v{}", cfg.dv_split)
        } else {
            String::new()
        }
        + if cfg.v_in_k { "_vk" } else { "" }
        + if tma { "_tma" } else { "" }
        + if late_epilogue { "_le" } else { "" }
        + if kv_multicast { "_mc" } else { "" }
        + match layout {
            RowLayout::Dense => "",
            RowLayout::Varlen => "_varlen",
            RowLayout::Paged => "_paged",
            RowLayout::BlockSparse => "_sparse",
        };
    let t = ForwardTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(cfg.elem),
        bm: cfg.block_m,
        bn: cfg.block_n,
        warps: cfg.warps(),
        key_warps: cfg.key_warps,
        dv_warps: cfg.dv_warps,
        share_p: shares_p(cfg),
        wg_loads: warpgroup_loads(cfg, par.modify_k.is_some() || par.modify_v.is_some()),
        m_tiles: cfg.m_tiles(),
        warp_size: WARP_SIZE,
        dqk,
        dv,
        dvw,
        dv_total,
        dv_split: cfg.dv_split,
        nstate,
        nstate_arr: nstate.max(1),
        nscales,
        nscales_arr: nscales.max(1),
        params_fields,
        custom_args,
        params_init,
        state_init,
        causal,
        packed: cfg.pack_gqa,
        mask_reads_head: reads(par.mask.as_ref(), |op| *op == Op::Index(Axis::H)),
        regions,
        modify_q: par.modify_q.is_some(),
        modify_k: par.modify_k.is_some(),
        modify_v: par.modify_v.is_some(),
        modify_scores: par.modify_scores.is_some(),
        mask: par.mask.is_some(),
        clamp: scores_read_customs_by_position(variant),
        wgmma: cfg.wgmma,
        ws: cfg.warp_specialized,
        persistent: cfg.persistent,
        stages: cfg.stages,
        late_epilogue,
        q_regs: cfg.q_in_registers,
        producer_regs,
        consumer_regs,
        // (Not with the late epilogue: a warpgroup holds the last tile's V
        // stage into the next tile's first computed block, and skipping two
        // blocks of a two-stage ring would wait for that stage's reload.)
        wg_skip: cfg.wgmma
            && cfg.warp_specialized
            && cfg.key_warps == 1
            && !cfg.pack_gqa
            && !late_epilogue
            && !kv_multicast
            && layout != RowLayout::BlockSparse
            && par.mask.as_ref().is_some_and(implies_causal),
        split_kv: cfg.split_kv,
        fused_combine: cfg.fused_combine,
        varlen,
        paged: layout == RowLayout::Paged,
        sparse: layout == RowLayout::BlockSparse,
        scheduled: tile_schedule,
        tma,
        // (Measured faster with two stages only: bench/NOTES.md session 44.)
        kv_bars: tma && cfg.stages == 2,
        kv_multicast,
        v_in_k: cfg.v_in_k,
        xor_rows: xor_rows(cfg, dv),
        // The transpose keeps a few more values live in the epilogue: at
        // Dqk <= 128 it made the forward 1.5-9% faster (H100: softmax,
        // causal, DiffTransformer), at Dqk 192 with Dv 128 (DeepSeek) 4%
        // (H200: the epilogue 1.02 -> 0.48 us a tile), at Dqk = 256 (RetNet,
        // Dv 512) it moved spills into the main loop and cost 6%
        // (bench/NOTES.md sessions 16 and 61).
        quad_stores: dqk <= 128 || dv_total <= 128,
        combine_rows: combine_rows_for(dv_total),
        combine_chunk: combine_chunk_for(dv_total),
        fused_chunk: fused_chunk_for(cfg, dv_total),
        wgmma_fns: if cfg.wgmma {
            wgmma_fns(
                cfg.elem,
                &[
                    // S = Q·Kᵀ with Q from shared memory or from registers.
                    if cfg.q_in_registers {
                        (cfg.block_n, Form::RsKMajor)
                    } else {
                        (cfg.block_n, Form::Ss)
                    },
                    (dvw, Form::RsNMajor),
                ],
            )
        } else {
            String::new()
        },
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;
    let mut args = forward_args_with(variant, cfg.split_kv, layout);
    if cfg.fused_combine {
        // The template takes the row blocks' counters after n_splits.
        let at = args
            .iter()
            .position(|a| *a == ArgKind::KvSplits)
            .map_or(args.len(), |i| i + 1);
        args.insert(at, ArgKind::Workspace("split_count"));
    }
    if tile_schedule {
        args.extend(TILE_SCHEDULE_ARGS);
    }
    let tensor_maps = if tma {
        tma_maps(cfg, dqk, dv, dv_total)
    } else {
        Vec::new()
    };
    args.extend(tensor_maps.iter().map(|m| ArgKind::TensorMap(m.tensor)));
    let row_outputs = row_output_names(online);
    let split_tile = SplitTile {
        block_m: cfg.block_m,
        block_n: cfg.block_n,
        stages: cfg.stages,
        dqk,
        dv_slice: dv,
        v_in_k: cfg.v_in_k,
        elem_bytes: cfg.elem.bytes(),
    };
    Ok(KernelSource {
        combine: (cfg.split_kv && !cfg.fused_combine).then(|| format!("{kernel_name}_combine")),
        split_kv: cfg.split_kv,
        name: kernel_name,
        source,
        threads: (cfg.warps() + if cfg.warp_specialized { 4 } else { 0 }) * WARP_SIZE,
        block_m: cfg.block_m,
        smem_bytes: smem_bytes(cfg, dqk, dv),
        args,
        row_outputs,
        packed_gqa: cfg.pack_gqa,
        dv_split: cfg.dv_split,
        elem: cfg.elem,
        persistent: cfg.persistent,
        dqk,
        dv: dv_total,
        block_n: cfg.block_n,
        kv_bytes_in_flight: split_tile.kv_bytes_in_flight(),
        split_fixed_work: split_tile.split_fixed_work(),
        split_state_words: nstate as u32 + 1,
        v_in_k: cfg.v_in_k,
        tile_schedule,
        cluster_pairs: kv_multicast,
        tensor_maps,
    })
}

/// The tensor maps of a dense forward with TMA loads: Q's boxes are a row
/// block's `block_m` rows, K's and V's a key block's `block_n`, each 64
/// columns wide (a Dv slice starts at a multiple of 64 columns of the whole
/// Dv).
fn tma_maps(cfg: &ForwardConfig, dqk: u32, dv_slice: u32, dv_total: u32) -> Vec<TensorMapSpec> {
    debug_assert!(dqk.is_multiple_of(64) && dv_slice.is_multiple_of(64));
    vec![
        TensorMapSpec::dense("q", dqk, "Sq", "H", cfg.block_m),
        TensorMapSpec::dense("k", dqk, "Skv", "Hkv", cfg.block_n),
        TensorMapSpec::dense("v", dv_total, "Skv", "Hkv", cfg.block_n),
    ]
}

/// The instruction set whose default tiles a forward takes on `isa`: shared
/// K/V storage (`v_in_k`) is refused by the warp-specialised prefill
/// kernel, so its kernels start from the sm_80 tiles on every GPU (on
/// sm_90a, [`ForwardConfig::for_packed_rows`] then takes `wgmma` where a KV
/// head has 64 or more query rows).
pub fn forward_default_isa(isa: Isa, v_in_k: bool) -> Isa {
    if v_in_k { Isa::Sm80 } else { isa }
}

/// The untuned forward configuration on `isa`: `default` (a dense, varlen…
/// rule such as [`ForwardConfig::default_for`]) on the instruction set whose
/// tiles the forward takes, then, with shared K/V storage,
/// [`ForwardConfig::with_v_in_k`]. The runtime, `aec compile` and the
/// benchmark all build it here.
pub fn untuned_forward_config(
    default: fn(&Variant, u32, u32, Elem, Isa) -> ForwardConfig,
    variant: &Variant,
    dqk: u32,
    dv: u32,
    elem: Elem,
    isa: Isa,
    v_in_k: bool,
) -> ForwardConfig {
    let isa = forward_default_isa(isa, v_in_k);
    let cfg = default(variant, dqk, dv, elem, isa);
    if v_in_k {
        cfg.with_v_in_k(dqk, dv, isa)
    } else {
        cfg
    }
}

/// Whether `split` (1, 2 or 4) cuts `dv_total` into slices a block can
/// compute (multiples of 16, at most [`MAX_DV_SLICE`]); every target's
/// forward checks this.
pub fn check_dv_split(split: u32, dv_total: u32) -> Result<(), CompileError> {
    check_dv_slices(split, 1, dv_total)
}

/// [`check_dv_split`] where `dv_warps` warps share each block's slice: each
/// warp's columns are what must fit.
fn check_dv_slices(split: u32, dv_warps: u32, dv_total: u32) -> Result<(), CompileError> {
    let parts = split * dv_warps.max(1);
    if !matches!(split, 1 | 2 | 4)
        || !dv_total.is_multiple_of(parts)
        || !(dv_total / parts).is_multiple_of(16)
        || dv_total / parts > MAX_DV_SLICE
    {
        return Err(CompileError(format!(
            "dv_split {split} does not fit Dv = {dv_total}: it must be 1, 2 or 4 and cut Dv into slices that are multiples of 16 of at most {MAX_DV_SLICE} columns{}",
            match default_dv_split(dv_total) {
                n if dv_total / n <= MAX_DV_SLICE => format!(" (dv_split {n} does)"),
                _ => String::new(),
            }
        )));
    }
    Ok(())
}

pub(crate) fn check_config(
    cfg: &ForwardConfig,
    dqk: u32,
    dv_total: u32,
) -> Result<(), CompileError> {
    let split = cfg.dv_split;
    check_dv_slices(split, cfg.dv_warps, dv_total)?;
    let dv = dv_total / split;
    // (Key warpgroups hold a stage each while the rest load: up to 6.)
    let max_stages = if cfg.wgmma && cfg.key_warps > 1 { 6 } else { 4 };
    if !(2..=max_stages).contains(&cfg.stages) {
        return Err(CompileError(format!(
            "{} K/V stages: the forward's K/V ring holds 2 to {max_stages} blocks{}",
            cfg.stages,
            if max_stages > 4 {
                " with key warpgroups"
            } else {
                ""
            }
        )));
    }
    if cfg.v_in_k && dv_total > dqk {
        return Err(CompileError(format!(
            "v_in_k (V stored in the first Dv columns of K) needs Dv <= Dqk; got Dqk {dqk}, Dv {dv_total}"
        )));
    }
    // On wgmma, key warps are warpgroups taking whole blocks in turn
    // (`keyed_block` in the template): two, beside a producer warpgroup, in
    // a ring deep enough that each can hold a stage while the next loads.
    let key_warpgroups = cfg.wgmma
        && cfg.key_warps == 2
        && cfg.warp_specialized
        && !cfg.persistent
        && cfg.dv_warps <= 1
        && cfg.stages > cfg.key_warps;
    if !matches!(cfg.key_warps, 1 | 2 | 4)
        || !cfg.warps.is_multiple_of(cfg.key_warps)
        || (cfg.key_warps > 1
            && !key_warpgroups
            && (cfg.wgmma || !(cfg.block_n / cfg.key_warps).is_multiple_of(16)))
    {
        return Err(CompileError(format!(
            "{} key warps with {} warps, {}-key blocks and {} stages are not supported: key_warps must be 1, 2 or 4 and divide the warps; above 1 it needs the sm_80 template (wgmma: false), each warp then a multiple of 16 keys, or on wgmma two key warpgroups with a producer warpgroup (warp_specialized: true, persistent: false, dv_warps: 1, three or more stages)",
            cfg.key_warps, cfg.warps, cfg.block_n, cfg.stages
        )));
    }
    if cfg.key_warps > 1 && !key_warps_share_columns(cfg, dv_total) {
        return Err(CompileError(format!(
            "{} key warps with {} O columns per warp are not supported: each key warp merges and writes an equal share of the warp's 8-column groups, so the columns per warp (Dv {dv_total} / dv_split {} / dv_warps {}) must be a multiple of {}",
            cfg.key_warps,
            cfg.warp_columns(dv_total),
            cfg.dv_split.max(1),
            cfg.dv_warps.max(1),
            8 * cfg.key_warps
        )));
    }
    if !matches!(cfg.dv_warps, 1 | 2)
        || (cfg.dv_warps > 1
            && (!cfg
                .warps
                .is_multiple_of(cfg.key_warps * cfg.dv_warps * if cfg.wgmma { 4 } else { 1 })
                || !cfg.dv_slice(dv_total).is_multiple_of(64 * cfg.dv_warps)
                || !dqk.is_multiple_of(64)))
    {
        return Err(CompileError(format!(
            "{} Dv warps with {} warps ({} key warps), Dqk {dqk} and Dv slices of {} are not supported: dv_warps must be 1 or 2 and divide the warps per key warp (on wgmma, warpgroups), and 2 needs Dqk a multiple of 64 and Dv slices a multiple of 128",
            cfg.dv_warps,
            cfg.warps,
            cfg.key_warps,
            cfg.dv_slice(dv_total)
        )));
    }
    if cfg.fused_combine && (!cfg.split_kv || cfg.wgmma) {
        return Err(CompileError(
            "the combine in the main kernel (fused_combine) needs split-KV (split_kv: true) and the sm_80 template (wgmma: false)".into(),
        ));
    }
    // The decoding features of the warp-specialised kernel run with a block
    // per row block (its persistent walk has no KV splits, and its tiles'
    // rows are one head's).
    let decoding = cfg.split_kv
        || cfg.pack_gqa
        || cfg.v_in_k
        || cfg.dv_warps > 1
        || dqk > WS_PERSISTENT_MAX_DQK;
    if cfg.warp_specialized && cfg.persistent && decoding {
        return Err(CompileError(format!(
            "split-KV, packed GQA rows, V in K, Dv warps and Dqk above {WS_PERSISTENT_MAX_DQK} are implemented for the warp-specialised forward with a block per row block (set persistent: false)"
        )));
    }
    if cfg.q_in_registers && !cfg.warp_specialized {
        return Err(CompileError(
            "Q in registers is implemented for the warp-specialised wgmma forward only".into(),
        ));
    }
    if cfg.persistent && !cfg.warp_specialized {
        return Err(CompileError(
            "persistent kernels are implemented for the warp-specialised wgmma forward only (set warp_specialized: true)".into(),
        ));
    }
    if cfg.warp_specialized && !cfg.wgmma {
        return Err(CompileError(
            "warp specialisation is implemented for the wgmma forward only (set wgmma: true)"
                .into(),
        ));
    }
    if cfg.wgmma {
        if !cfg.warps.is_multiple_of(4 * cfg.dv_warps.max(1)) || cfg.block_m != 16 * cfg.row_warps()
        {
            return Err(CompileError(format!(
                "wgmma tile {}x{} with {} warps is not supported: each warpgroup of 4 warps owns 64 rows (block_m = 16 x warps / dv_warps)",
                cfg.block_m, cfg.block_n, cfg.warps,
            )));
        }
        // (Dv warpgroups each take their share of the slice's columns.)
        let dvw = dv / cfg.dv_warps.max(1);
        if !wgmma_decoding_dims_ok(dqk, dvw) {
            return Err(CompileError(format!(
                "the wgmma forward needs Dqk and Dv to be multiples of {PANEL_COLS} with Dv <= {MAX_N} per warpgroup and Dqk <= {MAX_FORWARD_DQK}, got Dqk {dqk}, Dv {dvw}; use the sm_80 template (wgmma: false)"
            )));
        }
    }
    // wgmma takes any N that is a multiple of 8; the swizzled loader copies
    // K/V in passes of (loading threads / 8) rows: 16 for the producer
    // warpgroup, 4 per warp without warp specialisation. (Dv = 256 leaves
    // registers for key blocks between 64 and 128, bench/NOTES.md.)
    let rows_per_pass = if cfg.warp_specialized {
        4 * WARP_SIZE / 8
    } else {
        cfg.warps * WARP_SIZE / 8
    };
    let block_n_ok = if cfg.wgmma {
        cfg.block_n.is_multiple_of(rows_per_pass.max(1)) && (32..=128).contains(&cfg.block_n)
    } else {
        matches!(cfg.block_n, 32 | 64 | 128)
    };
    // 192 rows: three consumer warpgroups beside the producer, each with
    // 160 registers (`register_split`), one key and Dv warp each.
    if cfg.block_m == THREE_WARPGROUP_ROWS
        && !(cfg.wgmma
            && cfg.warp_specialized
            && cfg.warps == 12
            && cfg.key_warps == 1
            && cfg.dv_warps <= 1
            && !cfg.pack_gqa)
    {
        return Err(CompileError(format!(
            "tile {}x{} with {} warps is not supported: {THREE_WARPGROUP_ROWS} rows are three consumer warpgroups, which need the warp-specialised wgmma forward (wgmma: true, warp_specialized: true) with 12 warps, one key warp, one Dv warp and unpacked rows",
            cfg.block_m, cfg.block_n, cfg.warps
        )));
    }
    let row_warps = cfg.row_warps();
    if !(matches!(cfg.block_m, 16 | 32 | 64 | 128) || cfg.block_m == THREE_WARPGROUP_ROWS)
        || !block_n_ok
        || row_warps == 0
        || !matches!(cfg.block_m.checked_div(row_warps), Some(16 | 32))
        || !cfg.block_m.is_multiple_of(row_warps)
    {
        return Err(CompileError(format!(
            "tile {}x{} with {} warps{} is not supported: block_m must be 16, 32, 64 or 128 (192 on the warp-specialised wgmma forward), block_n 32, 64 or 128 (wgmma kernels: from 32 to 128, a multiple of 16 with warp specialisation, of 4 x warps without), and each warp must own 16 or 32 rows",
            cfg.block_m,
            cfg.block_n,
            cfg.warps,
            if cfg.key_warps > 1 {
                format!(" ({} key warps each)", cfg.key_warps)
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}
