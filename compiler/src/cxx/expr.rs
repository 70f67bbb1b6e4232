//! Expression generation: a region's graph as C++ statements (CUDA and HIP).
//!
//! Nodes are emitted once each, in arena (topological) order, as `const`
//! locals named after their node id, so shared subexpressions are computed
//! once. Two forms:
//! - pointwise: every value is one number (modification closures, masks, the
//!   epilogue);
//! - row: values that vary along the key axis are arrays over the thread's
//!   `NE` keys of the row; reductions fold the valid keys and then combine the
//!   lanes that share the row (`row_lanes_*`, defined by each prelude).

use super::spelling::{binary, c_scalar, float_lit, reduce, unary};
use aec_frontend::ir::{Axis, Binary, DType, NodeId, Op, Region};
use std::fmt::Write;

/// How the kernel reads a region's leaves: `Param`, `Index`, `Shape`,
/// `Custom`, and `Gather` (an indexed read): its expression names the
/// gather's integer operands `$0`, `$1`, …, which the emitter replaces.
pub type LeafFn<'a> = dyn Fn(&Op) -> String + 'a;

/// A gather's leaf expression with its operands filled in.
fn fill_operands(leaf: String, operands: &[String]) -> String {
    operands
        .iter()
        .enumerate()
        .rev() // `$10` before `$1`
        .fold(leaf, |e, (k, x)| e.replace(&format!("${k}"), x))
}

fn var(prefix: &str, id: NodeId) -> String {
    format!("{prefix}{}", id.0)
}

fn live_nodes(region: &Region) -> Vec<bool> {
    let roots: Vec<NodeId> = region.outputs.iter().map(|o| o.node).collect();
    region.graph.live(&roots)
}

/// Statements computing every output of a pointwise region; returns the code
/// and one C expression per output.
pub fn pointwise(region: &Region, prefix: &str, leaf: &LeafFn) -> (String, Vec<String>) {
    let g = &region.graph;
    let live = live_nodes(region);
    let mut code = String::new();
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let n = g.node(id);
        let a = |k: usize| var(prefix, n.args[k]);
        let rhs = match n.op {
            Op::Const(c) => match n.dtype {
                DType::F32 => float_lit(c.get()),
                DType::Int => format!("{}", c.get() as i64),
                DType::Bool => (if c.get() != 0.0 { "true" } else { "false" }).to_string(),
            },
            Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) => leaf(&n.op),
            Op::Unary(u) => unary(u, &a(0), n.dtype),
            Op::Binary(b) => binary(b, &a(0), &a(1), n.dtype),
            Op::Select => format!("({} ? {} : {})", a(0), a(1), a(2)),
            Op::Reduce(_) => {
                unreachable!("pointwise regions have no reductions (checked by the tracer)")
            }
            Op::Gather(_) => {
                fill_operands(leaf(&n.op), &(0..n.args.len()).map(a).collect::<Vec<_>>())
            }
        };
        let _ = writeln!(
            code,
            "    const {} {} = {rhs};",
            c_scalar(n.dtype),
            var(prefix, id)
        );
    }
    let outs = region.outputs.iter().map(|o| var(prefix, o.node)).collect();
    (code, outs)
}

