//! Reverse-mode automatic differentiation over the graph IR.
//!
//! Adjoint nodes are appended to the same graph, so the forward values they
//! need are shared, and the graph's folding applies to them. Every primitive
//! has a rule; comparisons, logic, `sign` and integer-valued nodes (index
//! arithmetic) carry no gradient.

use crate::ir::{Binary, DType, Graph, NodeId, Op, Reduce, Unary};
use std::collections::HashMap;
use std::f64::consts::LN_2;

/// How one evaluation of the graph sees the reduction axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eval {
    /// Every value is one number (a closure evaluated per element): a forward
    /// broadcast needs no sum in the graph, the caller accumulates per point.
    Pointwise,
    /// Values are rows along the graph's reduction axis (the online `fwd`, the
    /// normalisation backward): a forward broadcast along the row becomes a
    /// row sum of the adjoint.
    Row,
}

/// Gradients of `y` (seeded with the adjoint `seed`) with respect to `wrt`.
/// `None` means the gradient is identically zero.
pub fn grad(
    g: &mut Graph,
    y: NodeId,
    seed: NodeId,
    wrt: &[NodeId],
    eval: Eval,
) -> Vec<Option<NodeId>> {
    let mut adj: HashMap<NodeId, NodeId> = HashMap::new();
    adj.insert(y, seed);
    let live = g.live(&[y]);
    for id in (0..=y.0).rev().map(NodeId) {
        if !live[id.index()] {
            continue;
        }
        let Some(&a) = adj.get(&id) else { continue };
        let node = g.node(id).clone();
        if node.dtype != DType::F32 {
            continue;
        }
        let x = |k: usize| node.args[k];
        match node.op {
            // Gathers are leaves for the gradient: their operands are integer indices.
            Op::Const(_)
            | Op::Param(_)
            | Op::Index(_)
            | Op::Shape(_)
            | Op::Custom(_)
            | Op::Gather(_) => {}
            Op::Unary(u) => {
                let x0 = x(0);
                let d = match u {
                    Unary::Neg => Some(g.unary(Unary::Neg, a)),
                    Unary::Exp => Some(g.binary(Binary::Mul, a, id)),
                    Unary::Exp2 => {
                        let ln2 = g.f32(LN_2);
                        let t = g.binary(Binary::Mul, id, ln2);
                        Some(g.binary(Binary::Mul, a, t))
                    }
                    Unary::Log => Some(g.binary(Binary::Div, a, x0)),
                    Unary::Log2 => {
                        let ln2 = g.f32(LN_2);
                        let t = g.binary(Binary::Mul, x0, ln2);
                        Some(g.binary(Binary::Div, a, t))
                    }
                    Unary::Sqrt => {
                        let two = g.f32(2.0);
                        let t = g.binary(Binary::Mul, two, id);
                        Some(g.binary(Binary::Div, a, t))
                    }
                    Unary::Rsqrt => {
                        // d/dx x^-1/2 = -1/2 · y³
                        let y2 = g.binary(Binary::Mul, id, id);
                        let y3 = g.binary(Binary::Mul, y2, id);
                        let h = g.f32(-0.5);
                        let t = g.binary(Binary::Mul, h, y3);
                        Some(g.binary(Binary::Mul, a, t))
                    }
                    Unary::Tanh => {
                        let one = g.f32(1.0);
                        let y2 = g.binary(Binary::Mul, id, id);
                        let t = g.binary(Binary::Sub, one, y2);
                        Some(g.binary(Binary::Mul, a, t))
                    }
                    Unary::Sigmoid => {
                        let one = g.f32(1.0);
                        let c = g.binary(Binary::Sub, one, id);
                        let t = g.binary(Binary::Mul, id, c);
                        Some(g.binary(Binary::Mul, a, t))
                    }
                    Unary::Relu => {
                        let zero = g.f32(0.0);
                        let pos = g.binary(Binary::Gt, x0, zero);
                        Some(g.select(pos, a, zero))
                    }
                    Unary::Abs => {
                        let s = g.unary(Unary::Sign, x0);
                        Some(g.binary(Binary::Mul, a, s))
                    }
                    Unary::Sign | Unary::Not => None,
                };
                if let Some(d) = d {
                    accumulate(g, eval, &mut adj, x0, d);
                }
            }
            Op::Binary(b) => binary_rule(g, eval, &mut adj, b, id, x(0), x(1), a),
            Op::Select => {
                let zero = g.f32(0.0);
                let t = g.select(x(0), a, zero);
                let f = g.select(x(0), zero, a);
                accumulate(g, eval, &mut adj, x(1), t);
                accumulate(g, eval, &mut adj, x(2), f);
            }
            Op::Reduce(r) => {
                let x0 = x(0);
                let d = match r {
                    Reduce::Sum => a,
                    Reduce::AbsSum => {
                        let s = g.unary(Unary::Sign, x0);
                        g.binary(Binary::Mul, a, s)
                    }
                    Reduce::Max => {
                        // The subgradient shared equally among the row's maxima.
                        let (one, zero) = (g.f32(1.0), g.f32(0.0));
                        let at_max = g.binary(Binary::Eq, x0, id);
                        let ind = g.select(at_max, one, zero);
                        let count = g.reduce(Reduce::Sum, ind);
                        let share = g.binary(Binary::Div, a, count);
                        g.select(at_max, share, zero)
                    }
                };
                accumulate(g, eval, &mut adj, x0, d);
            }
        }
    }
    wrt.iter().map(|w| adj.get(w).copied()).collect()
}

