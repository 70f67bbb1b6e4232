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
use crate::neg_inf_mask::masked_as_neg_inf;
use crate::simplify::{Limits, simplify_region, simplify_region_knowing};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, AxisSet, Binary, DType, NodeId, Op, Output, ParamRole, Region};
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
    /// The row programs are split: `weight` and `grad_of_weight` exist.
    pub weight_first: bool,
    /// [`RowPrograms::grad_vanishes`].
    pub grad_vanishes: bool,
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
/// that sums `float x` over the warp or wavefront, in the target's spelling;
/// `weight_first` asks for the split row programs ([`RowPrograms`]) where
/// the variant has them.
pub fn backward_regions(
    variant: &Variant,
    wave_reduce: &str,
    weight_first: bool,
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
    let rows = row_programs(&plan, &fields, weight_first);
    regions.push_str(&rows.code);
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
        nrc: rows.nrc,
        weight_first: rows.weight_first,
        grad_vanishes: rows.grad_vanishes,
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
/// from `s`, `dp` and those constants.
#[derive(Debug, Clone)]
pub struct RowPrograms {
    /// `row_consts`, then `weight_and_grad` and, when `weight_first`, the
    /// two halves it is made of.
    pub code: String,
    /// Row constants per query row.
    pub nrc: usize,
    /// `dS` reads the score only through `P`: `weight(s, rc, P)` gives `p`
    /// and `grad_of_weight(p, dp, rc, P)` gives `ds`, so a kernel can form
    /// `P` before `dP` is known (while its GEMM runs).
    pub weight_first: bool,
    /// With `weight_first`: `grad_of_weight(0, dp, …)` is 0 (for finite
    /// operands), so scores whose weight was zeroed need no second test.
    pub grad_vanishes: bool,
}

/// The row programs of `plan`; with `weight_first`, in the split form where
/// the rules find `dS` as a function of `P`, `dP` and row constants (else
/// joint, and `weight_first` is false in the result).
pub fn row_programs(plan: &BackwardPlan, fields: &[String], weight_first: bool) -> RowPrograms {
    let combined = joint_row_region(plan);
    if weight_first && let Some((split, held)) = split_row_region(plan, &combined) {
        let mut rows = emit_row_programs(&split, fields, Some(held));
        rows.grad_vanishes = vanishes_at_zero(&split, 1, held);
        return rows;
    }
    emit_row_programs(&combined, fields, None)
}

/// The weight and dS of one score as one region (outputs `p`, `ds`) over
/// the ds region's params, simplified together so that they share their
/// common terms (exp(s − m)).
pub fn joint_row_region(plan: &BackwardPlan) -> Region {
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
    simplify_region(&combined, Limits::default()).0
}

/// The split form of [`joint_row_region`]'s `combined`: outputs `p` and `ds`,
/// where `ds` reads the score only through param `held` (the returned
/// index, one past the region's params), which holds `p`'s value; `None`
/// where the rules find no such form.
pub fn split_row_region(plan: &BackwardPlan, combined: &Region) -> Option<(Region, u32)> {
    let held = combined.params.len() as u32;
    let split = through_weight(combined, held)?;
    // Then `p` alone may take its row factor into the exponent (one row
    // constant fewer): `ds` reads `p` as a param, so it keeps one
    // exponential. (Jointly, `ds` would take its own factor into an
    // exponential of its own.)
    let nonneg: Vec<u32> = split
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(&p.role, ParamRole::State(f) if plan.nonneg_state.contains(f)))
        .map(|(k, _)| k as u32)
        .collect();
    let (split, _) = simplify_region_knowing(&split, Limits::default(), &nonneg);
    Some((fuse_row_offsets(&split), held))
}

