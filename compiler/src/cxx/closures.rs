//! Pieces every parallel template (CUDA and HIP) shares: how kernels name axis coordinates,
//! sizes and custom inputs, the element type's spellings, and the user's
//! elementwise closures (and their derived backward) as device functions.

use super::expr::{custom_element, pointwise};
use crate::CompileError;
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Binary, NodeId, Op, Output, Region};
use aec_frontend::variant::{Online, Parallel};
use std::fmt::Write;

/// The kernel expression of an axis's extent (`Params P` in scope).
pub fn axis_size(a: Axis) -> String {
    match a {
        Axis::B => "P.B".into(),
        Axis::H => "P.H".into(),
        Axis::Hkv => "P.Hkv".into(),
        Axis::Sq => "P.Sq".into(),
        Axis::Skv => "P.Skv".into(),
        Axis::Dqk => "DQK".into(),
        Axis::Dv => "DV".into(),
        Axis::S => "P.S".into(),
        Axis::Dk => "DK".into(),
    }
}

/// The kernel expression of an axis's coordinate (`Pt pt` in scope).
pub fn axis_coord(a: Axis) -> String {
    match a {
        Axis::B => "pt.b".into(),
        Axis::H => "pt.h".into(),
        Axis::Hkv => "pt.hk".into(),
        Axis::Sq => "pt.i".into(),
        Axis::Skv => "pt.j".into(),
        Axis::Dqk | Axis::Dv | Axis::Dk => "pt.d".into(),
        Axis::S => "pt.t".into(),
    }
}

/// `P.<pointer>[offset of the point]` for custom input `c` (axes of its declaration).
pub fn custom_at(variant: &Variant, c: u32, pointer: &str) -> String {
    custom_element(
        &format!("P.{pointer}{c}"),
        &variant.customs[c as usize].axes,
        &axis_coord,
        &axis_size,
    )
}

/// The element offset of indexed input `c` at the point (its broadcast axes)
/// and user-axis indices `indices` (C expressions; where none are given the
/// placeholders `$0`, `$1`, … that the expression emitter fills with the
/// gather's operands), each index clamped into its axis as the reference does.
pub fn gather_offset(variant: &Variant, c: u32, indices: &[String]) -> String {
    let decl = &variant.customs[c as usize];
    let mut offset = String::from("0LL");
    for (k, a) in decl.axes.iter().enumerate() {
        offset = if k == 0 {
            format!("(long long)({})", axis_coord(*a))
        } else {
            format!("({offset} * {} + {})", axis_size(*a), axis_coord(*a))
        };
    }
    for (k, (_, n)) in decl.user_axes.iter().enumerate() {
        let n = n.expect("user axis sizes are checked by check_indexed_inputs");
        let idx = indices.get(k).cloned().unwrap_or_else(|| format!("${k}"));
        offset = format!(
            "({offset} * {n} + min(max((long long)({idx}), 0LL), {}LL))",
            n - 1
        );
    }
    offset
}

/// Leaves of an elementwise closure: its element is `x`, the rest come from the point.
fn closure_leaf(variant: &Variant, seed: Option<u32>) -> impl Fn(&Op) -> String + '_ {
    move |op: &Op| match op {
        Op::Param(p) if Some(*p) == seed => "dy".into(),
        Op::Param(_) => "x".into(),
        Op::Index(a) => axis_coord(*a),
        Op::Shape(a) => axis_size(*a),
        Op::Custom(c) => custom_at(variant, *c, "in"),
        Op::Gather(c) => format!("P.in{c}[{}]", gather_offset(variant, *c, &[])),
        other => unreachable!("not a leaf of an elementwise closure: {other:?}"),
    }
}

/// The forward closures (`modify_q`…, `mask_fn`) as device functions
/// `float name(float x, const Pt&, const Params&)` (`bool mask_fn(const Pt&, const Params&)`).
pub fn forward_closures(variant: &Variant) -> String {
    let par = variant.parallel().expect("parallel variant");
    let mut out = String::new();
    for (region, name, ret) in [
        (&par.modify_q, "modify_q", "float"),
        (&par.modify_k, "modify_k", "float"),
        (&par.modify_v, "modify_v", "float"),
        (&par.modify_scores, "modify_scores", "float"),
        (&par.mask, "mask_fn", "bool"),
    ] {
        let Some(r) = region else { continue };
        let (code, outs) = pointwise(r, "n", &closure_leaf(variant, None));
        let arg = if name == "mask_fn" { "" } else { "float x, " };
        let _ = writeln!(
            out,
            "__device__ __forceinline__ {ret} {name}({arg}const Pt& pt, const Params& P) {{\n{code}    return {};\n}}\n",
            outs[0]
        );
    }
    out
}

