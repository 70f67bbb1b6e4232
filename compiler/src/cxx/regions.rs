//! The kernels' regions as device functions, the same for every target.
//!
//! Forward:
//! the user's closures, the mask's tile classification, the online block
//! update (`online_fwd`), the epilogue (`epilogue_o_factor`, `epilogue_scales`) and,
//! for split-KV kernels, the derived combine. They call only helpers every
//! prelude defines (`row_lanes_*`, `fast_exp2`, …) and read the template's
//! `NE`, `NSTATE_ARR` and `NSCALES_ARR`.

use super::closures::{axis_size, backward_closure, forward_closures, grad_atomics, grad_outputs};
use super::expr::{pointwise, row};
use super::intervals::mask_block_fn;
use super::spelling::float_lit;
use crate::CompileError;
use crate::backward_plan::{BackwardPlan, DOT_FIELD, backward_plan};
use crate::combine::{Merge, combine_plan};
use crate::simplify::{Limits, simplify_region};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, AxisSet, DType, NodeId, Op, Output, ParamRole, Region};
use std::fmt::Write;

/// Everything the backward templates fill in from the variant, the same for
/// every target: the regions (closures, mask classification, row constants,
/// `weight_and_grad`, the closures' backward) and the custom-input gradient
/// statements of the score, k, v and q closures.
#[derive(Debug, Clone)]
pub struct BackwardRegions {
    pub regions: String,
    /// State fields saved by the forward.
    pub nstate: usize,
    /// Per query row: the state, then dO·O where the backward reads it.
    pub nstat: usize,
    /// Row constants of `weight_and_grad`.
    pub nrc: usize,
    pub uses_dot: bool,
    /// Score-closure gradients: declarations before the per-score loop,
    /// accumulation per score (`gr`, `ok`, `key_owner` in scope) and the flush
    /// after it (`lane`, `b`, `h`, `hk` in scope).
    pub grad_decl: String,
    pub grad_accum: String,
    pub grad_flush: String,
    /// Gradient statements after `modify_k_bwd`, `modify_v_bwd`, `modify_q_bwd`.
    pub grad_k: String,
    pub grad_v: String,
    pub grad_q: String,
}

/// The backward's regions. `wave_reduce` is the statement (or statements)
/// that sums `float x` over the warp or wavefront, in the target's spelling.
pub fn backward_regions(
    variant: &Variant,
    wave_reduce: &str,
) -> Result<BackwardRegions, CompileError> {
    let par = variant.parallel().expect("parallel variant");
    let plan = backward_plan(variant)?;
    let online = &par.online;
    let fields: Vec<String> = online.state.iter().map(|f| f.name.clone()).collect();
    let nstate = fields.len();
    let nstat = nstate + usize::from(plan.uses_dot);
    let bwd = &par.backward;

    let mut regions = forward_closures(variant);
    if let Some(m) = &par.mask {
        regions.push_str(&mask_block_fn(m));
    }
    let (row_consts, weight_and_grad, nrc) = row_programs(&plan, &fields);
    regions.push_str(&row_consts);
    regions.push_str(&weight_and_grad);
    for (region, name, define) in [
        (&bwd.modify_q, "modify_q_bwd", "NGRAD_Q_ARR"),
        (&bwd.modify_k, "modify_k_bwd", "NGRAD_K_ARR"),
        (&bwd.modify_v, "modify_v_bwd", "NGRAD_V_ARR"),
        (&bwd.modify_scores, "modify_scores_bwd", "NGRAD_S_ARR"),
    ] {
        let Some(r) = region else { continue };
        let n = grad_outputs(variant, r).len();
        let _ = writeln!(regions, "#define {define} {}", n.max(1));
        regions.push_str(&backward_closure(variant, r, name));
        regions.push('\n');
    }

    // Score-closure gradients of custom inputs: inputs constant over a
    // (batch, head) step are summed in registers and added once per step and
    // warp; others are added per score.
    let (mut grad_decl, mut grad_accum, mut grad_flush) =
        (String::new(), String::new(), String::new());
    if let Some(r) = &bwd.modify_scores {
        let per_head = AxisSet::of(&[Axis::B, Axis::H, Axis::Hkv]);
        for (k, g) in grad_outputs(variant, r).iter().enumerate() {
            let axes = &variant.customs[g.custom as usize].axes;
            let target = &g.target;
            // An indexed read's element follows its indices: added per score.
            if !g.gathered && axes.iter().all(|a| per_head.contains(*a)) {
                let _ = writeln!(grad_decl, "        float gs{k} = 0.0f;");
                let _ = writeln!(grad_accum, "                gs{k} += ok ? gr[{k}] : 0.0f;");
                let _ = writeln!(
                    grad_flush,
                    "        {{\n            float x = gs{k};\n{wave_reduce}            const Pt pt = {{b, h, hk, 0, 0, 0}};\n            if (lane == 0 && key_owner) atomicAdd(&{target}, x);\n        }}"
                );
            } else {
                let _ = writeln!(
                    grad_accum,
                    "                if (ok && key_owner) atomicAdd(&{target}, gr[{k}]);"
                );
            }
        }
    }
    let grads = |r: &Option<Region>, indent: &str| {
        r.as_ref()
            .map(|r| grad_atomics(variant, r, "true", indent))
            .unwrap_or_default()
    };
    Ok(BackwardRegions {
        regions,
        nstate,
        nstat,
        nrc,
        uses_dot: plan.uses_dot,
        grad_decl,
        grad_accum,
        grad_flush,
        grad_k: grads(&bwd.modify_k, "                "),
        grad_v: grads(&bwd.modify_v, "                "),
        grad_q: grads(&bwd.modify_q, "        "),
    })
}