/// `(a ± r)·c`, with `a` varying along the row, `r` and `c` not and the sum
/// used once, becomes `a·c ± r·c`: per score one fused multiply-add where
/// the sum and the product are two (C++ compilers do not reassociate), and
/// `r·c` one row constant (softmax's `dS = P·(dP·scale − δ·scale)`). Exact
/// in real arithmetic; the simplifier's cost model does not see the fusion.
fn fuse_row_offsets(r: &Region) -> Region {
    let g = &r.graph;
    let ra = g.reduce_axis();
    let roots: Vec<NodeId> = r.outputs.iter().map(|o| o.node).collect();
    let live = g.live(&roots);
    let mut uses = vec![0usize; g.len()];
    for id in g.ids().filter(|id| live[id.index()]) {
        for a in &g.node(id).args {
            uses[a.index()] += 1;
        }
    }
    let along = |id: NodeId| g.node(id).axes.contains(ra);
    // The per-score term and row offset of a single-use sum along the row.
    let offset_sum = |id: NodeId| -> Option<(Binary, NodeId, NodeId, bool)> {
        let n = g.node(id);
        let Op::Binary(b @ (Binary::Add | Binary::Sub)) = n.op else {
            return None;
        };
        if uses[id.index()] != 1 || n.dtype != DType::F32 {
            return None;
        }
        let (x, y) = (n.args[0], n.args[1]);
        match (along(x), along(y)) {
            (true, false) => Some((b, x, y, true)),
            (false, true) => Some((b, y, x, false)),
            _ => None,
        }
    };
    let mut out = aec_frontend::ir::Graph::new(g.fold(), ra);
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    for id in g.ids().filter(|id| live[id.index()]) {
        let n = g.node(id);
        let img = |k: usize| map[n.args[k].index()].expect("operands precede users");
        let fused = match n.op {
            Op::Binary(Binary::Mul) if n.dtype == DType::F32 => {
                [(0, 1), (1, 0)].into_iter().find_map(|(si, ci)| {
                    let (b, a, off, a_first) = offset_sum(n.args[si])?;
                    (!along(n.args[ci])).then_some((b, a, off, a_first, n.args[ci]))
                })
            }
            _ => None,
        };
        let image = match fused {
            Some((b, a, off, a_first, c)) => {
                let (a, off, c) = (
                    map[a.index()].expect("operand"),
                    map[off.index()].expect("operand"),
                    map[c.index()].expect("operand"),
                );
                let (ac, oc) = (
                    out.binary(Binary::Mul, a, c),
                    out.binary(Binary::Mul, off, c),
                );
                if a_first {
                    out.binary(b, ac, oc)
                } else {
                    out.binary(b, oc, ac)
                }
            }
            None => {
                let args: Vec<NodeId> = (0..n.args.len()).map(img).collect();
                out.rebuild(n, &args)
            }
        };
        map[id.index()] = Some(image);
    }
    let mut fused = Region {
        graph: out,
        ..r.clone()
    };
    for (o, root) in fused.outputs.iter_mut().zip(roots) {
        o.node = map[root.index()].expect("root");
    }
    fused
}

/// Whether output `k` of `r` simplifies to 0 with param `held` set to 0.
fn vanishes_at_zero(r: &Region, k: usize, held: u32) -> bool {
    let g = &r.graph;
    let mut out = aec_frontend::ir::Graph::new(g.fold(), g.reduce_axis());
    let root = out.import(g, &[r.outputs[k].node], |o, _, n| {
        (n.op == Op::Param(held)).then(|| o.f32(0.0))
    })[0];
    let at_zero = Region {
        graph: out,
        outputs: vec![Output {
            name: "at_zero".into(),
            node: root,
        }],
        ..r.clone()
    };
    let (at_zero, _) = simplify_region(&at_zero, Limits::default());
    let n = at_zero.graph.node(at_zero.outputs[0].node);
    matches!(n.op, Op::Const(c) if c.get() == 0.0)
}

