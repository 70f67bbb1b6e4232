//! A uniform Q scale moved onto the scores: the rewritten forward regions
//! compute what the variant's do on scaled scores, the simplified online
//! step costs no more than before, other modifications of Q are left alone,
//! and the kernels no longer modify the Q tile; the backward's weights and
//! score gradients are those of the raw scores, and its kernels read q.

use aec_compiler::backward_plan::{DOT_FIELD, backward_plan};
use aec_compiler::cuda::dialect::{Elem, Isa};
use aec_compiler::q_scale::{fold_q_scale, fold_q_scale_backward};
use aec_compiler::simplify::{Limits, simplify_region};
use aec_compiler::{BackwardConfig, ForwardConfig, parallel_backward, parallel_forward};
use aec_frontend::ir::{Op, ParamRole, Region};
use aec_frontend::reference::eval::eval_region;
use aec_frontend::{Variant, parse_file};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn example(name: &str) -> Variant {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{name}.rs"));
    let src = std::fs::read_to_string(&path).expect("read example");
    parse_file(&src)
        .expect("parse example")
        .into_iter()
        .next()
        .expect("one variant")
        .variant
        .expect("valid variant")
}

/// Every output of `r` with its element (a row of scores) given by
/// `scores`, its state fields by `state`, indices and sizes fixed.
fn eval(r: &Region, scores: &[f64], state: &[f64]) -> Vec<Vec<f64>> {
    eval_region(r, &mut |op| match op {
        Op::Param(k) => match &r.params[*k as usize].role {
            ParamRole::Element => scores.to_vec(),
            ParamRole::State(_) => vec![state[*k as usize % state.len()]],
            ParamRole::Seed(_) => unreachable!("forward regions have no seeds"),
        },
        Op::Index(_) => vec![5.0],
        Op::Shape(_) => vec![300.0],
        other => unreachable!("{other:?}"),
    })
}

fn assert_rows_close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: output count");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len(), "{what}: row length");
        for (u, v) in x.iter().zip(y) {
            assert!(
                (u - v).abs() <= 1e-12 * u.abs().max(v.abs()).max(1.0),
                "{what}: {u} against {v}"
            );
        }
    }
}

#[test]
fn softmax_scale_moves_onto_the_online_step() {
    let v = example("softmax");
    let folded = fold_q_scale(&v, 128, 128).expect("q * rsqrt(Dqk) folds");
    let (orig, new) = (v.parallel().unwrap(), folded.parallel().unwrap());
    assert!(new.modify_q.is_none(), "the Q modification is gone");
    assert!(new.modify_scores.is_none());
    let c = 1.0 / 128f64.sqrt();
    let mut rng = StdRng::seed_from_u64(3);
    for trial in 0..20 {
        let s: Vec<f64> = (0..13).map(|_| rng.random_range(-40.0..40.0)).collect();
        let state = [rng.random_range(-2.0..2.0), rng.random_range(0.5..3.0)];
        let scaled: Vec<f64> = s.iter().map(|x| c * x).collect();
        assert_rows_close(
            &eval(&new.online.fwd, &s, &state),
            &eval(&orig.online.fwd, &scaled, &state),
            &format!("softmax online step, trial {trial}"),
        );
    }
    // The factor folds into the exp2 argument's multiply and the row max
    // (rowmax(c·s) = c·rowmax(s)): no operation per score more than before.
    let (_, before) = simplify_region(&orig.online.fwd, Limits::default());
    let (simplified, after) = simplify_region(&new.online.fwd, Limits::default());
    assert!(
        after.cost_after <= before.cost_after + 1.0,
        "folded online step costs {} against {}:\n{}",
        after.cost_after,
        before.cost_after,
        simplified.render(&[])
    );
}