/// The factor `f` of a recurrent modification of the form `x · f` where `f`
/// reads no element and does not vary over a head dim: a row scale, which a
/// template may apply to whole rows (or fold into another factor) instead of
/// rewriting every element. `None` for any other form.
pub fn row_scale_factor(region: &Region) -> Option<NodeId> {
    let g = &region.graph;
    let root = g.node(region.outputs.first()?.node);
    if root.op != Op::Binary(Binary::Mul) {
        return None;
    }
    let is_param = |id: NodeId| matches!(g.node(id).op, Op::Param(_));
    let factor = match (root.args[0], root.args[1]) {
        (x, f) if is_param(x) => f,
        (f, x) if is_param(x) => f,
        _ => return None,
    };
    let axes = g.node(factor).axes;
    let per_dim = [Axis::Dk, Axis::Dv, Axis::Dqk]
        .into_iter()
        .any(|a| axes.contains(a));
    let reads_element = g.depends_on(factor, |n| matches!(n.op, Op::Param(_) | Op::Gather(_)));
    (!per_dim && !reads_element).then_some(factor)
}

/// A per-step closure of a recurrent variant (`output` of `region`: the
/// decay, or a row-scale modification's factor ([`row_scale_factor`])), split
/// in two so that a template can issue its custom-input reads a chunk
/// before it needs the value: `void {name}_reads(const Pt&, const Params&,
/// float (&raw)[{NAME}_READS])` loads each custom input the closure reads
/// at the point, and `float {name}_from(const float (&raw)[…], const Pt&,
/// const Params&)` computes the closure from those values. (A read consumed
/// where it is issued stalls its warp for the memory's latency.) The
/// region's indexed reads, if any, stay in `_from`.
pub fn split_reads_fn(variant: &Variant, region: &Region, output: NodeId, name: &str) -> String {
    let mut r = region.clone();
    r.outputs = vec![Output {
        name: "value".into(),
        node: output,
    }];
    let live = r.graph.live(&[output]);
    let mut reads: Vec<u32> = Vec::new();
    for id in r.graph.ids() {
        if let Op::Custom(c) = r.graph.node(id).op
            && live[id.index()]
            && !reads.contains(&c)
        {
            reads.push(c);
        }
    }
    let leaf = closure_leaf(variant, None);
    let from_leaf = |op: &Op| match op {
        Op::Custom(c) => {
            let k = reads
                .iter()
                .position(|x| x == c)
                .expect("every live read is listed");
            format!("raw[{k}]")
        }
        other => leaf(other),
    };
    let (code, outs) = pointwise(&r, "n", &from_leaf);
    let count = format!("{}_READS", name.to_uppercase());
    let mut loads = String::new();
    for (k, c) in reads.iter().enumerate() {
        let _ = writeln!(loads, "    raw[{k}] = {};", custom_at(variant, *c, "in"));
    }
    format!(
        "#define {count} {}\n\
         __device__ __forceinline__ void {name}_reads(const Pt& pt, const Params& P, float (&raw)[{count}]) {{\n{loads}    (void)pt; (void)P; (void)raw;\n}}\n\
         __device__ __forceinline__ float {name}_from(const float (&raw)[{count}], const Pt& pt, const Params& P) {{\n{code}    (void)raw;\n    return {};\n}}\n",
        reads.len().max(1),
        outs[0]
    )
}

