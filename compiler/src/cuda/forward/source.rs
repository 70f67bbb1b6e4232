//! A generated forward kernel as the runtime and the launch plans see it:
//! its arguments (`ArgKind`, tensor maps), `KernelSource` with its grids,
//! persistent units and split-KV workspaces, and the combine's shape.

use super::*;

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
    /// [`SegmentSplit`](crate::cuda::recurrent_wgmma::SegmentSplit)). Ignored when
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
pub(super) enum RowLayout {
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
pub(super) fn forward_args_with(
    variant: &Variant,
    split_kv: bool,
    layout: RowLayout,
) -> Vec<ArgKind> {
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
pub const COMBINE_BLOCK_THREADS: u32 = 128;

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
pub(super) fn fused_chunk_for(cfg: &ForwardConfig, dv: u32) -> u32 {
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
    /// ([`KernelSource::cluster_pairs`]) `(2 · min(⌈units / 2⌉, ⌊sms / 2⌋), 1,
    /// 1)`: no more clusters than the multiprocessors hold at once (a
    /// cluster left over would start only once another had walked all its
    /// units). `None` when it exceeds what CUDA launches.
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
            2 * units.div_ceil(2).min(sms as usize / 2)
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