#[test]
fn a_score_modification_takes_the_scale() {
    let v = example("softcap");
    let folded = fold_q_scale(&v, 64, 64).expect("softcap's Q scale folds");
    let (orig, new) = (v.parallel().unwrap(), folded.parallel().unwrap());
    assert!(new.modify_q.is_none());
    let c = 1.0 / 64f64.sqrt();
    let s: Vec<f64> = vec![-300.0, -7.5, 0.0, 2.25, 90.0];
    let scaled: Vec<f64> = s.iter().map(|x| c * x).collect();
    assert_rows_close(
        &eval(new.modify_scores.as_ref().unwrap(), &s, &[0.0]),
        &eval(orig.modify_scores.as_ref().unwrap(), &scaled, &[0.0]),
        "softcap's modify_scores",
    );
    // The online step reads the modified scores, unchanged.
    let state = [0.3, 1.7];
    assert_rows_close(
        &eval(&new.online.fwd, &s, &state),
        &eval(&orig.online.fwd, &s, &state),
        "softcap's online step",
    );
}

#[test]
fn a_literal_scale_folds_and_other_modifications_stay() {
    let mla = fold_q_scale(&example("mla_decode"), 576, 512).expect("q * rsqrt(192.0) folds");
    assert!(mla.parallel().unwrap().modify_q.is_none());
    // A Q modification that is not one factor (RFA's feature map), or no
    // modification at all (RetNet's parallel form): nothing to fold.
    assert!(fold_q_scale(&example("rfa"), 64, 64).is_none());
    assert!(fold_q_scale(&example("retnet_parallel"), 128, 128).is_none());
}

#[test]
fn kernels_no_longer_modify_the_q_tile() {
    for (isa, wgmma) in [(Isa::Sm80, false), (Isa::Sm90a, true)] {
        let v = example("softmax");
        let cfg = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, isa);
        assert_eq!(cfg.wgmma, wgmma);
        let k = parallel_forward(&v, 128, 128, &cfg).expect("softmax forward");
        assert!(
            !k.source.contains("modify_q("),
            "{isa:?}: the scaled scores replace the pass over Q"
        );
        // The scale is now a constant of the online step.
        assert!(
            k.source.contains("online_fwd"),
            "{isa:?}: online step present"
        );
    }
}

/// Every output of a backward region with its score row `scores`, the seed
/// (dP or the closure's upstream gradient) `seed`, the state fields by name
/// (dO·O under `DOT_FIELD`), indices and sizes fixed.
fn eval_backward(r: &Region, scores: &[f64], seed: &[f64], state: &[(&str, f64)]) -> Vec<Vec<f64>> {
    eval_region(r, &mut |op| match op {
        Op::Param(k) => match &r.params[*k as usize].role {
            ParamRole::Element => scores.to_vec(),
            ParamRole::Seed(_) => seed.to_vec(),
            ParamRole::State(f) => vec![
                state
                    .iter()
                    .find(|(name, _)| name == f)
                    .unwrap_or_else(|| panic!("state field {f}"))
                    .1,
            ],
        },
        Op::Index(_) => vec![5.0],
        Op::Shape(_) => vec![300.0],
        other => unreachable!("{other:?}"),
    })
}

