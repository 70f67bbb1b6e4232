//! The block-mask builder: FlexAttention's `BlockMask` lists computed on the
//! GPU from a variant's own mask predicate (`templates/cuda/block_mask.cu`),
//! for the block-sparse forward.

use super::dialect::{Elem, ElemSpelling, WARP_SIZE, elem_spelling};
use crate::CompileError;
use crate::cxx::closures::{custom_params, forward_closures};
use crate::cxx::intervals::mask_block_fn;
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op};
use askama::Template;

/// A generated builder and what launching it needs.
#[derive(Clone, Debug)]
pub struct BlockMaskBuilder {
    pub source: String,
    pub name: String,
    /// Whether the mask reads the batch (its index or a custom input over
    /// `B`): then the lists are per batch, else one for every batch.
    pub per_batch: bool,
    /// Whether the mask reads the head (`H`, `Hkv`, or a custom input over
    /// them): then the lists are per head, else one for every head.
    pub per_head: bool,
}

#[derive(Template)]
#[template(path = "cuda/block_mask.cu", escape = "none")]
struct BuilderTemplate<'a> {
    version: &'a str,
    variant: &'a str,
    kernel_name: &'a str,
    sp: ElemSpelling,
    warp_size: u32,
    dqk: u32,
    dv: u32,
    params_fields: String,
    custom_args: String,
    params_init: String,
    closures: String,
}

/// The builder of `variant`'s block mask for head dims `dqk`, `dv` (which a
/// closure may read). The kernel takes the custom inputs, then `B, H, Hkv,
/// Sq, Skv`, `block_m, block_n`, the lists' column count, and the four
/// lists (i32); its grid is (mask rows, mask heads, mask batches) of one
/// warp each. Refuses variants without a mask.
pub fn block_mask_builder(
    variant: &Variant,
    dqk: u32,
    dv: u32,
) -> Result<BlockMaskBuilder, CompileError> {
    let par = variant.parallel().ok_or_else(|| {
        CompileError(format!(
            "`{}` is not a parallel variant: block masks are for the parallel forward",
            variant.name
        ))
    })?;
    let mask = par.mask.as_ref().ok_or_else(|| {
        CompileError(format!(
            "`{}` has no mask: there is no predicate to build a block mask from (every key \
             block would be seen whole); pass the lists to `forward_block_sparse` instead",
            variant.name
        ))
    })?;
    let depends = |axes: &[Axis]| {
        mask.graph.ids().any(|id| match &mask.graph.node(id).op {
            Op::Index(a) => axes.contains(a),
            Op::Custom(c) | Op::Gather(c) => variant.customs[*c as usize]
                .axes
                .iter()
                .any(|a| axes.contains(a)),
            _ => false,
        })
    };
    let per_batch = depends(&[Axis::B]);
    let per_head = depends(&[Axis::H, Axis::Hkv]);
    let p = custom_params(variant.customs.len(), false);
    let name = format!("aec_blockmask_{}", variant.name.to_lowercase());
    let mut closures = forward_closures(variant);
    closures.push_str(&mask_block_fn(mask));
    let t = BuilderTemplate {
        version: env!("CARGO_PKG_VERSION"),
        variant: &variant.name,
        kernel_name: &name,
        sp: elem_spelling(Elem::Bf16),
        warp_size: WARP_SIZE,
        dqk,
        dv,
        params_fields: p.fields,
        custom_args: p.args,
        params_init: p.init,
        closures,
    };
    let source = t
        .render()
        .map_err(|e| CompileError(format!("template rendering failed: {e}")))?;
    Ok(BlockMaskBuilder {
        source,
        name,
        per_batch,
        per_head,
    })
}
