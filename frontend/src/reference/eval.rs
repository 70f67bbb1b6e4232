//! Evaluation of one region at one point, in f64.
//!
//! A value is a row: one number, or one number per key of the row (for values
//! that vary over the reduction axis). Elementwise operations broadcast a
//! single number against a row; reductions fold a row to one number.

use crate::ir::{Op, Region};

pub type Row = Vec<f64>;

/// Evaluates every output of `region`. `leaf` gives the value of each leaf
/// (`Param`, `Index`, `Shape`, `Custom`) as a row. For regions that read
/// indexed inputs (`Gather`), use [`eval_region_with`].
pub fn eval_region(region: &Region, leaf: &mut dyn FnMut(&Op) -> Row) -> Vec<Row> {
    eval_region_with(region, leaf, &mut |c, _| {
        unreachable!(
            "region `{}` reads indexed input #{c}: evaluate it with eval_region_with",
            region.name
        )
    })
}

/// Like [`eval_region`]; `gather(custom, indices)` reads an indexed input at
/// integer indices (pointwise regions only).
pub fn eval_region_with(
    region: &Region,
    leaf: &mut dyn FnMut(&Op) -> Row,
    gather: &mut dyn FnMut(u32, &[i64]) -> f64,
) -> Vec<Row> {
    let g = &region.graph;
    let live = g.live(&region.outputs.iter().map(|o| o.node).collect::<Vec<_>>());
    let mut vals: Vec<Row> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let n = g.node(id);
        let arg = |k: usize| &vals[n.args[k].index()];
        let v = match n.op {
            Op::Const(c) => vec![c.get()],
            Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) => leaf(&n.op),
            Op::Unary(u) => arg(0).iter().map(|&x| u.apply(x)).collect(),
            Op::Binary(b) => zip2(arg(0), arg(1), |x, y| b.apply(x, y)),
            Op::Select => {
                let (c, a, e) = (arg(0), arg(1), arg(2));
                let len = c.len().max(a.len()).max(e.len());
                (0..len)
                    .map(|k| if at(c, k) != 0.0 { at(a, k) } else { at(e, k) })
                    .collect()
            }
            Op::Reduce(r) => vec![
                arg(0)
                    .iter()
                    .fold(r.identity(), |acc, &x| r.combine(acc, x)),
            ],
            Op::Gather(c) => {
                let idx: Vec<i64> = (0..n.args.len()).map(|k| arg(k)[0] as i64).collect();
                vec![gather(c, &idx)]
            }
        };
        vals[id.index()] = v;
    }
    region
        .outputs
        .iter()
        .map(|o| vals[o.node.index()].clone())
        .collect()
}

/// Evaluates a region whose values are all single numbers.
pub fn eval_scalar(region: &Region, leaf: &mut dyn FnMut(&Op) -> f64) -> Vec<f64> {
    eval_region(region, &mut |op| vec![leaf(op)])
        .into_iter()
        .map(|r| r[0])
        .collect()
}

/// [`eval_scalar`] for regions that may read indexed inputs.
pub fn eval_scalar_with(
    region: &Region,
    leaf: &mut dyn FnMut(&Op) -> f64,
    gather: &mut dyn FnMut(u32, &[i64]) -> f64,
) -> Vec<f64> {
    eval_region_with(region, &mut |op| vec![leaf(op)], gather)
        .into_iter()
        .map(|r| r[0])
        .collect()
}

fn at(r: &[f64], k: usize) -> f64 {
    if r.len() == 1 { r[0] } else { r[k] }
}

fn zip2(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Row {
    let len = a.len().max(b.len());
    (0..len).map(|k| f(at(a, k), at(b, k))).collect()
}
