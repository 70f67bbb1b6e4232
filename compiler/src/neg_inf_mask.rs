//! Whether a variant's online block update can see a masked key as a score
//! of −∞ instead of through a validity flag.
//!
//! The templates' general form of a partially masked block carries one
//! `bool` per score into the online update, which skips invalid keys in its
//! reductions and gives them `p = 0`. Sixty-four flags per thread do not fit
//! the predicate registers: nvcc packs them into bits and unpacks them at
//! every use, and on a causal diagonal block that bookkeeping is most of the
//! block's instructions (bench/NOTES.md, session 58). Where an update treats
//! a score of −∞ exactly as a key it does not see — every reduction's term
//! is its identity there and `p` is 0, as for softmax — the masked scores
//! can be −∞ and the update can run without flags.
//!
//! The property is checked numerically, as the split-KV combine is: random
//! rows with some keys removed must give the state, `alpha` and `p` of the
//! same rows with those keys' scores at −∞ (and `p = 0` there), from the
//! initial state and from one after an earlier block. A row with no valid
//! key keeps its own rule (the state is unchanged, `p = 0`), so the check
//! only needs rows with at least one.

use aec_frontend::ir::{Op, ParamRole, Region};
use aec_frontend::reference::eval::eval_region;
use aec_frontend::variant::Online;

/// One evaluation of `fwd` on a row of scores from state `st`, with every
/// size (a closure may read Skv) at `size`: the outputs (state fields in
/// declaration order, alpha, p per key).
fn update(fwd: &Region, fields: &[&str], st: &[f64], scores: &[f64], size: f64) -> Option<Update> {
    let outs = eval_region(fwd, &mut |op| match op {
        Op::Param(k) => match &fwd.params[*k as usize].role {
            ParamRole::State(f) => {
                vec![st[fields.iter().position(|x| x == f).expect("declared field")]]
            }
            _ => scores.to_vec(),
        },
        _ => vec![size],
    });
    let out = |name: &str| fwd.outputs.iter().position(|o| o.name == name);
    let state = fields
        .iter()
        .map(|f| out(&format!("state.{f}")).map(|k| outs[k][0]))
        .collect::<Option<Vec<f64>>>()?;
    let alpha = outs[out("alpha")?][0];
    let p = &outs[out("p")?];
    let p = (0..scores.len())
        .map(|e| p[if p.len() == 1 { 0 } else { e }])
        .collect();
    Some(Update { state, alpha, p })
}

struct Update {
    state: Vec<f64>,
    alpha: f64,
    p: Vec<f64>,
}

/// Whether `fwd` (the online block update as the kernels compute it, for
/// `online`'s state) treats a score of −∞ exactly as a key it does not see.
pub fn masked_as_neg_inf(online: &Online, fwd: &Region) -> bool {
    let fields: Vec<&str> = online.state.iter().map(|f| f.name.as_str()).collect();
    let mut next = crate::check_rng::uniform(0x2545_f491_4f6c_dd1d);
    // (Infinities only match themselves: the relative bound would let −∞
    // pass for any finite value.)
    let close = |a: f64, b: f64| {
        a == b
            || (a.is_finite()
                && b.is_finite()
                && (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs())))
    };
    let init: Vec<f64> = online.state.iter().map(|f| f.init).collect();
    for trial in 0..32 {
        let len = 2 + trial % 9;
        let size = if trial % 3 == 0 { 1000.0 } else { 64.0 };
        let scores: Vec<f64> = (0..len).map(|_| (next() - 0.5) * 8.0).collect();
        let mut valid: Vec<bool> = (0..len).map(|_| next() < 0.5).collect();
        valid[trial % len] = true;
        if trial % 4 == 0 {
            // Runs of masked keys at either end, as a causal diagonal has.
            valid.iter_mut().take(len / 2).for_each(|v| *v = false);
            valid[len - 1] = true;
        }
        // From the initial state, or from one after an earlier block.
        let st = if trial % 2 == 0 {
            init.clone()
        } else {
            let earlier: Vec<f64> = (0..3).map(|_| (next() - 0.5) * 8.0).collect();
            match update(fwd, &fields, &init, &earlier, size) {
                Some(u) => u.state,
                None => return false,
            }
        };
        let seen: Vec<f64> = scores
            .iter()
            .zip(&valid)
            .filter_map(|(s, v)| v.then_some(*s))
            .collect();
        let masked: Vec<f64> = scores
            .iter()
            .zip(&valid)
            .map(|(s, v)| if *v { *s } else { f64::NEG_INFINITY })
            .collect();
        let (Some(a), Some(b)) = (
            update(fwd, &fields, &st, &seen, size),
            update(fwd, &fields, &st, &masked, size),
        ) else {
            return false;
        };
        let same_state = a.state.iter().zip(&b.state).all(|(x, y)| close(*x, *y));
        let mut seen_p = a.p.iter();
        let same_p = b.p.iter().zip(&valid).all(|(pb, v)| {
            if *v {
                seen_p.next().is_some_and(|pa| close(*pa, *pb))
            } else {
                *pb == 0.0
            }
        });
        if !(same_state && close(a.alpha, b.alpha) && same_p) {
            return false;
        }
    }
    true
}