/// The recurrent closures as device functions: `modify_q`, `modify_k`,
/// `modify_v` (`float name(float x, const Pt&, const Params&)`), `decay_fn`
/// (`float decay_fn(const Pt&, const Params&)`: its halves
/// `decay_fn_reads` then `decay_fn_from` ([`split_reads_fn`])) and `normalize_fn` (`float
/// normalize_fn(float x, float nrm, const Pt&, const Params&)`: the output
/// element and its row's normaliser). The template's `Pt` has `b, h, t, d`.
pub fn recurrent_closures(variant: &Variant) -> String {
    let rec = variant.recurrent().expect("recurrent variant");
    let mut out = String::new();
    for (region, name) in [
        (&rec.modify_q, "modify_q"),
        (&rec.modify_k, "modify_k"),
        (&rec.modify_v, "modify_v"),
    ] {
        let Some(r) = region else { continue };
        let (code, outs) = pointwise(r, "n", &closure_leaf(variant, None));
        let _ = writeln!(
            out,
            "__device__ __forceinline__ float {name}(float x, const Pt& pt, const Params& P) {{\n{code}    return {};\n}}\n",
            outs[0]
        );
    }
    if let Some(d) = &rec.decay {
        // One copy of the arithmetic: `decay_fn` is its two halves in turn.
        out.push_str(&split_reads_fn(
            variant,
            &d.region,
            d.region.outputs[0].node,
            "decay_fn",
        ));
        out.push_str(
            "__device__ __forceinline__ float decay_fn(const Pt& pt, const Params& P) {\n    \
             float raw[DECAY_FN_READS];\n    decay_fn_reads(pt, P, raw);\n    \
             return decay_fn_from(raw, pt, P);\n}\n\n",
        );
    }
    if let Some(r) = &rec.normalize {
        let leaf = closure_leaf(variant, None);
        let normalize_leaf = |op: &Op| match op {
            Op::Param(k) => match r.params[*k as usize].role {
                aec_frontend::ir::ParamRole::Element => "x".into(),
                _ => "nrm".into(),
            },
            other => leaf(other),
        };
        let (code, outs) = pointwise(r, "n", &normalize_leaf);
        let _ = writeln!(
            out,
            "__device__ __forceinline__ float normalize_fn(float x, float nrm, const Pt& pt, const Params& P) {{\n{code}    return {};\n}}\n",
            outs[0]
        );
    }
    out
}

/// A derived closure backward as `float name(float x, float dy, const Pt&,
/// const Params&, float (&gr)[N])`: returns the element's gradient and puts
/// the contribution to each custom input's gradient in `gr`, in the order of
/// [`grad_outputs`].
pub fn backward_closure(variant: &Variant, region: &Region, name: &str) -> String {
    let seed = region
        .params
        .iter()
        .position(|p| matches!(p.role, aec_frontend::ir::ParamRole::Seed(_)))
        .map(|p| p as u32);
    let grads = grad_outputs(variant, region);
    let only = Region {
        outputs: std::iter::once(region.outputs[0].clone())
            .chain(grads.iter().map(|g| region.outputs[g.output].clone()))
            .collect(),
        ..region.clone()
    };
    let (code, outs) = pointwise(&only, "n", &closure_leaf(variant, seed));
    let mut body = code;
    for (k, e) in outs[1..].iter().enumerate() {
        let _ = writeln!(body, "    gr[{k}] = {e};");
    }
    format!(
        "{}__device__ __forceinline__ float {name}(float x, float dy, const Pt& pt, const Params& P, float (&gr)[{}]) {{\n{body}    return {};\n}}\n",
        gather_offset_fns(variant, region),
        grads.len().max(1),
        outs[0]
    )
}

/// One custom-input gradient a closure backward hands back in `gr`.
#[derive(Clone, Debug)]
pub struct GradOutput {
    /// The region output holding it.
    pub output: usize,
    /// The custom input.
    pub custom: u32,
    /// The gradient element it adds to, `P.g<c>[…]` (`pt` and `P` in scope).
    pub target: String,
    /// Whether it comes from an indexed read (its element follows the indices,
    /// not the point alone).
    pub gathered: bool,
}

/// The `grad.<input>` outputs of a closure backward, and those of its
/// indexed reads (`grad.<input>#<k>`, whose element is found by the
/// region's [`gather_offset_fns`]).
pub fn grad_outputs(variant: &Variant, region: &Region) -> Vec<GradOutput> {
    let custom = |name: &str| variant.customs.iter().position(|c| c.name == name);
    region
        .outputs
        .iter()
        .enumerate()
        .filter_map(|(k, o)| {
            let name = o.name.strip_prefix("grad.")?;
            match name.split_once('#') {
                None => {
                    let c = custom(name)? as u32;
                    Some(GradOutput {
                        output: k,
                        custom: c,
                        target: custom_at(variant, c, "g"),
                        gathered: false,
                    })
                }
                // `grad.<input>#<k>.<axis>`: an index of read k, not a gradient.
                Some((_, read)) if read.contains('.') => None,
                Some((input, read)) => {
                    let c = custom(input)? as u32;
                    Some(GradOutput {
                        output: k,
                        custom: c,
                        target: format!("P.g{c}[{}(pt, P)]", gather_fn_name(region, read)),
                        gathered: true,
                    })
                }
            }
        })
        .collect()
}

