//! The variable-length parallel forward: a packed batch of sequences of
//! different lengths in one launch, no padding
//! ([`ParallelKernels::forward_varlen`]).

use super::{
    Error, ForwardLaunch, ForwardOutput, HeadDims, KernelElement, KernelOptions, LaunchRows,
    MAX_GRID_YZ, ParallelKernels, Shape, check_boundaries, check_shapes_with, generate_forward,
    require_parallel, upload_i32,
};
use crate::compiler::{ForwardConfig, Isa, KernelSource, parallel_forward_varlen};
use crate::frontend::{self, ir::Axis};
use crate::runtime::{DeviceBuffer, Stream};

/// A packed batch of N sequences: sequence `n` is query rows
/// `cu_seqlens_q[n] … cu_seqlens_q[n + 1] − 1` and key rows
/// `cu_seqlens_k[n] … cu_seqlens_k[n + 1] − 1` of every head.
#[derive(Clone, Copy, Debug)]
pub struct VarlenBatch<'a> {
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `Hkv` (`H` for variants without grouped-query heads).
    pub kv_heads: usize,
    /// `[N + 1]`, increasing from 0 to the total query rows `Tq`.
    pub cu_seqlens_q: &'a [usize],
    /// `[N + 1]`, increasing from 0 to the total key rows `Tk`.
    pub cu_seqlens_k: &'a [usize],
}

impl VarlenBatch<'_> {
    fn sequences(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }

    fn longest(bounds: &[usize]) -> usize {
        bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }
}

/// Generates the variable-length forward of `variant` for `dims` and `isa`
/// without compiling it ([`parallel_forward_varlen`] with the options'
/// tile configuration, else [`ForwardConfig::varlen_default_for`]). Needs
/// no GPU.
pub fn varlen_forward_source(
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
        ForwardConfig::varlen_default_for,
        parallel_forward_varlen,
    )
}

/// Checks, without a GPU, a variable-length forward call of `variant`
/// ([`ParallelKernels::forward_varlen`]) and returns the outputs' shape
/// `(1, H, Hkv, Tq, Tk)` and the kernel's sizes `(N, H, Hkv, longest Sq,
/// longest Skv)`.
///
/// The boundaries: as many of each, 0 first, strictly increasing, at most
/// 65535 sequences, ending at the rows q and k hold. The variant: no custom
/// input over `Sq` or `Skv` (it would be indexed by a packed row), a fixed
/// `Sq` or `Skv` met by every sequence, a fixed `B` of 1. Then q, k, v and
/// the custom inputs as [`check_shapes`](super::check_shapes) checks them
/// for the packed shape.
pub fn check_varlen_shapes(
    variant: &frontend::Variant,
    dims: HeadDims,
    batch: &VarlenBatch<'_>,
    tensors: &[(&str, usize)],
) -> Result<(Shape, Shape), Error> {
    require_parallel(variant)?;
    let bad = |m: String| Err(Error::Shape(m));
    let (cu_q, cu_k) = (batch.cu_seqlens_q, batch.cu_seqlens_k);
    check_boundaries("cu_seqlens_q", cu_q, "row")?;
    check_boundaries("cu_seqlens_k", cu_k, "row")?;
    if cu_q.len() != cu_k.len() {
        return bad(format!(
            "`cu_seqlens_q` has {} entries but `cu_seqlens_k` {}: both give N + 1 boundaries \
             of the same N sequences",
            cu_q.len(),
            cu_k.len()
        ));
    }
    let n = batch.sequences();
    if n > MAX_GRID_YZ {
        return bad(format!(
            "the batch holds {n} sequences; CUDA's grid takes at most {MAX_GRID_YZ} per call: \
             split the batch"
        ));
    }
    if let Some(c) = variant.customs.iter().find(|c| {
        c.axes
            .iter()
            .any(|a| matches!(a, Axis::Sq | Axis::Skv | Axis::B))
    }) {
        return bad(format!(
            "custom input `{}` of `{}` is declared over {}; in a packed variable-length batch \
             every sequence is a batch of one at its own positions, so an input over B, Sq or \
             Skv has no packed layout: run its sequences as separate calls of `forward`",
            c.name,
            variant.name,
            super::axes_str(c)
        ));
    }
    for &(axis, fixed) in &variant.fixed_sizes {
        let bounds = match axis {
            Axis::Sq => ("cu_seqlens_q", cu_q),
            Axis::Skv => ("cu_seqlens_k", cu_k),
            _ => continue,
        };
        if let Some(i) = bounds.1.windows(2).position(|w| w[1] - w[0] != fixed) {
            return bad(format!(
                "`{}` fixes {axis} = {fixed}, but sequence {i} has {} rows (`{}`)",
                variant.name,
                bounds.1[i + 1] - bounds.1[i],
                bounds.0
            ));
        }
    }
    let (tq, tk) = (cu_q[n], cu_k[n]);
    let (h, hkv) = (batch.heads, batch.kv_heads);
    for (tensor, bound, total, rows_of, d) in [
        ("q", "cu_seqlens_q", tq, h, dims.dqk as usize),
        ("k", "cu_seqlens_k", tk, hkv, dims.dqk as usize),
    ] {
        let len = tensors
            .iter()
            .find(|(name, _)| *name == tensor)
            .map_or(0, |&(_, l)| l);
        let per_row = rows_of * d;
        if per_row > 0 && len.is_multiple_of(per_row) && len / per_row != total {
            return bad(format!(
                "`{bound}` ends at {total}, but {tensor} holds {} rows ([1, heads, rows, Dqk] \
                 with {rows_of} heads): the last entry must be the total number of rows",
                len / per_row
            ));
        }
    }
    let packed = Shape::new(1, h, hkv, tq, tk);
    check_shapes_with(variant, dims, packed, tensors, false)?;
    let sizes = Shape::new(
        n,
        h,
        hkv,
        VarlenBatch::longest(cu_q),
        VarlenBatch::longest(cu_k),
    );
    Ok((packed, sizes))
}

