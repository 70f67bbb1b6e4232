//! Derived backward regions: no variant writes a backward by hand.
//!
//! Modification closures are differentiated pointwise. The online row
//! normalisation is differentiated as a whole-row program: running `fwd` once
//! over the full row from the prologue's state gives the final state
//! `r = R(s)` and the weights; the epilogue's output is `o · c(r)`, so the
//! recomputed weights are `P = g(s, r) = p(s, r) · c(r)`. Reverse-mode over
//! that program gives `dS` from `dP`, in which every forward row quantity that
//! is a final-state field is replaced by the saved field — the backward then
//! needs only `s` (recomputed), `dP` and the saved state, plus row reductions
//! of `dP`-terms (for softmax, `Σ_k dP_ik P_ik = rowsum(dO∘O)`).

use crate::autodiff::{Eval, grad};
use crate::ir::{Axis, AxisSet, DType, Fold, Graph, NodeId, Op, Output, Param, ParamRole, Region};
use crate::variant::{Decay, Online, ParallelBackward, RecurrentBackward};

/// The backward of an elementwise closure: params as the forward plus the seed
/// `d<out>`; outputs `d<param>` for its element/row params and `grad.<input>`
/// for every custom input it reads (the contribution at one point: summing
/// over the input's broadcast axes is the evaluator's job).
pub fn closure_backward(fwd: &Region, out: &str, customs: &[String]) -> Region {
    let mut g = Graph::new(Fold::Exact, fwd.graph.reduce_axis());
    let y = g.import(
        &fwd.graph,
        &[fwd.output(out).expect("closure output")],
        |_, _, _| None,
    )[0];
    let mut params = fwd.params.clone();
    let seed_idx = params.len() as u32;
    params.push(Param {
        name: format!("d{out}"),
        role: ParamRole::Seed(out.to_string()),
        dtype: DType::F32,
        axes: fwd.iter_axes,
    });
    let seed = g.leaf(Op::Param(seed_idx), DType::F32, fwd.iter_axes);
    let mut targets: Vec<(String, NodeId)> = Vec::new();
    for (k, p) in fwd.params.iter().enumerate() {
        if matches!(p.role, ParamRole::Element | ParamRole::State(_)) {
            targets.push((
                format!("d{}", p.name),
                g.leaf(Op::Param(k as u32), p.dtype, p.axes),
            ));
        }
    }
    for id in fwd.graph.ids() {
        if let Op::Custom(c) = fwd.graph.node(id).op {
            let n = fwd.graph.node(id);
            targets.push((
                format!("grad.{}", customs[c as usize]),
                g.leaf(n.op, n.dtype, n.axes),
            ));
        }
    }
    // Each read of an indexed input is its own target: `grad.<input>#<k>`,
    // with its indices as outputs `grad.<input>#<k>.<axis>` so the evaluator
    // knows where the contribution goes.
    let mut index_outputs: Vec<Output> = Vec::new();
    let mut reads = 0;
    for id in g.ids().collect::<Vec<_>>() {
        if let Op::Gather(c) = g.node(id).op {
            let name = format!("grad.{}#{reads}", customs[c as usize]);
            for (a, idx) in g.node(id).args.clone().iter().enumerate() {
                index_outputs.push(Output {
                    name: format!("{name}.{a}"),
                    node: *idx,
                });
            }
            targets.push((name, id));
            reads += 1;
        }
    }
    let wrt: Vec<NodeId> = targets.iter().map(|t| t.1).collect();
    let grads = grad(&mut g, y, seed, &wrt, Eval::Pointwise);
    let zero = g.f32(0.0);
    let mut outputs: Vec<Output> = targets
        .into_iter()
        .zip(grads)
        .map(|((name, _), d)| Output {
            name,
            node: d.unwrap_or(zero),
        })
        .collect();
    outputs.extend(index_outputs);
    let mut r = Region {
        name: format!("{}_bwd", fwd.name),
        iter_axes: fwd.iter_axes,
        params,
        graph: g,
        outputs,
    };
    r.compact();
    r
}

pub fn parallel_backward(
    online: &Online,
    modifies: [&Option<Region>; 4],
    customs: &[String],
) -> Result<ParallelBackward, String> {
    let (recompute, norm) = normalisation_backward(online)?;
    let [q, k, v, s] = modifies;
    Ok(ParallelBackward {
        recompute,
        norm,
        modify_q: q.as_ref().map(|r| closure_backward(r, "q", customs)),
        modify_k: k.as_ref().map(|r| closure_backward(r, "k", customs)),
        modify_v: v.as_ref().map(|r| closure_backward(r, "v", customs)),
        modify_scores: s.as_ref().map(|r| closure_backward(r, "s", customs)),
    })
}

pub fn recurrent_backward(
    modifies: [&Option<Region>; 3],
    decay: Option<&Decay>,
    normalize: Option<&Region>,
    customs: &[String],
) -> RecurrentBackward {
    let [q, k, v] = modifies;
    RecurrentBackward {
        modify_q: q.as_ref().map(|r| closure_backward(r, "q", customs)),
        modify_k: k.as_ref().map(|r| closure_backward(r, "k", customs)),
        modify_v: v.as_ref().map(|r| closure_backward(r, "v", customs)),
        decay: decay.map(|d| closure_backward(&d.region, "decay", customs)),
        normalize: normalize.map(|r| closure_backward(r, "o", customs)),
    }
}

