//! The split-KV combine derived from each parallel example's online block:
//! the merge rule per state field, the rescale factor as a function of the
//! states, and refusals that name the field or the part of alpha at fault.

use aec_compiler::combine::{Merge, combine_plan, merge};
use aec_frontend::{Variant, parse_str};
mod common;
use common::example;

fn online(v: &Variant) -> &aec_frontend::variant::Online {
    &v.parallel().expect("parallel").online
}

#[test]
fn every_parallel_example_has_a_combine() {
    for (name, merges) in [
        ("softmax", vec![Merge::Max, Merge::Scaled]),
        ("softmax_gqa", vec![Merge::Max, Merge::Scaled]),
        ("decode", vec![Merge::Max, Merge::Scaled]),
        ("deepseek", vec![Merge::Max, Merge::Scaled]),
        ("softcap", vec![Merge::Max, Merge::Scaled]),
        ("alibi", vec![Merge::Max, Merge::Scaled]),
        ("retnet_parallel", vec![Merge::Sum]),
        ("sigmoid", vec![]),
        ("relu", vec![]),
    ] {
        let v = example(name);
        let plan = combine_plan(online(&v)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(plan.merges, merges, "{name}");
    }
}

/// Softmax's merge in numbers: two partial rows (max m, sum l, output o
/// relative to exp(m)) give the one-pass values.
#[test]
fn softmax_partials_merge_like_one_pass() {
    let v = example("softmax");
    let plan = combine_plan(online(&v)).expect("combine");
    let (m1, m2) = (1.5f64, -0.5f64);
    let (l1, l2) = (2.0, 3.0);
    let parts = vec![(vec![m1, l1], [1.0, 2.0]), (vec![m2, l2], [4.0, -1.0])];
    let (st, o) = merge(&plan, &parts);
    let c2 = (m2 - m1).exp();
    assert!((st[0] - m1).abs() < 1e-12);
    assert!((st[1] - (l1 + c2 * l2)).abs() < 1e-12, "{st:?}");
    assert!((o[0] - (1.0 + 4.0 * c2)).abs() < 1e-12 && (o[1] - (2.0 - c2)).abs() < 1e-12);
}

#[test]
fn states_without_a_merge_rule_are_refused_with_the_field() {
    // A running mean of the row maxima: neither max/min/sum nor rescaled.
    let v = parse_str(
        "pub struct Odd: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];
         online { state { m = 0.0 }
                  fwd = |s, st| (s, State { m: 0.5 * (st.m + rowmax(s)) }, 1.0)
                  epilogue = |o, st| (o, Scales { z: st.m }) } }",
    )
    .expect("variant");
    let err = combine_plan(online(&v)).unwrap_err().to_string();
    assert!(
        err.contains("field `m`") && err.contains("no split-KV combine"),
        "{err}"
    );
}
