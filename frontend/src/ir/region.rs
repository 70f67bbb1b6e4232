//! Regions: one traced closure (or one derived backward piece) as a graph with
//! named parameters and named outputs, evaluated once per point of its
//! iteration space.

use super::axis::AxisSet;
use super::graph::{Graph, NodeId};
use super::op::{DType, Op};
use serde::Serialize;
use std::fmt::{self, Write};

/// What a region parameter stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "of", rename_all = "snake_case")]
pub enum ParamRole {
    /// The element the closure transforms (`q`, `k`, `v`, the scores, the output row).
    Element,
    /// A row-state field: the incoming state in `fwd`, the final state elsewhere.
    State(String),
    /// The adjoint (gradient) flowing into a forward output.
    Seed(String),
}

#[derive(Clone, Debug, Serialize)]
pub struct Param {
    pub name: String,
    pub role: ParamRole,
    pub dtype: DType,
    pub axes: AxisSet,
}

#[derive(Clone, Debug)]
pub struct Output {
    pub name: String,
    pub node: NodeId,
}

#[derive(Clone, Debug)]
pub struct Region {
    pub name: String,
    /// The axes of one evaluation point; values may vary over a subset, and in
    /// row regions over the reduction axis as well.
    pub iter_axes: AxisSet,
    pub params: Vec<Param>,
    pub graph: Graph,
    pub outputs: Vec<Output>,
}

impl Region {
    pub fn output(&self, name: &str) -> Option<NodeId> {
        self.outputs.iter().find(|o| o.name == name).map(|o| o.node)
    }

    pub fn param_index(&self, role: &ParamRole) -> Option<u32> {
        self.params
            .iter()
            .position(|p| &p.role == role)
            .map(|p| p as u32)
    }

    /// The node of a parameter, if the graph uses it.
    pub fn param_node(&self, index: u32) -> Option<NodeId> {
        self.graph
            .ids()
            .find(|&id| self.graph.node(id).op == Op::Param(index))
    }

    /// Keeps only the nodes the outputs need, renumbered densely.
    pub fn compact(&mut self) {
        let roots: Vec<NodeId> = self.outputs.iter().map(|o| o.node).collect();
        let mut fresh = Graph::new(self.graph.fold(), self.graph.reduce_axis());
        let images = fresh.import(&self.graph, &roots, |_, _, _| None);
        for (o, img) in self.outputs.iter_mut().zip(images) {
            o.node = img;
        }
        self.graph = fresh;
    }

    /// Structural check of the graph plus parameter references and outputs.
    pub fn validate(&self) -> Result<(), String> {
        self.graph
            .validate()
            .map_err(|e| format!("region {}: {e}", self.name))?;
        for id in self.graph.ids() {
            if let Op::Param(p) = self.graph.node(id).op
                && p as usize >= self.params.len()
            {
                return Err(format!(
                    "region {}: {id} uses missing parameter {p}",
                    self.name
                ));
            }
        }
        for o in &self.outputs {
            if o.node.index() >= self.graph.len() {
                return Err(format!(
                    "region {}: output {} is not a node",
                    self.name, o.name
                ));
            }
        }
        Ok(())
    }

    /// A readable listing; `customs` names the variant's custom inputs.
    pub fn render(&self, customs: &[String]) -> String {
        let mut s = String::new();
        let params: Vec<String> = self.params.iter().map(|p| p.name.clone()).collect();
        let _ = writeln!(
            s,
            "  {}({}) over {}",
            self.name,
            params.join(", "),
            self.iter_axes
        );
        for id in self.graph.ids() {
            let n = self.graph.node(id);
            let args: Vec<String> = n.args.iter().map(|a| a.to_string()).collect();
            let what = match n.op {
                Op::Const(c) => format!("const {}", fmt_f64(c.get())),
                Op::Param(p) => format!("param {}", self.params[p as usize].name),
                Op::Index(a) => format!("index {}", index_name(a)),
                Op::Shape(a) => format!("shape {a}"),
                Op::Custom(c) => format!(
                    "input {}",
                    customs.get(c as usize).map(String::as_str).unwrap_or("?")
                ),
                Op::Unary(u) => format!("{} {}", u.name(), args.join(", ")),
                Op::Binary(b) => format!("{} {}", b.name(), args.join(", ")),
                Op::Select => format!("select {}", args.join(", ")),
                Op::Reduce(r) => format!("{} {}", r.name(), args.join(", ")),
                Op::Gather(c) => format!(
                    "input {}[{}]",
                    customs.get(c as usize).map(String::as_str).unwrap_or("?"),
                    args.join(", ")
                ),
            };
            let _ = writeln!(
                s,
                "    {:<5} = {what:<32} : {} {}",
                id.to_string(),
                n.dtype,
                n.axes
            );
        }
        for o in &self.outputs {
            let _ = writeln!(s, "    out {} = {}", o.name, o.node);
        }
        s
    }
}

/// The DSL name of the index variable over an axis.
pub fn index_name(a: super::axis::Axis) -> &'static str {
    use super::axis::Axis;
    match a {
        Axis::B => "b",
        Axis::H | Axis::Hkv => "h",
        Axis::Sq => "i",
        Axis::Skv => "j",
        Axis::S => "t",
        Axis::Dqk | Axis::Dk | Axis::Dv => "d",
    }
}

pub fn fmt_f64(v: f64) -> String {
    let mut s = String::new();
    if v.is_infinite() {
        s.push_str(if v > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(s, "{v:?}");
    }
    s
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(&[]))
    }
}
