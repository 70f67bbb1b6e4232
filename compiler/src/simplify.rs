//! Simplification of regions with equality saturation (`egg`).
//!
//! Only f32 arithmetic enters the e-graph; integer and boolean subexpressions
//! (index arithmetic, comparisons) are opaque leaves and come back unchanged.
//! Rules are directional and bounded (node, iteration and time limits; the
//! stop reason is reported). Rules that assume finite operands (`x − x → 0`,
//! `0·x → 0`) run only on regions built with [`Fold::AssumeFinite`] — the
//! derived backward regions — never on the user's forward closures.
//!
//! The cost model prices special-function-unit work (exp, log, tanh…) and
//! divisions above FMA-class operations and row reductions (cross-lane
//! shuffles) above both, so extraction prefers `exp2` with `log2 e` folded
//! into a multiply and factors row-scalars out of reductions.

use aec_frontend::ir::{
    Axis, AxisSet, Binary, DType, Fold, Graph, NodeId, Op, Reduce, Region, Unary,
};
use egg::{
    Analysis, CostFunction, DidMerge, EGraph, Extractor, Id, Language, Pattern, RecExpr, Rewrite,
    Runner, StopReason, Subst, Symbol, Var, define_language,
};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// An f64 constant for the e-graph, ordered and hashed by bits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Constant(u64);

impl Constant {
    pub fn new(v: f64) -> Constant {
        Constant(if v == 0.0 { 0 } else { v.to_bits() })
    }
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl fmt::Display for Constant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.get())
    }
}

impl FromStr for Constant {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "inf" => Ok(Constant::new(f64::INFINITY)),
            "-inf" => Ok(Constant::new(f64::NEG_INFINITY)),
            _ => s.parse::<f64>().map(Constant::new).map_err(|_| ()),
        }
    }
}

define_language! {
    /// The f32 arithmetic of a region.
    pub enum Math {
        "+" = Add([Id; 2]),
        "-" = Sub([Id; 2]),
        "*" = Mul([Id; 2]),
        "/" = Div([Id; 2]),
        "max" = Max([Id; 2]),
        "min" = Min([Id; 2]),
        "pow" = Pow([Id; 2]),
        "neg" = Neg([Id; 1]),
        "exp" = Exp([Id; 1]),
        "exp2" = Exp2([Id; 1]),
        "log" = Log([Id; 1]),
        "log2" = Log2([Id; 1]),
        "sqrt" = Sqrt([Id; 1]),
        "rsqrt" = Rsqrt([Id; 1]),
        "tanh" = Tanh([Id; 1]),
        "sigmoid" = Sigmoid([Id; 1]),
        "relu" = Relu([Id; 1]),
        "abs" = Abs([Id; 1]),
        "select" = Select([Id; 3]),
        "rowsum" = RowSum([Id; 1]),
        "rowmax" = RowMax([Id; 1]),
        "rowabssum" = RowAbsSum([Id; 1]),
        Num(Constant),
        Leaf(Symbol),
    }
}

/// The analysis: leaf axes and the leaves known to be ≥ 0 in, per-class
/// facts out.
#[derive(Debug, Default)]
pub struct Facts {
    leaf_axes: HashMap<Symbol, AxisSet>,
    nonneg_leaves: std::collections::HashSet<Symbol>,
}

/// Per e-class: the axes its value may vary over, its constant value and
/// whether it is known to be ≥ 0 (or NaN).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassData {
    pub axes: AxisSet,
    pub constant: Option<f64>,
    pub nonneg: bool,
}

fn apply_unary(u: Unary, x: f64) -> f64 {
    u.apply(x)
}

impl Analysis<Math> for Facts {
    type Data = ClassData;

