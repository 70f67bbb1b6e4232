//! The parallel backward kernels: `templates/cuda/parallel_bwd.cu` filled with
//! the variant's closures, their derived backward and the lowered
//! normalisation backward ([`crate::backward_plan`]).

use super::dialect::{Elem, ElemSpelling, Isa, WARP_SIZE, elem_spelling};
use super::forward::{ArgKind, TensorMapSpec};
use super::wgmma::{Form, wgmma_fns};
use crate::CompileError;
use crate::cxx::closures::{
    CustomParams, MAX_DQK, custom_params, parallel_inputs, reads, row_output_names,
    scores_read_customs_by_position,
};
use crate::cxx::regions::{BackwardRegions, backward_regions, implies_causal, is_causal};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op};
use askama::Template;

/// The backward template and the preludes it includes, as text: their
/// digest is part of the backward's tuning keys, so a changed template
/// never reuses old results.
pub const TEMPLATE_TEXT: &str = concat!(
    include_str!("../../../templates/cuda/parallel_bwd.cu"),
    include_str!("../../../templates/cuda/parallel_types.cu"),
    include_str!("../../../templates/cuda/prelude.cu"),
    include_str!("../../../templates/cuda/prelude_sm90.cu"),
    include_str!("../../../templates/cuda/tile_layout.cu"),
);

/// Tile configuration of the backward's main kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BackwardConfig {
    /// Query rows per step of the loop over query blocks (32, 64 or 128;
    /// with `wgmma`, 32, 64 or 80: [`BackwardConfig::transposes_dq`]).
    pub block_m: u32,
    /// Warps per block; each owns 16 keys and a `1 / split_d` slice of the
    /// dK and dV columns, so a block holds `16 · warps / split_d` keys.
    pub warps: u32,
    /// Warps that share 16 keys (1, 2 or 4): each recomputes their scores and
    /// accumulates a slice of dK and dV — what keeps head dims above 128 (2)
    /// and Dv above 256 (4) in registers.
    pub split_d: u32,
    pub elem: Elem,
    /// All five GEMMs on Hopper's `wgmma` (sm_90a only): K, V, Q, dO and dSᵀ
    /// in 128-byte-swizzled shared memory, `block_m` 64 on 8 warps. With
    /// `split_d` 1 each warpgroup owns 64 keys (Dqk, Dv of 64 or 128; 80
    /// queries per step with the producer warpgroup); with
    /// `split_d` 2 both warpgroups take the same 64 keys, each accumulating
    /// its share of the 64-column panels of dK and dV (Sᵀ and dPᵀ computed by
    /// both, or shared: [`BackwardConfig::shared_scores`]); head dims above
    /// 128 ([`wgmma_split_dims_ok`]), and with `block_m` 32 up to Dqk 256,
    /// Dv 512 ([`BackwardConfig::kv_groups`]).
    pub wgmma: bool,
    /// With `wgmma` and `split_d` 2: blocks per key block (1 or more), each
    /// recomputing Sᵀ and dPᵀ and holding its `1 / kv_groups` share of the
    /// dK and dV panels and of dQ's — fewer panels per warpgroup at the
    /// price of the recomputation ([`wgmma_grouped_dims_ok`]: the defaults
    /// take one; RetNet's 256/512 was slower in two or three). 1 everywhere
    /// else.
    pub kv_groups: u32,
    /// With `wgmma` and `split_d` 2: warpgroup 0 computes Sᵀ and warpgroup 1
    /// dPᵀ (instead of both computing both); Sᵀ goes to warpgroup 1 through
    /// shared memory, which forms Pᵀ and dSᵀ and hands their packed
    /// fragments back for the dK/dV GEMMs. Needs `256 · block_m` bytes of
    /// shared memory more.
    pub shared_scores: bool,
    /// With `wgmma`: a third warpgroup copies each step's Q, dO and row
    /// constants into a two-stage ring (mbarriers) ahead of the computing
    /// warpgroups and adds their dQ tiles, staged in shared memory, into
    /// the f32 accumulator with vector atomics, so the computing warpgroups
    /// neither issue loads nor wait on the atomics; they give it their
    /// spare registers (`setmaxnreg`). Needs the shared memory of the
    /// staged dQ tile ([`BackwardConfig::smem_bytes`]).
    pub warp_specialized: bool,
    /// With warp specialisation (ignored without): the producer loads each
    /// step's Q and dO with TMA tensor copies (one thread, a box per 64
    /// columns) instead of `cp.async` from every producer thread; the
    /// kernels then take tensor maps of `q` and `dout`
    /// ([`BackwardSource::tensor_maps`]). Not for packed variable-length
    /// batches, nor where Q is modified (the main kernel reads `qmod`).
    pub tma_loads: bool,
}