/// The weight/dS formulas split at the row: `row_consts` computes, once per
/// query row, every row-constant value the per-score part reads (from the
/// saved state and dO·O); `weight_and_grad` computes `p` and `ds` of one score
/// from `s`, `dp` and those constants. Returns both functions and the number
/// of row constants.
pub fn row_programs(plan: &BackwardPlan, fields: &[String]) -> (String, String, usize) {
    // One graph with both outputs, over the ds region's params.
    let mut combined = plan.ds.clone();
    let p_root = plan.recompute.output("p").expect("recompute has p");
    let ds_params = plan.ds.params.clone();
    let p = combined
        .graph
        .import(&plan.recompute.graph, &[p_root], |g, _, n| match n.op {
            Op::Param(k) => {
                let role = &plan.recompute.params[k as usize].role;
                let k2 = ds_params
                    .iter()
                    .position(|p| &p.role == role)
                    .expect("recompute params are ds params");
                Some(g.leaf(Op::Param(k2 as u32), n.dtype, n.axes))
            }
            _ => None,
        })[0];
    combined.outputs = vec![
        Output {
            name: "p".into(),
            node: p,
        },
        combined.outputs[0].clone(),
    ];
    // Simplified together, `p` and `ds` share their common terms (exp(s − m)).
    let (combined, _) = simplify_region(&combined, Limits::default());
    let g = &combined.graph;
    let ra = g.reduce_axis();
    let roots: Vec<NodeId> = combined.outputs.iter().map(|o| o.node).collect();
    let live = g.live(&roots);
    let along_row = |id: NodeId| g.node(id).axes.contains(ra);
    // Row constants read by per-score nodes (constants are free to repeat).
    let mut frontier: Vec<NodeId> = Vec::new();
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let n = g.node(id);
        if !along_row(id) {
            continue;
        }
        for a in &n.args {
            if !along_row(*a) && !matches!(g.node(*a).op, Op::Const(_)) && !frontier.contains(a) {
                frontier.push(*a);
            }
        }
    }
    for r in &roots {
        if !along_row(*r) && !frontier.contains(r) {
            frontier.push(*r);
        }
    }
    frontier.sort();

    let stat_index = |role: &ParamRole| -> usize {
        match role {
            ParamRole::State(f) if f == DOT_FIELD => fields.len(),
            ParamRole::State(f) => fields.iter().position(|x| x == f).expect("state field"),
            other => unreachable!("row constants read only the state and dO·O, not {other:?}"),
        }
    };

    // row_consts: the frontier nodes from the stats.
    let consts_region = Region {
        outputs: frontier
            .iter()
            .enumerate()
            .map(|(k, id)| Output {
                name: format!("rc{k}"),
                node: *id,
            })
            .collect(),
        ..combined.clone()
    };
    let leaf = |op: &Op| -> String {
        match op {
            Op::Param(k) => format!("st[{}]", stat_index(&combined.params[*k as usize].role)),
            Op::Shape(a) => axis_size(*a),
            other => unreachable!("row constants read only the state and sizes: {other:?}"),
        }
    };
    let (code, outs) = pointwise(&consts_region, "n", &leaf);
    let mut body = code;
    for (k, e) in outs.iter().enumerate() {
        let _ = writeln!(body, "    rc[{k}] = {e};");
    }
    let row_consts = format!(
        "__device__ __forceinline__ void row_consts(const float (&st)[NSTAT_ARR], float (&rc)[NRC_ARR], const Params& P) {{\n{body}}}\n\n"
    );

    // weight_and_grad: the frontier becomes params rc[k].
    let np = combined.params.len() as u32;
    let mut elem = combined.clone();
    let mut fresh = aec_frontend::ir::Graph::new(g.fold(), ra);
    let images = fresh.import(g, &roots, |fg, id, _| {
        frontier
            .iter()
            .position(|f| *f == id)
            .map(|k| fg.leaf(Op::Param(np + k as u32), DType::F32, AxisSet::EMPTY))
    });
    elem.graph = fresh;
    for (o, img) in elem.outputs.iter_mut().zip(images) {
        o.node = img;
    }
    let leaf = |op: &Op| -> String {
        match op {
            Op::Param(k) if *k >= np => format!("rc[{}]", k - np),
            Op::Param(k) => match &combined.params[*k as usize].role {
                ParamRole::Element => "s".into(),
                ParamRole::Seed(_) => "dp".into(),
                other => unreachable!("state {other:?} is a row constant"),
            },
            Op::Shape(a) => axis_size(*a),
            other => unreachable!("the weight and dS read only s, dp and row constants: {other:?}"),
        }
    };
    let (code, outs) = pointwise(&elem, "n", &leaf);
    let weight_and_grad = format!(
        "__device__ __forceinline__ void weight_and_grad(float s, float dp, const float (&rc)[NRC_ARR], float& p, float& ds, const Params& P) {{\n{code}    p = {};\n    ds = {};\n}}\n\n",
        outs[0], outs[1]
    );
    (row_consts, weight_and_grad, frontier.len())
}

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
        // The output is linear in o (`o · c(state)`, checked by the
        // frontend), so the templates compute c once per row — the epilogue
        // at o = 1 — and scale each element by it: one multiply per element
        // instead of, for softmax, a division.
        let factor_leaf = |op: &Op| -> String {
            match op {
                Op::Param(p) if matches!(epi.params[*p as usize].role, ParamRole::Element) => {
                    "1.0f".into()
                }
                other => leaf(other),
            }
        };
        let (code, outs) = pointwise(&only(&|n| n == "o"), "n", &factor_leaf);
        let _ = writeln!(
            regions,
            "__device__ __forceinline__ float epilogue_o_factor(const float (&st)[NSTATE_ARR], const Params& P) {{\n{code}    return {};\n}}\n",
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
    mask.output("mask")
        .is_some_and(|m| causal_term(mask, m, true))
}

/// Whether the mask is exactly `i >= j` (or `j <= i`), with nothing else.
pub fn is_causal(mask: &Region) -> bool {
    mask.output("mask")
        .is_some_and(|m| causal_term(mask, m, false))
}

/// Whether node `id` is `i >= j` (or `j <= i`), or with `in_and` a
/// conjunction with such a term.
fn causal_term(r: &Region, id: aec_frontend::ir::NodeId, in_and: bool) -> bool {
    use aec_frontend::ir::Binary;
    let n = r.graph.node(id);
    let is = |k: usize, axis: Axis| r.graph.node(n.args[k]).op == Op::Index(axis);
    match n.op {
        Op::Binary(Binary::Ge) => is(0, Axis::Sq) && is(1, Axis::Skv),
        Op::Binary(Binary::Le) => is(0, Axis::Skv) && is(1, Axis::Sq),
        Op::Binary(Binary::And) if in_and => {
            causal_term(r, n.args[0], true) || causal_term(r, n.args[1], true)
        }
        _ => false,
    }
}
