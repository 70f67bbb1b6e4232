//! Which parallel examples' online updates may see masked keys as scores of
//! −∞ (`neg_inf_mask`): those whose reductions ignore −∞ and give it p = 0.

use aec_compiler::neg_inf_mask::masked_as_neg_inf;
use aec_compiler::simplify::{Limits, simplify_region};
use aec_frontend::{Variant, parse_str};
mod common;
use common::example;

fn neg_inf_ok(v: &Variant) -> bool {
    let online = &v.parallel().expect("parallel").online;
    // As the kernels compute it (forward_regions simplifies it first), and
    // as written: both must agree.
    let (fwd, _) = simplify_region(&online.fwd, Limits::default());
    let simplified = masked_as_neg_inf(online, &fwd);
    assert_eq!(simplified, masked_as_neg_inf(online, &online.fwd));
    simplified
}

#[test]
fn softmax_like_updates_take_masked_keys_as_neg_inf() {
    for name in [
        "softmax",
        "softmax_causal",
        "softmax_gqa",
        "deepseek",
        "softcap",
        "alibi",
        "sliding_window",
        "diff_transformer",
        "document_mask",
        "relative_bias",
    ] {
        assert!(neg_inf_ok(&example(name)), "{name}");
    }
}

/// Without row normalisation p is the modified score itself, which is −∞
/// there, not 0: these keep their flags.
#[test]
fn updates_whose_weight_is_the_score_keep_flags() {
    for name in ["sigmoid", "relu", "retnet_parallel"] {
        assert!(!neg_inf_ok(&example(name)), "{name}");
    }
}

/// Updates that are softmax in every way but one: a row minimum (as −rowmax(−s)) in the state
/// (−∞ is no identity of min), and a weight that is 1 at −∞. Both keep flags.
#[test]
fn updates_that_see_neg_inf_keep_flags() {
    for (name, fwd) in [
        (
            "row minimum",
            "|s, st| { let m = max(st.m, rowmax(s)); let p = exp(s - m); \
             (p, State { m: m, l: st.l * exp(st.m - m) + rowsum(p), lo: min(st.lo, -rowmax(-s)) }, exp(st.m - m)) }",
        ),
        (
            "weight 1 at −∞",
            "|s, st| { let m = max(st.m, rowmax(s)); let p = exp(s - m) + 1.0; \
             (p, State { m: m, l: st.l * exp(st.m - m) + rowsum(p), lo: st.lo }, exp(st.m - m)) }",
        ),
    ] {
        let src = format!(
            "pub struct Odd: parallel {{ q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv];
             online {{ state {{ m = -inf, l = 0.0, lo = inf }}
                      fwd = {fwd}
                      epilogue = |o, st| (o / st.l, Scales {{ lse: st.m + log(st.l) }}) }} }}"
        );
        let v = parse_str(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!neg_inf_ok(&v), "{name}");
    }
}