    fn make(egraph: &mut EGraph<Math, Self>, enode: &Math, _id: Id) -> ClassData {
        let d = |id: &Id| &egraph[*id].data;
        let axes = match enode {
            Math::Leaf(s) => egraph
                .analysis
                .leaf_axes
                .get(s)
                .copied()
                .unwrap_or_default(),
            Math::Num(_) => AxisSet::EMPTY,
            Math::RowSum([x]) | Math::RowMax([x]) | Math::RowAbsSum([x]) => {
                d(x).axes.without(Axis::Skv)
            }
            other => other
                .children()
                .iter()
                .fold(AxisSet::EMPTY, |acc, c| acc.union(d(c).axes)),
        };
        let nn = |id: &Id| d(id).nonneg;
        let nonneg = match enode {
            Math::Num(n) => n.get() >= 0.0,
            Math::Leaf(s) => egraph.analysis.nonneg_leaves.contains(s),
            Math::Exp(_)
            | Math::Exp2(_)
            | Math::Sigmoid(_)
            | Math::Relu(_)
            | Math::Abs(_)
            | Math::Sqrt(_)
            | Math::Rsqrt(_)
            | Math::RowAbsSum(_) => true,
            Math::Add([a, b]) | Math::Mul([a, b]) | Math::Div([a, b]) | Math::Min([a, b]) => {
                nn(a) && nn(b)
            }
            Math::Max([a, b]) => nn(a) || nn(b),
            Math::Pow([a, _]) | Math::RowSum([a]) | Math::RowMax([a]) => nn(a),
            Math::Select([_, a, b]) => nn(a) && nn(b),
            Math::Sub(_) | Math::Neg(_) | Math::Log(_) | Math::Log2(_) | Math::Tanh(_) => false,
        };
        let c = |id: &Id| d(id).constant;
        let constant = match enode {
            Math::Num(n) => Some(n.get()),
            Math::Add([a, b]) => c(a).zip(c(b)).map(|(x, y)| x + y),
            Math::Sub([a, b]) => c(a).zip(c(b)).map(|(x, y)| x - y),
            Math::Mul([a, b]) => c(a).zip(c(b)).map(|(x, y)| x * y),
            Math::Div([a, b]) => c(a).zip(c(b)).map(|(x, y)| x / y),
            Math::Max([a, b]) => c(a).zip(c(b)).map(|(x, y)| Binary::Max.apply(x, y)),
            Math::Min([a, b]) => c(a).zip(c(b)).map(|(x, y)| Binary::Min.apply(x, y)),
            Math::Pow([a, b]) => c(a).zip(c(b)).map(|(x, y)| x.powf(y)),
            Math::Neg([a]) => c(a).map(|x| -x),
            Math::Exp([a]) => c(a).map(|x| apply_unary(Unary::Exp, x)),
            Math::Exp2([a]) => c(a).map(|x| apply_unary(Unary::Exp2, x)),
            Math::Log([a]) => c(a).map(|x| apply_unary(Unary::Log, x)),
            Math::Log2([a]) => c(a).map(|x| apply_unary(Unary::Log2, x)),
            Math::Sqrt([a]) => c(a).map(|x| apply_unary(Unary::Sqrt, x)),
            Math::Rsqrt([a]) => c(a).map(|x| apply_unary(Unary::Rsqrt, x)),
            Math::Tanh([a]) => c(a).map(|x| apply_unary(Unary::Tanh, x)),
            Math::Sigmoid([a]) => c(a).map(|x| apply_unary(Unary::Sigmoid, x)),
            Math::Relu([a]) => c(a).map(|x| apply_unary(Unary::Relu, x)),
            Math::Abs([a]) => c(a).map(|x| apply_unary(Unary::Abs, x)),
            _ => None,
        };
        ClassData {
            axes,
            constant: constant.filter(|v| v.is_finite()),
            nonneg,
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        // Equal values vary over at most the axes both forms vary over.
        let axes = a.axes.minus(a.axes.minus(b.axes));
        let constant = a.constant.or(b.constant);
        // Equal values: what one form proves holds for both.
        let nonneg = a.nonneg || b.nonneg;
        let changed_a = axes != a.axes || constant != a.constant || nonneg != a.nonneg;
        let changed_b = axes != b.axes || constant != b.constant || nonneg != b.nonneg;
        a.axes = axes;
        a.constant = constant;
        a.nonneg = nonneg;
        DidMerge(changed_a, changed_b)
    }

    fn modify(egraph: &mut EGraph<Math, Self>, id: Id) {
        if let Some(c) = egraph[id].data.constant {
            let n = egraph.add(Math::Num(Constant::new(c)));
            egraph.union(id, n);
        }
    }
}

/// Which operands a rule assumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assumes {
    /// Holds for all real values (up to rounding).
    Nothing,
    /// Needs finite operands: only for `Fold::AssumeFinite` regions.
    Finite,
}

