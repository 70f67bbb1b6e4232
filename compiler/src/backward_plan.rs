//! Lowering of the derived normalisation backward to what a kernel computes
//! per score: `P` and `dS` as pointwise functions of the score, `dP`, the
//! saved row state and one per-row number, `dO·O`.
//!
//! The derived `norm_bwd` region is a whole-row program: besides pointwise
//! terms it has row reductions over `dP` terms. A kernel that walks keys block
//! by block cannot evaluate those in the same pass. But a reduction
//! `rowsum(dP · w)` whose weight `w` is the recomputed weight `P` times a row
//! constant `c` needs no pass over the keys at all: with `O = Σⱼ Pⱼ vⱼ` (the
//! epilogue is `o · c(state)`, so this holds for every variant),
//! `Σⱼ dPⱼ Pⱼ = Σⱼ (dO·vⱼ) Pⱼ = dO·O`, hence `rowsum(dP · w) = c · (dO·O)`.
//! The simplifier proves `w / P` constant along the row and gives `c`; the
//! kernel's preprocessing computes `dO·O` per row (FlashAttention's `D`).
//! Reductions that are not of this form are refused with a message that
//! names them.

use crate::CompileError;
use crate::simplify::{Limits, provably_nonneg, row_constant_ratio, simplify_region};
use aec_frontend::Variant;
use aec_frontend::ir::{Binary, DType, Graph, NodeId, Op, Param, ParamRole, Reduce, Region, Unary};

/// The state-field name under which `dO·O` enters the lowered `ds` region.
/// Not a valid identifier, so no user field can have it.
pub const DOT_FIELD: &str = "dO·O";

/// The backward of the online normalisation as the kernels evaluate it.
#[derive(Clone, Debug)]
pub struct BackwardPlan {
    /// Output `p`: the weight of one score given the saved final row state.
    /// Params as the variant's `recompute` region; no row reductions.
    pub recompute: Region,
    /// Output `ds`: the score gradient from `s`, `dp`, the saved state and,
    /// when `uses_dot`, the param with role `State(DOT_FIELD)`. No reductions.
    pub ds: Region,
    pub uses_dot: bool,
    /// State fields the forward provably leaves ≥ 0 (by their `fact.`
    /// equations: softmax's row sum of exponentials), which the simplifier
    /// may use (an exponential's row factor moved into its exponent).
    pub nonneg_state: Vec<String>,
}

/// Lowers the variant's normalisation backward; errors say which row
/// reduction has no kernel form.
pub fn backward_plan(variant: &Variant) -> Result<BackwardPlan, CompileError> {
    let par = variant.parallel().ok_or_else(|| {
        CompileError(format!(
            "`{}` is a recurrent variant; the parallel backward needs a parallel one",
            variant.name
        ))
    })?;
    let limits = Limits::default();
    let (recompute, _) = simplify_region(&par.backward.recompute, limits);
    if has_reduction(&recompute, "p") {
        return Err(CompileError(format!(
            "the recomputed weights of `{}` need a row reduction; the backward kernels recompute weights from the saved state only",
            variant.name
        )));
    }
    let (norm, _) = simplify_region(&par.backward.norm, limits);
    let g = &norm.graph;
    let ds_root = norm.output("ds").expect("norm_bwd has ds");
    let dp_param = norm
        .param_index(&ParamRole::Seed("p".into()))
        .expect("norm_bwd has dp");

    // The recomputed weight, in the norm region's graph (params by role).
    let mut work = g.clone();
    let p_root = recompute.output("p").expect("recompute has p");
    let p_node = work.import(&recompute.graph, &[p_root], |w, _, n| match n.op {
        Op::Param(k) => {
            let role = &recompute.params[k as usize].role;
            let k2 = norm.param_index(role).unwrap_or_else(|| {
                panic!("recompute param {role:?} missing from norm_bwd (derivation invariant)")
            });
            Some(w.leaf(Op::Param(k2), n.dtype, n.axes))
        }
        _ => None,
    })[0];

    let mut out = Graph::new(g.fold(), g.reduce_axis());
    let dot_index = norm.params.len() as u32;
    let mut uses_dot = false;
    let mut failure: Option<String> = None;
    let ds = out.import(g, &[ds_root], |out, id, n| {
        let Op::Reduce(r) = n.op else { return None };
        let why = match r {
            Reduce::Sum => match split_dp_factor(&mut work, n.args[0], dp_param) {
                Some(w) => match row_constant_ratio(&work, w, p_node, out, limits) {
                    Some(c) => {
                        uses_dot = true;
                        let dot = out.leaf(Op::Param(dot_index), DType::F32, n.axes);
                        return Some(out.binary(Binary::Mul, c, dot));
                    }
                    None => "its dP-weight is not the recomputed weight times a row constant",
                },
                None => "it is not dP times a weight that does not depend on dP",
            },
            Reduce::Max | Reduce::AbsSum => "only sums of dP-terms are lowered",
        };
        if failure.is_none() {
            failure = Some(format!(
                "the normalisation backward of `{}` needs the row reduction %{} = {} over the keys, which has no kernel form yet: {why}",
                variant.name,
                id.0,
                describe(g, &norm.params, id)
            ));
        }
        // Any node will do: the result is discarded.
        Some(out.f32(0.0))
    })[0];
    if let Some(msg) = failure {
        return Err(CompileError(msg));
    }
    let mut params = norm.params.clone();
    params.push(Param {
        name: DOT_FIELD.into(),
        role: ParamRole::State(DOT_FIELD.into()),
        dtype: DType::F32,
        axes: norm.iter_axes,
    });
    let mut ds_region = Region {
        name: "ds".into(),
        iter_axes: norm.iter_axes,
        params,
        graph: out,
        outputs: vec![aec_frontend::ir::Output {
            name: "ds".into(),
            node: ds,
        }],
    };
    ds_region.compact();
    let (ds_region, _) = simplify_region(&ds_region, limits);
    debug_assert!(ds_region.validate().is_ok());
    // (From the derived region: simplified, a fact is its own state param.)
    let derived = &par.backward.norm;
    let nonneg_state = derived
        .outputs
        .iter()
        .filter_map(|o| {
            let field = o.name.strip_prefix("fact.")?;
            provably_nonneg(&derived.graph, o.node).then(|| field.to_string())
        })
        .collect();
    Ok(BackwardPlan {
        recompute,
        ds: ds_region,
        uses_dot,
        nonneg_state,
    })
}

