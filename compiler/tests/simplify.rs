//! The simplifier: every rule preserves value on random inputs, every region
//! of every example keeps its values, and the derived softmax backward loses
//! its dead `rowmax` subgradient term; the backward lowered for the kernels
//! (dO·O for the row reductions) equals the derived row program.

use aec_compiler::backward_plan::backward_plan;
use aec_compiler::simplify::{Assumes, Limits, Math, rules, simplify_region};
use aec_frontend::ir::{Op, ParamRole, Region};
use aec_frontend::reference::eval::eval_region_with;
use aec_frontend::{Variant, parse_file};
use egg::{ENodeOrVar, Language, Pattern};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::PathBuf;

const ROW: usize = 6;

/// Evaluates a pattern with its variables bound to rows (length 1 = scalar).
fn eval_pattern(p: &Pattern<Math>, env: &HashMap<String, Vec<f64>>) -> Vec<f64> {
    let nodes = p.ast.as_ref();
    let mut vals: Vec<Vec<f64>> = Vec::with_capacity(nodes.len());
    for n in nodes {
        let v = match n {
            ENodeOrVar::Var(v) => env[&v.to_string()].clone(),
            ENodeOrVar::ENode(e) => {
                let args: Vec<&Vec<f64>> = e
                    .children()
                    .iter()
                    .map(|c| &vals[usize::from(*c)])
                    .collect();
                eval_math(e, &args)
            }
        };
        vals.push(v);
    }
    vals.pop().expect("non-empty pattern")
}

fn eval_math(e: &Math, a: &[&Vec<f64>]) -> Vec<f64> {
    let len = a.iter().map(|x| x.len()).max().unwrap_or(1);
    let at = |k: usize, i: usize| if a[k].len() == 1 { a[k][0] } else { a[k][i] };
    let map1 = |f: fn(f64) -> f64| (0..len).map(|i| f(at(0, i))).collect::<Vec<_>>();
    let map2 = |f: fn(f64, f64) -> f64| (0..len).map(|i| f(at(0, i), at(1, i))).collect::<Vec<_>>();
    match e {
        Math::Num(c) => vec![c.get()],
        Math::Add(_) => map2(|x, y| x + y),
        Math::Sub(_) => map2(|x, y| x - y),
        Math::Mul(_) => map2(|x, y| x * y),
        Math::Div(_) => map2(|x, y| x / y),
        Math::Max(_) => map2(f64::max),
        Math::Min(_) => map2(f64::min),
        Math::Pow(_) => map2(f64::powf),
        Math::Neg(_) => map1(|x| -x),
        Math::Exp(_) => map1(f64::exp),
        Math::Exp2(_) => map1(f64::exp2),
        Math::Log(_) => map1(f64::ln),
        Math::Log2(_) => map1(f64::log2),
        Math::Sqrt(_) => map1(f64::sqrt),
        Math::Rsqrt(_) => map1(|x| 1.0 / x.sqrt()),
        Math::Tanh(_) => map1(f64::tanh),
        Math::Sigmoid(_) => map1(|x| 1.0 / (1.0 + (-x).exp())),
        Math::Relu(_) => map1(|x| x.max(0.0)),
        Math::Abs(_) => map1(f64::abs),
        Math::Select(_) => (0..len)
            .map(|i| if at(0, i) != 0.0 { at(1, i) } else { at(2, i) })
            .collect(),
        Math::RowSum(_) => vec![a[0].iter().sum()],
        Math::RowMax(_) => vec![a[0].iter().cloned().fold(f64::NEG_INFINITY, f64::max)],
        Math::RowAbsSum(_) => vec![a[0].iter().map(|x| x.abs()).sum()],
        Math::Leaf(_) => unreachable!("rules have no leaves"),
    }
}