fn gather_fn_name(region: &Region, read: &str) -> String {
    let base: String = region
        .name
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect();
    format!("{base}_gather{read}")
}

/// For each indexed read of a closure backward, `long long
/// <region>_gather<k>(const Pt&, const Params&)`: the element its gradient
/// goes to, from the read's index outputs (which depend on the point only:
/// [`check_indexed_inputs`]).
pub fn gather_offset_fns(variant: &Variant, region: &Region) -> String {
    let mut out = String::new();
    for g in grad_outputs(variant, region).iter().filter(|g| g.gathered) {
        let name = &region.outputs[g.output].name;
        let read = name.rsplit_once('#').map(|(_, r)| r).unwrap_or_default();
        let prefix = format!("{name}.");
        let indices: Vec<Output> = region
            .outputs
            .iter()
            .filter(|o| o.name.starts_with(&prefix))
            .cloned()
            .collect();
        let only = Region {
            outputs: indices,
            ..region.clone()
        };
        let (code, outs) = pointwise(&only, "n", &closure_leaf(variant, None));
        let _ = writeln!(
            out,
            "__device__ __forceinline__ long long {}(const Pt& pt, const Params& P) {{\n{code}    (void)P;\n    return {};\n}}\n",
            gather_fn_name(region, read),
            gather_offset(variant, g.custom, &outs)
        );
    }
    out
}

/// Statements adding each `gr[k]` to its custom input's gradient at the point
/// `pt`, with f32 atomics (contributions from many threads meet there).
pub fn grad_atomics(variant: &Variant, region: &Region, guard: &str, indent: &str) -> String {
    let mut s = String::new();
    for (k, g) in grad_outputs(variant, region).iter().enumerate() {
        let _ = writeln!(s, "{indent}if ({guard}) atomicAdd(&{}, gr[{k}]);", g.target);
    }
    s
}

/// Whether any node of an optional region satisfies `pred`.
pub fn reads(region: Option<&Region>, pred: impl Fn(&Op) -> bool) -> bool {
    region.is_some_and(|r| r.graph.nodes().iter().any(|n| pred(&n.op)))
}

/// Whether the score closures (mask, score modification) read a custom input
/// along `Sq` or `Skv`: then the templates clamp the point of padding rows
/// and keys into the tensors (index arithmetic alone needs no clamp).
pub fn scores_read_customs_by_position(variant: &Variant) -> bool {
    let par = variant.parallel().expect("parallel variant");
    let by_position = |op: &Op| match op {
        Op::Custom(c) => variant.customs[*c as usize]
            .axes
            .iter()
            .any(|a| matches!(a, Axis::Sq | Axis::Skv)),
        _ => false,
    };
    reads(par.mask.as_ref(), by_position) || reads(par.modify_scores.as_ref(), by_position)
}

/// The largest Dqk the parallel templates take in general (the backward, the
/// HIP templates).
pub const MAX_DQK: u32 = 256;

/// The largest Dqk the CUDA forward takes: its sm_80 template reads Q's
/// fragments from shared memory one 16-column step at a time, so registers
/// do not grow with Dqk (576: multi-head latent attention's decoding, Q and
/// the latent cache 512 + 64 RoPE columns wide). Shared memory bounds the
/// tiles that fit; the wgmma templates stop at 256.
pub const MAX_FORWARD_DQK: u32 = 576;

/// The largest Dv the parallel templates take: above 256 it is split into column
/// slices (forward: between blocks; backward: between the warps that share
/// keys).
pub const MAX_DV: u32 = 512;

/// That the head dims asked for agree with the ones the variant fixes
/// (`Dqk = 192`).
pub fn check_fixed_head_dims(variant: &Variant, dims: &[(Axis, u32)]) -> Result<(), CompileError> {
    for &(axis, d) in dims {
        if let Some((_, fixed)) = variant.fixed_sizes.iter().find(|(a, _)| *a == axis)
            && *fixed != d as usize
        {
            return Err(CompileError(format!(
                "`{}` fixes {axis} = {fixed}, asked for {d}",
                variant.name
            )));
        }
    }
    Ok(())
}

