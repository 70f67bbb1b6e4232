//! The forward's regions as device functions, the same for every target:
//! the user's closures, the mask's tile classification, the online block
//! update (`online_fwd`), the epilogue (`epilogue_o`, `epilogue_scales`) and,
//! for split-KV kernels, the derived combine. They call only helpers every
//! prelude defines (`row_lanes_*`, `fast_exp2`, …) and read the template's
//! `NE`, `NSTATE_ARR` and `NSCALES_ARR`.

use super::closures::{axis_size, forward_closures};
use super::expr::{pointwise, row};
use super::intervals::mask_block_fn;
use super::spelling::float_lit;
use crate::CompileError;
use crate::combine::{Merge, combine_plan};
use crate::simplify::{Limits, simplify_region};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op, ParamRole, Region};
use std::fmt::Write;

/// Every forward region of a parallel variant, with the split-KV combine
/// functions when `split_kv`.
pub fn forward_regions(variant: &Variant, split_kv: bool) -> Result<String, CompileError> {
    let par = variant.parallel().expect("parallel variant");
    let online = &par.online;
    let fields: Vec<String> = online.state.iter().map(|f| f.name.clone()).collect();
    let nstate = fields.len();
    let nscales = online.scales.len();

    let size = axis_size;
    let state_index = |region: &Region, p: u32| -> usize {
        match &region.params[p as usize].role {
            ParamRole::State(f) => fields
                .iter()
                .position(|x| x == f)
                .expect("declared state field"),
            other => unreachable!("not a state parameter: {other:?}"),
        }
    };

    let mut regions = forward_closures(variant);
    if let Some(m) = &par.mask {
        regions.push_str(&mask_block_fn(m));
    }

    // The online block update of one row.
    {
        // Simplified: exp becomes exp2 with log2(e) folded into one FMA per
        // score, row constants are hoisted (bench/NOTES.md, forward v5).
        let (fwd, _) = simplify_region(&online.fwd, Limits::default());
        let fwd = &fwd;
        let leaf = |op: &Op| -> String {
            match op {
                Op::Param(p) => match &fwd.params[*p as usize].role {
                    ParamRole::Element => "s".into(),
                    ParamRole::State(_) => format!("st[{}]", state_index(fwd, *p)),
                    ParamRole::Seed(_) => unreachable!("forward regions have no seeds"),
                },
                Op::Shape(a) => size(*a),
                other => {
                    unreachable!("the online block reads only s, the state and sizes: {other:?}")
                }
            }
        };
        let (code, outs) = row(fwd, "n", "valid", &leaf);
        let mut tail = String::new();
        for (o, (expr, is_row)) in fwd.outputs.iter().zip(&outs) {
            if o.name == "p" {
                let at = if *is_row {
                    format!("{expr}[e]")
                } else {
                    expr.clone()
                };
                let _ = writeln!(
                    tail,
                    "    #pragma unroll\n    for (int e = 0; e < NE; ++e) p[e] = valid[e] ? {at} : 0.0f;"
                );
            } else if o.name == "alpha" {
                let _ = writeln!(tail, "    alpha = any ? {expr} : 1.0f;");
            } else if let Some(f) = o.name.strip_prefix("state.") {
                let k = fields.iter().position(|x| x == f).expect("declared field");
                let _ = writeln!(tail, "    nst[{k}] = any ? {expr} : st[{k}];");
            }
        }
        if nstate == 0 {
            tail.push_str("    nst[0] = 0.0f;\n");
        }
        let _ = writeln!(
            regions,
            "__device__ __forceinline__ void online_fwd(const float (&s)[NE], const bool (&valid)[NE], const float (&st)[NSTATE_ARR],\n    float (&p)[NE], float (&nst)[NSTATE_ARR], float& alpha, bool& any, const Params& P) {{\n    any = false;\n    #pragma unroll\n    for (int e = 0; e < NE; ++e) any = any || valid[e];\n    any = row_lanes_any(any);\n{code}{tail}}}\n"
        );
    }

    // The epilogue: the output element and the final row scales.
    {
        let epi = &online.epilogue;
        let leaf = |op: &Op| -> String {
            match op {
                Op::Param(p) => match &epi.params[*p as usize].role {
                    ParamRole::Element => "x".into(),
                    _ => format!("st[{}]", state_index(epi, *p)),
                },
                Op::Shape(a) => size(*a),
                other => unreachable!("the epilogue reads only o, the state and sizes: {other:?}"),
            }
        };
        let only = |pred: &dyn Fn(&str) -> bool| Region {
            outputs: epi
                .outputs
                .iter()
                .filter(|o| pred(&o.name))
                .cloned()
                .collect(),
            ..epi.clone()
        };
        let (code, outs) = pointwise(&only(&|n| n == "o"), "n", &leaf);
        let _ = writeln!(
            regions,
            "__device__ __forceinline__ float epilogue_o(float x, const float (&st)[NSTATE_ARR], const Params& P) {{\n{code}    return {};\n}}\n",
            outs[0]
        );
        let scales = only(&|n| n.starts_with("scale."));
        let (code, outs) = pointwise(&scales, "n", &leaf);
        let mut body = code;
        for (k, e) in outs.iter().enumerate() {
            let _ = writeln!(body, "    sc[{k}] = {e};");
        }
        if nscales == 0 {
            body.push_str("    sc[0] = 0.0f;\n");
        }
        let _ = writeln!(
            regions,
            "__device__ __forceinline__ void epilogue_scales(const float (&st)[NSTATE_ARR], float (&sc)[NSCALES_ARR], const Params& P) {{\n{body}}}\n"
        );
    }

    if split_kv {
        regions.push_str(&combine_fns(online, nstate)?);
    }
    Ok(regions)
}