/// A rule with the condition its applier checks, for the tests.
#[derive(Debug)]
pub struct Rule {
    pub rewrite: Rewrite<Math, Facts>,
    pub lhs: &'static str,
    pub rhs: &'static str,
    pub assumes: Assumes,
    /// Pattern variables that must not vary along the row (`Skv`).
    pub row_constant: &'static [&'static str],
    /// Pattern variables that must be constants above zero.
    pub positive: &'static [&'static str],
    /// Pattern variables that must be row constants known to be ≥ 0 and not
    /// constants (a state field's proven sign, see [`simplify_region_knowing`]).
    pub nonneg: &'static [&'static str],
}

/// A rule condition: `holds` for the class of every one of `vars`.
fn every_class(
    vars: &'static [&'static str],
    holds: fn(&ClassData) -> bool,
) -> impl Fn(&mut EGraph<Math, Facts>, Id, &Subst) -> bool {
    let vars: Vec<Var> = vars
        .iter()
        .map(|v| v.parse().expect("pattern variable"))
        .collect();
    move |eg, _, subst| vars.iter().all(|v| holds(&eg[subst[*v]].data))
}

fn not_along_row(data: &ClassData) -> bool {
    !data.axes.contains(Axis::Skv)
}

fn positive_constant(data: &ClassData) -> bool {
    data.constant.is_some_and(|c| c > 0.0)
}

fn nonneg_row_value(data: &ClassData) -> bool {
    not_along_row(data) && data.nonneg && data.constant.is_none()
}

macro_rules! rules {
    ($( $name:literal : $lhs:literal => $rhs:literal $(, assumes $a:ident)? $(, row_constant $($rc:literal),+)? $(, positive $($pc:literal),+)? $(, nonneg $($nc:literal),+)? ;)*) => {
        vec![$({
            let row_constant: &'static [&'static str] = &[$($($rc),+)?];
            let positive: &'static [&'static str] = &[$($($pc),+)?];
            let nonneg: &'static [&'static str] = &[$($($nc),+)?];
            let assumes = rules!(@assumes $($a)?);
            let lhs: Pattern<Math> = $lhs.parse().expect("rule lhs");
            let rhs: Pattern<Math> = $rhs.parse().expect("rule rhs");
            let rewrite = if !nonneg.is_empty() {
                Rewrite::new($name, lhs, egg::ConditionalApplier { condition: every_class(nonneg, nonneg_row_value), applier: rhs })
                    .expect("valid rule")
            } else if !positive.is_empty() {
                Rewrite::new($name, lhs, egg::ConditionalApplier { condition: every_class(positive, positive_constant), applier: rhs })
                    .expect("valid rule")
            } else if row_constant.is_empty() {
                Rewrite::new($name, lhs, rhs).expect("valid rule")
            } else {
                Rewrite::new($name, lhs, egg::ConditionalApplier { condition: every_class(row_constant, not_along_row), applier: rhs })
                    .expect("valid rule")
            };
            Rule { rewrite, lhs: $lhs, rhs: $rhs, assumes, row_constant, positive, nonneg }
        }),*]
    };
    (@assumes) => { Assumes::Nothing };
    (@assumes Finite) => { Assumes::Finite };
}