/// Builds the recompute region `P = g(s, state)` and the normalisation
/// backward `dS(s, dP, state)`.
fn normalisation_backward(online: &Online) -> Result<(Region, Region), String> {
    let fwd = &online.fwd;
    let epi = &online.epilogue;
    let s_param = &fwd.params[fwd.param_index(&ParamRole::Element).expect("fwd has s") as usize];
    let s_axes = s_param.axes;
    let row_axes = s_axes.without(Axis::Skv);

    // The whole-row program, with the prologue's initial state folded in.
    let mut g = Graph::new(Fold::AssumeFinite, Axis::Skv);
    let s = g.leaf(Op::Param(0), DType::F32, s_axes);
    let mut roots = vec![fwd.output("p").expect("fwd has p")];
    for f in &online.state {
        roots.push(
            fwd.output(&format!("state.{}", f.name))
                .expect("fwd has every state field"),
        );
    }
    let images = g.import(&fwd.graph, &roots, |g, _, n| match n.op {
        Op::Param(p) => Some(match &fwd.params[p as usize].role {
            ParamRole::State(f) => {
                let init = online
                    .state
                    .iter()
                    .find(|x| &x.name == f)
                    .expect("declared")
                    .init;
                g.f32(init)
            }
            _ => s,
        }),
        _ => None,
    });
    let (p, finals) = (images[0], images[1..].to_vec());
    let c = g.import(
        &epi.graph,
        &[epi.output("o").expect("epilogue has o")],
        |g, _, n| match n.op {
            Op::Param(k) => Some(match &epi.params[k as usize].role {
                ParamRole::State(f) => {
                    finals[online
                        .state
                        .iter()
                        .position(|x| &x.name == f)
                        .expect("declared")]
                }
                _ => g.f32(1.0),
            }),
            _ => None,
        },
    )[0];
    let weights = g.binary(crate::ir::Binary::Mul, p, c);
    let dp = g.leaf(Op::Param(1), DType::F32, s_axes);
    let ds = grad(&mut g, weights, dp, &[s], Eval::Row)[0].unwrap_or_else(|| g.f32(0.0));

    let state_params = || -> Vec<Param> {
        online
            .state
            .iter()
            .map(|f| Param {
                name: format!("st.{}", f.name),
                role: ParamRole::State(f.name.clone()),
                dtype: DType::F32,
                axes: row_axes,
            })
            .collect()
    };
    let s_decl = Param {
        name: "s".into(),
        role: ParamRole::Element,
        dtype: DType::F32,
        axes: s_axes,
    };

    // Recompute: params [s, state…].
    let recompute_graph = with_saved_state(&g, weights, &finals, 1, row_axes, |id| {
        (id == s).then_some(0)
    });
    let mut recompute = Region {
        name: "recompute".into(),
        iter_axes: row_axes,
        params: [vec![s_decl.clone()], state_params()].concat(),
        graph: recompute_graph.0,
        outputs: vec![Output {
            name: "p".into(),
            node: recompute_graph.1,
        }],
    };
    recompute.compact();
    if recompute
        .graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Reduce(_)))
    {
        return Err("the weights returned by `fwd` depend on the row through something other than the state; \
                    compute them from `s` and the new state fields (e.g. `exp(s - m)` with `m` the new max)"
            .into());
    }

    // dS: params [s, dp, state…].
    let norm_graph = with_saved_state(&g, ds, &finals, 2, row_axes, |id| {
        if id == s {
            Some(0)
        } else if id == dp {
            Some(1)
        } else {
            None
        }
    });
    let dp_decl = Param {
        name: "dp".into(),
        role: ParamRole::Seed("p".into()),
        dtype: DType::F32,
        axes: s_axes,
    };
    // Facts for the simplifier: each final state field as the row program
    // computes it from `s` and the other fields (e.g. `st.l = rowsum(exp(s -
    // st.m))`). They hold at run time because the state was saved from exactly
    // this computation; outputs after `ds` are never evaluated by kernels.
    let mut norm_graph = norm_graph;
    let mut outputs = vec![Output {
        name: "ds".into(),
        node: norm_graph.1,
    }];
    for (k, f) in online.state.iter().enumerate() {
        let root = finals[k];
        if finals.iter().filter(|x| **x == root).count() > 1 {
            continue;
        }
        let fact = norm_graph.0.import(&g, &[root], |o, id, n| {
            if id == root {
                return None;
            }
            if let Some(j) = finals.iter().position(|x| *x == id) {
                return Some(o.leaf(Op::Param(2 + j as u32), DType::F32, row_axes));
            }
            (id == s).then(|| o.leaf(Op::Param(0), n.dtype, n.axes))
        })[0];
        if !matches!(norm_graph.0.node(fact).op, Op::Param(_) | Op::Const(_)) {
            outputs.push(Output {
                name: format!("fact.{}", f.name),
                node: fact,
            });
        }
    }
    let mut norm = Region {
        name: "norm_bwd".into(),
        iter_axes: row_axes,
        params: [vec![s_decl, dp_decl], state_params()].concat(),
        graph: norm_graph.0,
        outputs,
    };
    norm.compact();
    Ok((recompute, norm))
}

/// Copies `root` from the whole-row program, replacing each final-state node by
/// a state parameter (numbered from `first`) and the row's leaves by `leaf`'s
/// parameter numbers.
fn with_saved_state(
    g: &Graph,
    root: NodeId,
    finals: &[NodeId],
    first: u32,
    row_axes: AxisSet,
    leaf: impl Fn(NodeId) -> Option<u32>,
) -> (Graph, NodeId) {
    let mut out = Graph::new(Fold::AssumeFinite, Axis::Skv);
    let r = out.import(g, &[root], |o, id, n| {
        if let Some(k) = finals.iter().position(|f| *f == id) {
            return Some(o.leaf(Op::Param(first + k as u32), DType::F32, row_axes));
        }
        leaf(id).map(|p| o.leaf(Op::Param(p), n.dtype, n.axes))
    })[0];
    (out, r)
}