impl BackwardConfig {
    /// Measured on an H200 (bench/NOTES.md): for head dims up to 128, 32
    /// query rows per step on eight warps (128 keys per block: half the dQ
    /// atomics of 64 keys; 64 rows was 2% faster but spills under NVRTC);
    /// four warps with 64 rows where both dims are ≤ 64; 32 rows on four
    /// warps above 128, where a warp's dK and dV accumulators fill the
    /// registers; for Dv above 256, four warps share 16 keys (each a quarter
    /// of the dK and dV columns). Where Dqk does not split evenly between the
    /// warps that share a dQ row tile (Dqk = 80, 96, …), the next candidate
    /// that fits.
    ///
    /// On sm_90a, head dims of 64 or 128 use `wgmma` (64 queries per step,
    /// 128 keys per block on two warpgroups); up to Dqk + Dv = 320 (DeepSeek
    /// 192/128) the same on 32-query steps, where a warpgroup's dK and dV
    /// fit its registers beside the smaller Sᵀ and dPᵀ (13% faster than both
    /// warpgroups on 64 keys: half the dQ additions per query, bench/NOTES.md
    /// session 40); larger multiples of 64 whose dK and dV panels fit two
    /// warpgroups' registers (DiffTransformer 128/256) use it with both
    /// warpgroups on 64 keys; larger ones (RetNet's 256/512) the same on 32
    /// queries per step (the K, V, Q and dO tiles then fit the shared
    /// memory), up to six panels per warpgroup
    /// ([`wgmma_grouped_dims_ok`]).
    pub fn default_for(dqk: u32, dv: u32, elem: Elem, isa: Isa) -> BackwardConfig {
        if isa == Isa::Sm90a {
            let shape = if wgmma_backward_dims_ok(dqk, dv) {
                Some((64, 1, 1))
            } else if wgmma_own_keys_dims_ok(dqk, dv) {
                Some((32, 1, 1))
            } else if wgmma_split_dims_ok(dqk, dv) {
                Some((64, 2, 1))
            } else if wgmma_grouped_dims_ok(dqk, dv) {
                Some((32, 2, 1))
            } else {
                None
            };
            if let Some((block_m, split_d, kv_groups)) = shape {
                let cfg = BackwardConfig {
                    block_m,
                    warps: 8,
                    split_d,
                    elem,
                    wgmma: true,
                    kv_groups,
                    shared_scores: split_d == 2,
                    warp_specialized: true,
                    tma_loads: true,
                };
                // The first that fits, with room for four row constants (what a
                // variant needs is known only when it is generated): the
                // producer warpgroup before the shared scores.
                let plain = BackwardConfig {
                    warp_specialized: false,
                    tma_loads: false,
                    ..cfg
                };
                let unshared = |c: BackwardConfig| BackwardConfig {
                    shared_scores: false,
                    ..c
                };
                return [cfg, unshared(cfg), plain]
                    .into_iter()
                    .find(|c| c.smem_bytes(dqk, dv, 4) <= isa.max_dynamic_smem())
                    .unwrap_or(unshared(plain));
            }
        }
        let preferred: &[(u32, u32, u32)] = if dqk <= 64 && dv <= 64 {
            &[(64, 4, 1)]
        } else if dqk <= 128 && dv <= 128 {
            &[(32, 8, 1), (64, 8, 1), (64, 4, 1)]
        } else if dv > 256 {
            // A quarter of Dv (≤ 128 columns) per warp; 32 keys per block.
            &[(32, 8, 4)]
        } else {
            &[(32, 8, 2), (64, 8, 2), (32, 4, 1), (64, 4, 1)]
        };
        let (block_m, warps, split_d) = preferred
            .iter()
            .chain(&[(64, 4, 1)])
            .copied()
            .find(|&(m, w, k)| tile_fits(dqk, dv, m, w, k))
            .unwrap_or((64, 4, 1));
        BackwardConfig::mma_sync(block_m, warps, split_d, elem)
    }

    /// The default for `variant` on `isa`: [`BackwardConfig::default_for`],
    /// on 80-query steps with dQ computed transposed
    /// ([`BackwardConfig::transposes_dq`]) where that default is the
    /// warp-specialised kernel with a warpgroup per 64 keys at Dqk = Dv =
    /// 128 and the variant has no mask (or the plain causal one), no score
    /// modification and no custom inputs. Measured backward alone
    /// (bench/NOTES.md sessions 47 and 48): on an H100 softmax b8 s2048
    /// 4.1% faster, b1 s8192 5.7%, GQA 5.5%, sigmoid level; on an H200
    /// causal b8 3.3%, causal b1 s8192 7.6%, GQA causal 4.6% (each key
    /// block's walk starting at its diagonal row); slower where the step
    /// does more per score or less per key: softcap +1.4% (its tanh spills
    /// at 80), ReLU at d64 +1.0%, a 256-key sliding window +5% (a walk of
    /// 384 rows in five 80-row steps against six of 64), and custom inputs'
    /// per-score gradients spill past the budget (relative bias: 136 bytes).
    /// Where the default is the paired 32-query kernel (Dqk + Dv up to 320,
    /// dK and dV filling a warpgroup's registers), the same variants take
    /// 48-query steps with dQ transposed: Sᵀ and dPᵀ at N = 48 instead of 32
    /// (less shared memory read per product), each step's dQ in turns and
    /// in bulk; DeepSeek 192/128 causal b8 s2048 on an H200, main kernel
    /// 1193 → 1151 µs in three rounds, 1195 → 1182 in five (the whole
    /// backward level): a small gain, never slower (bench/NOTES.md session
    /// 57); the tuner's space keeps the paired steps.
    pub fn for_variant(
        variant: &Variant,
        dqk: u32,
        dv: u32,
        elem: Elem,
        isa: Isa,
    ) -> BackwardConfig {
        let cfg = BackwardConfig::default_for(dqk, dv, elem, isa);
        let plain = variant
            .parallel()
            .is_some_and(|p| p.modify_scores.is_none() && p.mask.as_ref().is_none_or(is_causal))
            && variant.customs.is_empty();
        let wide = BackwardConfig { block_m: 80, ..cfg };
        let own_keys = BackwardConfig { block_m: 48, ..cfg };
        if plain
            && (dqk, dv) == (128, 128)
            && cfg.lags_dq()
            && wide.transposes_dq()
            && wide.smem_bytes(dqk, dv, 4) <= isa.max_dynamic_smem()
        {
            wide
        } else if plain
            && cfg.pairs_steps()
            && own_keys.transposes_dq()
            && own_keys.smem_bytes(dqk, dv, 4) <= isa.max_dynamic_smem()
        {
            own_keys
        } else {
            cfg
        }
    }

    /// The `mma.sync` kernel's tile: `block_m` query rows per step on
    /// `warps` warps, `split_d` of them sharing 16 keys.
    fn mma_sync(block_m: u32, warps: u32, split_d: u32, elem: Elem) -> BackwardConfig {
        BackwardConfig {
            block_m,
            warps,
            split_d,
            elem,
            wgmma: false,
            kv_groups: 1,
            shared_scores: false,
            warp_specialized: false,
            tma_loads: false,
        }
    }

    pub fn block_n(&self) -> u32 {
        16 * self.warps / self.split_d.max(1)
    }