/// Every rule, in one table: name, left side, right side, assumptions.
pub fn rules() -> Vec<Rule> {
    rules! {
        "add-comm": "(+ ?a ?b)" => "(+ ?b ?a)";
        "mul-comm": "(* ?a ?b)" => "(* ?b ?a)";
        "add-assoc": "(+ (+ ?a ?b) ?c)" => "(+ ?a (+ ?b ?c))";
        "mul-assoc": "(* (* ?a ?b) ?c)" => "(* ?a (* ?b ?c))";
        "add-zero": "(+ ?a 0.0)" => "?a";
        "mul-one": "(* ?a 1.0)" => "?a";
        "sub-zero": "(- ?a 0.0)" => "?a";
        "div-one": "(/ ?a 1.0)" => "?a";
        "neg-neg": "(neg (neg ?a))" => "?a";
        "sub-as-add": "(- ?a ?b)" => "(+ ?a (neg ?b))";
        "add-neg-as-sub": "(+ ?a (neg ?b))" => "(- ?a ?b)";
        "mul-neg": "(* ?a (neg ?b))" => "(neg (* ?a ?b))";
        "neg-mul": "(neg (* ?a ?b))" => "(* (neg ?a) ?b)";
        "mul-recip": "(* ?a (/ 1.0 ?b))" => "(/ ?a ?b)";
        "div-div": "(/ (/ ?a ?b) ?c)" => "(/ ?a (* ?b ?c))";
        "mul-div": "(* ?a (/ ?b ?c))" => "(/ (* ?a ?b) ?c)";
        "distribute": "(* ?a (+ ?b ?c))" => "(+ (* ?a ?b) (* ?a ?c))";
        "factor": "(+ (* ?a ?b) (* ?a ?c))" => "(* ?a (+ ?b ?c))";
        "exp-add": "(* (exp ?a) (exp ?b))" => "(exp (+ ?a ?b))";
        "exp-sub": "(/ (exp ?a) (exp ?b))" => "(exp (- ?a ?b))";
        "log-exp": "(log (exp ?a))" => "?a";
        "exp-to-exp2": "(exp ?a)" => "(exp2 (* ?a 1.4426950408889634))";
        "select-same": "(select ?c ?a ?a)" => "?a";
        "max-same": "(max ?a ?a)" => "?a";
        "rowsum-add": "(rowsum (+ ?a ?b))" => "(+ (rowsum ?a) (rowsum ?b))";
        "rowsum-neg": "(rowsum (neg ?a))" => "(neg (rowsum ?a))";
        "rowsum-factor": "(rowsum (* ?a ?b))" => "(* ?a (rowsum ?b))", row_constant "?a";
        "rowsum-div": "(rowsum (/ ?a ?b))" => "(/ (rowsum ?a) ?b)", row_constant "?b";
        // A positive factor keeps the order of the row (a Q scale moved onto
        // the scores, `q_scale`).
        "rowmax-factor": "(rowmax (* ?a ?b))" => "(* ?a (rowmax ?b))", positive "?a";
        "mul-zero": "(* ?a 0.0)" => "0.0", assumes Finite;
        "sub-self": "(- ?a ?a)" => "0.0", assumes Finite;
        "add-neg-self": "(+ ?a (neg ?a))" => "0.0", assumes Finite;
        "div-mul-cancel": "(/ (* ?a ?b) ?b)" => "?a", assumes Finite;
        "mul-div-cancel": "(* (/ ?a ?b) ?b)" => "?a", assumes Finite;
        "zero-div": "(/ 0.0 ?a)" => "0.0", assumes Finite;
        "zero-sub": "(- 0.0 ?a)" => "(neg ?a)";
        "neg-div": "(/ (neg ?a) ?b)" => "(neg (/ ?a ?b))";
        "minus-one-div": "(/ -1.0 ?b)" => "(neg (/ 1.0 ?b))";
        "div-cancel-left": "(/ ?a (* ?a ?b))" => "(/ 1.0 ?b)", assumes Finite;
        "div-by-ratio": "(/ ?a (/ ?a ?b))" => "?b", assumes Finite;
        "div-as-recip": "(/ ?a ?b)" => "(* ?a (/ 1.0 ?b))", row_constant "?b";
        // A row factor ≥ 0 of an exponential moves into its exponent, where
        // it joins the row's other terms (softmax's P = exp2(a·s − m′) / l
        // then needs one row constant, not two). Exact at 0 and +inf too.
        "exp2-absorb": "(* ?c (exp2 ?x))" => "(exp2 (+ ?x (log2 ?c)))", nonneg "?c";
    }
}

/// Instruction-cost estimate: FMA-class 1, division 4, SFU 4–8, row reductions 12.
#[derive(Debug, Clone, Copy)]
pub struct GpuCost;

impl CostFunction<Math> for GpuCost {
    type Cost = f64;
    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &Math, mut costs: C) -> f64 {
        let own = match enode {
            Math::Num(_) | Math::Leaf(_) => 0.0,
            Math::Add(_)
            | Math::Sub(_)
            | Math::Mul(_)
            | Math::Neg(_)
            | Math::Max(_)
            | Math::Min(_) => 1.0,
            Math::Select(_) | Math::Relu(_) | Math::Abs(_) => 1.0,
            Math::Div(_) => 4.0,
            Math::Exp2(_) => 4.0,
            Math::Exp(_) | Math::Log(_) | Math::Log2(_) | Math::Sqrt(_) | Math::Rsqrt(_) => 6.0,
            Math::Tanh(_) | Math::Sigmoid(_) => 8.0,
            Math::Pow(_) => 12.0,
            Math::RowSum(_) | Math::RowMax(_) | Math::RowAbsSum(_) => 12.0,
        };
        enode.fold(own, |acc, id| acc + costs(id))
    }
}

