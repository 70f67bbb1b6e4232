//! The graph IR: an arena DAG of typed nodes, built through a hash-consing,
//! folding builder.
//!
//! Nodes are only ever appended and operands always precede their users, so
//! arena order is a topological order. Building the same operation on the same
//! operands twice returns the existing node (common subexpressions are shared
//! by construction).

use super::axis::{Axis, AxisSet};
use super::op::{Binary, ConstBits, DType, Op, Reduce, Unary};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::fmt;

/// Index of a node in its graph's arena.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

pub type Args = SmallVec<[NodeId; 3]>;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub args: Args,
    pub dtype: DType,
    /// The axes this value varies over.
    pub axes: AxisSet,
}

/// How far the builder may simplify while building.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// Only rewrites that hold for every f64, infinities and NaN included:
    /// constant folding, `x + 0`, `x * 1`, `x / 1`, `select(true, a, b)`.
    Exact,
    /// Also rewrites that assume non-constant operands are finite: `0 * x → 0`,
    /// `max(-inf, x) → x`, `-inf - x → -inf`. Used when deriving backward
    /// graphs, where it removes the prologue's `-inf`/`0` initial state.
    AssumeFinite,
}

#[derive(Clone, Debug)]
pub struct Graph {
    nodes: Vec<Node>,
    memo: HashMap<(Op, Args, DType), NodeId>,
    fold: Fold,
    /// The axis row reductions run over.
    reduce_axis: Axis,
}

impl Graph {
    pub fn new(fold: Fold, reduce_axis: Axis) -> Graph {
        Graph {
            nodes: Vec::new(),
            memo: HashMap::new(),
            fold,
            reduce_axis,
        }
    }

    pub fn fold(&self) -> Fold {
        self.fold
    }

