//! The combine of partial online row states: what split-KV decoding needs to
//! merge the rows that blocks computed over disjoint key ranges.
//!
//! The DSL has no `combine` closure; it is derived from `fwd`. Each state
//! field's update must have one of the forms
//! - `max(st.f, x)` / `min(st.f, x)` with `x` free of the state: partials
//!   merge by max / min;
//! - `st.f + x` with `x` free of the state: partials add;
//! - `st.f · alpha + x` (the output's own rescale): partials add after each
//!   is rescaled like its accumulated output;
//!
//! and `alpha` must depend on the scores only through the new state, so that
//! it is a function `c(old state, new state)`: partial `X`'s output and scaled
//! fields then enter the merge multiplied by `c(state_X, merged)`. Softmax's
//! `alpha = exp(m − m')` is of that form, as is every variant whose `alpha`
//! is 1. The derived rule is then checked numerically: random rows split at
//! random points must merge to what one pass over all keys gives.

use crate::CompileError;
use aec_frontend::ir::{Axis, AxisSet, Binary, DType, Graph, NodeId, Op, Param, ParamRole, Region};
use aec_frontend::reference::eval::eval_region;
use aec_frontend::variant::Online;

/// How one state field merges across partials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    Max,
    Min,
    Sum,
    /// Rescaled by `c(state_X, merged)` and summed, like the output.
    Scaled,
}

/// The derived combine of a variant's online state.
#[derive(Clone, Debug)]
pub struct Combine {
    /// Per state field, in declaration order.
    pub merges: Vec<Merge>,
    /// Output `c`: the factor a partial's output (and scaled fields) is
    /// multiplied by. Params: the partial's state (`State(f)`, one per field,
    /// in order), then the merged state (`State("merged.f")`). Reads no
    /// merged field whose merge is [`Merge::Scaled`].
    pub rescale: Region,
}

/// The prefix of the merged-state parameter names in [`Combine::rescale`].
pub const MERGED: &str = "merged.";