    /// A short name for reports: rows per step and warps (`m64w8`), the
    /// warps sharing keys (`s2`) and blocks per key block (`g2`) where
    /// above 1, the instruction set, and the wgmma kernel's options.
    pub fn label(&self) -> String {
        let mut s = format!("m{}w{}", self.block_m, self.warps);
        if self.split_d > 1 {
            s += &format!("s{}", self.split_d);
        }
        if self.kv_groups > 1 {
            s += &format!("g{}", self.kv_groups);
        }
        s += if self.wgmma { " wgmma" } else { " mma.sync" };
        if self.shared_scores {
            s += " shared-scores";
        }
        if self.warp_specialized {
            s += if self.tma_loads { " ws tma" } else { " ws" };
        }
        s
    }

    /// The backward's tile space on `isa` for head dims `dqk`, `dv`: what
    /// the tuner profiles. On sm_90a every form of the wgmma kernel (64 or
    /// 32 query rows per step; each warpgroup on its own 64 keys or both on
    /// the same keys, in one or two blocks per key block, with or without
    /// shared scores; with or without the producer warpgroup, which loads by
    /// TMA), then on every target the `mma.sync` tiles whose warps divide
    /// the head dims (`tile_fits`). Candidates the head dims or the
    /// shared memory do not take are in the list too: the generator refuses
    /// them with the reason ([`parallel_backward`]), which the tuner
    /// reports.
    pub fn space(dqk: u32, dv: u32, elem: Elem, isa: Isa) -> Vec<BackwardConfig> {
        let mut out = Vec::new();
        if isa == Isa::Sm90a {
            for (block_m, split_d, kv_groups) in [
                (80, 1, 1),
                (48, 1, 1),
                (64, 1, 1),
                (32, 1, 1),
                (64, 2, 1),
                (32, 2, 1),
                (64, 2, 2),
                (32, 2, 2),
            ] {
                // (80- and 48-query steps stage dQ for the producer:
                // warp-specialised only.)
                let producer: &[bool] = if block_m == 80 || block_m == 48 {
                    &[true]
                } else {
                    &[true, false]
                };
                for &warp_specialized in producer {
                    let shared: &[bool] = if split_d == 2 {
                        &[true, false]
                    } else {
                        &[false]
                    };
                    for &shared_scores in shared {
                        out.push(BackwardConfig {
                            block_m,
                            warps: 8,
                            split_d,
                            elem,
                            wgmma: true,
                            kv_groups,
                            shared_scores,
                            warp_specialized,
                            tma_loads: warp_specialized,
                        });
                    }
                }
            }
        }
        for block_m in [32, 64] {
            for warps in [4, 8] {
                for split_d in [1, 2, 4] {
                    if tile_fits(dqk, dv, block_m, warps, split_d) {
                        out.push(BackwardConfig::mma_sync(block_m, warps, split_d, elem));
                    }
                }
            }
        }
        out
    }

    /// Threads of the main kernel: the computing warps, and the producer
    /// warpgroup of a warp-specialised one.
    pub fn main_threads(&self) -> u32 {
        (self.warps + if self.warp_specialized { 4 } else { 0 }) * WARP_SIZE
    }

    /// Whether the kernel's 32-query steps pair on 64-row boundaries, dQ
    /// computed once per pair over its 64 rows (the template's `DQ_ROWS`):
    /// the warp-specialised wgmma kernel with a warpgroup per 64 keys on
    /// 32-query steps (each step alone would run dQ over 64 rows, 32 of them
    /// padding). The generator keeps single steps where a mask other than
    /// the plain causal one could hide one step of a pair; the staged tile
    /// keeps its 64 rows there.
    pub fn pairs_steps(&self) -> bool {
        self.wgmma && self.warp_specialized && self.split_d == 1 && self.block_m == 32
    }

    /// Whether a step's dQ can run at the top of the next step, behind its
    /// own dV/dK GEMMs, instead of behind a barrier of both warpgroups in the
    /// middle of the step: the warp-specialised wgmma kernel with a
    /// warpgroup per 64 keys on 64-query steps. The two warpgroups then hand
    /// over each dSᵀ tile through mbarriers one step apart, and neither
    /// waits for the other's current step. The generator takes it without a
    /// mask only (slower under the causal one; bench/NOTES.md session 46).
    pub fn lags_dq(&self) -> bool {
        self.wgmma
            && self.warp_specialized
            && self.split_d == 1
            && self.block_m == 64
            && !self.shared_scores
    }

    /// Whether the kernel takes 80 or 48 queries per step with dQ computed
    /// transposed (dQᵀ = Kᵀ·dSᵀ, M a 64-column panel of Dqk, N the step's
    /// queries; neither is a multiple of wgmma's 64 rows): the
    /// warp-specialised wgmma kernel with a warpgroup per 64 keys. At 80, a
    /// fifth fewer steps than 64 queries per step, and the Sᵀ/dPᵀ GEMMs at
    /// N = 80 read less shared memory per product; at 48 (Dqk + Dv up to
    /// 320, where Sᵀ and dPᵀ at 80 or 64 do not fit beside dK and dV), the
    /// same against the paired 32-query steps.
    pub fn transposes_dq(&self) -> bool {
        self.wgmma
            && self.warp_specialized
            && self.split_d == 1
            && self.kv_groups == 1
            && (self.block_m == 80 || self.block_m == 48)
            && !self.shared_scores
    }

    /// Whether the two warpgroups take each step's dQ in turns: the one
    /// whose turn it is computes the whole dQ (every 64-column panel of Dqk
    /// over both warpgroups' dS) and stages it, while the other only
    /// signals its dS written and goes on to its next step — so one's
    /// element step and GEMMs overlap the other's dQ GEMM instead of both
    /// waiting at a barrier for theirs (cuDNN's backward does the same).
    /// The kernels on 80-query steps. (H200: level alone, the warpgroup
    /// ahead then waiting for Q/dO that the producer copies only after its
    /// atomics; with [`BackwardConfig::adds_dq_in_bulk`] 4% off softmax's
    /// main kernel, bench/NOTES.md session 53.)
    pub fn takes_dq_turns(&self) -> bool {
        self.transposes_dq()
    }