#[test]
fn every_rule_preserves_value_on_random_inputs() {
    let mut rng = StdRng::seed_from_u64(11);
    let all = rules();
    assert!(all.len() >= 30, "expected the full rule table");
    for rule in &all {
        let lhs: Pattern<Math> = rule.lhs.parse().expect("lhs");
        let rhs: Pattern<Math> = rule.rhs.parse().expect("rhs");
        for trial in 0..50 {
            let mut env = HashMap::new();
            for v in lhs.vars() {
                let name = v.to_string();
                // Positive, finite operands: every rule's domain (log, division) includes them.
                let scalar = rule.row_constant.contains(&name.as_str())
                    || rule.positive.contains(&name.as_str())
                    || rule.nonneg.contains(&name.as_str());
                let len = if scalar || trial % 3 == 0 { 1 } else { ROW };
                env.insert(
                    name,
                    (0..len)
                        .map(|_| rng.random_range(0.3..2.0))
                        .collect::<Vec<f64>>(),
                );
            }
            let (l, r) = (eval_pattern(&lhs, &env), eval_pattern(&rhs, &env));
            let len = l.len().max(r.len());
            for i in 0..len {
                let (x, y) = (
                    if l.len() == 1 { l[0] } else { l[i] },
                    if r.len() == 1 { r[0] } else { r[i] },
                );
                assert!(
                    (x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1.0),
                    "rule {}: {} = {x} but {} = {y} for {env:?}",
                    rule.rewrite.name,
                    rule.lhs,
                    rule.rhs
                );
            }
        }
        // A rule that asks for positive constants (or values ≥ 0) must need
        // them: with negative ones some row breaks it.
        for (vars, what) in [
            (rule.positive, "positive constants"),
            (rule.nonneg, "values ≥ 0"),
        ] {
            if vars.is_empty() {
                continue;
            }
            let env: HashMap<String, Vec<f64>> = lhs
                .vars()
                .iter()
                .map(|v| {
                    let name = v.to_string();
                    let vals = if vars.contains(&name.as_str()) {
                        vec![-1.5]
                    } else {
                        vec![0.5, -2.0, 1.25]
                    };
                    (name, vals)
                })
                .collect();
            let (l, r) = (eval_pattern(&lhs, &env), eval_pattern(&rhs, &env));
            assert!(
                l.iter().zip(&r).any(|(x, y)| x != y),
                "rule {} asks for {what} needlessly",
                rule.rewrite.name
            );
        }
        if rule.assumes == Assumes::Finite {
            // Finite-only rules must really need the assumption somewhere (or they belong in the exact set).
            let needs = [f64::INFINITY, 0.0, f64::NAN].into_iter().any(|x| {
                let env: HashMap<String, Vec<f64>> = lhs
                    .vars()
                    .iter()
                    .map(|v| (v.to_string(), vec![x]))
                    .collect();
                let (l, r) = (eval_pattern(&lhs, &env)[0], eval_pattern(&rhs, &env)[0]);
                !(l == r || (l.is_nan() && r.is_nan()))
            });
            assert!(
                needs,
                "rule {} is marked Finite needlessly",
                rule.rewrite.name
            );
        }
    }
}