/// Derives and checks the combine of `online`; the error says which field
/// or which part of `alpha` has no merge rule.
pub fn combine_plan(online: &Online) -> Result<Combine, CompileError> {
    let fwd = &online.fwd;
    let refuse =
        |why: String| CompileError(format!("no split-KV combine for this online state: {why}"));
    let g = &fwd.graph;
    let fields: Vec<&str> = online.state.iter().map(|f| f.name.as_str()).collect();
    let state_param = |id: NodeId| -> Option<usize> {
        match g.node(id).op {
            Op::Param(k) => match &fwd.params[k as usize].role {
                ParamRole::State(f) => fields.iter().position(|x| x == f),
                _ => None,
            },
            _ => None,
        }
    };
    let reads_state = |id: NodeId| {
        g.depends_on(id, |n| {
            matches!(n.op, Op::Param(k) if matches!(fwd.params[k as usize].role, ParamRole::State(_)))
        })
    };
    let alpha = fwd
        .output("alpha")
        .ok_or_else(|| refuse("`fwd` has no alpha output".into()))?;
    let state_out: Vec<NodeId> = fields
        .iter()
        .map(|f| {
            fwd.output(&format!("state.{f}"))
                .ok_or_else(|| refuse(format!("`fwd` does not update field `{f}`")))
        })
        .collect::<Result<_, _>>()?;

    let mut merges = Vec::new();
    for (k, &out) in state_out.iter().enumerate() {
        let n = g.node(out);
        // The operand that is this field's incoming value, and the other one.
        let split = |n: &aec_frontend::ir::Node| -> Option<NodeId> {
            let (a, b) = (n.args[0], n.args[1]);
            if state_param(a) == Some(k) {
                Some(b)
            } else if state_param(b) == Some(k) {
                Some(a)
            } else {
                None
            }
        };
        let merge = match n.op {
            Op::Binary(op @ (Binary::Max | Binary::Min | Binary::Add)) => {
                match split(n) {
                    Some(x) if !reads_state(x) => match op {
                        Binary::Max => Some(Merge::Max),
                        Binary::Min => Some(Merge::Min),
                        _ => Some(Merge::Sum),
                    },
                    _ if op == Binary::Add => {
                        // st.f · alpha + x, either operand order.
                        n.args.iter().find_map(|&t| {
                            let tn = g.node(t);
                            (tn.op == Op::Binary(Binary::Mul) && split(tn) == Some(alpha))
                                .then_some(Merge::Scaled)
                        })
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        merges.push(merge.ok_or_else(|| {
            refuse(format!(
                "field `{}` is updated neither as max/min/sum with a term free of the state nor as `st.{} * alpha + x`",
                fields[k], fields[k]
            ))
        })?);
    }

    let rescale = rescale_region(fwd, &fields, &state_out, alpha, &merges).map_err(refuse)?;
    let plan = Combine { merges, rescale };
    check_numerically(online, &plan).map_err(refuse)?;
    Ok(plan)
}

/// `alpha` rewritten as a function of the incoming and the new state.
fn rescale_region(
    fwd: &Region,
    fields: &[&str],
    state_out: &[NodeId],
    alpha: NodeId,
    merges: &[Merge],
) -> Result<Region, String> {
    let n = fields.len();
    let mut params: Vec<Param> = Vec::with_capacity(2 * n);
    for prefix in ["", MERGED] {
        for f in fields {
            params.push(Param {
                name: format!("{prefix}{f}"),
                role: ParamRole::State(format!("{prefix}{f}")),
                dtype: DType::F32,
                axes: AxisSet::EMPTY,
            });
        }
    }
    let mut graph = Graph::new(fwd.graph.fold(), fwd.graph.reduce_axis());
    // The scores' image: a marker the result must not depend on.
    let scores_marker = Op::Index(Axis::Skv);
    let roots = graph.import(&fwd.graph, &[alpha], |dst, id, node| {
        if let Some(k) = state_out.iter().position(|&o| o == id) {
            return Some(dst.leaf(Op::Param((n + k) as u32), DType::F32, AxisSet::EMPTY));
        }
        match node.op {
            Op::Param(p) => Some(match &fwd.params[p as usize].role {
                ParamRole::State(f) => {
                    let k = fields.iter().position(|x| x == f).expect("declared field");
                    dst.leaf(Op::Param(k as u32), DType::F32, AxisSet::EMPTY)
                }
                _ => dst.leaf(scores_marker, DType::Int, AxisSet::of(&[Axis::Skv])),
            }),
            _ => None,
        }
    });
    let c = roots[0];
    if graph.depends_on(c, |x| {
        matches!(
            x.op,
            Op::Index(_) | Op::Custom(_) | Op::Gather(_) | Op::Reduce(_)
        )
    }) {
        return Err(
            "alpha depends on the scores (or on inputs) other than through the new state".into(),
        );
    }
    if let Some(k) = (0..n).find(|&k| {
        merges[k] == Merge::Scaled && graph.depends_on(c, |x| x.op == Op::Param((n + k) as u32))
    }) {
        return Err(format!(
            "alpha reads the new `{}`, which is itself rescaled by alpha",
            fields[k]
        ));
    }
    let mut region = Region {
        name: "combine_rescale".into(),
        iter_axes: AxisSet::EMPTY,
        params,
        graph,
        outputs: vec![aec_frontend::ir::Output {
            name: "c".into(),
            node: c,
        }],
    };
    region.compact();
    Ok(region)
}

/// The state and unnormalised output (two columns) of one row after `blocks`
/// of scores, from the initial state.
fn run_blocks(online: &Online, blocks: &[Vec<f64>], values: &[[f64; 2]]) -> (Vec<f64>, [f64; 2]) {
    let row = run_row(online, &online.fwd, blocks, values);
    (row.state, row.acc)
}

/// One row's pass over blocks of scores with an online block update (the
/// variant's own or a rewrite of it), in f64.
pub(crate) struct RowRun {
    /// The final state, per field.
    pub state: Vec<f64>,
    /// The unnormalised output, two value columns.
    pub acc: [f64; 2],
    /// Each block's weights, one per key.
    pub weights: Vec<Vec<f64>>,
}

/// Runs `fwd` (with `online`'s state fields and outputs) over `blocks` from
/// the initial state; `values` holds one pair of value columns per key.
pub(crate) fn run_row(
    online: &Online,
    fwd: &Region,
    blocks: &[Vec<f64>],
    values: &[[f64; 2]],
) -> RowRun {
    let fields: Vec<&str> = online.state.iter().map(|f| f.name.as_str()).collect();
    let out = |name: &str| fwd.outputs.iter().position(|o| o.name == name);
    let (p_out, a_out) = (out("p").expect("p output"), out("alpha").expect("alpha"));
    let st_out: Vec<usize> = fields
        .iter()
        .map(|f| out(&format!("state.{f}")).expect("state output"))
        .collect();
    let mut st: Vec<f64> = online.state.iter().map(|f| f.init).collect();
    let mut acc = [0.0; 2];
    let mut weights = Vec::with_capacity(blocks.len());
    let mut j = 0;
    for s in blocks {
        let outs = eval_region(fwd, &mut |op| match op {
            Op::Param(k) => match &fwd.params[*k as usize].role {
                ParamRole::State(f) => vec![st[fields.iter().position(|x| x == f).expect("field")]],
                _ => s.clone(),
            },
            // Sizes (a closure may read Skv): any fixed value.
            _ => vec![64.0],
        });
        let alpha = outs[a_out][0];
        let p = &outs[p_out];
        let p: Vec<f64> = (0..s.len())
            .map(|e| p[if p.len() == 1 { 0 } else { e }])
            .collect();
        for (d, a) in acc.iter_mut().enumerate() {
            let add: f64 = p.iter().zip(&values[j..]).map(|(p, v)| p * v[d]).sum();
            *a = alpha * *a + add;
        }
        j += s.len();
        st = st_out.iter().map(|&k| outs[k][0]).collect();
        weights.push(p);
    }
    RowRun {
        state: st,
        acc,
        weights,
    }
}

/// Merges partials `(state, output)` with the plan, in f64.
pub fn merge(plan: &Combine, parts: &[(Vec<f64>, [f64; 2])]) -> (Vec<f64>, [f64; 2]) {
    let n = plan.merges.len();
    let mut m = parts[0].0.clone();
    for (st, _) in &parts[1..] {
        for k in 0..n {
            m[k] = match plan.merges[k] {
                Merge::Max => m[k].max(st[k]),
                Merge::Min => m[k].min(st[k]),
                Merge::Sum => m[k] + st[k],
                Merge::Scaled => m[k],
            };
        }
    }
    let c: Vec<f64> = parts
        .iter()
        .map(|(st, _)| {
            eval_region(&plan.rescale, &mut |op| match op {
                Op::Param(k) if (*k as usize) < n => vec![st[*k as usize]],
                Op::Param(k) => vec![m[*k as usize - n]],
                _ => vec![64.0],
            })[0][0]
        })
        .collect();
    for k in 0..n {
        if plan.merges[k] == Merge::Scaled {
            m[k] = parts.iter().zip(&c).map(|((st, _), c)| c * st[k]).sum();
        }
    }
    let mut o = [0.0; 2];
    for ((_, acc), c) in parts.iter().zip(&c) {
        o[0] += c * acc[0];
        o[1] += c * acc[1];
    }
    (m, o)
}

/// Random rows cut into two or three partials must merge to the one-pass result.
fn check_numerically(online: &Online, plan: &Combine) -> Result<(), String> {
    let mut next = crate::check_rng::uniform(0x9e37_79b9_7f4a_7c15);
    for trial in 0..24 {
        let len = 3 + (next() * 14.0) as usize;
        let scores: Vec<f64> = (0..len).map(|_| (next() - 0.5) * 8.0).collect();
        let values: Vec<[f64; 2]> = (0..len).map(|_| [next() - 0.5, next() - 0.5]).collect();
        let blocks = |from: usize, to: usize| -> Vec<Vec<f64>> {
            scores[from..to]
                .chunks(2 + trial % 3)
                .map(<[f64]>::to_vec)
                .collect()
        };
        let whole = run_blocks(online, &blocks(0, len), &values);
        let cut1 = 1 + (next() * (len - 2) as f64) as usize;
        let cut2 = cut1 + ((len - cut1) as f64 * next()) as usize;
        let mut parts = vec![run_blocks(online, &blocks(0, cut1), &values)];
        for (a, b) in [(cut1, cut2), (cut2, len)] {
            if a < b {
                parts.push(run_blocks(online, &blocks(a, b), &values[a..]));
            }
        }
        let merged = merge(plan, &parts);
        // (Infinities only match themselves, through `a == b`: the relative
        // bound would let one pass for any finite value.)
        let close = |a: f64, b: f64| {
            a.is_finite() && b.is_finite() && (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
        };
        let ok = merged
            .0
            .iter()
            .zip(&whole.0)
            .all(|(a, b)| close(*a, *b) || a == b)
            && merged
                .1
                .iter()
                .zip(&whole.1)
                .all(|(a, b)| close(*a, *b) || a == b);
        if !ok {
            return Err(format!(
                "the derived merge does not reproduce one pass over the keys (state {:?} vs {:?}, output {:?} vs {:?})",
                merged.0, whole.0, merged.1, whole.1
            ));
        }
    }
    Ok(())
}