fn has_reduction(r: &Region, output: &str) -> bool {
    let root = r.output(output).expect("output");
    let live = r.graph.live(&[root]);
    r.graph
        .ids()
        .any(|id| live[id.index()] && matches!(r.graph.node(id).op, Op::Reduce(_)))
}

/// For `x = dp · w` (through products, negations and divisions by terms free
/// of `dp`), builds `w` in `g`; `None` if `x` is not of that form.
fn split_dp_factor(g: &mut Graph, x: NodeId, dp: u32) -> Option<NodeId> {
    let has_dp = |g: &Graph, id: NodeId| g.depends_on(id, |n| n.op == Op::Param(dp));
    let n = g.node(x).clone();
    match n.op {
        Op::Param(k) if k == dp => Some(g.f32(1.0)),
        Op::Binary(Binary::Mul) => {
            let (a, b) = (n.args[0], n.args[1]);
            match (has_dp(g, a), has_dp(g, b)) {
                (true, false) => {
                    let w = split_dp_factor(g, a, dp)?;
                    Some(g.binary(Binary::Mul, w, b))
                }
                (false, true) => {
                    let w = split_dp_factor(g, b, dp)?;
                    Some(g.binary(Binary::Mul, a, w))
                }
                _ => None,
            }
        }
        Op::Binary(Binary::Div) if !has_dp(g, n.args[1]) => {
            let w = split_dp_factor(g, n.args[0], dp)?;
            Some(g.binary(Binary::Div, w, n.args[1]))
        }
        Op::Unary(Unary::Neg) => {
            let w = split_dp_factor(g, n.args[0], dp)?;
            Some(g.unary(Unary::Neg, w))
        }
        _ => None,
    }
    .filter(|w| !has_dp(g, *w) && !g.depends_on(*w, |n| matches!(n.op, Op::Reduce(_))))
}

/// A short infix rendering of a node for error messages.
fn describe(g: &Graph, params: &[Param], id: NodeId) -> String {
    fn go(g: &Graph, params: &[Param], id: NodeId, depth: usize) -> String {
        let n = g.node(id);
        if depth > 4 {
            return format!("%{}", id.0);
        }
        let a = |k: usize| go(g, params, n.args[k], depth + 1);
        match n.op {
            Op::Const(c) => aec_frontend::ir::region::fmt_f64(c.get()),
            Op::Param(k) => params[k as usize].name.clone(),
            Op::Index(a) => aec_frontend::ir::region::index_name(a).to_string(),
            Op::Shape(a) => format!("{a}"),
            Op::Custom(c) => format!("input{c}"),
            Op::Gather(c) => format!("input{c}[..]"),
            Op::Unary(u) => format!("{}({})", u.name(), a(0)),
            Op::Binary(b) => format!("{}({}, {})", b.name(), a(0), a(1)),
            Op::Select => format!("select({}, {}, {})", a(0), a(1), a(2)),
            Op::Reduce(r) => format!("{}({})", r.name(), a(0)),
        }
    }
    go(g, params, id, 0)
}
