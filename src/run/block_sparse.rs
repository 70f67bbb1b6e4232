//! The forward under a block-sparse mask ([`ParallelKernels::forward_block_sparse`]):
//! FlexAttention's `BlockMask` lists, each row block visiting only the key
//! blocks its mask row names.

use super::{
    Error, ForwardLaunch, ForwardOutput, HeadDims, KernelElement, KernelOptions, LaunchRows,
    ParallelKernels, Shape, check_shapes_with, compile_and_load, generate_forward, loading_error,
    require_parallel, upload_i32,
};
use crate::compiler::tile_order::tile_order;
use crate::compiler::{
    BlockMaskBuilder, ForwardConfig, Isa, KernelSource, block_mask_builder,
    parallel_forward_block_sparse,
};
use crate::frontend;
use crate::runtime::{DType, DeviceBuffer, Kernel, Module, Param, Stream};

/// A block-sparse mask in FlexAttention's `BlockMask` layout. The mask cuts
/// the scores into blocks of `block_m` query rows × `block_n` keys; mask row
/// `r` (query rows `r · block_m …`) of batch `b` and head `h` visits the
/// `kv_num_blocks[b, h, r]` partial key blocks `kv_indices[b, h, r, 0 …]`,
/// where the variant's mask (if any) decides per score, and the
/// `full_kv_num_blocks[b, h, r]` full ones `full_kv_indices[b, h, r, 0 …]`,
/// where every key is seen and the mask is not evaluated. Keys of blocks not
/// listed are hidden. A row that sees no key gets the output of an empty row
/// (as under a mask that hides every key).
///
/// `batches` and `heads` are 1 (one mask for every sequence or head) or `B`
/// and `H`; the number of mask rows `R` and of index columns `C` follow from
/// the lengths: `kv_num_blocks` holds `batches · heads · R` counts and
/// `kv_indices` `batches · heads · R · C` entries (the full lists alike).
#[derive(Clone, Copy, Debug)]
pub struct BlockMask<'a> {
    /// Query rows per mask block: a multiple of the kernel's `block_m`.
    pub block_m: usize,
    /// Keys per mask block: a multiple of the kernel's `block_n`.
    pub block_n: usize,
    /// 1 or `B`.
    pub batches: usize,
    /// 1 or `H`.
    pub heads: usize,
    /// `[batches, heads, R]`: partial key blocks per mask row.
    pub kv_num_blocks: &'a [u32],
    /// `[batches, heads, R, C]`: the partial key blocks, in their first entries.
    pub kv_indices: &'a [u32],
    /// `[batches, heads, R]`: full key blocks per mask row.
    pub full_kv_num_blocks: &'a [u32],
    /// `[batches, heads, R, C]`: the full key blocks, in their first entries.
    pub full_kv_indices: &'a [u32],
}

/// The device side of a block-sparse launch.
pub(super) struct BlockMaskArgs {
    pub(super) kv_num_blocks: DeviceBuffer<i32>,
    pub(super) kv_indices: DeviceBuffer<i32>,
    pub(super) full_kv_num_blocks: DeviceBuffer<i32>,
    pub(super) full_kv_indices: DeviceBuffer<i32>,
    /// `mask_batches, mask_heads, mask_rows, mask_cols, mask_block_m,
    /// mask_block_n`.
    pub(super) extents: [i32; 6],
    /// For a kernel with a tile schedule ([`KernelSource::tile_schedule`]):
    /// `tile_order` (the launch brings the counter).
    pub(super) tile_order: Option<DeviceBuffer<i32>>,
}

impl BlockMaskArgs {
    /// The value of the [`ArgKind::BlockMask`](crate::compiler::ArgKind)
    /// argument `name`.
    pub(super) fn arg(&self, name: &str) -> Option<crate::runtime::Arg<'_>> {
        use crate::runtime::Arg;
        let [batches, heads, rows, cols, bm, bn] = self.extents;
        Some(match name {
            "kv_num_blocks" => Arg::from(&self.kv_num_blocks),
            "kv_indices" => Arg::from(&self.kv_indices),
            "full_kv_num_blocks" => Arg::from(&self.full_kv_num_blocks),
            "full_kv_indices" => Arg::from(&self.full_kv_indices),
            "mask_batches" => Arg::from(batches),
            "mask_heads" => Arg::from(heads),
            "mask_rows" => Arg::from(rows),
            "mask_cols" => Arg::from(cols),
            "mask_block_m" => Arg::from(bm),
            "mask_block_n" => Arg::from(bn),
            "tile_order" => Arg::from(self.tile_order.as_ref()?),
            _ => return None,
        })
    }
}

