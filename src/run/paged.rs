//! The forward over a paged KV cache, as serving engines keep keys and
//! values ([`ParallelKernels::forward_paged`]).

use super::{
    Error, ForwardLaunch, ForwardOutput, HeadDims, KernelElement, KernelOptions, LaunchRows,
    ParallelKernels, Shape, check_shapes_with, generate_forward, kv_splits_on, require_parallel,
    upload_i32,
};
use crate::compiler::{ForwardConfig, Isa, KernelSource, parallel_forward_paged};
use crate::frontend::{self, ir::Axis};
use crate::runtime::{DeviceBuffer, Stream};

/// The smallest and largest page (rows of one head) the kernels take.
const PAGE_SIZES: std::ops::RangeInclusive<usize> = 16..=256;

/// A call over a paged KV cache: `k` is `[pages, Hkv, page_size, Dqk]` and
/// `v` `[pages, Hkv, page_size, Dv]`; sequence `b`'s keys are rows `0 …
/// seqlens_k[b] − 1` of its pages `block_table[b · pages_per_seq + 0], …`
/// in order (`pages_per_seq = block_table.len() / B`, `B =
/// seqlens_k.len()`); the queries are dense, `[B, H, Sq, Dqk]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `Hkv`.
    pub kv_heads: usize,
    /// Query rows per sequence `Sq` (1 for decoding).
    pub queries: usize,
    /// Rows per page: a power of two from 16 to 256.
    pub page_size: usize,
    /// `[B, pages_per_seq]`: each sequence's pages in order; entries past
    /// the pages its keys fill are not read.
    pub block_table: &'a [u32],
    /// `[B]`: each sequence's keys, at least 1 and at most `pages_per_seq ·
    /// page_size`.
    pub seqlens_k: &'a [usize],
}

/// The device side of a paged launch.
pub(super) struct PagedArgs<'a> {
    pub(super) block_table: &'a DeviceBuffer<i32>,
    pub(super) seqlens_k: &'a DeviceBuffer<i32>,
    pub(super) pages_per_seq: i32,
    pub(super) page_shift: i32,
}

impl PagedArgs<'_> {
    /// The value of the [`ArgKind::PagedKv`](crate::compiler::ArgKind)
    /// argument `name`.
    pub(super) fn arg(&self, name: &str) -> Option<crate::runtime::Arg<'_>> {
        use crate::runtime::Arg;
        Some(match name {
            "block_table" => Arg::from(self.block_table),
            "seqlens_k" => Arg::from(self.seqlens_k),
            "pages_per_seq" => Arg::from(self.pages_per_seq),
            "page_shift" => Arg::from(self.page_shift),
            _ => return None,
        })
    }
}

/// Generates the paged forward of `variant` for `dims` and `isa` without
/// compiling it ([`parallel_forward_paged`] with the options' tile
/// configuration, else the default one). Needs no GPU.
pub fn paged_forward_source(
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
        parallel_forward_paged,
    )
}

