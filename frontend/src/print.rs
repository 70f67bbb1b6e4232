//! Human-readable and JSON renderings of a traced variant.

use crate::ir::{Op, Region};
use crate::variant::{Body, Pattern, TensorDecl, Variant};
use serde_json::{Value, json};
use std::fmt::Write;

fn decl(t: &TensorDecl, fixed: &[(crate::ir::Axis, usize)]) -> String {
    let mut axes: Vec<String> = t
        .axes
        .iter()
        .map(|a| match fixed.iter().find(|(x, _)| x == a) {
            Some((_, n)) => format!("{a} = {n}"),
            None => a.to_string(),
        })
        .collect();
    axes.extend(t.user_axes.iter().map(|(u, n)| match n {
        Some(n) => format!("{u} = {n} (indexed)"),
        None => format!("{u} (indexed)"),
    }));
    format!("{}: [{}]", t.name, axes.join(", "))
}

/// The summary, forward graph and backward graph, as `aec check` prints them.
pub fn render(v: &Variant) -> String {
    let customs = v.custom_names();
    let mut s = String::new();
    let pattern = match v.pattern {
        Pattern::Parallel => "parallel",
        Pattern::Recurrent => "recurrent",
    };
    let _ = writeln!(s, "variant {} ({pattern})", v.name);
    if !v.doc.is_empty() {
        for line in v.doc.lines() {
            let _ = writeln!(s, "  /// {line}");
        }
    }
    let mut tensors = vec![&v.q, &v.k, &v.v];
    tensors.extend(v.customs.iter());
    let list: Vec<String> = tensors.iter().map(|t| decl(t, &v.fixed_sizes)).collect();
    let _ = writeln!(s, "  inputs: {}", list.join(", "));
    match &v.body {
        Body::Parallel(p) => {
            if !p.online.state.is_empty() {
                let st: Vec<String> = p
                    .online
                    .state
                    .iter()
                    .map(|f| format!("{} = {}", f.name, crate::ir::region::fmt_f64(f.init)))
                    .collect();
                let _ = writeln!(s, "  online state: {}", st.join(", "));
            }
            if !p.online.scales.is_empty() {
                let _ = writeln!(s, "  final row scales: {}", p.online.scales.join(", "));
            }
            let saved = saved_state(&p.backward.recompute, &p.backward.norm);
            let _ = writeln!(
                s,
                "  backward saves per row: {}",
                if saved.is_empty() {
                    "nothing".to_string()
                } else {
                    saved.join(", ")
                }
            );
            let extra = row_passes(&p.backward.norm);
            let _ = writeln!(s, "  backward row reductions: {extra}");
        }
        Body::Recurrent(r) => {
            let decay = match &r.decay {
                None => "none",
                Some(d) if d.per_key_dim => "per key dimension",
                Some(_) => "per head and step",
            };
            let _ = writeln!(
                s,
                "  decay: {decay}; normalised output: {}",
                if r.normalize.is_some() { "yes" } else { "no" }
            );
        }
    }
    let _ = writeln!(s, "forward graph:");
    for r in v.forward_regions() {
        s.push_str(&r.render(&customs));
    }
    let _ = writeln!(s, "backward graph:");
    for r in v.backward_regions() {
        s.push_str(&r.render(&customs));
    }
    s
}

/// State fields the backward regions read.
fn saved_state(recompute: &Region, norm: &Region) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in [recompute, norm] {
        for id in r.graph.ids() {
            if let Op::Param(p) = r.graph.node(id).op
                && let crate::ir::ParamRole::State(f) = &r.params[p as usize].role
                && !out.contains(f)
            {
                out.push(f.clone());
            }
        }
    }
    out
}

/// Describes the row reductions of the normalisation backward.
fn row_passes(norm: &Region) -> String {
    let seed = norm.param_index(&crate::ir::ParamRole::Seed("p".into()));
    let (mut with_dp, mut without) = (0, 0);
    // Only what `ds` needs: the `fact.*` outputs are equalities, not work.
    let live = norm
        .graph
        .live(&norm.output("ds").into_iter().collect::<Vec<_>>());
    for id in norm.graph.ids().filter(|id| live[id.index()]) {
        if let Op::Reduce(_) = norm.graph.node(id).op {
            let uses_dp = norm
                .graph
                .depends_on(id, |n| Some(n.op) == seed.map(Op::Param));
            if uses_dp { with_dp += 1 } else { without += 1 }
        }
    }
    format!("{with_dp} over dP terms, {without} over the scores alone")
}

fn region_json(r: &Region, customs: &[String]) -> Value {
    let nodes: Vec<Value> = r
        .graph
        .ids()
        .map(|id| {
            let n = r.graph.node(id);
            let (op, extra) = match n.op {
                Op::Const(c) => ("const", json!({ "value": if c.get().is_finite() { json!(c.get()) } else { json!(crate::ir::region::fmt_f64(c.get())) } })),
                Op::Param(p) => ("param", json!({ "param": r.params[p as usize].name })),
                Op::Index(a) => ("index", json!({ "axis": a })),
                Op::Shape(a) => ("shape", json!({ "axis": a })),
                Op::Custom(c) => ("input", json!({ "input": customs.get(c as usize) })),
                Op::Unary(u) => (u.name(), json!({})),
                Op::Binary(b) => (b.name(), json!({})),
                Op::Select => ("select", json!({})),
                Op::Reduce(x) => (x.name(), json!({})),
                Op::Gather(c) => ("gather", json!({ "input": customs.get(c as usize) })),
            };
            let mut o = json!({
                "id": id.0,
                "op": op,
                "args": n.args.iter().map(|a| a.0).collect::<Vec<_>>(),
                "dtype": n.dtype,
                "axes": n.axes,
            });
            if let (Value::Object(m), Value::Object(e)) = (&mut o, extra) {
                m.extend(e);
            }
            o
        })
        .collect();
    json!({
        "name": r.name,
        "iter_axes": r.iter_axes,
        "params": r.params,
        "nodes": nodes,
        "outputs": r.outputs.iter().map(|o| json!({ "name": o.name, "node": o.node.0 })).collect::<Vec<_>>(),
    })
}

/// The machine-readable form of `aec check --json`.
pub fn to_json(v: &Variant) -> Value {
    let customs = v.custom_names();
    let mut tensors = vec![&v.q, &v.k, &v.v];
    tensors.extend(v.customs.iter());
    let state = match &v.body {
        Body::Parallel(p) => json!(p.online.state),
        Body::Recurrent(_) => json!([]),
    };
    json!({
        "name": v.name,
        "doc": v.doc,
        "pattern": v.pattern,
        "inputs": tensors,
        "custom_inputs": customs,
        "fixed_sizes": v.fixed_sizes.iter().map(|(a, n)| json!({ "axis": a, "size": n })).collect::<Vec<_>>(),
        "online_state": state,
        "forward": v.forward_regions().into_iter().map(|r| region_json(r, &customs)).collect::<Vec<_>>(),
        "backward": v.backward_regions().into_iter().map(|r| region_json(r, &customs)).collect::<Vec<_>>(),
    })
}