/// [`GpuCost`] with hoisting: an operation whose value does not vary along
/// the row (`Skv`) runs once per row, not once per score, so it costs a
/// twentieth. This is what makes `x / l` → `x · (1 / l)` pay: the reciprocal
/// is a row constant.
struct HoistCost<'a> {
    egraph: &'a EGraph<Math, Facts>,
}

impl CostFunction<Math> for HoistCost<'_> {
    type Cost = f64;
    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &Math, mut costs: C) -> f64 {
        let axes = match enode {
            Math::Leaf(s) => self
                .egraph
                .analysis
                .leaf_axes
                .get(s)
                .copied()
                .unwrap_or_default(),
            Math::Num(_) => AxisSet::EMPTY,
            Math::RowSum(_) | Math::RowMax(_) | Math::RowAbsSum(_) => AxisSet::EMPTY,
            other => other.children().iter().fold(AxisSet::EMPTY, |acc, c| {
                acc.union(self.egraph[*c].data.axes)
            }),
        };
        let own = GpuCost.cost(enode, |_| 0.0);
        let own = if axes.contains(Axis::Skv) {
            own
        } else {
            own / 20.0
        };
        enode.fold(own, |acc, id| acc + costs(id))
    }
}

/// What a simplification did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Tree cost (shared subexpressions counted at each use) of the outputs.
    pub cost_before: f64,
    pub cost_after: f64,
    pub egraph_nodes: usize,
    pub iterations: usize,
    /// Saturated, or which limit stopped the search.
    pub stop: String,
}

/// Limits of one saturation run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub nodes: usize,
    pub iterations: usize,
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            nodes: 20_000,
            iterations: 24,
            time: Duration::from_secs(2),
        }
    }
}

/// The nodes of `g` that `roots` need, as an e-graph: f32 arithmetic as
/// `Math` nodes, everything else (params, indices, integer and boolean
/// subexpressions) as opaque leaves named after their node id.
struct Loaded {
    egraph: EGraph<Math, Facts>,
    class_of: HashMap<NodeId, Id>,
    leaves: HashMap<Symbol, NodeId>,
}

/// (Leaves that are params in `nonneg` are known to be ≥ 0.)
fn load(g: &Graph, roots: &[NodeId], nonneg: &[u32]) -> Loaded {
    let live = g.live(roots);
    let mut egraph: EGraph<Math, Facts> = EGraph::new(Facts::default());
    let mut class_of: HashMap<NodeId, Id> = HashMap::new();
    let mut leaves: HashMap<Symbol, NodeId> = HashMap::new();
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let n = g.node(id);
        let enode = to_math(n, &class_of).filter(|_| n.dtype == DType::F32);
        let enode = match enode {
            Some(e) => e,
            None => {
                let sym = Symbol::from(format!("n{}", id.0));
                egraph.analysis.leaf_axes.insert(sym, n.axes);
                if matches!(n.op, Op::Param(k) if nonneg.contains(&k)) {
                    egraph.analysis.nonneg_leaves.insert(sym);
                }
                leaves.insert(sym, id);
                Math::Leaf(sym)
            }
        };
        class_of.insert(id, egraph.add(enode));
    }
    Loaded {
        egraph,
        class_of,
        leaves,
    }
}

/// The rules a graph folded with `fold` may use; the rules that need values
/// known ≥ 0 only with `signs` (they move a factor into an exponential,
/// which pays where one output holds the exponential alone and costs a
/// second exponential where two outputs share it: the extraction's tree
/// cost does not see sharing, so only callers that know ask for them).
fn rewrites_for(fold: Fold, signs: bool) -> Vec<Rewrite<Math, Facts>> {
    let assume_finite = fold == Fold::AssumeFinite;
    rules()
        .into_iter()
        .filter(|r| assume_finite || r.assumes == Assumes::Nothing)
        .filter(|r| signs || r.nonneg.is_empty())
        .map(|r| r.rewrite)
        .collect()
}