fn examples() -> Vec<(String, Variant)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let path = entry.expect("entry").path();
        let src = std::fs::read_to_string(&path).expect("read");
        for inv in parse_file(&src).expect("rust") {
            out.push((
                path.file_stem().unwrap().to_string_lossy().into_owned(),
                inv.variant.expect("valid"),
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Leaf values for a random point of `r`: element params as rows of ROW
/// values in row regions, seeds random. States are random, except that where
/// the region states facts (`fact.<field>`: how the forward computed a saved
/// field) they are made consistent with them, as they are at run time.
fn random_point(r: &Region, seed: u64) -> (Vec<Vec<f64>>, Vec<f64>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let ra = r.graph.reduce_axis();
    let mut vals: Vec<Vec<f64>> = r
        .params
        .iter()
        .map(|p| {
            let len = if p.axes.contains(ra) { ROW } else { 1 };
            let (lo, hi) = match p.role {
                ParamRole::State(_) => (0.5, 2.0),
                _ => (-1.0, 1.0),
            };
            (0..len).map(|_| rng.random_range(lo..hi)).collect()
        })
        .collect();
    let customs: Vec<f64> = (0..8).map(|_| rng.random_range(0.2..0.9)).collect();
    for _ in 0..=r.params.len() {
        let outs = eval_at(r, &vals, &customs);
        for (o, v) in r.outputs.iter().zip(outs) {
            if let Some(field) = o.name.strip_prefix("fact.") {
                let k = r
                    .param_index(&ParamRole::State(field.to_string()))
                    .expect("fact of a state field");
                vals[k as usize] = v;
            }
        }
    }
    (vals, customs)
}

fn eval_at(r: &Region, vals: &[Vec<f64>], customs: &[f64]) -> Vec<Vec<f64>> {
    eval_region_with(
        r,
        &mut |op| match op {
            Op::Param(k) => vals[*k as usize].clone(),
            Op::Index(_) => vec![3.0],
            Op::Shape(_) => vec![7.0],
            Op::Custom(c) => vec![customs[*c as usize]],
            _ => unreachable!(),
        },
        // Indexed inputs: a deterministic table.
        &mut |c, idx| customs[c as usize] + 0.01 * idx.iter().sum::<i64>() as f64,
    )
}

/// The non-fact outputs of `r` at `point`.
fn values(r: &Region, point: &(Vec<Vec<f64>>, Vec<f64>)) -> Vec<Vec<f64>> {
    let outs = eval_at(r, &point.0, &point.1);
    r.outputs
        .iter()
        .zip(outs)
        .filter(|(o, _)| !o.name.starts_with("fact."))
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn simplified_regions_of_every_example_keep_their_values() {
    let mut checked = 0;
    for (name, v) in examples() {
        for r in v.forward_regions().into_iter().chain(v.backward_regions()) {
            let (s, report) = simplify_region(r, Limits::default());
            s.validate()
                .unwrap_or_else(|e| panic!("{name}/{}: {e}", r.name));
            assert!(
                report.cost_after <= report.cost_before + 1e-9,
                "{name}/{}: cost rose {report:?}",
                r.name
            );
            for seed in 0..4 {
                let point = random_point(r, seed);
                let (a, b) = (values(r, &point), values(&s, &point));
                for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
                    let same = (x.is_nan() && y.is_nan())
                        || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0);
                    assert!(
                        same,
                        "{name}/{}: {x} became {y} ({report:?})\nbefore:\n{}\nafter:\n{}",
                        r.name, r, s
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 60, "checked {checked} regions");
}

#[test]
fn softmax_backward_loses_the_dead_rowmax_term() {
    let v = examples()
        .into_iter()
        .find(|(n, _)| n == "softmax")
        .expect("softmax")
        .1;
    let norm = &v.parallel().expect("parallel").backward.norm;
    // Reductions that `ds` needs (the facts are equalities, not computations).
    let reductions = |r: &Region| {
        let live = r.graph.live(&[r.output("ds").expect("ds")]);
        r.graph
            .ids()
            .filter(|id| live[id.index()] && matches!(r.graph.node(*id).op, Op::Reduce(_)))
            .count()
    };
    let (s, report) = simplify_region(norm, Limits::default());
    assert!(report.cost_after < report.cost_before, "{report:?}");
    // Before: rowsum(dP·p), the subgradient's rowsum over dP terms, and the
    // count of maxima. After: one row reduction, rowsum(dP·p) — the
    // FlashAttention preprocessing D = rowsum(dO∘O) up to the factor 1/l.
    assert_eq!(reductions(norm), 3, "{norm}");
    assert_eq!(reductions(&s), 1, "simplified:\n{s}\n{report:?}");
    let live = s.graph.live(&[s.output("ds").expect("ds")]);
    assert!(
        !s.graph.ids().any(|id| live[id.index()]
            && matches!(
                s.graph.node(id).op,
                Op::Binary(aec_frontend::ir::Binary::Eq)
            )),
        "the max indicator is gone:\n{s}"
    );
}

/// One random row of a parallel variant's derived backward (`norm`, with a
/// saved state consistent with its facts): the ds region's params (the
/// norm's, then dO·O), the custom inputs, the recomputed weights P along
/// the row and the derived dS.
struct DerivedRow {
    vals: Vec<Vec<f64>>,
    customs: Vec<f64>,
    p: Vec<f64>,
    ds: Vec<f64>,
}

fn derived_row(par: &aec_frontend::variant::Parallel, seed: u64) -> DerivedRow {
    let norm = &par.backward.norm;
    let point = random_point(norm, seed);
    let ds = values(norm, &point)[0].clone();
    // P from the derived recompute region, params by role.
    let rc = &par.backward.recompute;
    let by_role: Vec<Vec<f64>> = rc
        .params
        .iter()
        .map(|p| point.0[norm.param_index(&p.role).expect("norm has the param") as usize].clone())
        .collect();
    let p = eval_at(rc, &by_role, &point.1).remove(0);
    let dp = &point.0[norm.param_index(&ParamRole::Seed("p".into())).expect("dp") as usize];
    let p: Vec<f64> = (0..dp.len())
        .map(|j| if p.len() == 1 { p[0] } else { p[j] })
        .collect();
    let dot: f64 = p.iter().zip(dp).map(|(a, b)| a * b).sum();
    let mut vals = point.0.clone();
    vals.push(vec![dot]);
    DerivedRow {
        vals,
        customs: point.1,
        p,
        ds,
    }
}

/// `got` (one value or one per key) against `want` along the row.
fn assert_row_close(got: &[f64], want: &[f64], what: &str) {
    for (j, w) in want.iter().enumerate() {
        let g = if got.len() == 1 { got[0] } else { got[j] };
        assert!(
            (g - w).abs() <= 1e-9 * w.abs().max(1.0),
            "{what}[{j}] = {g}, derived {w}"
        );
    }
}

#[test]
fn lowered_backward_matches_the_derived_row_program() {
    // The kernels evaluate dS pointwise with rowsum(dP·w) replaced by
    // c·(dO·O), where dO·O = Σⱼ dPⱼ Pⱼ; on random rows with a consistent
    // saved state this must equal the derived whole-row program.
    let mut checked = 0;
    for (name, v) in examples() {
        let Some(par) = v.parallel() else { continue };
        if v.customs.iter().any(|c| !c.user_axes.is_empty()) {
            continue;
        }
        let plan = backward_plan(&v).unwrap_or_else(|e| panic!("{name}: {e}"));
        for seed in 0..4 {
            let row = derived_row(par, 100 + seed);
            let got = eval_at(&plan.ds, &row.vals, &row.customs).remove(0);
            assert_row_close(&got, &row.ds, &format!("{name}: ds\n{}\n", plan.ds));
            let rc = &plan.recompute;
            let norm = &par.backward.norm;
            let by_role: Vec<Vec<f64>> = rc
                .params
                .iter()
                .map(|p| row.vals[norm.param_index(&p.role).expect("param") as usize].clone())
                .collect();
            let got_p = eval_at(rc, &by_role, &row.customs).remove(0);
            assert_row_close(&got_p, &row.p, &format!("{name}: p"));
        }
        checked += 1;
    }
    assert!(checked >= 13, "checked {checked} variants");
}

/// The saved state fields the forward leaves ≥ 0, read off the derived
/// `fact.` equations: softmax's row sum (a sum of exponentials), not its
/// row maximum; a variant without an online block has none.
#[test]
fn nonneg_state_fields_come_from_the_facts() {
    let plan = |name: &str| {
        let v = examples()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name}"))
            .1;
        aec_compiler::backward_plan::backward_plan(&v).expect("plan")
    };
    assert_eq!(plan("softmax").nonneg_state, vec!["l".to_string()]);
    assert_eq!(plan("deepseek").nonneg_state, vec!["l".to_string()]);
    assert!(plan("sigmoid").nonneg_state.is_empty());
}

/// The split row programs the wgmma backward runs where dS reads the score
/// only through P (`split_row_region`: P with its row factor in the
/// exponent, dS from the held P, the row offset fused): on random rows with
/// a consistent saved state, P and dS equal the derived whole-row program's.
/// (Variants with a score closure have it too — their weight is the
/// modified score — but their kernels keep the joint form.)
#[test]
fn split_row_programs_match_the_derived_row_program() {
    use aec_compiler::cxx::regions::{joint_row_region, split_row_region};
    let mut split = Vec::new();
    // Each example as written and as the kernels generate it (a uniform Q
    // scale moved onto the scores, which puts the scale into dS: the fused
    // row offset `dP·scale − δ·scale`).
    let variants = examples().into_iter().flat_map(|(name, v)| {
        let folded = aec_compiler::q_scale::backward_variant(&v, 128, 128, true)
            .map(|f| (format!("{name} (Q scale folded)"), f));
        std::iter::once((name, v)).chain(folded)
    });
    for (name, v) in variants {
        let Some(par) = v.parallel() else { continue };
        if v.customs.iter().any(|c| !c.user_axes.is_empty()) {
            continue;
        }
        let plan = backward_plan(&v).unwrap_or_else(|e| panic!("{name}: {e}"));
        let Some((region, held)) = split_row_region(&plan, &joint_row_region(&plan)) else {
            continue;
        };
        split.push(name.clone());
        assert_eq!(held as usize, plan.ds.params.len(), "{name}");
        for seed in 0..4 {
            let row = derived_row(par, 200 + seed);
            let mut vals = row.vals.clone();
            vals.push(row.p.clone());
            let outs = eval_at(&region, &vals, &row.customs);
            // (The held P is one past the region's params: no Display.)
            assert_row_close(&outs[0], &row.p, &format!("{name}: split p"));
            assert_row_close(&outs[1], &row.ds, &format!("{name}: split ds"));
        }
    }
    for name in [
        "softmax",
        "softmax_causal",
        "softmax_gqa",
        "deepseek",
        "diff_transformer",
        "softmax (Q scale folded)",
        "deepseek (Q scale folded)",
    ] {
        assert!(
            split.contains(&name.to_string()),
            "{name}: no split form ({split:?})"
        );
    }
}