/// Generates the block-sparse forward of `variant` for `dims` and `isa`
/// without compiling it ([`parallel_forward_block_sparse`] with the options'
/// tile configuration, else the default one). Needs no GPU.
pub fn block_sparse_forward_source(
    variant: &frontend::Variant,
    dims: HeadDims,
    options: &KernelOptions,
    isa: Isa,
) -> Result<KernelSource, Error> {
    generate_forward(
        variant,
        dims,
        options,
        isa,
        ForwardConfig::cp_async_default_for,
        parallel_forward_block_sparse,
    )
}

/// Checks, without a GPU, a block-sparse forward call of `variant` with
/// `shape` for a kernel of `kernel_block_m` × `kernel_block_n` tiles
/// ([`KernelSource::block_m`], [`KernelSource::block_n`]).
///
/// In order: the tensors as [`check_shapes`](super::check_shapes) checks
/// them; the mask's block sizes (multiples of the kernel's); its
/// `batches` and `heads` (1, or B and H); the list lengths (whole mask rows
/// and index rows, at least the `ceil(Sq / block_m)` rows the call has, the
/// full lists as long as the partial ones); every row's counts (within its
/// index row and the `ceil(Skv / block_n)` key blocks); every listed block
/// (a key block of the call, listed once per row across both lists).
pub fn check_block_mask(
    variant: &frontend::Variant,
    dims: HeadDims,
    shape: Shape,
    mask: &BlockMask<'_>,
    (kernel_block_m, kernel_block_n): (u32, u32),
    tensors: &[(&str, usize)],
) -> Result<(), Error> {
    require_parallel(variant)?;
    let bad = |m: String| Err(Error::Shape(m));
    let (bm, bn) = (mask.block_m, mask.block_n);
    let (kbm, kbn) = (kernel_block_m as usize, kernel_block_n as usize);
    if bm == 0 || !bm.is_multiple_of(kbm) || bn == 0 || !bn.is_multiple_of(kbn) {
        return bad(format!(
            "the block mask's blocks are {bm} × {bn} (rows × keys); the kernel's tiles are \
             {kbm} × {kbn}, and each mask block must cover whole tiles (multiples of both)"
        ));
    }
    for (what, n, full) in [
        ("batches", mask.batches, shape.b),
        ("heads", mask.heads, shape.h),
    ] {
        if n != 1 && n != full {
            return bad(format!(
                "the block mask has {what} = {n}: it must be 1 (shared) or the call's {full}"
            ));
        }
    }
    let planes = mask.batches * mask.heads;
    let counts = mask.kv_num_blocks.len();
    if counts == 0 || !counts.is_multiple_of(planes) {
        return bad(format!(
            "`kv_num_blocks` has {counts} entries, which is not [batches, heads, rows] with \
             batches · heads = {planes} and at least one row"
        ));
    }
    let rows = counts / planes;
    let need_rows = shape.sq.div_ceil(bm);
    if rows < need_rows {
        return bad(format!(
            "`kv_num_blocks` has {rows} mask rows per batch and head; Sq = {} needs {need_rows} \
             rows of {bm}",
            shape.sq
        ));
    }
    let entries = mask.kv_indices.len();
    if entries == 0 || !entries.is_multiple_of(counts) {
        return bad(format!(
            "`kv_indices` has {entries} entries, which is not [batches, heads, rows, columns] \
             with batches · heads · rows = {counts} and at least one column"
        ));
    }
    let cols = entries / counts;
    if mask.full_kv_num_blocks.len() != counts || mask.full_kv_indices.len() != entries {
        return bad(format!(
            "the full lists have {} counts and {} entries; the partial lists {counts} and \
             {entries}: both are [batches, heads, rows(, columns)] alike",
            mask.full_kv_num_blocks.len(),
            mask.full_kv_indices.len()
        ));
    }
    let key_blocks = shape.skv.div_ceil(bn);
    if [planes, rows, cols, bm, bn]
        .iter()
        .any(|&n| i32::try_from(n).is_err())
        || i32::try_from(entries).is_err()
    {
        return bad(format!(
            "the block mask has {entries} index entries; the kernel takes 32-bit extents"
        ));
    }
    check_shapes_with(variant, dims, shape, tensors, true)?;
    let mut seen = vec![usize::MAX; key_blocks];
    for plane in 0..planes {
        let (b, h) = (plane / mask.heads, plane % mask.heads);
        for r in 0..rows {
            let at = plane * rows + r;
            let (np, nf) = (
                mask.kv_num_blocks[at] as usize,
                mask.full_kv_num_blocks[at] as usize,
            );
            if np > cols || nf > cols || np + nf > key_blocks {
                return bad(format!(
                    "mask row [{b}, {h}, {r}] lists {np} partial and {nf} full key blocks; \
                     each list holds at most {cols} and Skv = {} has {key_blocks} blocks of {bn}",
                    shape.skv
                ));
            }
            let lists = [
                ("kv_indices", &mask.kv_indices[at * cols..at * cols + np]),
                (
                    "full_kv_indices",
                    &mask.full_kv_indices[at * cols..at * cols + nf],
                ),
            ];
            for (name, list) in lists {
                for (c, &blk) in list.iter().enumerate() {
                    let blk = blk as usize;
                    if blk >= key_blocks {
                        return bad(format!(
                            "`{name}[{b}, {h}, {r}, {c}]` = {blk} is not a key block: Skv = {} \
                             has {key_blocks} blocks of {bn}",
                            shape.skv
                        ));
                    }
                    if seen[blk] == at {
                        return bad(format!(
                            "mask row [{b}, {h}, {r}] lists key block {blk} twice (`{name}[{b}, \
                             {h}, {r}, {c}]`): each block is partial or full, once"
                        ));
                    }
                    seen[blk] = at;
                }
            }
        }
    }
    Ok(())
}