/// Statements computing every output of a row region over `ne` keys per thread.
/// `leaf` gives scalar leaves; a leaf that varies along the row must be given
/// as an array expression indexable by `[e]`. `valid` names the `bool[ne]`
/// array of keys that exist for this row (reductions skip the others), or is
/// `None` where every key takes part. Returns the code and, per output, its
/// expression and whether it is a per-key array.
pub fn row(
    region: &Region,
    prefix: &str,
    valid: Option<&str>,
    leaf: &LeafFn,
) -> (String, Vec<(String, bool)>) {
    let g = &region.graph;
    let ra = g.reduce_axis();
    let live = live_nodes(region);
    let mut code = String::new();
    let is_row = |id: NodeId| g.node(id).axes.contains(ra);
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let n = g.node(id);
        let name = var(prefix, id);
        let ty = c_scalar(n.dtype);
        // Operand `k` read at key `e` (arrays) or as is (scalars).
        let a = |k: usize| {
            let arg = n.args[k];
            if is_row(arg) {
                format!("{}[e]", var(prefix, arg))
            } else {
                var(prefix, arg)
            }
        };
        if let Op::Reduce(r) = n.op {
            let (identity, combine, quad) = reduce(r);
            let x = a(0);
            let test = valid.map(|v| format!("if ({v}[e]) ")).unwrap_or_default();
            let _ = writeln!(
                code,
                "    float {name} = {identity};\n    #pragma unroll\n    for (int e = 0; e < NE; ++e) {test}{name} = {};\n    {name} = {quad}({name});",
                combine(&name, &x)
            );
            continue;
        }
        let rhs = match n.op {
            Op::Const(c) => match n.dtype {
                DType::F32 => float_lit(c.get()),
                DType::Int => format!("{}", c.get() as i64),
                DType::Bool => (if c.get() != 0.0 { "true" } else { "false" }).to_string(),
            },
            Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) => {
                let l = leaf(&n.op);
                if is_row(id) { format!("{l}[e]") } else { l }
            }
            Op::Unary(u) => unary(u, &a(0), n.dtype),
            Op::Binary(b) => distributed_fma(region, id, prefix)
                .unwrap_or_else(|| binary(b, &a(0), &a(1), n.dtype)),
            Op::Select => format!("({} ? {} : {})", a(0), a(1), a(2)),
            Op::Reduce(_) => unreachable!("handled above"),
            Op::Gather(_) => {
                fill_operands(leaf(&n.op), &(0..n.args.len()).map(a).collect::<Vec<_>>())
            }
        };
        if is_row(id) {
            let _ = writeln!(
                code,
                "    {ty} {name}[NE];\n    #pragma unroll\n    for (int e = 0; e < NE; ++e) {name}[e] = {rhs};"
            );
        } else {
            let _ = writeln!(code, "    const {ty} {name} = {rhs};");
        }
    }
    let outs = region
        .outputs
        .iter()
        .map(|o| (var(prefix, o.node), is_row(o.node)))
        .collect();
    (code, outs)
}

/// `(x ± k) · c` per key, with `k` and `c` constant along the row, as
/// `x · c ± (k · c)`: the product of row constants is hoisted by the compiler
/// and the rest contracts to one FMA per key (online softmax's
/// `exp2((s − m) · log2 e)` costs an FMA instead of a subtraction and a
/// multiplication). Rounds differently from the factored form by at most an
/// ulp of the product.
fn distributed_fma(region: &Region, id: NodeId, prefix: &str) -> Option<String> {
    let g = &region.graph;
    let ra = g.reduce_axis();
    let is_row = |id: NodeId| g.node(id).axes.contains(ra);
    let n = g.node(id);
    if n.op != Op::Binary(Binary::Mul) || n.dtype != DType::F32 || !is_row(id) {
        return None;
    }
    let (sum, c) = match (is_row(n.args[0]), is_row(n.args[1])) {
        (true, false) => (n.args[0], n.args[1]),
        (false, true) => (n.args[1], n.args[0]),
        _ => return None,
    };
    let s = g.node(sum);
    let sign = match s.op {
        Op::Binary(Binary::Add) => "+",
        Op::Binary(Binary::Sub) => "-",
        _ => return None,
    };
    let (x, k) = (s.args[0], s.args[1]);
    if !is_row(x) || is_row(k) {
        return None;
    }
    Some(format!(
        "({}[e] * {c} {sign} ({k} * {c}))",
        var(prefix, x),
        c = var(prefix, c),
        k = var(prefix, k)
    ))
}

/// The C expression of a custom input's element at the current point: inputs
/// are contiguous in their declared axis order, and `coord`/`size` name each
/// axis's coordinate and extent in the kernel.
pub fn custom_element(
    pointer: &str,
    axes: &[Axis],
    coord: &dyn Fn(Axis) -> String,
    size: &dyn Fn(Axis) -> String,
) -> String {
    let mut offset = String::from("0");
    for (n, a) in axes.iter().enumerate() {
        offset = if n == 0 {
            format!("(long long)({})", coord(*a))
        } else {
            format!("({offset} * {} + {})", size(*a), coord(*a))
        };
    }
    format!("{pointer}[{offset}]")
}
