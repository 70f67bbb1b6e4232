//! Every primitive's derivative against central finite differences, and every
//! folding rule against evaluation, on random inputs.

use aec_frontend::autodiff::{Eval, grad};
use aec_frontend::ir::{Axis, AxisSet, Binary, DType, Fold, Graph, NodeId, Op, Reduce, Unary};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Evaluates node `y` of `g` with `Param(k)` bound to `xs[k]` (scalars).
fn eval(g: &Graph, y: NodeId, xs: &[f64]) -> f64 {
    let mut vals = vec![0.0; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        let a = |k: usize| vals[n.args[k].index()];
        vals[id.index()] = match n.op {
            Op::Const(c) => c.get(),
            Op::Param(p) => xs[p as usize],
            Op::Unary(u) => u.apply(a(0)),
            Op::Binary(b) => b.apply(a(0), a(1)),
            Op::Select => {
                if a(0) != 0.0 {
                    a(1)
                } else {
                    a(2)
                }
            }
            Op::Reduce(_) | Op::Index(_) | Op::Shape(_) | Op::Custom(_) | Op::Gather(_) => {
                unreachable!("scalar test graphs only")
            }
        };
        if id == y {
            break;
        }
    }
    vals[y.index()]
}

/// Domain of inputs on which the primitive is smooth.
fn sample(rng: &mut StdRng, positive: bool) -> f64 {
    let x: f64 = rng.random_range(0.2..1.8);
    if positive || rng.random_bool(0.5) {
        x
    } else {
        -x
    }
}

fn check_derivative(
    name: &str,
    build: impl Fn(&mut Graph, &[NodeId]) -> NodeId,
    arity: usize,
    positive: bool,
) {
    let mut rng = StdRng::seed_from_u64(name.len() as u64 * 7919);
    for _ in 0..20 {
        let mut g = Graph::new(Fold::Exact, Axis::Skv);
        let xs: Vec<NodeId> = (0..arity)
            .map(|k| g.leaf(Op::Param(k as u32), DType::F32, AxisSet::EMPTY))
            .collect();
        let y = build(&mut g, &xs);
        let seed = g.leaf(Op::Param(arity as u32), DType::F32, AxisSet::EMPTY);
        let grads = grad(&mut g, y, seed, &xs, Eval::Pointwise);
        g.validate()
            .unwrap_or_else(|e| panic!("{name}: invalid gradient graph: {e}"));
        let point: Vec<f64> = (0..arity).map(|_| sample(&mut rng, positive)).collect();
        let upstream = rng.random_range(0.5..1.5);
        for k in 0..arity {
            let mut at = point.clone();
            at.push(upstream);
            let analytic = grads[k].map(|d| eval(&g, d, &at)).unwrap_or(0.0);
            let eps = 1e-6;
            let (mut p, mut m) = (point.clone(), point.clone());
            p[k] += eps;
            m[k] -= eps;
            let fd = upstream * (eval(&g, y, &p) - eval(&g, y, &m)) / (2.0 * eps);
            let err = (fd - analytic).abs() / fd.abs().max(1.0);
            assert!(
                err < 1e-7,
                "{name}: d/dx{k} at {point:?}: finite difference {fd}, autodiff {analytic}"
            );
        }
    }
}

#[test]
fn unary_derivatives() {
    let cases: &[(Unary, bool)] = &[
        (Unary::Neg, false),
        (Unary::Exp, false),
        (Unary::Exp2, false),
        (Unary::Log, true),
        (Unary::Log2, true),
        (Unary::Sqrt, true),
        (Unary::Rsqrt, true),
        (Unary::Tanh, false),
        (Unary::Sigmoid, false),
        (Unary::Relu, false),
        (Unary::Abs, false),
        (Unary::Sign, false),
    ];
    for &(u, positive) in cases {
        check_derivative(u.name(), |g, x| g.unary(u, x[0]), 1, positive);
    }
}

#[test]
fn binary_derivatives() {
    for b in [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Max,
        Binary::Min,
    ] {
        check_derivative(b.name(), |g, x| g.binary(b, x[0], x[1]), 2, false);
    }
    for c in [2.0, 3.0, 0.5, -1.5] {
        check_derivative(
            "pow",
            |g, x| {
                let e = g.f32(c);
                g.binary(Binary::Pow, x[0], e)
            },
            1,
            true,
        );
    }
}

#[test]
fn select_and_comparisons() {
    // select(x0 > x1, x0 * x1, exp(x1)): comparisons carry no gradient, both branches do.
    check_derivative(
        "select",
        |g, x| {
            let c = g.binary(Binary::Gt, x[0], x[1]);
            let a = g.binary(Binary::Mul, x[0], x[1]);
            let b = g.unary(Unary::Exp, x[1]);
            g.select(c, a, b)
        },
        2,
        false,
    );
}

#[test]
fn composite_chain_rule() {
    // softplus-like composite with shared subexpressions.
    check_derivative(
        "composite",
        |g, x| {
            let e = g.unary(Unary::Exp, x[0]);
            let one = g.f32(1.0);
            let s = g.binary(Binary::Add, one, e);
            let l = g.unary(Unary::Log, s);
            let t = g.unary(Unary::Tanh, x[1]);
            let m = g.binary(Binary::Mul, l, t);
            g.binary(Binary::Div, m, s)
        },
        2,
        false,
    );
}