impl ParallelKernels {
    /// The block-sparse forward's source (generated and compiled on the
    /// first call of this or [`forward_block_sparse`](Self::forward_block_sparse)).
    pub fn block_sparse_source(&self) -> Result<&KernelSource, Error> {
        Ok(&self
            .layout_kernel(&self.sparse, block_sparse_forward_source, "block-sparse")?
            .source)
    }

    /// Runs the forward of `shape` under the block-sparse mask `mask`
    /// ([`BlockMask`]): tensors as for [`forward`](Self::forward), and each
    /// row block visits only the key blocks its mask row lists. The first
    /// call compiles the kernel; every check ([`check_block_mask`], listed
    /// blocks inside the keys and never twice included) happens before
    /// anything is uploaded or launched.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_block_sparse<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: Shape,
        mask: &BlockMask<'_>,
    ) -> Result<ForwardOutput<T>, Error> {
        let lens = self.input_lens(stream, q, k, v, customs)?;
        let kernel =
            self.layout_kernel(&self.sparse, block_sparse_forward_source, "block-sparse")?;
        let tiles = (kernel.source.block_m, kernel.source.block_n);
        check_block_mask(&self.variant, self.dims, shape, mask, tiles, &lens)?;
        let planes = mask.batches * mask.heads;
        let rows = mask.kv_num_blocks.len() / planes;
        let cols = mask.kv_indices.len() / mask.kv_num_blocks.len();
        // check_block_mask bounded every count and index by 32-bit extents.
        let args = BlockMaskArgs {
            kv_num_blocks: upload_i32(stream, "kv_num_blocks", mask.kv_num_blocks.iter().copied())?,
            kv_indices: upload_i32(stream, "kv_indices", mask.kv_indices.iter().copied())?,
            full_kv_num_blocks: upload_i32(
                stream,
                "full_kv_num_blocks",
                mask.full_kv_num_blocks.iter().copied(),
            )?,
            full_kv_indices: upload_i32(
                stream,
                "full_kv_indices",
                mask.full_kv_indices.iter().copied(),
            )?,
            extents: [
                mask.batches,
                mask.heads,
                rows,
                cols,
                mask.block_m,
                mask.block_n,
            ]
            .map(|n| n as i32),
            tile_order: if kernel.source.tile_schedule {
                Some(self.tile_order(stream, &kernel.source, shape, mask)?)
            } else {
                None
            },
        };
        let mut out = self.alloc_output::<T>(stream, shape)?;
        let launch = ForwardLaunch {
            source: &kernel.source,
            main: &kernel.main,
            combine: kernel.combine.as_ref(),
            sizes: shape,
            n_splits: 1,
            rows: LaunchRows::BlockSparse(&args),
        };
        self.launch_forward(stream, &launch, q, k, v, customs, &mut out)?;
        Ok(out)
    }
}

