//! Which parallel examples' online updates hold their running maximum
//! (`held_max`), what the held update computes, and the variants for which
//! holding would change the answer or overflow the weights.

use aec_compiler::combine::{Combine, Merge, combine_plan, merge};
use aec_compiler::held_max::{BLOCK_MAX, HOLD, Held, held_online_fwd};
use aec_compiler::simplify::{Limits, simplify_region};
use aec_frontend::ir::{Op, ParamRole, Region};
use aec_frontend::reference::eval::eval_region;
use aec_frontend::{Variant, parse_str};
mod common;
use common::example;

/// The held update of `v`'s online block as written; the kernels' form (of
/// the simplified block) must agree on whether it holds.
fn held(v: &Variant) -> Option<Held> {
    let par = v.parallel().expect("parallel");
    let (simplified, _) = simplify_region(&par.online.fwd, Limits::default());
    let held = held_online_fwd(&par.online, &par.online.fwd);
    assert_eq!(
        held.is_some(),
        held_online_fwd(&par.online, &simplified).is_some(),
        "{}",
        v.name
    );
    held
}

/// A variant of softmax's shape with `fwd` and `epilogue` of its own.
fn odd(fwd: &str, epilogue: &str) -> Variant {
    let src = format!(
        "pub struct Odd: parallel {{ q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];
         online {{ state {{ m = -inf, l = 0.0 }}
                  fwd = {fwd}
                  epilogue = {epilogue} }} }}"
    );
    parse_str(&src).unwrap_or_else(|e| panic!("{e}"))
}

const SOFTMAX_FWD: &str = "|s, st| { let m = max(st.m, rowmax(s)); let p = exp(s - m); \
     (p, State { m: m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m)) }";
const SOFTMAX_EPI: &str = "|o, st| (o / st.l, Scales { lse: st.m + log(st.l) })";

#[test]
fn softmax_like_updates_hold_their_maximum() {
    for name in [
        "softmax",
        "softmax_causal",
        "softmax_gqa",
        "decode",
        "deepseek",
        "softcap",
        "alibi",
        "sliding_window",
        "diff_transformer",
        "document_mask",
        "relative_bias",
    ] {
        assert!(held(&example(name)).is_some(), "{name}");
    }
}

#[test]
fn updates_without_a_running_maximum_are_left_alone() {
    for name in ["sigmoid", "relu", "retnet_parallel"] {
        assert!(held(&example(name)).is_none(), "{name}");
    }
}

/// The held update in numbers: from m = 0, a block whose maximum is within
/// the hold keeps m (alpha 1, weights above 1); one beyond it takes the new
/// maximum.
#[test]
fn the_maximum_moves_only_past_the_hold() {
    let v = odd(SOFTMAX_FWD, SOFTMAX_EPI);
    let fwd = held(&v).expect("held").fwd;
    let run = |m: f64, l: f64, s: &[f64]| {
        let outs = eval_region(&fwd, &mut |op| match op {
            Op::Param(k) => match &fwd.params[*k as usize].role {
                ParamRole::State(f) if f == "m" => vec![m],
                ParamRole::State(_) => vec![l],
                _ => s.to_vec(),
            },
            _ => vec![64.0],
        });
        let get = |name: &str| {
            let k = fwd.outputs.iter().position(|o| o.name == name).expect(name);
            outs[k].clone()
        };
        (
            get("state.m")[0],
            get("state.l")[0],
            get("alpha")[0],
            get("p"),
        )
    };
    let within = HOLD - 0.5;
    let (m, l, alpha, p) = run(0.0, 1.0, &[within, 0.0]);
    assert_eq!((m, alpha), (0.0, 1.0));
    assert!((p[0] - within.exp()).abs() < 1e-12 && (p[1] - 1.0).abs() < 1e-12);
    assert!((l - (1.0 + within.exp() + 1.0)).abs() < 1e-12);
    let beyond = HOLD + 0.5;
    let (m, _, alpha, p) = run(0.0, 1.0, &[beyond, 0.0]);
    assert_eq!(m, beyond);
    assert!((alpha - (-beyond).exp()).abs() < 1e-15 && (p[0] - 1.0).abs() < 1e-12);
    // The first block takes its maximum from the initial −∞.
    let (m, _, _, _) = run(f64::NEG_INFINITY, 0.0, &[-3.0, -7.0]);
    assert_eq!(m, -3.0);
}