/// Refuses custom inputs read by index (user axes), which the recurrent
/// templates do not take yet.
pub fn refuse_indexed_inputs(variant: &Variant) -> Result<(), CompileError> {
    match variant.customs.iter().find(|c| !c.user_axes.is_empty()) {
        Some(c) => Err(CompileError(format!(
            "custom input `{}` has user axes (read by index); the recurrent templates do not support indexed inputs yet",
            c.name
        ))),
        None => Ok(()),
    }
}

/// What the parallel templates require of custom inputs read by index: a
/// fixed size for every user axis (`R = 33`), reads only in the elementwise
/// closures (modifications, score modification, mask), and indices that
/// depend on the point, not on the element's value (the backward finds the
/// gradient's element from them).
pub fn check_indexed_inputs(variant: &Variant, par: &Parallel) -> Result<(), CompileError> {
    for c in variant.customs.iter() {
        if let Some((axis, _)) = c.user_axes.iter().find(|(_, n)| n.is_none()) {
            return Err(CompileError(format!(
                "custom input `{}` has the user axis `{axis}` without a size; the GPU templates need it fixed: declare `{axis} = <n>`",
                c.name
            )));
        }
    }
    let gathers = |r: &Region| {
        r.graph
            .nodes()
            .iter()
            .any(|n| matches!(n.op, Op::Gather(_)))
    };
    for (region, what) in [
        (&par.online.fwd, "the online update"),
        (&par.online.epilogue, "the epilogue"),
    ] {
        if gathers(region) {
            return Err(CompileError(format!(
                "{what} reads a custom input by index; the GPU templates take indexed reads in the elementwise closures (modify_q/k/v, modify_scores, mask) only"
            )));
        }
    }
    for (region, name) in [
        (&par.modify_q, "modify_q"),
        (&par.modify_k, "modify_k"),
        (&par.modify_v, "modify_v"),
        (&par.modify_scores, "modify_scores"),
        (&par.mask, "mask"),
    ] {
        let Some(r) = region else { continue };
        let g = &r.graph;
        for id in g.ids() {
            let n = g.node(id);
            if let Op::Gather(c) = n.op
                && n.args
                    .iter()
                    .any(|a| g.depends_on(*a, |m| matches!(m.op, Op::Param(_))))
            {
                return Err(CompileError(format!(
                    "`{name}` reads custom input `{}` at an index computed from the element's value; the GPU templates take indices computed from the position (b, h, i, j…) only",
                    variant.customs[c as usize].name
                )));
            }
        }
    }
    Ok(())
}

/// What every parallel template requires of a variant and its head dims:
/// the parallel pattern, head dims matching the variant's fixed sizes and a
/// multiple of 16 up to 256 (Dv up to 512), and indexed reads the templates
/// take ([`check_indexed_inputs`]). `kernel`
/// names the template in messages (`forward`, `backward`).
pub fn parallel_inputs<'v>(
    variant: &'v Variant,
    dqk: u32,
    dv: u32,
    kernel: &str,
    max_dqk: u32,
) -> Result<&'v Parallel, CompileError> {
    let par = variant.parallel().ok_or_else(|| {
        CompileError(format!(
            "`{}` is a recurrent variant; the parallel {kernel} needs a parallel one",
            variant.name
        ))
    })?;
    check_fixed_head_dims(variant, &[(Axis::Dqk, dqk), (Axis::Dv, dv)])?;
    for (axis, d) in [(Axis::Dqk, dqk), (Axis::Dv, dv)] {
        let max = if axis == Axis::Dv { MAX_DV } else { max_dqk };
        if d == 0 || d % 16 != 0 || d > max {
            return Err(CompileError(format!(
                "head dimension {axis} = {d} is not supported by the parallel {kernel} templates: it needs a multiple of 16 up to {max}"
            )));
        }
    }
    check_indexed_inputs(variant, par)?;
    Ok(par)
}

/// What the forward's `rowout` holds, in order: `scale.<name>`, then `state.<field>`.
pub fn row_output_names(online: &Online) -> Vec<String> {
    online
        .scales
        .iter()
        .map(|s| format!("scale.{s}"))
        .chain(online.state.iter().map(|f| format!("state.{}", f.name)))
        .collect()
}