#[test]
fn the_backward_recomputes_weights_and_gradients_of_the_raw_scores() {
    let v = example("softmax");
    let folded = fold_q_scale_backward(&v, 128, 128).expect("softmax's Q scale folds");
    assert!(folded.parallel().unwrap().modify_q.is_none());
    assert!(folded.parallel().unwrap().backward.modify_q.is_none());
    let (orig, new) = (backward_plan(&v).unwrap(), backward_plan(&folded).unwrap());
    assert_eq!(orig.uses_dot, new.uses_dot);
    let c = 1.0 / 128f64.sqrt();
    let mut rng = StdRng::seed_from_u64(5);
    for trial in 0..20 {
        let s: Vec<f64> = (0..11).map(|_| rng.random_range(-40.0..40.0)).collect();
        let dp: Vec<f64> = (0..11).map(|_| rng.random_range(-3.0..3.0)).collect();
        let scaled: Vec<f64> = s.iter().map(|x| c * x).collect();
        let state = [
            ("m", rng.random_range(-2.0..2.0)),
            ("l", rng.random_range(0.5..3.0)),
            (DOT_FIELD, rng.random_range(-1.0..1.0)),
        ];
        // The weight of the raw score is the original weight of the scaled one.
        assert_rows_close(
            &eval_backward(&new.recompute, &s, &dp, &state),
            &eval_backward(&orig.recompute, &scaled, &dp, &state),
            &format!("recomputed p, trial {trial}"),
        );
        // dL/ds_raw = c · dL/ds_scaled: the kernels' dK and dQ need no rescale.
        let want: Vec<Vec<f64>> = eval_backward(&orig.ds, &scaled, &dp, &state)
            .into_iter()
            .map(|row| row.into_iter().map(|x| c * x).collect())
            .collect();
        assert_rows_close(
            &eval_backward(&new.ds, &s, &dp, &state),
            &want,
            &format!("ds, trial {trial}"),
        );
    }
}

#[test]
fn a_score_modification_gradient_takes_the_scale() {
    let v = example("softcap");
    let folded = fold_q_scale_backward(&v, 64, 64).expect("softcap's Q scale folds");
    let (orig, new) = (v.parallel().unwrap(), folded.parallel().unwrap());
    let (orig_bwd, new_bwd) = (
        orig.backward.modify_scores.as_ref().unwrap(),
        new.backward.modify_scores.as_ref().unwrap(),
    );
    let c = 1.0 / 64f64.sqrt();
    let s: Vec<f64> = vec![-300.0, -7.5, 0.0, 2.25, 90.0];
    let dy: Vec<f64> = vec![0.5, -1.25, 2.0, 0.75, -0.1];
    let scaled: Vec<f64> = s.iter().map(|x| c * x).collect();
    let want: Vec<Vec<f64>> = eval_backward(orig_bwd, &scaled, &dy, &[])
        .into_iter()
        .map(|row| row.into_iter().map(|x| c * x).collect())
        .collect();
    assert_rows_close(
        &eval_backward(new_bwd, &s, &dy, &[]),
        &want,
        "softcap's score gradient",
    );
}

#[test]
fn wgmma_backward_kernels_read_q_itself() {
    let v = example("softmax");
    let cfg = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm90a);
    assert!(cfg.wgmma);
    let k = parallel_backward(&v, 128, 128, &cfg).expect("softmax backward");
    assert!(!k.modifies_q, "no qmod workspace to fill");
    assert!(
        !k.source.contains("modify_q(") && !k.source.contains("modify_q_bwd("),
        "neither the row kernel's pass over Q nor dQ's rescale"
    );
    assert!(k.source.contains("qsrc = q;"), "the main kernel loads q");
    // Kept where the fold is not taken: the mma.sync kernel (its register
    // allocation spilled more with it), a score closure that reads custom
    // inputs (its gradient and the scaled one are two values per score), a
    // Q modification that is not one factor.
    let mapped = aec_frontend::parse_str(
        r#"
        pub struct MappedQ: parallel {
            q: [B, H, Sq, Dqk], k: [B, H, Skv, Dqk], v: [B, H, Skv, Dv];
            modify_q = |q| relu(q) * rsqrt(Dqk);
        }
    "#,
    )
    .expect("parse");
    assert!(fold_q_scale_backward(&mapped, 128, 128).is_none());
    let sm80 = BackwardConfig::default_for(128, 128, Elem::Bf16, Isa::Sm80);
    assert!(!sm80.wgmma);
    for (variant, cfg) in [(&v, sm80), (&example("relative_bias"), cfg), (&mapped, cfg)] {
        let k = parallel_backward(variant, 128, 128, &cfg).expect("backward");
        assert!(k.modifies_q, "{}", k.main.name);
        assert!(
            k.source.contains("qsrc = qmod;") && k.source.contains("modify_q_bwd("),
            "{}",
            k.main.name
        );
    }
}
