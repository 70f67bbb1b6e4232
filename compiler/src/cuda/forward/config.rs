//! The forward's tile configuration: `ForwardConfig`, its defaults and shape
//! rules, what a configuration costs in shared memory and registers, and
//! `check_config`, which refuses what the template cannot build.

use super::*;

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
    /// `2 · min(⌈units / 2⌉, ⌊SMs / 2⌋)`) that walk adjacent row-block pairs of one
    /// head in step, and each key block both read comes from L2 once: each
    /// CTA copies half its boxes into both CTAs' shared memory (TMA
    /// multicast). Under a causal mask the extra diagonal block of one CTA
    /// is placed so the pair's steps stay aligned, which needs `block_m` a
    /// multiple of `block_n`. Sizes the pairing does not fit (row blocks per
    /// head not a multiple of 4; under a causal mask `Sq ≠ Skv`) run
    /// with each CTA loading its own blocks. Correct but slower: on an H200
    /// every benchmark forward ran 14–31% slower with it, at 28% more
    /// cycles for DeepSeek (bench/NOTES.md session 74), so no default, the
    /// runtime or the tuner picks it; it stays for measurement
    /// (`aec-bench --kv-multicast`).
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
    /// (`wgmma_packed_tile`), elsewhere four
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
    /// `wgmma_packed_tile`'s one warpgroup on
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

/// Static shared memory of the warp-specialised kernel (its mbarriers),
/// rounded up: it shares the per-block limit with the dynamic allocation.
pub(crate) const WS_STATIC_SMEM: u32 = 128;

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

/// Dynamic shared memory of the forward kernel: Q, and `stages` K and V
/// tiles (rows padded by 8 elements for `ldmatrix` on sm_80; swizzled tiles
/// unpadded plus 1 KiB to align them to 1024 bytes).
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
pub(super) fn shares_p(cfg: &ForwardConfig) -> bool {
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
pub(super) fn warpgroup_loads(cfg: &ForwardConfig, modifies_kv: bool) -> bool {
    shares_p(cfg) && !modifies_kv && cfg.key_warps == 1 && !(cfg.v_in_k && cfg.dv_split > 1)
}

/// Words per thread of the P hand-over ([`shares_p`]): P's fragments (BN / 4)
/// and the two rows' rescale; the row state handed over at the end must fit
/// too.
pub(super) fn p_exchange_words(cfg: &ForwardConfig) -> u32 {
    cfg.block_n / 4 + 2
}

/// Whether the sm_80 template's tiles use XOR rows (`TILE_XOR_ROWS` in
/// `templates/cuda/prelude.cu`: 128-byte-aligned rows, so `cp.async` reads
/// each L2 sector once; bench/NOTES.md): always, except for V read from K
/// in slices (`dv`, one block's) that are not 64 columns wide.
pub(super) fn xor_rows(cfg: &ForwardConfig, dv: u32) -> bool {
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
pub(super) fn ring_bytes(cfg: &ForwardConfig, dqk: u32, dv: u32) -> u32 {
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
pub(super) fn key_warp_scratch_bytes(cfg: &ForwardConfig, dv: u32, nstate: usize) -> u32 {
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