/// The custom inputs (`in<c>`, read) and, for the backward, their gradients
/// (`g<c>`, added to) as `Params` fields, kernel parameters and the
/// statements copying the second into the first. Parameters and statements
/// are single lines (the backward passes them through a macro).
#[derive(Debug, Default)]
pub struct CustomParams {
    pub fields: String,
    pub args: String,
    pub init: String,
}

pub fn custom_params(customs: usize, with_grads: bool) -> CustomParams {
    let mut p = CustomParams::default();
    for c in 0..customs {
        let _ = writeln!(p.fields, "    const float* __restrict__ in{c};");
        let _ = write!(p.args, "const float* __restrict__ in{c}, ");
        let _ = write!(p.init, "P.in{c} = in{c}; ");
    }
    for c in (0..customs).filter(|_| with_grads) {
        let _ = writeln!(p.fields, "    float* g{c};");
        let _ = write!(p.args, "float* __restrict__ g{c}, ");
        let _ = write!(p.init, "P.g{c} = g{c}; ");
    }
    p
}

/// The recurrent backward's closures, every one taking `float (&gr)[N]` with
/// one `N` (the most custom gradients any of them has, at least 1):
/// `modify_q_bwd`, `modify_k_bwd`, `modify_v_bwd` (`float name(float x,
/// float dy, const Pt&, const Params&, float (&gr)[N])`: the element's
/// gradient), `decay_bwd` (`void decay_bwd(float dy, …, gr)`: `dy` is the
/// gradient of the decay's value) and `normalize_bwd` (`float
/// normalize_bwd(float x, float nrm, float dy, …, float& dn, gr)`: the output
/// gradient before normalisation; `dn` gets the normaliser's). Returns the
/// code and `N`.
pub fn recurrent_backward_closures(variant: &Variant) -> (String, usize) {
    use aec_frontend::ir::ParamRole;
    let bwd = &variant.recurrent().expect("recurrent variant").backward;
    let regions = [
        (&bwd.modify_q, "modify_q_bwd"),
        (&bwd.modify_k, "modify_k_bwd"),
        (&bwd.modify_v, "modify_v_bwd"),
        (&bwd.decay, "decay_bwd"),
        (&bwd.normalize, "normalize_bwd"),
    ];
    let n = regions
        .iter()
        .filter_map(|(r, _)| r.as_ref())
        .map(|r| grad_outputs(variant, r).len())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut out = String::new();
    for (region, name) in regions {
        let Some(region) = region else { continue };
        let grads = grad_outputs(variant, region);
        // The outputs the closure hands back before the gradients.
        let named: Vec<usize> = match name {
            "decay_bwd" => Vec::new(),
            "normalize_bwd" => ["do", "dn"]
                .iter()
                .filter_map(|want| region.outputs.iter().position(|o| o.name == *want))
                .collect(),
            _ => vec![0],
        };
        let only = Region {
            outputs: named
                .iter()
                .chain(grads.iter().map(|g| &g.output))
                .map(|&k| region.outputs[k].clone())
                .collect(),
            ..region.clone()
        };
        let base = closure_leaf(variant, None);
        let leaf = |op: &Op| match op {
            Op::Param(k) => match region.params[*k as usize].role {
                ParamRole::Seed(_) => "dy".into(),
                ParamRole::State(_) => "nrm".into(),
                _ => "x".into(),
            },
            other => base(other),
        };
        let (code, outs) = pointwise(&only, "n", &leaf);
        let mut body = code;
        for (k, e) in outs[named.len()..].iter().enumerate() {
            let _ = writeln!(body, "    gr[{k}] = {e};");
        }
        let tail = "const Pt& pt, const Params& P";
        let _ = match name {
            "decay_bwd" => writeln!(
                out,
                "__device__ __forceinline__ void decay_bwd(float dy, {tail}, float (&gr)[{n}]) {{\n{body}}}\n"
            ),
            "normalize_bwd" => {
                let dn = if named.len() > 1 {
                    outs[1].clone()
                } else {
                    "0.f".into()
                };
                writeln!(
                    out,
                    "__device__ __forceinline__ float normalize_bwd(float x, float nrm, float dy, {tail}, float& dn, float (&gr)[{n}]) {{\n{body}    dn = {dn};\n    return {};\n}}\n",
                    outs[0]
                )
            }
            _ => writeln!(
                out,
                "__device__ __forceinline__ float {name}(float x, float dy, {tail}, float (&gr)[{n}]) {{\n{body}    return {};\n}}\n",
                outs[0]
            ),
        };
    }
    (out, n)
}