    /// Whether the staged dQ tile is unpadded, its rows those of dq_acc,
    /// its float columns XOR-permuted in groups of 8 by bits 1-2 of the row
    /// (the template's `DQ_PERM`) so that the fragment stores stay free of
    /// bank conflicts: the kernels with dQ transposed (80 or 48 queries per
    /// step) and those on paired 32-query steps, whose tiles go into dq_acc
    /// in bulk
    /// ([`BackwardConfig::adds_dq_in_bulk`]).
    pub fn permutes_staged_dq(&self) -> bool {
        self.transposes_dq() || (self.pairs_steps() && self.kv_groups == 1)
    }

    /// Whether the producer adds each staged dQ tile into dq_acc with one
    /// bulk reduction (one thread, the copy engine) instead of vector
    /// atomics from all its threads: the kernels whose staged tile is
    /// unpadded ([`BackwardConfig::permutes_staged_dq`]: dQ's rows as they
    /// lie in dq_acc, whose 8-column groups keep the tile's permutation for
    /// the element kernel to undo), for dense batches (`varlen` false: the
    /// element kernel cannot place a packed row in its sequence). Level or
    /// slower in the kernels on 64-query steps and split keys
    /// (bench/NOTES.md session 53); on paired 32-query steps (DeepSeek
    /// 192/128), 10% off the main kernel once the producer adds its tiles two
    /// steps behind (session 57).
    pub fn adds_dq_in_bulk(&self, varlen: bool) -> bool {
        self.permutes_staged_dq() && !varlen
    }

    /// Rows of the producer's staged dQ tile.
    fn staged_dq_rows(&self) -> u32 {
        if self.pairs_steps() { 64 } else { self.block_m }
    }

    /// Dynamic shared memory of the main kernel for head dims `dqk`, `dv`
    /// and `nrc` row constants per query row: the K and V block, two stages
    /// of Q and dO, dSᵀ (two buffers when warp-specialised, whose steps
    /// overlap), the row constants and, warp-specialised, the staged f32 dQ
    /// tile (rows of Dqk + 8; 64 rows where the steps pair).
    pub fn smem_bytes(&self, dqk: u32, dv: u32, nrc: u32) -> u32 {
        let (bm, bn) = (self.block_m, self.block_n());
        let pad = if self.wgmma { 0 } else { 8 };
        let ds_buffers = if self.warp_specialized { 2 } else { 1 };
        // wgmma's dSᵀ rows are one 128-byte swizzle row (64 queries), the
        // same bytes as dS stored K-major; 80 queries per step store dS as
        // [80][BN].
        let ds_cols = if self.transposes_dq() {
            bm
        } else if self.wgmma {
            64
        } else {
            bm + pad
        };
        let elems = bn * (dqk + pad)
            + bn * (dv + pad)
            + 2 * bm * (dqk + pad)
            + 2 * bm * (dv + pad)
            + ds_buffers * bn * ds_cols;
        // (Unpadded and permuted: `permutes_staged_dq`.)
        let staged_dq = if self.permutes_staged_dq() {
            4 * self.staged_dq_rows() * dqk
        } else if self.warp_specialized {
            4 * self.staged_dq_rows() * (dqk + 8)
        } else {
            0
        };
        // Sᵀ one way, the packed Pᵀ and dSᵀ back: BM / 2 words per thread.
        let exchange = if self.shared_scores {
            4 * (bm / 2) * 128
        } else {
            0
        };
        // Swizzled tiles are aligned to 1024 bytes inside the allocation; the
        // transposed-dQ kernel has no slack (its allocation starts aligned,
        // checked at run time) and keeps its six mbarriers and the mask
        // trim's two bounds in the 80 bytes at the end.
        let align_slack = if self.transposes_dq() {
            80
        } else if self.wgmma {
            1024
        } else {
            0
        };
        elems * 2 + 4 * 2 * nrc.max(1) * bm + staged_dq + exchange + align_slack
    }
}

/// How a kernel's grid follows from the call's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// `x`: query rows (`B·H·Sq`) over `per_block`.
    Rows { per_block: u32 },
    /// `x`: key blocks of `block_n`, `groups` blocks each (adjacent); `y`:
    /// KV heads; `z`: batch.
    KeyBlocks { block_n: u32, groups: u32 },
    /// `x`: dQ elements (`B·H·Sq·Dqk`) over `per_block`.
    Elements { per_block: u32 },
}

/// One kernel of the backward and how to launch it.
#[derive(Clone, Debug)]
pub struct Launch {
    pub name: String,
    pub threads: u32,
    pub smem_bytes: u32,
    pub grid: Grid,
}

impl Launch {
    /// The grid for sizes `B, H, Hkv, Sq, Skv` and the kernel's `Dqk`, or
    /// `None` when a dimension exceeds what CUDA launches.
    pub fn grid_for(&self, [b, h, hkv, sq, skv]: [usize; 5], dqk: u32) -> Option<(u32, u32, u32)> {
        let (x, y, z) = match self.grid {
            Grid::Rows { per_block } => ((b * h * sq).div_ceil(per_block as usize), 1, 1),
            Grid::KeyBlocks { block_n, groups } => {
                (skv.div_ceil(block_n as usize) * groups as usize, hkv, b)
            }
            Grid::Elements { per_block } => (
                (b * h * sq * dqk as usize).div_ceil(per_block as usize),
                1,
                1,
            ),
        };
        let fits = x < (1 << 31) && y < 65536 && z < 65536;
        fits.then_some((x as u32, y as u32, z as u32))
    }
}

/// The backward's arguments in launch order (the three kernels of every
/// target take these): q, k, v, o, dO, the forward's row outputs, the
/// workspaces, dq, dk, dv, the custom inputs, their gradients, the sizes.
pub fn backward_args(variant: &Variant) -> Vec<ArgKind> {
    let mut args: Vec<ArgKind> = ["q", "k", "v", "o", "dout"]
        .into_iter()
        .map(ArgKind::Tensor)
        .collect();
    args.push(ArgKind::RowOut);
    args.extend(["dot", "qmod", "dq_acc"].map(ArgKind::Workspace));
    args.extend(["dq", "dk", "dv"].map(ArgKind::Tensor));
    args.extend(
        variant
            .customs
            .iter()
            .map(|c| ArgKind::Custom(c.name.clone())),
    );
    args.extend(
        variant
            .customs
            .iter()
            .map(|c| ArgKind::CustomGrad(c.name.clone())),
    );
    args.extend([Axis::B, Axis::H, Axis::Hkv, Axis::Sq, Axis::Skv].map(ArgKind::Size));
    args
}