#[allow(clippy::too_many_arguments)]
fn binary_rule(
    g: &mut Graph,
    eval: Eval,
    adj: &mut HashMap<NodeId, NodeId>,
    b: Binary,
    out: NodeId,
    x: NodeId,
    y: NodeId,
    a: NodeId,
) {
    match b {
        Binary::Add => {
            accumulate(g, eval, adj, x, a);
            accumulate(g, eval, adj, y, a);
        }
        Binary::Sub => {
            accumulate(g, eval, adj, x, a);
            let n = g.unary(Unary::Neg, a);
            accumulate(g, eval, adj, y, n);
        }
        Binary::Mul => {
            let dx = g.binary(Binary::Mul, a, y);
            let dy = g.binary(Binary::Mul, a, x);
            accumulate(g, eval, adj, x, dx);
            accumulate(g, eval, adj, y, dy);
        }
        Binary::Div => {
            let dx = g.binary(Binary::Div, a, y);
            accumulate(g, eval, adj, x, dx);
            // d(x/y)/dy = -(x/y)/y
            let t = g.binary(Binary::Div, out, y);
            let t = g.binary(Binary::Mul, a, t);
            let dy = g.unary(Unary::Neg, t);
            accumulate(g, eval, adj, y, dy);
        }
        Binary::Max | Binary::Min => {
            let cmp = if b == Binary::Max {
                Binary::Ge
            } else {
                Binary::Le
            };
            let zero = g.f32(0.0);
            let first = g.binary(cmp, x, y);
            let dx = g.select(first, a, zero);
            let dy = g.select(first, zero, a);
            accumulate(g, eval, adj, x, dx);
            accumulate(g, eval, adj, y, dy);
        }
        Binary::Pow => {
            // The exponent is a constant: d/dx x^c = c · x^(c-1).
            if let Some(c) = g.const_value(y) {
                let cm1 = g.f32(c - 1.0);
                let p = g.binary(Binary::Pow, x, cm1);
                let cc = g.f32(c);
                let t = g.binary(Binary::Mul, cc, p);
                let dx = g.binary(Binary::Mul, a, t);
                accumulate(g, eval, adj, x, dx);
            } else {
                let dx = {
                    let one = g.f32(1.0);
                    let ym1 = g.binary(Binary::Sub, y, one);
                    let p = g.binary(Binary::Pow, x, ym1);
                    let t = g.binary(Binary::Mul, y, p);
                    g.binary(Binary::Mul, a, t)
                };
                accumulate(g, eval, adj, x, dx);
                let l = g.unary(Unary::Log, x);
                let t = g.binary(Binary::Mul, out, l);
                let dy = g.binary(Binary::Mul, a, t);
                accumulate(g, eval, adj, y, dy);
            }
        }
        Binary::Lt
        | Binary::Le
        | Binary::Gt
        | Binary::Ge
        | Binary::Eq
        | Binary::Ne
        | Binary::And
        | Binary::Or => {}
    }
}

/// Adds `d` to the adjoint of `x`. In row evaluation, a contribution that
/// varies along the row while `x` does not (broadcast in the forward) is
/// summed over the row.
fn accumulate(g: &mut Graph, eval: Eval, adj: &mut HashMap<NodeId, NodeId>, x: NodeId, d: NodeId) {
    let xn = g.node(x);
    if xn.dtype != DType::F32 || matches!(xn.op, Op::Const(_)) {
        return;
    }
    let ra = g.reduce_axis();
    let d = if eval == Eval::Row && g.node(d).axes.contains(ra) && !xn.axes.contains(ra) {
        g.reduce(Reduce::Sum, d)
    } else {
        d
    };
    let sum = match adj.get(&x) {
        Some(&prev) => g.binary(Binary::Add, prev, d),
        None => d,
    };
    adj.insert(x, sum);
}