impl ParallelKernels {
    /// The order in which the CTAs of `source` (a kernel with a tile
    /// schedule) take the row blocks of `shape` under `mask`: longest lists
    /// first within windows of heads ([`tile_order`]), uploaded.
    fn tile_order(
        &self,
        stream: &Stream,
        source: &KernelSource,
        shape: Shape,
        mask: &BlockMask<'_>,
    ) -> Result<DeviceBuffer<i32>, Error> {
        let block_m = source.block_m as usize;
        let row_blocks = shape.sq.div_ceil(block_m);
        let planes = shape.b * shape.h;
        if i32::try_from(planes * row_blocks).is_err() {
            return Err(Error::Shape(format!(
                "the shape {shape} has {} row blocks of {block_m}; the block-sparse kernel                  takes 32-bit tile indices",
                planes * row_blocks
            )));
        }
        let ctas = source
            .launch_grid(
                [shape.b, shape.h, shape.hkv, shape.sq],
                self.device.sm_count(),
                1,
            )
            .map_or(1, |(x, _, _)| x as usize);
        let mask_rows = mask.kv_num_blocks.len() / (mask.batches * mask.heads);
        let listed = |plane: usize, r: usize| {
            let (b, h) = (plane / shape.h, plane % shape.h);
            let (b, h) = (b % mask.batches, h % mask.heads);
            let at = (b * mask.heads + h) * mask_rows + r * block_m / mask.block_m;
            mask.kv_num_blocks[at] + mask.full_kv_num_blocks[at]
        };
        upload_i32(
            stream,
            "tile_order",
            tile_order(planes, row_blocks, ctas, listed),
        )
    }
}

/// A block mask built on the GPU from the variant's own mask predicate
/// ([`ParallelKernels::block_mask`]), in the layout [`BlockMask`] borrows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockMaskLists {
    pub block_m: usize,
    pub block_n: usize,
    /// `B` where the mask reads the batch (its index or an input over `B`),
    /// else 1.
    pub batches: usize,
    /// `H` where the mask reads the head, else 1.
    pub heads: usize,
    pub kv_num_blocks: Vec<u32>,
    pub kv_indices: Vec<u32>,
    pub full_kv_num_blocks: Vec<u32>,
    pub full_kv_indices: Vec<u32>,
}

impl BlockMaskLists {
    /// The lists as [`forward_block_sparse`](ParallelKernels::forward_block_sparse) takes them.
    pub fn as_mask(&self) -> BlockMask<'_> {
        BlockMask {
            block_m: self.block_m,
            block_n: self.block_n,
            batches: self.batches,
            heads: self.heads,
            kv_num_blocks: &self.kv_num_blocks,
            kv_indices: &self.kv_indices,
            full_kv_num_blocks: &self.full_kv_num_blocks,
            full_kv_indices: &self.full_kv_indices,
        }
    }

    /// Listed key blocks (partial and full) over all mask rows.
    pub fn listed(&self) -> u64 {
        self.kv_num_blocks
            .iter()
            .chain(&self.full_kv_num_blocks)
            .map(|&n| u64::from(n))
            .sum()
    }
}

