//! The held row maximum: FlashAttention-4's conditional rescaling, derived
//! for any variant whose online state has a running maximum.
//!
//! A softmax-like update keeps `m = max(m, x)` (x: the block's scaled maximum)
//! and rescales the running output by `alpha = exp(m_old − m_new)` whenever
//! `m` moves, which costs a multiply per output element. The final output
//! does not depend on which `m` the row used, only on `m` being near enough
//! the true maximum that the weights cannot overflow. Holding `m` until a
//! block's maximum exceeds it by [`HOLD`] (8·ln 2) leaves `alpha = 1` on most
//! blocks, so the kernels can skip the rescale where a whole warp's rows
//! keep theirs, and bounds every weight by 2⁸ (bench/NOTES.md, session 63:
//! DiffTransformer 3.9% less energy a launch).
//!
//! Each field updated as `max(st.f, x)` with `x` free of the state becomes
//! `x > st.f + HOLD ? x : st.f`. (Not `max(st.f, x − HOLD)`, one
//! instruction fewer: that field is the running maximum less a constant and
//! moves whenever the maximum does; bench/NOTES.md, session 64.) The
//! rewrite is taken only where it is
//! checked to be exact, numerically as the split-KV combine is: random rows
//! of blocks whose maxima rise by small and large steps must give the same
//! epilogue outputs (the output and every final row scale) as the variant's
//! own update, and no weight may exceed its own update's weight by more than
//! e^HOLD (the units of `m` are those of the exponent).
//!
//! The final state is an output (the row outputs, the backward's saved
//! state), and there the variant's own must come out: the kernels also keep
//! each held field's true maximum (the `block_max` outputs) and at the end
//! move the state onto it with the split-KV combine's rescale
//! (`crate::combine`), which a variant must therefore have. Kernels whose
//! partial rows merge (split-KV, key warps) keep the variant's own update:
//! their merged state would be a held one. Where it pays is the
//! generator's call (`cuda::forward::HELD_MAX_MIN_O_COLUMNS`).

use crate::combine::{Merge, combine_plan, run_row};
use aec_frontend::ir::{Binary, Graph, NodeId, Op, Output, ParamRole, Region};
use aec_frontend::reference::eval::eval_region;
use aec_frontend::variant::Online;

/// How far a block's maximum may exceed the held one before it is taken:
/// 8·ln 2, so a weight is at most 2⁸.
pub const HOLD: f64 = 8.0 * std::f64::consts::LN_2;

/// `fwd` — `online`'s block update, as written or simplified — with
/// every running maximum held, or `None` where it has none or the rewrite is
/// not exact for it. (The kernels hold the simplified update's maximum: the
/// simplifier has no comparisons, so it would keep the condition's operands
/// unsimplified beside the selected ones.)
pub fn held_online_fwd(online: &Online, fwd: &Region) -> Option<Held> {
    let g = &fwd.graph;
    let is_state = |id: NodeId| matches!(g.node(id).op, Op::Param(k) if matches!(fwd.params[k as usize].role, ParamRole::State(_)));
    let reads_state = |id: NodeId| {
        g.depends_on(id, |n| matches!(n.op, Op::Param(k) if matches!(fwd.params[k as usize].role, ParamRole::State(_))))
    };
    // (max node, the field's incoming value, the block's term x).
    let mut held: Vec<(NodeId, NodeId, NodeId)> = Vec::new();
    for f in &online.state {
        let Some(out) = fwd.output(&format!("state.{}", f.name)) else {
            continue;
        };
        let n = g.node(out);
        if n.op != Op::Binary(Binary::Max) {
            continue;
        }
        let own = |id: NodeId| {
            is_state(id)
                && matches!(g.node(id).op, Op::Param(k) if fwd.params[k as usize].role == ParamRole::State(f.name.clone()))
        };
        let (a, b) = (n.args[0], n.args[1]);
        let pair = if own(a) && !reads_state(b) {
            Some((a, b))
        } else if own(b) && !reads_state(a) {
            Some((b, a))
        } else {
            None
        };
        if let Some((st, x)) = pair {
            held.push((out, st, x));
        }
    }
    if held.is_empty() {
        return None;
    }

    let mut graph = Graph::new(g.fold(), g.reduce_axis());
    let roots: Vec<NodeId> = fwd.outputs.iter().map(|o| o.node).collect();
    let images = graph.import(g, &roots, |dst, id, _| {
        let &(_, st, x) = held.iter().find(|(m, _, _)| *m == id)?;
        // Operands precede their users and the graph is hash-consed, so
        // importing them again gives the images already made.
        let ops = dst.import(g, &[st, x], |_, _, _| None);
        let (st, x) = (ops[0], ops[1]);
        let hold = dst.f32(HOLD);
        let bar = dst.binary(Binary::Add, st, hold);
        let rises = dst.binary(Binary::Gt, x, bar);
        Some(dst.select(rises, x, st))
    });
    // Each held field's block term too, for the row maximum itself.
    let terms: Vec<NodeId> = held.iter().map(|&(_, _, x)| x).collect();
    let term_images = graph.import(g, &terms, |_, _, _| None);
    let mut region = Region {
        graph,
        ..fwd.clone()
    };
    for (o, img) in region.outputs.iter_mut().zip(images) {
        o.node = img;
    }
    let field_of = |m: NodeId| {
        let k = online
            .state
            .iter()
            .position(|f| fwd.output(&format!("state.{}", f.name)) == Some(m))
            .expect("a held node is a field's update");
        (k, online.state[k].name.clone())
    };
    let fields: Vec<usize> = held.iter().map(|&(m, _, _)| field_of(m).0).collect();
    // The final state is moved onto the true maxima by the combine's rescale.
    let plan = combine_plan(online).ok()?;
    if fields.iter().any(|&k| plan.merges[k] != Merge::Max) {
        return None;
    }
    for (&(m, _, _), node) in held.iter().zip(term_images) {
        region.outputs.push(Output {
            name: format!("{BLOCK_MAX}{}", field_of(m).1),
            node,
        });
    }
    region.compact();
    if region.validate().is_err() || !exact(online, &region) {
        return None;
    }
    Some(Held {
        fwd: region,
        fields,
    })
}

