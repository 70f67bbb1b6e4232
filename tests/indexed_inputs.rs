//! Custom inputs with user axes, read by index: the relative-position bias
//! example against a closed form, block invariance, gradients of the table,
//! clamping, and the errors for misuse.

mod common;

use aec::frontend::ir::Axis;
use aec::frontend::parse_str;
use aec::frontend::reference::{self, Options, Tensor};
use common::*;

const SIZES: [(Axis, usize); 6] = [
    (Axis::B, 2),
    (Axis::H, 3),
    (Axis::Sq, 7),
    (Axis::Skv, 40),
    (Axis::Dqk, 5),
    (Axis::Dv, 4),
];

#[test]
fn relative_bias_matches_closed_form_with_clamped_distances() {
    let v = example("relative_bias");
    let mut r = rng(5);
    let x = inputs(&v, &SIZES, &mut r, (-1.0, 1.0));
    assert_eq!(
        x.customs["rel"].shape,
        vec![3, 33],
        "the table is [H, R = 33]"
    );
    let got = reference::forward(&v, &x, Options::default())
        .expect("forward")
        .o;
    let (b_n, h_n, sq, skv, d, dv) = (2, 3, 7, 40, 5, 4);
    let mut want = Tensor::zeros(&[b_n, h_n, sq, dv]);
    let mut clamped = 0;
    for b in 0..b_n {
        for h in 0..h_n {
            for i in 0..sq {
                let s: Vec<f64> = (0..skv)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|e| x.q.get(&[b, h, i, e]) * x.k.get(&[b, h, j, e]))
                            .sum();
                        let bucket = (i as i64 - j as i64 + 16).clamp(0, 32) as usize;
                        if bucket == 0 {
                            clamped += 1;
                        }
                        dot / (d as f64).sqrt() + x.customs["rel"].get(&[h, bucket])
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|t| (t - m).exp()).sum();
                for e in 0..dv {
                    let o: f64 = (0..skv)
                        .map(|j| (s[j] - m).exp() / z * x.v.get(&[b, h, j, e]))
                        .sum();
                    want.set(&[b, h, i, e], o);
                }
            }
        }
    }
    assert!(
        clamped > 0,
        "the test must reach distances beyond the table"
    );
    assert_close("relative_bias forward", &got, &want, 1e-12);
    for block in [1, 3, 8] {
        let blocked = reference::forward(&v, &x, Options { block: Some(block) })
            .expect("forward")
            .o;
        assert_close(
            &format!("relative_bias with KV blocks of {block}"),
            &blocked,
            &got,
            1e-12,
        );
    }
}

#[test]
fn relative_bias_gradients_match_finite_differences() {
    let v = example("relative_bias");
    let mut r = rng(6);
    let sizes = [
        (Axis::B, 1),
        (Axis::H, 2),
        (Axis::Sq, 5),
        (Axis::Skv, 23),
        (Axis::Dqk, 3),
        (Axis::Dv, 2),
    ];
    let x = inputs(&v, &sizes, &mut r, (-1.0, 1.0));
    // 33 table entries, all checked: several are hit by many (i, j), the
    // clamped ends by all distances beyond ±16, some never (gradient 0).
    check_gradients(&v, &x, 40, 1e-6, &mut r);
}

#[test]
fn a_table_of_the_wrong_size_is_refused_at_run_time() {
    let v = example("relative_bias");
    let mut r = rng(7);
    let mut x = inputs(&v, &SIZES, &mut r, (-1.0, 1.0));
    x.customs.insert("rel".into(), Tensor::zeros(&[3, 31]));
    let err = reference::forward(&v, &x, Options::default())
        .expect_err("wrong table size")
        .to_string();
    assert_eq!(
        err,
        "tensor `rel` has shape [3, 31]: user axis R is 31, declared [H, R = 33]"
    );
    x.customs.insert("rel".into(), Tensor::zeros(&[3]));
    let err = reference::forward(&v, &x, Options::default())
        .expect_err("missing user axis")
        .to_string();
    assert_eq!(
        err,
        "tensor `rel` has shape [3] (1 axes) but is declared [H, R = 33] (2 axes)"
    );
}

fn trace_err(body: &str) -> String {
    let src = format!(
        "pub struct T: parallel {{ q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; rel: [H, R]; slopes: [H]; {body} }}"
    );
    match parse_str(&src) {
        Ok(_) => panic!("accepted: {body}"),
        Err(d) => d.message,
    }
}

#[test]
fn misuse_of_indexed_inputs_is_reported() {
    assert_eq!(
        trace_err("modify_scores = |s, b, h, i, j| s + rel;"),
        "`rel` has user axes [R]: read it with an index, e.g. `rel[i - j]`"
    );
    assert_eq!(
        trace_err("modify_scores = |s, b, h, i, j| s + rel[i][j];"),
        "`rel` has 1 user axis but is indexed with 2"
    );
    assert_eq!(
        trace_err("modify_scores = |s, b, h, i, j| s + rel[s];"),
        "an index must be an integer expression (index variables, integer constants, + - *)"
    );
    assert_eq!(
        trace_err("modify_scores = |s, b, h, i, j| s + slopes[h];"),
        "`slopes` has 0 user axes but is indexed with 1"
    );
    assert_eq!(
        trace_err("modify_scores = |s, b, h, i, j| s + s[i];"),
        "`s` is not a custom input; only custom inputs with user axes can be indexed"
    );
    let src = "pub struct T: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; rel: [R, H]; }";
    let err = parse_str(src)
        .expect_err("broadcast axis after a user axis")
        .message;
    assert_eq!(
        err,
        "the broadcast axis `H` must come before the user axes of `rel`"
    );
}

#[test]
fn gpu_templates_need_fixed_user_axis_sizes() {
    use aec::compiler::{Elem, ForwardConfig, Isa, parallel_forward};
    let src = "pub struct T: parallel { q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; rel: [H, R]; modify_scores = |s, b, h, i, j| s + rel[i - j]; }";
    let v = parse_str(src).expect("valid");
    let cfg = ForwardConfig::default_for(&v, 64, 64, Elem::Bf16, Isa::Sm80);
    let e = parallel_forward(&v, 64, 64, &cfg).expect_err("R has no size");
    assert_eq!(
        e.0,
        "custom input `rel` has the user axis `R` without a size; the GPU templates need it fixed: declare `R = <n>`"
    );
    // With a size the same variant generates, reading the table clamped.
    let fixed = parse_str(&src.replace("rel: [H, R]", "rel: [H, R = 9]")).expect("valid");
    let k = parallel_forward(&fixed, 64, 64, &cfg).expect("generates");
    assert!(
        k.source.contains("* 9 + min(max((long long)("),
        "the read is clamped into the 9 entries"
    );
}