impl ParallelKernels {
    /// The variable-length forward's source (generated and compiled on the
    /// first call of this or [`forward_varlen`](Self::forward_varlen)).
    pub fn varlen_source(&self) -> Result<&KernelSource, Error> {
        Ok(&self
            .layout_kernel(&self.varlen, varlen_forward_source, "variable-length")?
            .source)
    }

    /// Runs the forward over a packed batch of sequences of different
    /// lengths, without padding (as serving assembles prefills).
    ///
    /// - `q`: `[1, H, Tq, Dqk]`, `k`: `[1, Hkv, Tk, Dqk]`, `v`: `[1, Hkv, Tk,
    ///   Dv]`: in each head the sequences one after another, as `batch`'s
    ///   boundaries say.
    /// - `customs`: as for [`forward`](Self::forward); inputs over `B`, `Sq`
    ///   or `Skv` are refused (they have no packed layout).
    ///
    /// Each sequence's rows of `o` (`[1, H, Tq, Dv]`) and of the row outputs
    /// equal a [`forward`](Self::forward) call with `B = 1` on that
    /// sequence alone: the closures see `b = 0`, `B = 1` and the sequence's
    /// own positions, `Sq` and `Skv` (a causal mask is causal within each
    /// sequence). The first call compiles the kernel (through the kernel
    /// cache). Every check happens before anything is uploaded or launched
    /// ([`check_varlen_shapes`]). [`backward`](Self::backward) takes its
    /// output: the gradients come packed the same way.
    pub fn forward_varlen<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        batch: &VarlenBatch<'_>,
    ) -> Result<ForwardOutput<T>, Error> {
        let lens = self.input_lens(stream, q, k, v, customs)?;
        let (packed, sizes) = check_varlen_shapes(&self.variant, self.dims, batch, &lens)?;
        let kernel = self.layout_kernel(&self.varlen, varlen_forward_source, "variable-length")?;
        // check_varlen_shapes bounded every entry by the i32 row counts.
        let cu_q = upload_i32(stream, "cu_seqlens_q", batch.cu_seqlens_q.iter().copied())?;
        let cu_k = upload_i32(stream, "cu_seqlens_k", batch.cu_seqlens_k.iter().copied())?;
        let mut out = self.alloc_output::<T>(stream, packed)?;
        let launch = ForwardLaunch {
            source: &kernel.source,
            main: &kernel.main,
            combine: None,
            sizes,
            n_splits: 1,
            rows: LaunchRows::Varlen {
                cu_q: &cu_q,
                cu_k: &cu_k,
            },
        };
        self.launch_forward(stream, &launch, q, k, v, customs, &mut out)?;
        out.cu_seqlens = Some((batch.cu_seqlens_q.to_vec(), batch.cu_seqlens_k.to_vec()));
        Ok(out)
    }
}