/// Checks, without a GPU, a paged forward call of `variant`
/// ([`ParallelKernels::forward_paged`]) and returns the call's shape `(B, H,
/// Hkv, Sq, longest sequence's keys)`.
///
/// In order: the page size (a power of two from 16 to 256); the block
/// table (`B` rows, at least one page each); every sequence's key count
/// (1 to its pages' rows); the caches (whole pages of `Hkv · page_size`
/// rows, as many in v as in k); every block-table entry a sequence reads
/// inside the cache; no custom input over `Skv` (it has no paged layout);
/// then q and the custom inputs as [`check_shapes`](super::check_shapes)
/// checks them, the variant's fixed `Sq` included.
pub fn check_paged_shapes(
    variant: &frontend::Variant,
    dims: HeadDims,
    paged: &PagedKv<'_>,
    tensors: &[(&str, usize)],
) -> Result<Shape, Error> {
    require_parallel(variant)?;
    let bad = |m: String| Err(Error::Shape(m));
    let p = paged.page_size;
    if !p.is_power_of_two() || !PAGE_SIZES.contains(&p) {
        return bad(format!(
            "page size {p} is not supported: pages hold a power of two of rows from {} to {}",
            PAGE_SIZES.start(),
            PAGE_SIZES.end()
        ));
    }
    let b = paged.seqlens_k.len();
    if b == 0 {
        return bad("`seqlens_k` is empty: a paged call needs at least one sequence".into());
    }
    let table = paged.block_table;
    if table.is_empty() || !table.len().is_multiple_of(b) {
        return bad(format!(
            "`block_table` has {} entries, which is not B = {b} rows (one per entry of \
             `seqlens_k`) of at least one page",
            table.len()
        ));
    }
    let per_seq = table.len() / b;
    if let Some((s, &n)) = paged
        .seqlens_k
        .iter()
        .enumerate()
        .find(|&(_, &n)| n == 0 || n > per_seq * p)
    {
        return bad(format!(
            "sequence {s} has {n} keys (`seqlens_k[{s}]`), but its {per_seq} pages of {p} rows \
             hold 1 to {}",
            per_seq * p
        ));
    }
    let len_of = |name: &str| {
        tensors
            .iter()
            .find(|(t, _)| *t == name)
            .map_or(0, |&(_, l)| l)
    };
    let (hkv, dqk, dv) = (paged.kv_heads, dims.dqk as usize, dims.dv as usize);
    let page_k = hkv * p * dqk;
    let (k_len, v_len) = (len_of("k"), len_of("v"));
    if page_k == 0 || k_len == 0 || !k_len.is_multiple_of(page_k) {
        return bad(format!(
            "tensor `k` has {k_len} elements, which is not a whole number of pages [Hkv, page \
             size, Dqk] = [{hkv}, {p}, {dqk}]: the cache is [pages, Hkv, page size, Dqk]"
        ));
    }
    let pages = k_len / page_k;
    if v_len != pages * hkv * p * dv {
        return bad(format!(
            "tensor `v` has {v_len} elements, expected [pages, Hkv, page size, Dv] = [{pages}, \
             {hkv}, {p}, {dv}] = {} (as many pages as k)",
            pages * hkv * p * dv
        ));
    }
    if i32::try_from(pages).is_err() || i32::try_from(per_seq).is_err() {
        return bad(format!(
            "the cache has {pages} pages and the table {per_seq} per sequence; the kernel's \
             block table holds 32-bit entries: split the cache"
        ));
    }
    for (s, &n) in paged.seqlens_k.iter().enumerate() {
        let row = &table[s * per_seq..(s + 1) * per_seq];
        if let Some((i, &page)) = row
            .iter()
            .take(n.div_ceil(p))
            .enumerate()
            .find(|&(_, &page)| page as usize >= pages)
        {
            return bad(format!(
                "`block_table[{s}][{i}]` = {page} points outside the cache of {pages} pages \
                 (sequence {s} reads its first {} pages)",
                n.div_ceil(p)
            ));
        }
    }
    if let Some(c) = variant.customs.iter().find(|c| c.axes.contains(&Axis::Skv)) {
        return bad(format!(
            "custom input `{}` of `{}` is declared over {}; over a paged KV cache the keys \
             have no dense layout for it: use `forward` on a contiguous cache",
            c.name,
            variant.name,
            super::axes_str(c)
        ));
    }
    let longest = paged.seqlens_k.iter().copied().max().unwrap_or(1);
    for &(axis, fixed) in &variant.fixed_sizes {
        if axis == Axis::Sq && paged.queries != fixed {
            return bad(format!(
                "`{}` fixes Sq = {fixed}, but the call has {} queries per sequence",
                variant.name, paged.queries
            ));
        }
        if axis == Axis::Skv
            && let Some(s) = paged.seqlens_k.iter().position(|&n| n != fixed)
        {
            return bad(format!(
                "`{}` fixes Skv = {fixed}, but sequence {s} has {} keys",
                variant.name, paged.seqlens_k[s]
            ));
        }
    }
    let shape = Shape::new(b, paged.heads, hkv, paged.queries, longest);
    // q and the custom inputs against the call's shape; k and v, checked
    // above as caches, stand in with their dense sizes.
    let dense: Vec<(&str, usize)> = tensors
        .iter()
        .map(|&(n, l)| match n {
            "k" => (n, b * hkv * longest * dqk),
            "v" => (n, b * hkv * longest * dv),
            _ => (n, l),
        })
        .collect();
    check_shapes_with(variant, dims, shape, &dense, false)?;
    Ok(shape)
}

impl ParallelKernels {
    /// The paged forward's source (generated and compiled on the first call
    /// of this or [`forward_paged`](Self::forward_paged)).
    pub fn paged_source(&self) -> Result<&KernelSource, Error> {
        Ok(&self
            .layout_kernel(&self.paged, paged_forward_source, "paged")?
            .source)
    }

    /// The KV splits [`forward_paged`](Self::forward_paged) launches with
    /// for `shape` (`Skv` the longest sequence's keys) on this device.
    pub fn paged_kv_splits(&self, shape: Shape) -> Result<u32, Error> {
        let kernel = self.layout_kernel(&self.paged, paged_forward_source, "paged")?;
        Ok(kv_splits_on(
            &self.device,
            &kernel.source,
            &kernel.main,
            shape,
        ))
    }

    /// Runs the forward with keys and values in a paged cache ([`PagedKv`]
    /// says where each sequence's keys are): `q` `[B, H, Sq, Dqk]`, `k`
    /// `[pages, Hkv, page_size, Dqk]`, `v` `[pages, Hkv, page_size, Dv]`.
    /// Returns what [`forward`](Self::forward) returns for `[B, H, Sq]`
    /// queries; each sequence sees only its own `seqlens_k[b]` keys (the
    /// closures see it as `Skv`). Decoding variants keep their packed heads
    /// and KV splits. The first call compiles the kernel; every check
    /// ([`check_paged_shapes`], block-table entries inside the cache
    /// included) happens before anything is uploaded or launched.
    pub fn forward_paged<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        paged: &PagedKv<'_>,
    ) -> Result<ForwardOutput<T>, Error> {
        let lens = self.input_lens(stream, q, k, v, customs)?;
        let shape = check_paged_shapes(&self.variant, self.dims, paged, &lens)?;
        let kernel = self.layout_kernel(&self.paged, paged_forward_source, "paged")?;
        // check_paged_shapes bounded the entries a kernel reads by the page
        // count and the key counts by the table's rows, both 32-bit.
        let table = upload_i32(stream, "block_table", paged.block_table.iter().copied())?;
        let seqlens = upload_i32(stream, "seqlens_k", paged.seqlens_k.iter().copied())?;
        let mut out = self.alloc_output::<T>(stream, shape)?;
        let launch = ForwardLaunch {
            source: &kernel.source,
            main: &kernel.main,
            combine: kernel.combine.as_ref(),
            sizes: shape,
            n_splits: kv_splits_on(&self.device, &kernel.source, &kernel.main, shape),
            rows: LaunchRows::Paged(PagedArgs {
                block_table: &table,
                seqlens_k: &seqlens,
                pages_per_seq: (paged.block_table.len() / shape.b) as i32,
                page_shift: paged.page_size.trailing_zeros() as i32,
            }),
        };
        self.launch_forward(stream, &launch, q, k, v, customs, &mut out)?;
        Ok(out)
    }
}