fn runner(egraph: EGraph<Math, Facts>, limits: Limits) -> Runner<Math, Facts> {
    Runner::default()
        .with_egraph(egraph)
        .with_node_limit(limits.nodes)
        .with_iter_limit(limits.iterations)
        .with_time_limit(limits.time)
}

/// Prices like [`GpuCost`], but a leaf that varies along the row costs
/// infinitely much: what it extracts is constant along the row.
struct RowConstantCost<'a> {
    leaf_axes: &'a HashMap<Symbol, AxisSet>,
}

impl CostFunction<Math> for RowConstantCost<'_> {
    type Cost = f64;
    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &Math, costs: C) -> f64 {
        if let Math::Leaf(s) = enode
            && self.leaf_axes.get(s).is_some_and(|a| a.contains(Axis::Skv))
        {
            return f64::INFINITY;
        }
        GpuCost.cost(enode, costs)
    }
}

/// If `num / den` (two nodes of `g`) is provably constant along the row under
/// the rule table (with `g`'s fold assumptions), builds that row constant in
/// `out` — leaves are copied from `g`, so `out` must number params as `g`
/// does — and returns it. `None` when no row-constant form was found.
pub fn row_constant_ratio(
    g: &Graph,
    num: NodeId,
    den: NodeId,
    out: &mut Graph,
    limits: Limits,
) -> Option<NodeId> {
    let Loaded {
        mut egraph,
        class_of,
        leaves,
    } = load(g, &[num, den], &[]);
    let ratio = egraph.add(Math::Div([class_of[&num], class_of[&den]]));
    let runner = runner(egraph, limits).run(&rewrites_for(g.fold(), false));
    let eg = &runner.egraph;
    if eg[eg.find(ratio)].data.axes.contains(Axis::Skv) {
        return None;
    }
    let cost = RowConstantCost {
        leaf_axes: &eg.analysis.leaf_axes,
    };
    let (c, expr) = Extractor::new(eg, cost).find_best(eg.find(ratio));
    c.is_finite().then(|| from_math(&expr, out, g, &leaves))
}

/// Prices like [`HoistCost`], but a leaf in `forbidden` costs infinitely
/// much: what it extracts reads none of them.
struct AvoidingCost<'a> {
    egraph: &'a EGraph<Math, Facts>,
    forbidden: &'a std::collections::HashSet<Symbol>,
}

impl CostFunction<Math> for AvoidingCost<'_> {
    type Cost = f64;
    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &Math, costs: C) -> f64 {
        if let Math::Leaf(s) = enode
            && self.forbidden.contains(s)
        {
            return f64::INFINITY;
        }
        HoistCost {
            egraph: self.egraph,
        }
        .cost(enode, costs)
    }
}

/// `root` (a node of `g`) rewritten through `via`, a subterm whose value the
/// caller already holds: builds in `out` an expression equal to `root` (under
/// the rule table and `g`'s fold assumptions) in which `via_leaf` (a node of
/// `out`) stands for `via`'s value and no leaf of `g` for which `avoid` holds
/// appears. Other leaves are copied from `g`, so `out` must number params as
/// `g` does. `None` when the rules find no such form.
///
/// The backward's `dS` through the recomputed weight `P` is this: for softmax
/// `dS = P·(dP − δ)·scale` no longer reads the score, so `P` can be formed
/// while the `dP` GEMM still runs.
pub fn express_through(
    g: &Graph,
    root: NodeId,
    via: NodeId,
    avoid: impl Fn(&Graph, NodeId) -> bool,
    out: &mut Graph,
    via_leaf: NodeId,
    limits: Limits,
) -> Option<NodeId> {
    let Loaded {
        mut egraph,
        class_of,
        mut leaves,
    } = load(g, &[root, via], &[]);
    let forbidden: std::collections::HashSet<Symbol> = leaves
        .iter()
        .filter(|(_, id)| avoid(g, **id))
        .map(|(s, _)| *s)
        .collect();
    // A leaf named after no node id: the held value of `via`.
    let held = Symbol::from("held");
    egraph.analysis.leaf_axes.insert(held, g.node(via).axes);
    let held_class = egraph.add(Math::Leaf(held));
    egraph.union(held_class, class_of[&via]);
    egraph.rebuild();
    let runner = runner(egraph, limits).run(&rewrites_for(g.fold(), false));
    let eg = &runner.egraph;
    let cost = AvoidingCost {
        egraph: eg,
        forbidden: &forbidden,
    };
    let (c, expr) = Extractor::new(eg, cost).find_best(eg.find(class_of[&root]));
    if !c.is_finite() {
        return None;
    }
    leaves.remove(&held);
    let mut fixed = HashMap::new();
    fixed.insert(held, via_leaf);
    Some(from_math_with(&expr, out, g, &leaves, &fixed))
}