/// Statements setting `st[r][k]` to each state field's initial value.
pub fn state_init(online: &aec_frontend::variant::Online) -> String {
    let mut s = String::new();
    for (k, f) in online.state.iter().enumerate() {
        let _ = writeln!(s, "        st[r][{k}] = {};", float_lit(f.init));
    }
    if online.state.is_empty() {
        s.push_str("        st[r][0] = 0.0f;\n");
    }
    s
}

/// The split-KV combine as device functions: `combine_merge` folds a
/// partial's state into the merged one (fields that merge by max, min or
/// sum), `combine_rescale` gives the factor of a partial's output and scaled
/// fields, `combine_scaled` marks the fields summed after rescaling.
fn combine_fns(
    online: &aec_frontend::variant::Online,
    nstate: usize,
) -> Result<String, CompileError> {
    let plan = combine_plan(online)?;
    let mut merge = String::new();
    let mut scaled = String::new();
    for (k, m) in plan.merges.iter().enumerate() {
        let _ = match m {
            Merge::Max => writeln!(merge, "    m[{k}] = fmaxf(m[{k}], x[{k}]);"),
            Merge::Min => writeln!(merge, "    m[{k}] = fminf(m[{k}], x[{k}]);"),
            Merge::Sum => writeln!(merge, "    m[{k}] += x[{k}];"),
            Merge::Scaled => writeln!(scaled, "    acc[{k}] += c * x[{k}];"),
        };
    }
    let leaf = |op: &Op| -> String {
        match op {
            Op::Param(p) if (*p as usize) < nstate => format!("st[{p}]"),
            Op::Param(p) => format!("m[{}]", *p as usize - nstate),
            Op::Shape(a) => axis_size(*a),
            other => unreachable!("the rescale reads only states and sizes: {other:?}"),
        }
    };
    let (code, outs) = pointwise(&plan.rescale, "n", &leaf);
    let mut finish = String::new();
    for (k, m) in plan.merges.iter().enumerate() {
        if *m == Merge::Scaled {
            let _ = writeln!(finish, "    m[{k}] = acc[{k}];");
        }
    }
    let c = &outs[0];
    Ok(format!(
        "// Split-KV combine, derived from `fwd` (compiler/src/combine.rs).\n\
         __device__ __forceinline__ void combine_merge(float (&m)[NSTATE_ARR], const float (&x)[NSTATE_ARR]) {{\n{merge}}}\n\n\
         __device__ __forceinline__ float combine_rescale(const float (&st)[NSTATE_ARR], const float (&m)[NSTATE_ARR], const Params& P) {{\n{code}    return {c};\n}}\n\n\
         // Fields merged as rescaled sums: accumulated, then stored.\n\
         __device__ __forceinline__ void combine_scaled_add(float (&acc)[NSTATE_ARR], float c, const float (&x)[NSTATE_ARR]) {{\n{scaled}}}\n\n\
         __device__ __forceinline__ void combine_scaled_finish(float (&m)[NSTATE_ARR], const float (&acc)[NSTATE_ARR]) {{\n{finish}}}\n\n"
    ))
}

/// Whether a mask is false wherever `j > i` (causal, or causal and more): then
/// no key past the block's last query row needs to be visited.
pub fn implies_causal(mask: &Region) -> bool {
    use aec_frontend::ir::{Binary, NodeId};
    fn go(r: &Region, id: NodeId) -> bool {
        let n = r.graph.node(id);
        let is = |k: usize, axis: Axis| r.graph.node(n.args[k]).op == Op::Index(axis);
        match n.op {
            Op::Binary(Binary::Ge) => is(0, Axis::Sq) && is(1, Axis::Skv),
            Op::Binary(Binary::Le) => is(0, Axis::Skv) && is(1, Axis::Sq),
            Op::Binary(Binary::And) => go(r, n.args[0]) || go(r, n.args[1]),
            _ => false,
        }
    }
    mask.output("mask").is_some_and(|m| go(mask, m))
}