/// Row reductions: differentiate `Σ_j w_j · f(row)_j` for vectors through the
/// reference evaluator, against finite differences.
#[test]
fn reduction_derivatives() {
    use aec_frontend::ir::{Output, Param, ParamRole, Region};
    use aec_frontend::reference::eval::eval_region;
    let row = AxisSet::of(&[Axis::Skv]);
    for r in [Reduce::Sum, Reduce::Max, Reduce::AbsSum] {
        let mut g = Graph::new(Fold::Exact, Axis::Skv);
        let s = g.leaf(Op::Param(0), DType::F32, row);
        let red = g.reduce(r, s);
        // y_j = exp(s_j - red) * red: uses the reduction both broadcast and as a factor.
        let d = g.binary(Binary::Sub, s, red);
        let e = g.unary(Unary::Exp, d);
        let y = g.binary(Binary::Mul, e, red);
        let seed = g.leaf(Op::Param(1), DType::F32, row);
        let ds = grad(&mut g, y, seed, &[s], Eval::Row)[0].expect("depends on s");
        let param = |n: &str, role| Param {
            name: n.into(),
            role,
            dtype: DType::F32,
            axes: row,
        };
        let region = Region {
            name: "t".into(),
            iter_axes: AxisSet::EMPTY,
            params: vec![
                param("s", ParamRole::Element),
                param("ds", ParamRole::Seed("y".into())),
            ],
            graph: g,
            outputs: vec![
                Output {
                    name: "y".into(),
                    node: y,
                },
                Output {
                    name: "ds".into(),
                    node: ds,
                },
            ],
        };
        region.validate().expect("valid region");
        let mut rng = StdRng::seed_from_u64(3);
        let sv: Vec<f64> = (0..7).map(|_| rng.random_range(-1.5..1.5)).collect();
        let w: Vec<f64> = (0..7).map(|_| rng.random_range(-1.0..1.0)).collect();
        let run = |sv: &[f64]| {
            eval_region(&region, &mut |op| match op {
                Op::Param(0) => sv.to_vec(),
                _ => w.clone(),
            })
        };
        let analytic = run(&sv)[1].clone();
        for j in 0..7 {
            let eps = 1e-6;
            let (mut p, mut m) = (sv.clone(), sv.clone());
            p[j] += eps;
            m[j] -= eps;
            let f = |v: &[f64]| run(v)[0].iter().zip(&w).map(|(a, b)| a * b).sum::<f64>();
            let fd = (f(&p) - f(&m)) / (2.0 * eps);
            assert!(
                (fd - analytic[j]).abs() < 1e-7 * fd.abs().max(1.0),
                "{}: ds_{j}: fd {fd}, autodiff {}",
                r.name(),
                analytic[j]
            );
        }
    }
}

/// Folding never changes a value: the folded graph and an unfolded evaluation
/// agree on random (and, for `Fold::Exact`, special) inputs.
#[test]
fn folding_preserves_values() {
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        2.5,
    ];
    let consts = [0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, 3.0];
    let ops = [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Max,
        Binary::Min,
    ];
    for fold in [Fold::Exact, Fold::AssumeFinite] {
        for b in ops {
            for c in consts {
                for const_first in [true, false] {
                    let mut g = Graph::new(fold, Axis::Skv);
                    let x = g.leaf(Op::Param(0), DType::F32, AxisSet::EMPTY);
                    let k = g.f32(c);
                    let y = if const_first {
                        g.binary(b, k, x)
                    } else {
                        g.binary(b, x, k)
                    };
                    let inputs: Vec<f64> = match fold {
                        Fold::Exact => specials.to_vec(),
                        Fold::AssumeFinite => vec![0.5, -2.0, 3.25, 1e-3],
                    };
                    for xv in inputs {
                        let want = if const_first {
                            b.apply(c, xv)
                        } else {
                            b.apply(xv, c)
                        };
                        let got = eval(&g, y, &[xv]);
                        let same = (want.is_nan() && got.is_nan()) || want == got;
                        assert!(
                            same,
                            "{fold:?}: {} with const {c} ({}) at x = {xv}: folded {got}, direct {want}",
                            b.name(),
                            if const_first { "first" } else { "second" }
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn hash_consing_shares_nodes_and_types_follow_operands() {
    let mut g = Graph::new(Fold::Exact, Axis::Skv);
    let x = g.leaf(Op::Param(0), DType::F32, AxisSet::of(&[Axis::Skv]));
    let a = g.unary(Unary::Exp, x);
    let b = g.unary(Unary::Exp, x);
    assert_eq!(a, b, "the same operation on the same operand is one node");
    let r = g.reduce(Reduce::Sum, a);
    assert!(
        !g.node(r).axes.contains(Axis::Skv),
        "a reduction removes the row axis"
    );
    g.validate().expect("a well-formed graph validates");
    let i = g.leaf(Op::Index(Axis::Sq), DType::Int, AxisSet::of(&[Axis::Sq]));
    let j = g.leaf(Op::Index(Axis::Skv), DType::Int, AxisSet::of(&[Axis::Skv]));
    let d = g.binary(Binary::Sub, i, j);
    assert_eq!(
        g.node(d).dtype,
        DType::Int,
        "index arithmetic stays integer"
    );
    let half = g.f32(0.5);
    let f = g.binary(Binary::Mul, d, half);
    assert_eq!(g.node(f).dtype, DType::F32);
    assert_eq!(g.node(f).axes, AxisSet::of(&[Axis::Sq, Axis::Skv]));
}