/// Whether `root` (a node of `g`) is ≥ 0 (or NaN) for every value of its
/// leaves, by the analysis the rules' conditions read.
pub fn provably_nonneg(g: &Graph, root: NodeId) -> bool {
    let Loaded {
        egraph, class_of, ..
    } = load(g, &[root], &[]);
    egraph[class_of[&root]].data.nonneg
}

/// Simplifies every output of a region; the result evaluates to the same
/// values (up to rounding, under the region's fold assumptions).
pub fn simplify_region(region: &Region, limits: Limits) -> (Region, Report) {
    simplify_with(region, limits, &[], false)
}

/// [`simplify_region`], knowing that the params in `nonneg` are ≥ 0 (the
/// saved state fields the forward computed as sums of exponentials, say),
/// with the rules that need signs (`exp2-absorb`).
pub fn simplify_region_knowing(
    region: &Region,
    limits: Limits,
    nonneg: &[u32],
) -> (Region, Report) {
    simplify_with(region, limits, nonneg, true)
}

fn simplify_with(region: &Region, limits: Limits, nonneg: &[u32], signs: bool) -> (Region, Report) {
    let g = &region.graph;
    let roots: Vec<NodeId> = region.outputs.iter().map(|o| o.node).collect();
    let live = g.live(&roots);
    let Loaded {
        mut egraph,
        class_of,
        leaves,
    } = load(g, &roots, nonneg);
    let rewrites = rewrites_for(g.fold(), signs);
    let root_classes: Vec<Id> = roots.iter().map(|r| class_of[r]).collect();
    // `fact.<field>` outputs equal their state parameter (see the derivation).
    for o in &region.outputs {
        let Some(field) = o.name.strip_prefix("fact.") else {
            continue;
        };
        let param = region.param_index(&aec_frontend::ir::ParamRole::State(field.to_string()));
        let leaf = param.and_then(|p| {
            g.ids()
                .find(|id| g.node(*id).op == Op::Param(p) && live[id.index()])
        });
        if let Some(leaf) = leaf {
            egraph.union(class_of[&o.node], class_of[&leaf]);
        }
    }
    egraph.rebuild();
    // Tree costs before and after, by the same extractor, so they compare.
    let cost_before: f64 = {
        let ex = Extractor::new(&egraph, HoistCost { egraph: &egraph });
        root_classes.iter().map(|c| ex.find_best_cost(*c)).sum()
    };
    let runner = runner(egraph, limits).run(&rewrites);
    let stop = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".to_string(),
        Some(other) => format!("{other:?}"),
        None => "not run".to_string(),
    };
    let extractor = Extractor::new(
        &runner.egraph,
        HoistCost {
            egraph: &runner.egraph,
        },
    );
    let mut out = Graph::new(g.fold(), g.reduce_axis());
    let mut cost_after = 0.0;
    let mut images = Vec::new();
    for class in &root_classes {
        let (cost, expr) = extractor.find_best(*class);
        cost_after += cost;
        images.push(from_math(&expr, &mut out, g, &leaves));
    }
    let mut simplified = Region {
        graph: out,
        ..region.clone()
    };
    for (o, img) in simplified.outputs.iter_mut().zip(images) {
        o.node = img;
    }
    simplified.compact();
    let report = Report {
        cost_before,
        cost_after,
        egraph_nodes: runner.egraph.total_number_of_nodes(),
        iterations: runner.iterations.len(),
        stop,
    };
    (simplified, report)
}