/// `combined` (outputs `p`, `ds`) with `ds` rewritten to read the score only
/// through `p`, which it reads as param `held`; `None` if the rules find no
/// such form.
fn through_weight(combined: &Region, held: u32) -> Option<Region> {
    let g = &combined.graph;
    let score = combined.param_index(&ParamRole::Element)?;
    let (p_root, ds_root) = (combined.outputs[0].node, combined.outputs[1].node);
    let mut out = aec_frontend::ir::Graph::new(g.fold(), g.reduce_axis());
    let p = out.import(g, &[p_root], |_, _, _| None)[0];
    let held_leaf = out.leaf(Op::Param(held), DType::F32, g.node(p_root).axes);
    let reads_score =
        |g: &aec_frontend::ir::Graph, id: NodeId| g.depends_on(id, |n| n.op == Op::Param(score));
    let ds = crate::simplify::express_through(
        g,
        ds_root,
        p_root,
        reads_score,
        &mut out,
        held_leaf,
        Limits::default(),
    )?;
    let mut split = Region {
        graph: out,
        ..combined.clone()
    };
    split.outputs[0].node = p;
    split.outputs[1].node = ds;
    Some(split)
}

/// The C++ of the row programs of `combined` (outputs `p`, `ds`); with
/// `held`, `ds` reads `p` as that param and the split halves are emitted too.
fn emit_row_programs(combined: &Region, fields: &[String], held: Option<u32>) -> RowPrograms {
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
    let mut text = format!(
        "__device__ __forceinline__ void row_consts(const float (&st)[NSTAT_ARR], float (&rc)[NRC_ARR], const Params& P) {{\n{body}}}\n\n"
    );

    // The per-score programs: the frontier becomes params rc[k] (numbered
    // past every other param).
    let np = combined.params.len() as u32 + 1;
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
            Op::Param(k) if Some(*k) == held => "p".into(),
            Op::Param(k) => match &combined.params[*k as usize].role {
                ParamRole::Element => "s".into(),
                ParamRole::Seed(_) => "dp".into(),
                other => unreachable!("state {other:?} is a row constant"),
            },
            Op::Shape(a) => axis_size(*a),
            other => unreachable!("the weight and dS read only s, dp and row constants: {other:?}"),
        }
    };
    if held.is_some() {
        let half = |k: usize| {
            let mut r = elem.clone();
            r.outputs = vec![elem.outputs[k].clone()];
            pointwise(&r, "n", &leaf)
        };
        let (wcode, w) = half(0);
        let (gcode, d) = half(1);
        let _ = write!(
            text,
            "__device__ __forceinline__ float weight(float s, const float (&rc)[NRC_ARR], const Params& P) {{\n{wcode}    return {};\n}}\n\n\
             __device__ __forceinline__ float grad_of_weight(float p, float dp, const float (&rc)[NRC_ARR], const Params& P) {{\n{gcode}    return {};\n}}\n\n\
             __device__ __forceinline__ void weight_and_grad(float s, float dp, const float (&rc)[NRC_ARR], float& p, float& ds, const Params& P) {{\n    p = weight(s, rc, P);\n    ds = grad_of_weight(p, dp, rc, P);\n}}\n\n",
            w[0], d[0]
        );
    } else {
        let (code, outs) = pointwise(&elem, "n", &leaf);
        let _ = write!(
            text,
            "__device__ __forceinline__ void weight_and_grad(float s, float dp, const float (&rc)[NRC_ARR], float& p, float& ds, const Params& P) {{\n{code}    p = {};\n    ds = {};\n}}\n\n",
            outs[0], outs[1]
        );
    }
    RowPrograms {
        code: text,
        nrc: frontier.len(),
        weight_first: held.is_some(),
        grad_vanishes: false,
    }
}

/// The index in `fields` of `region`'s state parameter `p`.
fn state_index(fields: &[String], region: &Region, p: u32) -> usize {
    match &region.params[p as usize].role {
        ParamRole::State(f) => fields
            .iter()
            .position(|x| x == f)
            .expect("declared state field"),
        other => unreachable!("not a state parameter: {other:?}"),
    }
}