/// Generated backward source and everything needed to launch it. The three
/// kernels take the same arguments, in the order of `args`.
#[derive(Clone, Debug)]
pub struct BackwardSource {
    pub source: String,
    /// `Tensor`: q, k, v, o and dout (`dO`) are read, dq, dk, dv written;
    /// `RowOut` is the forward's row output (read); `Workspace`s are scratch
    /// (see [`BackwardSource::workspace_len`]); `CustomGrad`s are f32 like
    /// their inputs and are *added to* (pass zeros).
    pub args: Vec<ArgKind>,
    /// Per query row: dO·O, the modified q, a zeroed dQ accumulator.
    pub pre: Launch,
    /// Per KV block: dK, dV, custom-input gradients of the score closures, dQ accumulation.
    pub main: Launch,
    /// Per dQ element: the q modification's backward, dq written.
    pub post: Launch,
    pub dqk: u32,
    pub dv: u32,
    /// What the forward's `rowout` holds, in order (the backward reads the state).
    pub row_outputs: Vec<String>,
    pub config: BackwardConfig,
    /// Kernels of a packed variable-length batch ([`parallel_backward_varlen`]).
    pub varlen: bool,
    /// Whether the row kernel writes the modified Q to `qmod` for the main
    /// kernel (a `modify_q` that is not a uniform scale folded onto the
    /// scores); otherwise `qmod` is not read and one element is enough.
    pub modifies_q: bool,
    /// The tensor maps the kernels take ([`ArgKind::TensorMap`], in
    /// argument order); empty without TMA loads.
    pub tensor_maps: Vec<TensorMapSpec>,
}

impl BackwardSource {
    /// What the launch plan takes from these kernels.
    pub fn kernels(&self) -> crate::launch_plan::BackwardKernels<'_> {
        crate::launch_plan::BackwardKernels {
            launches: [&self.pre, &self.main, &self.post],
            args: &self.args,
            tensor_maps: &self.tensor_maps,
            row_outputs: &self.row_outputs,
            modifies_q: self.modifies_q,
        }
    }

    /// Elements of a workspace argument for `rows = B·H·Sq` query rows.
    pub fn workspace_len(&self, name: &str, rows: usize) -> usize {
        match name {
            "dot" => rows,
            // Not read where Q is not modified: one element for the argument.
            "qmod" if !self.modifies_q => 1,
            "qmod" | "dq_acc" => rows * self.dqk as usize,
            other => unreachable!("unknown workspace `{other}`"),
        }
    }
}

#[derive(Template)]
#[template(path = "cuda/parallel_bwd.cu", escape = "none")]
struct BackwardTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: ElemSpelling,
    bm: u32,
    bn: u32,
    warps: u32,
    ksplit: u32,
    warp_size: u32,
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
    /// P formed between the Sᵀ and dPᵀ GEMMs' completions, dS from P after
    /// ([`crate::cxx::regions::RowPrograms::weight_first`]).
    weight_first: bool,
    /// dS of a zeroed weight is zero: one dS loop without the mask's test.
    grad_vanishes: bool,
    mask: bool,
    clamp: bool,
    wgmma: bool,
    /// The warp-specialised main kernel ([`BackwardConfig::warp_specialized`]).
    ws: bool,
    /// 32-query steps paired for dQ ([`BackwardConfig::pairs_steps`]).
    dq_pairs: bool,
    /// A step's dQ runs at the top of the next step ([`BackwardConfig::lags_dq`]).
    dq_lag: bool,
    /// dQ computed transposed on 80-query steps ([`BackwardConfig::transposes_dq`]).
    dq_t: bool,
    /// Each step's whole dQ computed by one warpgroup, the two in turns
    /// ([`BackwardConfig::takes_dq_turns`]).
    dq_turns: bool,
    /// The staged dQ tile unpadded and permuted
    /// ([`BackwardConfig::permutes_staged_dq`]).
    dq_perm: bool,
    /// The producer adds each staged dQ tile with one bulk reduction
    /// ([`BackwardConfig::adds_dq_in_bulk`]).
    dq_bulk: bool,
    /// dS stored K-major by `stmatrix.trans` for the dQ GEMM (wgmma kernels
    /// without the lag), instead of the dSᵀ tile.
    ds_k: bool,
    /// Full blocks get their own element loop without per-score tests (not
    /// where a score closure runs per score: two copies of it spill, and the
    /// tests are then a small part of the step).
    split_full_blocks: bool,
    wgmma_fns: String,
    /// The wgmma kernel with both warpgroups on the same 64 keys.
    kv_split: bool,
    /// A packed variable-length batch (`cu_q`, `cu_k` after the sizes).
    varlen: bool,
    /// The producer copies Q and dO with TMA (tensor maps as parameters).
    tma: bool,
    /// 64-column panels of dK then dV, and the slots each warpgroup holds.
    kv_panels: u32,
    nkv: u32,
    /// Blocks per key block ([`BackwardConfig::kv_groups`]).
    kv_groups: u32,
    /// One warpgroup computes Sᵀ, the other dPᵀ ([`BackwardConfig::shared_scores`]).
    share: bool,
    kv_issue: String,
    post_elems: u32,
    /// dK and dV stored 16 bytes per lane after a transpose across each
    /// quad (wgmma kernels with a warpgroup per 64 keys and no k or v
    /// modification, whose backward reads k and v per element).
    quad_stores: bool,
}

/// Generates the parallel backward kernels of `variant` for head dims `dqk`, `dv`.
pub fn parallel_backward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &BackwardConfig,
) -> Result<BackwardSource, CompileError> {
    generate_backward(variant, dqk, dv, cfg, false)
}