fn to_math(n: &aec_frontend::ir::Node, class_of: &HashMap<NodeId, Id>) -> Option<Math> {
    let a = |k: usize| class_of.get(&n.args[k]).copied();
    Some(match n.op {
        Op::Const(c) => Math::Num(Constant::new(c.get())),
        Op::Param(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) | Op::Gather(_) => return None,
        Op::Unary(u) => {
            let x = [a(0)?];
            match u {
                Unary::Neg => Math::Neg(x),
                Unary::Exp => Math::Exp(x),
                Unary::Exp2 => Math::Exp2(x),
                Unary::Log => Math::Log(x),
                Unary::Log2 => Math::Log2(x),
                Unary::Sqrt => Math::Sqrt(x),
                Unary::Rsqrt => Math::Rsqrt(x),
                Unary::Tanh => Math::Tanh(x),
                Unary::Sigmoid => Math::Sigmoid(x),
                Unary::Relu => Math::Relu(x),
                Unary::Abs => Math::Abs(x),
                Unary::Sign | Unary::Not => return None,
            }
        }
        Op::Binary(b) => {
            let xy = [a(0)?, a(1)?];
            match b {
                Binary::Add => Math::Add(xy),
                Binary::Sub => Math::Sub(xy),
                Binary::Mul => Math::Mul(xy),
                Binary::Div => Math::Div(xy),
                Binary::Max => Math::Max(xy),
                Binary::Min => Math::Min(xy),
                Binary::Pow => Math::Pow(xy),
                _ => return None,
            }
        }
        Op::Select => Math::Select([a(0)?, a(1)?, a(2)?]),
        Op::Reduce(r) => {
            let x = [a(0)?];
            match r {
                Reduce::Sum => Math::RowSum(x),
                Reduce::Max => Math::RowMax(x),
                Reduce::AbsSum => Math::RowAbsSum(x),
            }
        }
    })
}

/// Rebuilds an extracted expression in `out`; leaves copy their original
/// subgraph from `src`.
fn from_math(
    expr: &RecExpr<Math>,
    out: &mut Graph,
    src: &Graph,
    leaves: &HashMap<Symbol, NodeId>,
) -> NodeId {
    from_math_with(expr, out, src, leaves, &HashMap::new())
}

/// [`from_math`], with the leaves in `fixed` standing for nodes of `out`.
fn from_math_with(
    expr: &RecExpr<Math>,
    out: &mut Graph,
    src: &Graph,
    leaves: &HashMap<Symbol, NodeId>,
    fixed: &HashMap<Symbol, NodeId>,
) -> NodeId {
    let mut ids: Vec<NodeId> = Vec::with_capacity(expr.as_ref().len());
    for node in expr.as_ref() {
        let c = |k: usize| ids[usize::from(node.children()[k])];
        let id = match node {
            Math::Num(v) => out.f32(v.get()),
            Math::Leaf(s) => match fixed.get(s) {
                Some(id) => *id,
                None => out.import(src, &[leaves[s]], |_, _, _| None)[0],
            },
            Math::Add(_) => out.binary(Binary::Add, c(0), c(1)),
            Math::Sub(_) => out.binary(Binary::Sub, c(0), c(1)),
            Math::Mul(_) => out.binary(Binary::Mul, c(0), c(1)),
            Math::Div(_) => out.binary(Binary::Div, c(0), c(1)),
            Math::Max(_) => out.binary(Binary::Max, c(0), c(1)),
            Math::Min(_) => out.binary(Binary::Min, c(0), c(1)),
            Math::Pow(_) => out.binary(Binary::Pow, c(0), c(1)),
            Math::Neg(_) => out.unary(Unary::Neg, c(0)),
            Math::Exp(_) => out.unary(Unary::Exp, c(0)),
            Math::Exp2(_) => out.unary(Unary::Exp2, c(0)),
            Math::Log(_) => out.unary(Unary::Log, c(0)),
            Math::Log2(_) => out.unary(Unary::Log2, c(0)),
            Math::Sqrt(_) => out.unary(Unary::Sqrt, c(0)),
            Math::Rsqrt(_) => out.unary(Unary::Rsqrt, c(0)),
            Math::Tanh(_) => out.unary(Unary::Tanh, c(0)),
            Math::Sigmoid(_) => out.unary(Unary::Sigmoid, c(0)),
            Math::Relu(_) => out.unary(Unary::Relu, c(0)),
            Math::Abs(_) => out.unary(Unary::Abs, c(0)),
            Math::Select(_) => out.select(c(0), c(1), c(2)),
            Math::RowSum(_) => out.reduce(Reduce::Sum, c(0)),
            Math::RowMax(_) => out.reduce(Reduce::Max, c(0)),
            Math::RowAbsSum(_) => out.reduce(Reduce::AbsSum, c(0)),
        };
        ids.push(id);
    }
    *ids.last().expect("non-empty expression")
}