    pub fn reduce_axis(&self) -> Axis {
        self.reduce_axis
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ids(&self) -> impl DoubleEndedIterator<Item = NodeId> + use<> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn const_value(&self, id: NodeId) -> Option<f64> {
        match self.node(id).op {
            Op::Const(c) => Some(c.get()),
            _ => None,
        }
    }

    fn intern(&mut self, op: Op, args: Args, dtype: DType, axes: AxisSet) -> NodeId {
        let key = (op, args, dtype);
        if let Some(&id) = self.memo.get(&key) {
            return id;
        }
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            op,
            args: key.1.clone(),
            dtype,
            axes,
        });
        self.memo.insert(key, id);
        id
    }

    pub fn constant(&mut self, v: f64, dtype: DType) -> NodeId {
        self.intern(
            Op::Const(ConstBits::new(v)),
            Args::new(),
            dtype,
            AxisSet::EMPTY,
        )
    }

    pub fn f32(&mut self, v: f64) -> NodeId {
        self.constant(v, DType::F32)
    }

    /// A leaf: `Param`, `Index`, `Shape` or `Custom`.
    pub fn leaf(&mut self, op: Op, dtype: DType, axes: AxisSet) -> NodeId {
        debug_assert!(matches!(
            op,
            Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_)
        ));
        self.intern(op, Args::new(), dtype, axes)
    }

    pub fn unary(&mut self, u: Unary, x: NodeId) -> NodeId {
        let xn = self.node(x);
        let dtype = match (u, xn.dtype) {
            (Unary::Not, _) => DType::Bool,
            (Unary::Neg | Unary::Abs | Unary::Sign, DType::Int) => DType::Int,
            _ => DType::F32,
        };
        let axes = xn.axes;
        if let Some(c) = self.const_value(x) {
            return self.constant(u.apply(c), dtype);
        }
        if u == Unary::Neg
            && let Op::Unary(Unary::Neg) = self.node(x).op
        {
            let inner = self.node(x).args[0];
            if self.node(inner).dtype == dtype {
                return inner;
            }
        }
        self.intern(Op::Unary(u), smallvec::smallvec![x], dtype, axes)
    }

    pub fn binary(&mut self, b: Binary, x: NodeId, y: NodeId) -> NodeId {
        let (xn, yn) = (self.node(x), self.node(y));
        let dtype = if b.is_comparison() || b.is_logical() {
            DType::Bool
        } else if xn.dtype == DType::Int
            && yn.dtype == DType::Int
            && matches!(
                b,
                Binary::Add | Binary::Sub | Binary::Mul | Binary::Max | Binary::Min
            )
        {
            DType::Int
        } else {
            DType::F32
        };
        let axes = xn.axes.union(yn.axes);
        let (cx, cy) = (self.const_value(x), self.const_value(y));
        if let (Some(a), Some(c)) = (cx, cy) {
            return self.constant(b.apply(a, c), dtype);
        }
        if let Some(id) = self.fold_binary(b, x, y, cx, cy, dtype) {
            return id;
        }
        self.intern(Op::Binary(b), smallvec::smallvec![x, y], dtype, axes)
    }

    /// Algebraic identities; `None` when none applies. A rewrite to an operand is
    /// only taken when it keeps the node's dtype and axes.
    fn fold_binary(
        &mut self,
        b: Binary,
        x: NodeId,
        y: NodeId,
        cx: Option<f64>,
        cy: Option<f64>,
        dtype: DType,
    ) -> Option<NodeId> {
        let axes = self.node(x).axes.union(self.node(y).axes);
        let keeps = |g: &Graph, id: NodeId| g.node(id).dtype == dtype && g.node(id).axes == axes;
        let exact = match (b, cx, cy) {
            (Binary::Add, Some(0.0), _) => Some(y),
            (Binary::Add | Binary::Sub, _, Some(0.0)) => Some(x),
            (Binary::Mul, Some(1.0), _) => Some(y),
            (Binary::Mul | Binary::Div, _, Some(1.0)) => Some(x),
            (Binary::Sub, Some(0.0), _) => return Some(self.unary(Unary::Neg, y)),
            _ => None,
        };
        if let Some(id) = exact.filter(|&id| keeps(self, id)) {
            return Some(id);
        }
        if self.fold != Fold::AssumeFinite {
            return None;
        }
        let ninf = f64::NEG_INFINITY;
        let inf = f64::INFINITY;
        let finite = match (b, cx, cy) {
            (Binary::Mul, Some(c), _) | (Binary::Mul, _, Some(c)) if c == 0.0 => {
                return Some(self.constant(0.0, dtype));
            }
            (Binary::Div, Some(0.0), _) => return Some(self.constant(0.0, dtype)),
            (Binary::Max, Some(c), _) if c == ninf => Some(y),
            (Binary::Max, _, Some(c)) if c == ninf => Some(x),
            (Binary::Min, Some(c), _) if c == inf => Some(y),
            (Binary::Min, _, Some(c)) if c == inf => Some(x),
            (Binary::Sub | Binary::Add, Some(c), _) if c.is_infinite() => {
                return Some(self.constant(c, dtype));
            }
            (Binary::Sub, _, Some(c)) if c.is_infinite() => return Some(self.constant(-c, dtype)),
            (Binary::Add, _, Some(c)) if c.is_infinite() => return Some(self.constant(c, dtype)),
            _ => None,
        };
        finite.filter(|&id| keeps(self, id))
    }

    pub fn select(&mut self, c: NodeId, a: NodeId, b: NodeId) -> NodeId {
        let (an, bn) = (self.node(a), self.node(b));
        let dtype = if an.dtype == bn.dtype {
            an.dtype
        } else {
            DType::F32
        };
        let axes = self.node(c).axes.union(an.axes).union(bn.axes);
        if let Some(cv) = self.const_value(c) {
            let pick = if cv != 0.0 { a } else { b };
            if self.node(pick).dtype == dtype && self.node(pick).axes == axes {
                return pick;
            }
        }
        if a == b && self.node(a).axes == axes {
            return a;
        }
        self.intern(Op::Select, smallvec::smallvec![c, a, b], dtype, axes)
    }

    /// Reads custom input `custom` (broadcast over `axes`) at integer indices.
    pub fn gather(&mut self, custom: u32, axes: AxisSet, indices: &[NodeId]) -> NodeId {
        let axes = indices
            .iter()
            .fold(axes, |acc, i| acc.union(self.node(*i).axes));
        self.intern(
            Op::Gather(custom),
            indices.iter().copied().collect(),
            DType::F32,
            axes,
        )
    }

    pub fn reduce(&mut self, r: Reduce, x: NodeId) -> NodeId {
        let axes = self.node(x).axes.without(self.reduce_axis);
        self.intern(Op::Reduce(r), smallvec::smallvec![x], DType::F32, axes)
    }

    /// Rebuilds an operation of another graph here, on already-mapped operands.
    pub fn rebuild(&mut self, node: &Node, args: &[NodeId]) -> NodeId {
        match node.op {
            Op::Const(c) => self.constant(c.get(), node.dtype),
            Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) => {
                self.leaf(node.op, node.dtype, node.axes)
            }
            Op::Unary(u) => self.unary(u, args[0]),
            Op::Binary(b) => self.binary(b, args[0], args[1]),
            Op::Select => self.select(args[0], args[1], args[2]),
            Op::Reduce(r) => self.reduce(r, args[0]),
            Op::Gather(c) => self.gather(c, node.axes, args),
        }
    }

    /// Copies the nodes of `src` that `roots` depend on into `self`, replacing
    /// each source node for which `subst` answers `Some`. Returns the images of
    /// the roots. Folding of `self` applies to the copied nodes.
    pub fn import(
        &mut self,
        src: &Graph,
        roots: &[NodeId],
        mut subst: impl FnMut(&mut Graph, NodeId, &Node) -> Option<NodeId>,
    ) -> Vec<NodeId> {
        let live = src.live(roots);
        let mut map: Vec<Option<NodeId>> = vec![None; src.len()];
        for id in src.ids() {
            if !live[id.index()] {
                continue;
            }
            let node = src.node(id);
            let image = match subst(self, id, node) {
                Some(n) => n,
                None => {
                    let args: Args = node
                        .args
                        .iter()
                        .map(|a| map[a.index()].expect("operands precede users"))
                        .collect();
                    self.rebuild(node, &args)
                }
            };
            map[id.index()] = Some(image);
        }
        roots
            .iter()
            .map(|r| map[r.index()].expect("root is live"))
            .collect()
    }

    /// Which nodes the roots depend on (themselves included).
    pub fn live(&self, roots: &[NodeId]) -> Vec<bool> {
        let mut live = vec![false; self.len()];
        for r in roots {
            live[r.index()] = true;
        }
        for id in self.ids().rev() {
            if live[id.index()] {
                for a in &self.node(id).args {
                    live[a.index()] = true;
                }
            }
        }
        live
    }

    /// Whether `id` depends on any node for which `pred` holds.
    pub fn depends_on(&self, id: NodeId, pred: impl Fn(&Node) -> bool) -> bool {
        let live = self.live(&[id]);
        self.ids().any(|n| live[n.index()] && pred(self.node(n)))
    }

    /// Checks the structural invariants: operands precede users, arities, and
    /// that every node's dtype and axes are what its operation gives.
    pub fn validate(&self) -> Result<(), String> {
        for id in self.ids() {
            let mut check = Graph::new(Fold::Exact, self.reduce_axis);
            let n = self.node(id);
            if n.args.iter().any(|a| a.index() >= id.index()) {
                return Err(format!("{id}: an operand does not precede its user"));
            }
            let arity = match n.op {
                Op::Const(_) | Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) => 0,
                Op::Unary(_) | Op::Reduce(_) => 1,
                Op::Binary(_) => 2,
                Op::Select => 3,
                Op::Gather(_) => n.args.len().max(1),
            };
            if n.args.len() != arity {
                return Err(format!("{id}: {:?} takes {arity} operands", n.op));
            }
            if let Op::Reduce(_) = n.op
                && !self.node(n.args[0]).axes.contains(self.reduce_axis)
            {
                return Err(format!(
                    "{id}: reduces a value that does not vary over {}",
                    self.reduce_axis
                ));
            }
            // Recompute the type on fresh leaves carrying the operands' types.
            let args: Args = n
                .args
                .iter()
                .enumerate()
                .map(|(k, a)| {
                    let an = self.node(*a);
                    check.leaf(Op::Param(k as u32), an.dtype, an.axes)
                })
                .collect();
            let again = check.rebuild(n, &args);
            let expect = check.node(again);
            if (expect.dtype, expect.axes) != (n.dtype, n.axes) {
                return Err(format!(
                    "{id}: stored type {} {} but the operation gives {} {}",
                    n.dtype, n.axes, expect.dtype, expect.axes
                ));
            }
        }
        Ok(())
    }
}