/// The backward of a packed variable-length batch (the gradients of
/// [`parallel_forward_varlen`](super::forward::parallel_forward_varlen)'s
/// output): the same kernels with `cu_q` and `cu_k` after the sizes. `B` is
/// the number of sequences and `Sq`, `Skv` the longest ones: the main
/// kernel's grid is `(⌈Skv / block_n⌉, Hkv, B)` and each block walks its
/// sequence's query blocks; the row and element kernels cover the packed
/// rows `H · Tq` (launch them with `B = 1, Sq = Tq`,
/// [`BackwardSource::varlen`]). The closures see each sequence as a batch of
/// one at its own positions, as in the forward.
pub fn parallel_backward_varlen(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &BackwardConfig,
) -> Result<BackwardSource, CompileError> {
    generate_backward(variant, dqk, dv, cfg, true)
}

fn generate_backward(
    variant: &Variant,
    dqk: u32,
    dv: u32,
    cfg: &BackwardConfig,
    varlen: bool,
) -> Result<BackwardSource, CompileError> {
    // A uniform Q scale is applied to the scores instead (`q_scale`), in the
    // wgmma kernels: the mma.sync kernel's register allocation at Dqk 80 and
    // 96 on sm_90a spilled twice as much with the folded element step
    // (NVRTC: 72 → 152 bytes at d80).
    let folded = crate::q_scale::backward_variant(variant, dqk, dv, cfg.wgmma);
    let variant = folded.as_ref().unwrap_or(variant);
    let par = parallel_inputs(variant, dqk, dv, "backward", MAX_DQK)?;
    let kv_panels = (dqk + dv) / 64;
    let dims_ok = match (cfg.split_d, cfg.block_m, cfg.kv_groups) {
        (1, 64, 1) => wgmma_backward_dims_ok(dqk, dv),
        (1, 80, 1) => wgmma_backward_dims_ok(dqk, dv) && cfg.transposes_dq(),
        (1, 48, 1) => wgmma_own_keys_dims_ok(dqk, dv) && cfg.transposes_dq(),
        (1, 32, 1) => wgmma_own_keys_dims_ok(dqk, dv),
        // (Covers the one-block split kernel: wgmma_split_dims_ok's dims are
        // at most three panels per warpgroup.)
        (2, 32 | 64, groups @ 1..) => {
            wgmma_grouped_dims_ok(dqk, dv)
                && 2 * groups <= kv_panels
                && kv_panels.div_ceil(2 * groups) <= MAX_PANELS_PER_WARPGROUP
        }
        _ => false,
    };
    if cfg.shared_scores && !(cfg.wgmma && cfg.split_d == 2) {
        return Err(CompileError(
            "shared_scores needs the wgmma backward with both warpgroups on the same keys (wgmma: true, split_d 2)".into(),
        ));
    }
    if !cfg.wgmma && cfg.kv_groups != 1 {
        return Err(CompileError(format!(
            "kv_groups {} needs the wgmma backward (wgmma: true, split_d 2); the mma.sync kernel takes 1",
            cfg.kv_groups
        )));
    }
    if cfg.warp_specialized && !cfg.wgmma {
        return Err(CompileError(
            "the warp-specialised backward needs the wgmma kernel (wgmma: true, sm_90a)".into(),
        ));
    }
    if cfg.wgmma && !(dims_ok && cfg.warps == 8) {
        return Err(CompileError(format!(
            "the wgmma backward takes 8 warps with block_m 64 and split_d 1 (Dqk, Dv of 64 or 128), block_m 80 and split_d 1 with the producer warpgroup (warp_specialized; Dqk, Dv of 64 or 128), block_m 32, split_d 1 (Dqk, Dv multiples of 64 up to 256, Dqk + Dv at most {MAX_OWN_KEYS_DQK_PLUS_DV}; block_m 48 at those dims with the producer warpgroup), block_m 64 and split_d 2 (Dqk, Dv multiples of 64 up to 256, Dqk + Dv at most {MAX_SPLIT_DQK_PLUS_DV}), or split_d 2 with block_m 32 or 64 and kv_groups blocks per key block (Dqk up to {MAX_DQK}, Dv up to 512, multiples of 64, at most {MAX_PANELS_PER_WARPGROUP} of the 64-column dK/dV panels per warpgroup); got block_m {}, {} warps, split_d {}, kv_groups {}, Dqk {dqk}, Dv {dv} (use wgmma: false)",
            cfg.block_m, cfg.warps, cfg.split_d, cfg.kv_groups
        )));
    }
    let kv_split = cfg.wgmma && cfg.split_d == 2;
    // The split kernel's 64-column panels of [dK | dV] and the slots each
    // warpgroup holds (slot group·2 + warpgroup holds the slot·NKV-th on).
    let nkv = kv_panels.div_ceil(2 * cfg.kv_groups);
    if !(cfg.transposes_dq() || tile_fits(dqk, dv, cfg.block_m, cfg.warps, cfg.split_d)) {
        return Err(CompileError(format!(
            "backward tile block_m = {} with {} warps (split_d {}) does not fit Dqk = {dqk}, Dv = {dv}: block_m must be 32, 64 or 128, at most 16 × warps, the warps sharing a 16-row dQ tile must split Dqk/16 evenly, and split_d (1, 2 or 4) must divide the warps, Dqk/16 and Dv/16",
            cfg.block_m, cfg.warps, cfg.split_d
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
        weight_first,
        grad_vanishes,
    } = backward_regions(
        variant,
        "#pragma unroll\n            for (int off = WARP / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);\n",
        // The weights formed while the dP GEMM runs: on the wgmma kernels
        // whose warpgroups compute both GEMMs, for scores the closure does
        // not modify (its backward reads the raw score, which P replaces).
        cfg.wgmma && !cfg.shared_scores && par.modify_scores.is_none(),
    )?;
    let online = &par.online;
    let CustomParams {
        fields: params_fields,
        args: custom_args,
        init: params_init,
    } = custom_params(variant.customs.len(), true);
    // TMA boxes address one head's dense rows of q itself: not a packed
    // batch, nor the modified copy in `qmod`.
    let tma = cfg.tma_loads && cfg.warp_specialized && !varlen && par.modify_q.is_none();
    // Paired steps need every step of a pair to see a key of the block: no
    // mask, or the plain causal one (whose walk starts at the diagonal).
    let dq_pairs = cfg.pairs_steps() && par.mask.as_ref().is_none_or(is_causal);
    // Without a mask (H100: 2.5-6% faster there, 4% slower under the causal
    // one, bench/NOTES.md session 46).
    let dq_lag = cfg.lags_dq() && par.mask.is_none();
    // dS stored K-major (H100, backward alone: causal b8 −4.7%, DeepSeek
    // −2.4%, DiffTransformer −2.2%), except in the lagged kernels (ReLU d64
    // +1.7%, bench/NOTES.md session 47) and where custom inputs take
    // registers in the element step (RetNet's decay spilled 184 bytes),
    // which keep the dSᵀ tile. (80-query steps read dS K-major always.)
    let ds_k = cfg.transposes_dq() || (cfg.wgmma && !dq_lag && variant.customs.is_empty());
    // The dQ GEMM: dQᵀ = Kᵀ·dS at 80 queries, dS·K from dS or from the dSᵀ
    // tile.
    let dq_form = if cfg.transposes_dq() {
        (cfg.block_m, Form::SsMMajor)
    } else if ds_k {
        (64, Form::SsNMajor)
    } else {
        (64, Form::SsTransposed)
    };
    let kernel_name = format!(
        "aec_bwd_{}_{}_d{dqk}x{dv}_m{}w{}{}{}",
        variant.name.to_lowercase(),
        cfg.elem.name(),
        cfg.block_m,
        cfg.warps,
        if cfg.split_d > 1 {
            format!("s{}", cfg.split_d)
        } else {
            String::new()
        } + &if cfg.kv_groups > 1 {
            format!("g{}", cfg.kv_groups)
        } else {
            String::new()
        },
        if cfg.wgmma { "_wgmma" } else { "" }
    ) + if cfg.shared_scores { "_xs" } else { "" }
        + if cfg.warp_specialized { "_ws" } else { "" }
        + if tma { "_tma" } else { "" }
        + if dq_pairs { "_dq64" } else { "" }
        + if dq_lag { "_dqlag" } else { "" }
        + if varlen { "_varlen" } else { "" };
    // (Custom-input gradients per score come only from the score closure.)
    let split_full_blocks = par.modify_scores.is_none();
    let t = BackwardTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &kernel_name,
        sp: elem_spelling(cfg.elem),
        bm: cfg.block_m,
        bn: cfg.block_n(),
        warps: cfg.warps,
        ksplit: cfg.split_d,
        warp_size: WARP_SIZE,
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
        // Trimming classifies with the group's first head: only for masks
        // that do not read the query head.
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
        wgmma: cfg.wgmma,
        ws: cfg.warp_specialized,
        dq_pairs,
        dq_lag,
        dq_t: cfg.transposes_dq(),
        dq_turns: cfg.takes_dq_turns(),
        dq_perm: cfg.permutes_staged_dq(),
        dq_bulk: cfg.adds_dq_in_bulk(varlen),
        ds_k,
        split_full_blocks,
        weight_first,
        grad_vanishes,
        wgmma_fns: if kv_split {
            wgmma_fns(
                cfg.elem,
                &[(cfg.block_m, Form::Ss), dq_form, (64, Form::RsNMajor)],
            )
        } else if cfg.wgmma {
            let uses = [
                (cfg.block_m, Form::Ss),
                dq_form,
                (dqk, Form::RsNMajor),
                (dv, Form::RsNMajor),
            ];
            wgmma_fns(cfg.elem, &uses)
        } else {
            String::new()
        },
        kv_split,
        varlen,
        tma,
        kv_panels,
        nkv,
        // (1 unless split: refused above otherwise.)
        kv_groups: cfg.kv_groups,
        share: cfg.shared_scores,
        kv_issue: if kv_split {
            kv_split_issue(dqk / 64, kv_panels, nkv, cfg.kv_groups)
        } else {
            String::new()
        },
        post_elems: POST_ELEMS,
        // (The wgmma kernels' head dims are multiples of 64: whole groups
        // of four 8-column blocks, which the template asserts.)
        quad_stores: cfg.wgmma && !kv_split && par.modify_k.is_none() && par.modify_v.is_none(),
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;

    let mut args = backward_args(variant);
    if varlen {
        args.extend([ArgKind::CuSeqlens, ArgKind::CuSeqlensKv]);
    }
    // Q and dO as [B·H, Sq, D], boxes of 64 columns x a step's rows.
    let tensor_maps: Vec<TensorMapSpec> = if tma {
        vec![
            TensorMapSpec::dense("q", dqk, "Sq", "H", cfg.block_m),
            TensorMapSpec::dense("dout", dv, "Sq", "H", cfg.block_m),
        ]
    } else {
        Vec::new()
    };
    args.extend(tensor_maps.iter().map(|m| ArgKind::TensorMap(m.tensor)));

    let bn = cfg.block_n();
    let smem_bytes = cfg.smem_bytes(dqk, dv, nrc as u32);
    if cfg.wgmma && smem_bytes > Isa::Sm90a.max_dynamic_smem() {
        return Err(CompileError(format!(
            "the wgmma backward for Dqk = {dqk}, Dv = {dv} needs {smem_bytes} bytes of shared memory{}, more than sm_90a's {} (use warp_specialized: false)",
            if cfg.warp_specialized {
                " with the staged dQ tile of the warp-specialised kernel"
            } else {
                ""
            },
            Isa::Sm90a.max_dynamic_smem()
        )));
    }
    let threads = cfg.warps * WARP_SIZE;
    let row_outputs = row_output_names(online);
    Ok(BackwardSource {
        source,
        args,
        pre: Launch {
            name: format!("{kernel_name}_pre"),
            threads,
            smem_bytes: 0,
            grid: Grid::Rows {
                per_block: cfg.warps,
            },
        },
        main: Launch {
            name: format!("{kernel_name}_main"),
            threads: cfg.main_threads(),
            smem_bytes,
            grid: Grid::KeyBlocks {
                block_n: bn,
                groups: cfg.kv_groups,
            },
        },
        post: Launch {
            name: format!("{kernel_name}_post"),
            threads,
            smem_bytes: 0,
            grid: Grid::Elements {
                per_block: threads * POST_ELEMS,
            },
        },
        dqk,
        dv,
        row_outputs,
        config: *cfg,
        varlen,
        modifies_q: par.modify_q.is_some(),
        tensor_maps,
    })
}

/// dQ elements per thread of the element kernel: 16-byte stores of dq and
/// two 16-byte loads of the f32 accumulator (Dqk is a multiple of 16).
const POST_ELEMS: u32 = 8;

/// Whether the `wgmma` backward takes these head dims: its registers hold
/// dK and dV of 64 keys per warpgroup, which fits up to 128 columns each.
pub fn wgmma_backward_dims_ok(dqk: u32, dv: u32) -> bool {
    matches!(dqk, 64 | 128) && matches!(dv, 64 | 128)
}

/// Dqk + Dv of the wgmma backward with a warpgroup per 64 keys on 32-query
/// steps: dK and dV of its 64 keys, `(Dqk + Dv) / 2` registers, beside
/// Sᵀ and dPᵀ of 32 queries (32). At 384 (DiffTransformer's 128/256) ptxas
/// serialises the wgmma for want of registers.
pub const MAX_OWN_KEYS_DQK_PLUS_DV: u32 = 5 * 64;

/// Whether the `wgmma` backward with a warpgroup per 64 keys (`split_d` 1)
/// takes these head dims on 32-query steps (`block_m` 32): multiples of 64
/// up to 256 whose dK and dV fit a warpgroup's registers beside the step's
/// scores ([`MAX_OWN_KEYS_DQK_PLUS_DV`]).
pub fn wgmma_own_keys_dims_ok(dqk: u32, dv: u32) -> bool {
    let dim_ok = |d: u32| d.is_multiple_of(64) && (64..=256).contains(&d);
    dim_ok(dqk) && dim_ok(dv) && dqk + dv <= MAX_OWN_KEYS_DQK_PLUS_DV
}

/// Dqk + Dv of the split wgmma backward: each warpgroup holds
/// ⌈(Dqk + Dv) / 128⌉ 64-column accumulator panels (32 registers each) next
/// to Sᵀ and dPᵀ (64 registers); three panels is what fits without spills.
pub const MAX_SPLIT_DQK_PLUS_DV: u32 = 6 * 64;

/// 64-column dK/dV accumulator panels a warpgroup of the split kernel may
/// hold: six fill the 255 registers of a thread without the producer
/// warpgroup (RetNet's 256/512 on 32-query steps); on 64-query steps three
/// ([`MAX_SPLIT_DQK_PLUS_DV`]).
pub const MAX_PANELS_PER_WARPGROUP: u32 = 6;

/// Head dims of the split kernel on 32-query steps: multiples of 64, Dqk up
/// to the backward's largest, Dv up to 512 — at most twelve panels, so one
/// block per key block holds them (six per warpgroup). The default takes
/// one: each further block ([`BackwardConfig::kv_groups`]) recomputes Sᵀ
/// and dPᵀ, and RetNet's 256/512 backward took 3.21 ms in one block, 4.70
/// in two and 6.35 in three on an H100 (bench/NOTES.md, session 40).
pub fn wgmma_grouped_dims_ok(dqk: u32, dv: u32) -> bool {
    dqk.is_multiple_of(64)
        && dv.is_multiple_of(64)
        && (64..=MAX_DQK).contains(&dqk)
        && (64..=512).contains(&dv)
}

/// Whether the `wgmma` backward with both warpgroups on the same 64 keys
/// (`split_d` 2) takes these head dims: multiples of 64 up to 256 whose dK
/// and dV panels split into at most three per warpgroup.
pub fn wgmma_split_dims_ok(dqk: u32, dv: u32) -> bool {
    let dim_ok = |d: u32| d.is_multiple_of(64) && (64..=256).contains(&d);
    dim_ok(dqk) && dim_ok(dv) && dqk + dv <= MAX_SPLIT_DQK_PLUS_DV
}

/// The dK/dV wgmma of the split kernel: warpgroup 0 holds the first `nkv`
/// of the `panels` 64-column panels of [dK | dV] (the first `qp` are dK's),
/// warpgroup 1 the rest, each panel one `m64n64k16` per 16 queries with dSᵀ
/// (dK, B = Q) or Pᵀ (dV, B = dO) from registers. Unrolled per warpgroup so
/// every operand is static.
fn kv_split_issue(qp: u32, panels: u32, nkv: u32, groups: u32) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("        {\n        const int slot_ = grp * 2 + slice;\n");
    let slots = 2 * groups;
    for slot in 0..slots {
        let _ = writeln!(
            out,
            "        {}\n#pragma unroll\n        for (int kk = 0; kk < BM / 16; ++kk) {{",
            if slot == 0 {
                "if (slot_ == 0) {".to_string()
            } else if slot + 1 < slots {
                format!("}} else if (slot_ == {slot}) {{")
            } else {
                "} else {".to_string()
            }
        );
        for s in 0..nkv {
            let gp = slot * nkv + s;
            if gp >= panels {
                continue;
            }
            let (a, tile, p) = if gp < qp {
                ("da", "sQc", gp)
            } else {
                ("pa", "sdOc", gp - qp)
            };
            let _ = writeln!(
                out,
                "            wgmma_rs_n64(kv_acc[{s}], {a}[kk], sw128_desc_at(smem_u32({tile}), {p} * (BM * 128) + kk * 16 * 128, BM * 128));"
            );
        }
        out.push_str("        }\n");
    }
    out.push_str("        }\n        }\n");
    out
}

/// Whether `block_m` query rows on `warps` warps (`split_d` per 16 keys)
/// tile the products: for dQ each warp takes a 16-row tile and an equal
/// share of Dqk in steps of 16 columns; for dK and dV each warp of a key
/// group an equal share of Dqk and Dv.
fn tile_fits(dqk: u32, dv: u32, block_m: u32, warps: u32, split_d: u32) -> bool {
    let rt = block_m / 16;
    matches!(block_m, 32 | 64 | 128)
        && matches!(warps, 2 | 4 | 8)
        && matches!(split_d, 1 | 2 | 4)
        && warps.is_multiple_of(split_d)
        && rt <= warps
        && warps.is_multiple_of(rt)
        && (dqk / 16).is_multiple_of(warps / rt)
        && (dqk / 16).is_multiple_of(split_d)
        && (dv / 16).is_multiple_of(split_d)
}