impl ParallelKernels {
    /// Builds the block mask of the variant's own mask predicate for
    /// `shape` in blocks of `block_m` query rows × `block_n` keys, as
    /// FlexAttention's `create_block_mask` does: a block the predicate hides
    /// entirely is left out, one it shows entirely is listed full (the
    /// forward then skips the predicate there), any other is partial. Each
    /// block is classified by interval arithmetic where that decides and
    /// otherwise by evaluating the predicate on all its pairs, on the GPU
    /// (one warp per mask row), so masks that read custom inputs (documents)
    /// get exact lists too. The mask is per batch or per head only where the
    /// predicate reads them.
    ///
    /// `customs` are the variant's custom inputs as for
    /// [`forward`](Self::forward) (checked against `shape` first). Variants
    /// without a mask are refused. The builder is compiled on the first call
    /// (through the kernel cache); the lists come back to the host.
    pub fn block_mask(
        &self,
        stream: &Stream,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: Shape,
        block_m: usize,
        block_n: usize,
    ) -> Result<BlockMaskLists, Error> {
        let builder = self.mask_builder()?;
        if block_m == 0
            || block_n == 0
            || block_m > i32::MAX as usize
            || block_n > i32::MAX as usize
        {
            return Err(Error::Shape(format!(
                "block mask blocks of {block_m} × {block_n} (rows × keys): both must be positive \
                 32-bit sizes"
            )));
        }
        self.check_devices(stream, customs.iter().map(|(n, b)| (*n, b.ordinal())))?;
        // The customs against the shape (q, k and v as the shape has them).
        let (dqk, dv) = (self.dims.dqk as usize, self.dims.dv as usize);
        let kv_rows = shape.b * shape.hkv * shape.skv;
        let lens: Vec<(&str, usize)> = [
            ("q", shape.rows() * dqk),
            ("k", kv_rows * dqk),
            ("v", kv_rows * dv),
        ]
        .into_iter()
        .chain(customs.iter().map(|(n, b)| (*n, b.len())))
        .collect();
        self.check(shape, &lens)?;
        let rows = shape.sq.div_ceil(block_m);
        let cols = shape.skv.div_ceil(block_n);
        let batches = if builder.source.per_batch { shape.b } else { 1 };
        let heads = if builder.source.per_head { shape.h } else { 1 };
        let counts = batches * heads * rows;
        let runtime = |e| Error::Runtime {
            during: format!("building the block mask of `{}`", self.variant.name),
            source: e,
        };
        let grid = (
            u32::try_from(rows).map_err(|_| {
                Error::Shape(format!(
                    "{rows} mask rows of {block_m} query rows: more than CUDA launches, use \
                     larger blocks"
                ))
            })?,
            heads as u32,
            batches as u32,
        );
        let mut np = stream.alloc_zeros::<i32>(counts).map_err(runtime)?;
        let mut ip = stream.alloc_zeros::<i32>(counts * cols).map_err(runtime)?;
        let mut nf = stream.alloc_zeros::<i32>(counts).map_err(runtime)?;
        let mut ifull = stream.alloc_zeros::<i32>(counts * cols).map_err(runtime)?;
        {
            let mut args: Vec<crate::runtime::Arg<'_>> = Vec::new();
            for c in &self.variant.customs {
                let buf = customs
                    .iter()
                    .find(|(n, _)| *n == c.name)
                    .map(|(_, b)| *b)
                    .expect("check_shapes found every custom input");
                args.push(buf.into());
            }
            for n in [
                shape.b, shape.h, shape.hkv, shape.sq, shape.skv, block_m, block_n, cols,
            ] {
                args.push(i32::try_from(n).expect("checked 32-bit sizes").into());
            }
            args.extend([
                (&mut np).into(),
                (&mut ip).into(),
                (&mut nf).into(),
                (&mut ifull).into(),
            ]);
            builder
                .kernel
                .launch(stream, grid, (32, 1, 1), 0, &mut args)
                .map_err(runtime)?;
        }
        let down = |b: &DeviceBuffer<i32>| -> Result<Vec<u32>, Error> {
            Ok(stream
                .download(b)
                .map_err(runtime)?
                .into_iter()
                .map(|x| x as u32)
                .collect())
        };
        Ok(BlockMaskLists {
            block_m,
            block_n,
            batches,
            heads,
            kv_num_blocks: down(&np)?,
            kv_indices: down(&ip)?,
            full_kv_num_blocks: down(&nf)?,
            full_kv_indices: down(&ifull)?,
        })
    }

    /// The block-mask builder, generated and compiled on first use.
    fn mask_builder(&self) -> Result<&MaskBuilder, Error> {
        if let Some(b) = self.mask_builder.get() {
            return Ok(b);
        }
        let source =
            block_mask_builder(&self.variant, self.dims.dqk, self.dims.dv).map_err(|source| {
                Error::Compile {
                    variant: self.variant.name.clone(),
                    kernel: "block mask",
                    source,
                }
            })?;
        let what = format!("the block-mask builder of `{}`", self.variant.name);
        let module = compile_and_load(&self.device, &source.source, &self.options, &what)?;
        let params: Vec<Param> = self
            .variant
            .customs
            .iter()
            .map(|_| Param::In(DType::F32))
            .chain(std::iter::repeat_n(Param::I32, 8))
            .chain(std::iter::repeat_n(Param::Out(DType::I32), 4))
            .collect();
        let kernel = module
            .kernel(&source.name, &params)
            .map_err(loading_error(&self.device, &what))?;
        let _ = self.mask_builder.set(MaskBuilder {
            source,
            kernel,
            _module: module,
        });
        Ok(self.mask_builder.get().expect("set above"))
    }
}

/// The loaded block-mask builder.
#[derive(Debug)]
pub(super) struct MaskBuilder {
    source: BlockMaskBuilder,
    kernel: Kernel,
    _module: Module,
}
