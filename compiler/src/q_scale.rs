//! Moving a uniform Q scale onto the scores.
//!
//! Most variants scale Q by a constant (`modify_q = |q| q * rsqrt(Dqk)`).
//! Applied to Q that is a pass over the Q tile in shared memory before the
//! first score of every row block (3.5% of the Hopper forward's consumer time
//! at 16 key blocks a row block, bench/NOTES.md). Since `(c·q)·k = c·(q·k)`,
//! the forward can instead give the scores the factor: `c·s` enters
//! `modify_scores` (or, without one, the online step), where the simplifier
//! folds it into the `exp2` argument's multiply (`rowmax(c·s) = c·rowmax(s)`
//! for `c > 0`). In exact arithmetic the two are the same function; in the
//! kernel the scores are no longer computed from a rounded scaled Q, so the
//! result is, if anything, closer to the reference.
//!
//! The backward takes the same rewrite ([`fold_q_scale_backward`]) with its
//! derived regions re-derived from the rewritten closures: `P` is recomputed
//! from `c·s` and the derived `dS` is the gradient of the raw score, so the
//! kernels read `q` itself, the row kernel writes no modified copy of Q (a
//! read and a write of all of Q), and dQ needs no rescale. The saved row
//! state means the same thing either way.

use crate::backward_plan::backward_plan;
use crate::cxx::closures::reads;
use aec_frontend::derive;
use aec_frontend::ir::{Axis, Binary, Graph, NodeId, Op, ParamRole, Region};
use aec_frontend::variant::{Body, Variant};

/// The variant with its uniform Q scale moved onto the scores, or `None`
/// where `modify_q` is absent or is not `q · c` (or `q / c`) for a finite,
/// nonzero `c` computed from constants and the head dims alone.
pub fn fold_q_scale(variant: &Variant, dqk: u32, dv: u32) -> Option<Variant> {
    let par = variant.parallel()?;
    let c = uniform_scale(par.modify_q.as_ref()?, dqk, dv)?;
    let mut folded = variant.clone();
    let Body::Parallel(p) = &mut folded.body else {
        return None;
    };
    p.modify_q = None;
    // The scores' first reader takes them scaled.
    let target = match &mut p.modify_scores {
        Some(r) => r,
        None => &mut p.online.fwd,
    };
    *target = scale_element(target, c)?;
    Some(folded)
}

/// The variant for the backward with its uniform Q scale moved onto the
/// scores ([`fold_q_scale`]) and the closures' backward (the recomputed
/// weight, the normalisation's `dS`, the score closure's gradient)
/// re-derived from the rewritten closures; `None` where there is no such
/// scale or the rewritten normalisation has no kernel form.
pub fn fold_q_scale_backward(variant: &Variant, dqk: u32, dv: u32) -> Option<Variant> {
    let mut folded = fold_q_scale(variant, dqk, dv)?;
    let customs = variant.custom_names();
    let Body::Parallel(p) = &mut folded.body else {
        return None;
    };
    p.backward = derive::parallel_backward(
        &p.online,
        [&p.modify_q, &p.modify_k, &p.modify_v, &p.modify_scores],
        &customs,
    )
    .ok()?;
    backward_plan(&folded).is_ok().then_some(folded)
}

/// The variant a backward kernel generates from: [`fold_q_scale_backward`]'s
/// where `folds` (the target's kernel takes it) and no score closure reads
/// custom inputs, else `None` (the variant's own `modify_q`). Where a score
/// closure reads custom inputs its gradient to them and the scaled score
/// gradient are two values per score, and NVRTC spilled 132 bytes in the
/// relative-bias backward against 88 without the fold.
pub fn backward_variant(variant: &Variant, dqk: u32, dv: u32, folds: bool) -> Option<Variant> {
    let par = variant.parallel()?;
    let closure_reads_inputs = reads(par.modify_scores.as_ref(), |op| {
        matches!(op, Op::Custom(_) | Op::Gather(_))
    });
    if !folds || closure_reads_inputs {
        return None;
    }
    fold_q_scale_backward(variant, dqk, dv)
}

/// `c` where `region` computes `q · c`, `c · q` or `q / c`.
fn uniform_scale(region: &Region, dqk: u32, dv: u32) -> Option<f64> {
    let [out] = region.outputs.as_slice() else {
        return None;
    };
    let g = &region.graph;
    let root = g.node(out.node);
    let is_element = |id: NodeId| match g.node(id).op {
        Op::Param(k) => region.params[k as usize].role == ParamRole::Element,
        _ => false,
    };
    let c = match (root.op, root.args.as_slice()) {
        (Op::Binary(Binary::Mul), [a, b]) if is_element(*a) => head_dim_value(g, *b, dqk, dv)?,
        (Op::Binary(Binary::Mul), [a, b]) if is_element(*b) => head_dim_value(g, *a, dqk, dv)?,
        (Op::Binary(Binary::Div), [a, b]) if is_element(*a) => {
            1.0 / head_dim_value(g, *b, dqk, dv)?
        }
        _ => return None,
    };
    (c.is_finite() && c != 0.0).then_some(c)
}

/// The value of `id` where it reads only constants and the head dims.
fn head_dim_value(g: &Graph, id: NodeId, dqk: u32, dv: u32) -> Option<f64> {
    let n = g.node(id);
    let arg = |k: usize| head_dim_value(g, n.args[k], dqk, dv);
    match n.op {
        Op::Const(c) => Some(c.get()),
        Op::Shape(Axis::Dqk) => Some(f64::from(dqk)),
        Op::Shape(Axis::Dv) => Some(f64::from(dv)),
        Op::Unary(u) => Some(u.apply(arg(0)?)),
        Op::Binary(b) => Some(b.apply(arg(0)?, arg(1)?)),
        _ => None,
    }
}

/// `region` with its element parameter (the score) multiplied by `c`.
fn scale_element(region: &Region, c: f64) -> Option<Region> {
    let element = region.param_index(&ParamRole::Element)?;
    let mut graph = Graph::new(region.graph.fold(), region.graph.reduce_axis());
    let factor = graph.f32(c);
    let roots: Vec<NodeId> = region.outputs.iter().map(|o| o.node).collect();
    let images = graph.import(&region.graph, &roots, |g, _, n| {
        (n.op == Op::Param(element)).then(|| {
            let s = g.leaf(n.op, n.dtype, n.axes);
            g.binary(Binary::Mul, s, factor)
        })
    });
    let mut scaled = region.clone();
    scaled.graph = graph;
    for (o, img) in scaled.outputs.iter_mut().zip(images) {
        o.node = img;
    }
    Some(scaled)
}