/// Every forward region of a parallel variant, with the split-KV combine
/// functions when `split_kv`, and the online update with its running maxima
/// held (`ROW_MAX_HELD`) where `hold_row_max` asks and that is exact (the
/// template must then leave the held form wherever it writes a state).
pub fn forward_regions(
    variant: &Variant,
    split_kv: bool,
    hold_row_max: bool,
) -> Result<String, CompileError> {
    let par = variant.parallel().expect("parallel variant");
    let online = &par.online;
    let fields: Vec<String> = online.state.iter().map(|f| f.name.clone()).collect();
    let nstate = fields.len();
    let nscales = online.scales.len();

    let size = axis_size;

    let mut regions = forward_closures(variant);
    if let Some(m) = &par.mask {
        regions.push_str(&mask_block_fn(m));
    }

    // The online block update of one row.
    // Simplified: exp becomes exp2 with log2(e) folded into one FMA per
    // score, row constants are hoisted (bench/NOTES.md, forward v5).
    let (fwd, _) = simplify_region(&online.fwd, Limits::default());
    let neg_inf = masked_as_neg_inf(online, &fwd);
    regions.push_str(&online_fns(&fwd, &fields, false, neg_inf, ""));
    let _ = writeln!(regions, "#define MASKED_AS_NEG_INF {}\n", u8::from(neg_inf));
    // The same with its running maxima held (crate::held_max), where the
    // caller asks (its template leaves the held form wherever it writes a
    // state: the row outputs, split-KV's partial rows) and that is exact.
    let held = if !hold_row_max {
        None
    } else {
        crate::held_max::held_online_fwd(online, &fwd)
            .filter(|h| masked_as_neg_inf(online, &h.fwd) == neg_inf)
    };
    // Where the maximum is held, most blocks leave alpha at 1 and the
    // templates may skip O's rescale when a whole warp's rows do.
    let _ = writeln!(regions, "#define ROW_MAX_HELD {}", u8::from(held.is_some()));
    if let Some(h) = &held {
        let _ = writeln!(regions, "#define NHELD {}\n", h.fields.len());
        regions.push_str(&online_fns(&h.fwd, &fields, true, neg_inf, "_held"));
        regions.push_str(&combine_fns(online, nstate)?);
        regions.push_str(&held_state_fns(online, &h.fields));
    }

    // The epilogue: the output element and the final row scales.
    {
        let epi = &online.epilogue;
        let leaf = |op: &Op| -> String {
            match op {
                Op::Param(p) => match &epi.params[*p as usize].role {
                    ParamRole::Element => "x".into(),
                    _ => format!("st[{}]", state_index(&fields, epi, *p)),
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

    // (The held update brought the combine already.)
    if split_kv && held.is_none() {
        regions.push_str(&combine_fns(online, nstate)?);
    }
    Ok(regions)
}

/// `online_fwd{suffix}` (and `online_fwd_neg_inf{suffix}` where `neg_inf`)
/// from the online update `fwd`. With `held` (`fwd` is a held update,
/// `crate::held_max::Held`) each also takes `mx`, the row's true maxima of
/// the held fields in the order of `fwd`'s `block_max` outputs, and keeps it.
fn online_fns(fwd: &Region, fields: &[String], held: bool, neg_inf: bool, suffix: &str) -> String {
    let leaf = |op: &Op| -> String {
        match op {
            Op::Param(p) => match &fwd.params[*p as usize].role {
                ParamRole::Element => "s".into(),
                ParamRole::State(_) => format!("st[{}]", state_index(fields, fwd, *p)),
                ParamRole::Seed(_) => unreachable!("forward regions have no seeds"),
            },
            Op::Shape(a) => axis_size(*a),
            other => {
                unreachable!("the online block reads only s, the state and sizes: {other:?}")
            }
        }
    };
    // `p_valid`: what p is where a key's p is not the update's own.
    let update_body = |valid: Option<&str>, p_valid: &str| {
        let (code, outs) = row(fwd, "n", valid, &leaf);
        let mut tail = String::new();
        let mut held_k = 0;
        for (o, (expr, is_row)) in fwd.outputs.iter().zip(&outs) {
            if o.name == "p" {
                let at = if *is_row {
                    format!("{expr}[e]")
                } else {
                    expr.clone()
                };
                let _ = writeln!(
                    tail,
                    "    #pragma unroll\n    for (int e = 0; e < NE; ++e) p[e] = {p_valid} ? {at} : 0.0f;"
                );
            } else if o.name == "alpha" {
                let _ = writeln!(tail, "    alpha = any ? {expr} : 1.0f;");
            } else if let Some(f) = o.name.strip_prefix("state.") {
                let k = fields.iter().position(|x| x == f).expect("declared field");
                let _ = writeln!(tail, "    nst[{k}] = any ? {expr} : st[{k}];");
            } else if o.name.starts_with(crate::held_max::BLOCK_MAX) {
                let _ = writeln!(
                    tail,
                    "    mx[{held_k}] = any ? fmaxf(mx[{held_k}], {expr}) : mx[{held_k}];"
                );
                held_k += 1;
            }
        }
        if fields.is_empty() {
            tail.push_str("    nst[0] = 0.0f;\n");
        }
        code + &tail
    };
    let mx = if held { " float (&mx)[NHELD]," } else { "" };
    let mut text = format!(
        "__device__ __forceinline__ void online_fwd{suffix}(const float (&s)[NE], const bool (&valid)[NE], const float (&st)[NSTATE_ARR],\n    float (&p)[NE], float (&nst)[NSTATE_ARR], float& alpha, bool& any,{mx} const Params& P) {{\n    any = false;\n    #pragma unroll\n    for (int e = 0; e < NE; ++e) any = any || valid[e];\n    any = row_lanes_any(any);\n{}}}\n\n",
        update_body(Some("valid"), "valid[e]")
    );
    // Partially masked blocks with masked scores at −∞ and no flags, where
    // that is exact (crate::neg_inf_mask); `any` comes in as this thread's
    // own (whether any of its keys is valid).
    if neg_inf {
        let _ = writeln!(
            text,
            "__device__ __forceinline__ void online_fwd_neg_inf{suffix}(const float (&s)[NE], const float (&st)[NSTATE_ARR],\n    float (&p)[NE], float (&nst)[NSTATE_ARR], float& alpha, bool& any,{mx} const Params& P) {{\n    any = row_lanes_any(any);\n{}}}\n",
            update_body(None, "any")
        );
    }
    text
}

/// With held maxima: `held_init` (the true maxima's initial values) and
/// `held_final_state`, a row's final state in the variant's own terms — each
/// held field at its true maximum, the rescaled fields moved onto it by the
/// combine's rescale, as the merge of one partial (`combine_fns`, which must
/// come first). Only for rows that saw a key.
fn held_state_fns(online: &aec_frontend::variant::Online, held: &[usize]) -> String {
    let mut init = String::new();
    let mut take = String::new();
    for (i, &k) in held.iter().enumerate() {
        let _ = writeln!(init, "    mx[{i}] = {};", float_lit(online.state[k].init));
        let _ = writeln!(take, "    out[{k}] = mx[{i}];");
    }
    format!(
        "__device__ __forceinline__ void held_init(float (&mx)[NHELD]) {{\n{init}}}\n\n\
         __device__ __forceinline__ void held_final_state(const float (&st)[NSTATE_ARR], const float (&mx)[NHELD], float (&out)[NSTATE_ARR], const Params& P) {{\n\
         \x20   #pragma unroll\n    for (int f = 0; f < NSTATE_ARR; ++f) out[f] = st[f];\n{take}\
         \x20   const float c = combine_rescale(st, out, P);\n\
         \x20   float acc[NSTATE_ARR];\n    #pragma unroll\n    for (int f = 0; f < NSTATE_ARR; ++f) acc[f] = 0.0f;\n\
         \x20   combine_scaled_add(acc, c, st);\n    combine_scaled_finish(out, acc);\n}}\n\n"
    )
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