/// Holding is refused where it changes the answer (a scale that reports the
/// maximum) or where the exponent's units would let a held weight grow past
/// 2⁸ (here e^(10·HOLD)).
#[test]
fn holding_is_refused_where_it_is_not_exact() {
    let reports_max = odd(SOFTMAX_FWD, "|o, st| (o / st.l, Scales { mx: st.m })");
    assert!(held(&reports_max).is_none());
    let steep = odd(
        "|s, st| { let m = max(st.m, rowmax(s)); let p = exp(10.0 * (s - m)); \
         (p, State { m: m, l: st.l * exp(10.0 * (st.m - m)) + rowsum(p) }, exp(10.0 * (st.m - m))) }",
        "|o, st| (o / st.l, Scales { lse: 10.0 * st.m + log(st.l) })",
    );
    assert!(held(&steep).is_none());
    // The same update in base 2 holds (weights up to 2^HOLD < 2⁸).
    let base2 = odd(
        "|s, st| { let m = max(st.m, rowmax(s)); let p = exp2(s - m); \
         (p, State { m: m, l: st.l * exp2(st.m - m) + rowsum(p) }, exp2(st.m - m)) }",
        "|o, st| (o / st.l, Scales { lse: st.m + log2(st.l) })",
    );
    assert!(held(&base2).is_some());
}

/// What the kernels do at the end of a row: the held state moved onto the
/// true maximum (kept from the `block_max` outputs) by the combine's
/// rescale gives the state of the variant's own update.
#[test]
fn the_final_state_moves_onto_the_true_maximum() {
    for name in ["softmax", "deepseek", "softcap", "diff_transformer"] {
        let v = example(name);
        let par = v.parallel().expect("parallel");
        let online = &par.online;
        let h = held(&v).expect("held");
        assert_eq!(h.fields, vec![0], "{name}: m is the held field");
        let plan = combine_plan(online).expect("combine");
        let step = |fwd: &Region, st: &[f64], s: &[f64]| {
            let outs = eval_region(fwd, &mut |op| match op {
                Op::Param(k) => match &fwd.params[*k as usize].role {
                    ParamRole::State(f) => {
                        vec![
                            st[online
                                .state
                                .iter()
                                .position(|x| &x.name == f)
                                .expect("field")],
                        ]
                    }
                    _ => s.to_vec(),
                },
                _ => vec![64.0],
            });
            let get =
                |name: &str| outs[fwd.outputs.iter().position(|o| o.name == name).expect(name)][0];
            let state: Vec<f64> = online
                .state
                .iter()
                .map(|f| get(&format!("state.{}", f.name)))
                .collect();
            let block_max = fwd
                .outputs
                .iter()
                .any(|o| o.name.starts_with(BLOCK_MAX))
                .then(|| get(&format!("{BLOCK_MAX}{}", online.state[0].name)));
            (state, block_max)
        };
        // Scores rising by steps within and beyond the hold (at a score
        // scale of 1, or 1/8 where the update scales by 1/sqrt(Dqk = 64)).
        let blocks: [&[f64]; 7] = [
            &[0.5, -1.0],
            &[3.0, 1.0],
            &[4.5],
            &[12.0, 2.0],
            &[14.0],
            &[90.0, -3.0],
            &[100.0],
        ];
        let init: Vec<f64> = online.state.iter().map(|f| f.init).collect();
        let (mut own, mut lazy, mut mx) = (init.clone(), init.clone(), f64::NEG_INFINITY);
        let mut ever_held = false;
        for s in blocks {
            own = step(&online.fwd, &own, s).0;
            let (next, bm) = step(&h.fwd, &lazy, s);
            lazy = next;
            mx = mx.max(bm.expect("block_max output"));
            ever_held |= lazy[0] != mx;
        }
        assert!(ever_held, "{name}: the rows never held their maximum");
        let (canonical, _) = merge_onto(&plan, &lazy, mx);
        for (a, b) in canonical.iter().zip(&own) {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "{name}: {canonical:?} vs {own:?}"
            );
        }
    }
}

/// `held_final_state` in f64: one partial merged onto the maxima `mx`.
fn merge_onto(plan: &Combine, st: &[f64], mx: f64) -> (Vec<f64>, [f64; 2]) {
    // The merge of the partial with a state at the true maximum and no mass.
    let mut empty = st.to_vec();
    empty[0] = mx;
    for (k, m) in plan.merges.iter().enumerate() {
        if *m == Merge::Scaled {
            empty[k] = 0.0;
        }
    }
    merge(plan, &[(st.to_vec(), [1.0, 0.0]), (empty, [0.0, 0.0])])
}