/// The prefix of the held update's outputs that give each held field's
/// block term (what `max(st.f, x)` would have taken): the kernels keep the
/// row's true maximum from them and give the final state in the variant's
/// own terms ([`Held`]).
pub const BLOCK_MAX: &str = "block_max.";

/// A held online update.
#[derive(Clone, Debug)]
pub struct Held {
    /// The update with its maxima held; besides the variant's outputs, one
    /// `block_max.<field>` per held field.
    pub fwd: Region,
    /// The held fields, by index in the state, in the order of the
    /// `block_max` outputs.
    pub fields: Vec<usize>,
}

/// The epilogue's outputs (the output, both value columns, then each final
/// row scale) for a row's final state and unnormalised output.
fn finish(online: &Online, state: &[f64], acc: [f64; 2]) -> Vec<f64> {
    let epi = &online.epilogue;
    let fields: Vec<&str> = online.state.iter().map(|f| f.name.as_str()).collect();
    let mut out = Vec::new();
    for (d, o) in acc.into_iter().enumerate() {
        let vals = eval_region(epi, &mut |op| match op {
            Op::Param(k) => match &epi.params[*k as usize].role {
                ParamRole::State(f) => {
                    vec![state[fields.iter().position(|x| x == f).expect("declared field")]]
                }
                _ => vec![o],
            },
            _ => vec![64.0],
        });
        for (v, e) in vals.iter().zip(&epi.outputs) {
            // The scales do not depend on the column: take them once.
            if e.name == "o" || d == 0 {
                out.push(v[0]);
            }
        }
    }
    out
}

/// Random rows whose block maxima rise by steps below and above the hold,
/// at score spreads from a fraction of a unit to hundreds (the variant's
/// scale may be anything), through `held` and through the variant's own
/// update.
fn exact(online: &Online, held: &Region) -> bool {
    let mut next = crate::check_rng::uniform(0x51a7_c0de_9e37_79b9);
    let close = |a: f64, b: f64| {
        a.is_finite() && b.is_finite() && (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
    };
    let bound = HOLD.exp() * (1.0 + 1e-9);
    for trial in 0..48 {
        let spread = 0.5 * 1000f64.powf(next());
        let nblocks = 2 + trial % 6;
        let mut blocks = Vec::with_capacity(nblocks);
        let mut level = 0.0;
        for _ in 0..nblocks {
            // Rising, falling and level blocks, in steps up to the spread.
            level += (next() - 0.3) * spread;
            let len = 1 + (next() * 6.0) as usize;
            blocks.push(
                (0..len)
                    .map(|_| level + (next() - 0.5) * spread)
                    .collect::<Vec<f64>>(),
            );
        }
        let keys: usize = blocks.iter().map(Vec::len).sum();
        let values: Vec<[f64; 2]> = (0..keys).map(|_| [next() - 0.5, next() - 0.5]).collect();
        let own = run_row(online, &online.fwd, &blocks, &values);
        let lazy = run_row(online, held, &blocks, &values);
        let same = finish(online, &own.state, own.acc)
            .into_iter()
            .zip(finish(online, &lazy.state, lazy.acc))
            .all(|(a, b)| close(a, b));
        let bounded = own
            .weights
            .iter()
            .flatten()
            .zip(lazy.weights.iter().flatten())
            .all(|(a, b)| b.is_finite() && b.abs() <= bound * a.abs().max(f64::MIN_POSITIVE));
        if !(same && bounded) {
            return false;
        }
    }
    true
}
