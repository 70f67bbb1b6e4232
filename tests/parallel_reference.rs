//! The parallel-pattern examples against the f64 reference interpreter.
//!
//! For every parallel example: the reference forward matches an independent
//! closed form written here with plain loops (textbook softmax, sigmoid, ReLU,
//! the RetNet decay matrix, ALiBi, softcapping, document masks, …); it does not
//! depend on the KV block size of the online normalisation; and the reference
//! backward matches finite differences of the reference forward. One more test
//! runs `aec check` over every file in `examples/`.
mod common;
use aec::frontend::Variant;
use aec::frontend::ir::Axis;
use aec::frontend::reference::{self, Inputs, Options, Tensor};
use common::*;
use rand::Rng;
use rand::rngs::StdRng;

// ---------------------------------------------------------------------------
// The closed forms.

/// How a row of scores becomes weights.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Norm {
    /// `exp(s_j − m) / Σ exp(s − m)` over the visible keys, `m` the row max.
    Softmax,
    /// The scores themselves.
    Plain,
    /// `s_j / max(Σ_j |s_j|, 1)` (RetNet's normaliser as the example writes it).
    AbsSum,
}

/// The closed-form output and the row scale: the log-sum-exp for
/// [`Norm::Softmax`], `max(Σ|s|, 1)` for [`Norm::AbsSum`], unused for
/// [`Norm::Plain`]. A row with no visible key outputs 0 (its scale is NaN and
/// not compared).
struct Closed {
    o: Tensor,
    scale: Tensor,
}

/// Plain-loop attention over `inp`: query head `h` reads kv head
/// `h / (H / Hkv)`; `score([b, h, i, j], q_i·k_j)` gives the final score;
/// `visible([b, h, i, j])` says whether key `j` exists for query `i`.
fn closed_form(
    inp: &Inputs,
    norm: Norm,
    score: impl Fn([usize; 4], f64) -> f64,
    visible: impl Fn([usize; 4]) -> bool,
) -> Closed {
    let (b_n, h_n, sq, dqk) = (
        inp.q.shape[0],
        inp.q.shape[1],
        inp.q.shape[2],
        inp.q.shape[3],
    );
    let (hkv, skv, dv) = (inp.k.shape[1], inp.k.shape[2], inp.v.shape[3]);
    assert_eq!(h_n % hkv, 0);
    let group = h_n / hkv;
    let mut o = Tensor::zeros(&[b_n, h_n, sq, dv]);
    let mut scale = Tensor::zeros(&[b_n, h_n, sq]);
    for b in 0..b_n {
        for h in 0..h_n {
            let hk = h / group;
            for i in 0..sq {
                let mut js = Vec::new();
                let mut s = Vec::new();
                for j in 0..skv {
                    if !visible([b, h, i, j]) {
                        continue;
                    }
                    let mut qk = 0.0;
                    for d in 0..dqk {
                        qk += inp.q.get(&[b, h, i, d]) * inp.k.get(&[b, hk, j, d]);
                    }
                    js.push(j);
                    s.push(score([b, h, i, j], qk));
                }
                if js.is_empty() {
                    scale.set(&[b, h, i], f64::NAN);
                    continue;
                }
                let (w, sc): (Vec<f64>, f64) = match norm {
                    Norm::Softmax => {
                        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                        let l: f64 = e.iter().sum();
                        (e.iter().map(|x| x / l).collect(), m + l.ln())
                    }
                    Norm::Plain => (s.clone(), f64::NAN),
                    Norm::AbsSum => {
                        let n = s.iter().map(|x| x.abs()).sum::<f64>().max(1.0);
                        (s.iter().map(|x| x / n).collect(), n)
                    }
                };
                scale.set(&[b, h, i], sc);
                for e in 0..dv {
                    let mut acc = 0.0;
                    for (&j, wj) in js.iter().zip(&w) {
                        acc += wj * inp.v.get(&[b, hk, j, e]);
                    }
                    o.set(&[b, h, i, e], acc);
                }
            }
        }
    }
    Closed { o, scale }
}

fn inv_sqrt(d: usize) -> f64 {
    1.0 / (d as f64).sqrt()
}

fn dqk_of(inp: &Inputs) -> usize {
    inp.q.shape[3]
}

// ---------------------------------------------------------------------------
// Shared checks.

fn sizes(
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    dqk: usize,
    dv: usize,
) -> Vec<(Axis, usize)> {
    vec![
        (Axis::B, b),
        (Axis::H, h),
        (Axis::Hkv, hkv),
        (Axis::Sq, sq),
        (Axis::Skv, skv),
        (Axis::Dqk, dqk),
        (Axis::Dv, dv),
    ]
}

/// The default odd sizes: B 2, H 4 (Hkv 2 where the variant has kv heads),
/// Sq 7, Skv 13, Dqk 5, Dv 3.
fn odd() -> Vec<(Axis, usize)> {
    sizes(2, 4, 2, 7, 13, 5, 3)
}

/// Compares the reference forward with the closed form: the output, and the
/// row scale `scale_name` (when given) on rows with a visible key.
fn check_forward(v: &Variant, inp: &Inputs, want: &Closed, scale_name: Option<&str>) {
    let got = reference::forward(v, inp, Options::default()).expect("forward");
    assert_close(&format!("{}: output", v.name), &got.o, &want.o, 1e-12);
    if let Some(name) = scale_name {
        let scale = &got.scales[name];
        let rows: Vec<usize> = (0..want.scale.data.len())
            .filter(|&r| !want.scale.data[r].is_nan())
            .collect();
        assert!(!rows.is_empty());
        let pick = |t: &Tensor| Tensor {
            shape: vec![rows.len()],
            data: rows.iter().map(|&r| t.data[r]).collect(),
        };
        assert_close(
            &format!("{}: row scale `{name}`", v.name),
            &pick(scale),
            &pick(&want.scale),
            1e-12,
        );
    }
}

/// KV blocks of 1, 3 and 4 give the whole-row result: output, row scales and
/// final row state (non-finite entries, e.g. of fully masked rows, must agree
/// exactly).
fn check_blocks(v: &Variant, inp: &Inputs) {
    let whole = reference::forward(v, inp, Options::default()).expect("forward");
    assert!(whole.o.norm() > 0.0);
    for block in [1, 3, 4] {
        let blocked = reference::forward(v, inp, Options { block: Some(block) }).expect("forward");
        assert_close(
            &format!("{}: output with KV blocks of {block}", v.name),
            &blocked.o,
            &whole.o,
            1e-12,
        );
        let aux = whole
            .scales
            .iter()
            .map(|(n, t)| (format!("row scale `{n}`"), t, &blocked.scales[n]))
            .chain(
                whole
                    .row_state
                    .iter()
                    .map(|(n, t)| (format!("row state `{n}`"), t, &blocked.row_state[n])),
            );
        for (what, w, g) in aux {
            for (x, y) in g.data.iter().zip(&w.data) {
                let ok = if x.is_finite() && y.is_finite() {
                    (x - y).abs() <= 1e-12 * y.abs().max(1.0)
                } else {
                    x == y || (x.is_nan() && y.is_nan())
                };
                assert!(
                    ok,
                    "{}: {what} with KV blocks of {block}: {x} vs whole row {y}",
                    v.name
                );
            }
        }
    }
}

/// The central finite-difference check of `common::check_gradients`, for q, k
/// and v only (for variants whose custom inputs are discrete).
fn check_qkv_gradients(v: &Variant, inp: &Inputs, samples: usize, tol: f64, rng: &mut StdRng) {
    let shape = reference::forward(v, inp, Options::default())
        .expect("forward")
        .o
        .shape;
    let d_o = random(&shape, rng, -1.0, 1.0);
    let grads = reference::backward(v, inp, &d_o).expect("backward");
    type Pick = fn(&mut Inputs) -> &mut Tensor;
    let tensors: [(&str, &Tensor, Pick); 3] = [
        ("q", &grads.dq, |x| &mut x.q),
        ("k", &grads.dk, |x| &mut x.k),
        ("v", &grads.dv, |x| &mut x.v),
    ];
    for (name, analytic, pick) in tensors {
        let len = analytic.data.len();
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for _ in 0..samples {
            let c = rng.random_range(0..len);
            let x = pick(&mut inp.clone()).data[c];
            let eps = 1e-5 * x.abs().max(1.0);
            let mut plus = inp.clone();
            pick(&mut plus).data[c] = x + eps;
            let mut minus = inp.clone();
            pick(&mut minus).data[c] = x - eps;
            let fd = (loss(v, &plus, &d_o) - loss(v, &minus, &d_o)) / (2.0 * eps);
            num += (fd - analytic.data[c]).powi(2);
            den += fd * fd;
        }
        assert!(
            den > 0.0,
            "{}: all sampled finite differences of `{name}` are zero",
            v.name
        );
        let rel = (num / den).sqrt();
        assert!(
            rel < tol,
            "{}: gradient of `{name}` disagrees with finite differences: relative error {rel:e}",
            v.name
        );
    }
}

// ---------------------------------------------------------------------------
// softmax

#[test]
fn softmax_forward_matches_closed_form() {
    let v = example("softmax");
    let inp = inputs(&v, &odd(), &mut rng(10), (0.1, 0.9));
    let c = inv_sqrt(dqk_of(&inp));
    let want = closed_form(&inp, Norm::Softmax, |_, qk| qk * c, |_| true);
    // The lse row scale is log Σ_j exp(s_ij).
    check_forward(&v, &inp, &want, Some("lse"));
    let got = reference::forward(&v, &inp, Options::default()).unwrap();
    let (b, h, i) = (1, 2, 3);
    let direct: f64 = (0..13)
        .map(|j| {
            let s: f64 = (0..5)
                .map(|d| inp.q.get(&[b, h, i, d]) * inp.k.get(&[b, h, j, d]))
                .sum();
            (s * c).exp()
        })
        .sum::<f64>()
        .ln();
    let lse = got.scales["lse"].get(&[b, h, i]);
    assert!(
        (lse - direct).abs() < 1e-12 * direct.abs().max(1.0),
        "lse {lse} vs log Σ exp {direct}"
    );
}

#[test]
fn softmax_is_block_invariant() {
    let v = example("softmax");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(11), (0.1, 0.9)));
}

#[test]
fn softmax_gradients_match_finite_differences() {
    let v = example("softmax");
    let mut r = rng(12);
    let inp = inputs(&v, &sizes(2, 3, 3, 5, 7, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// softmax_gqa

#[test]
fn softmax_gqa_forward_matches_closed_form() {
    let v = example("softmax_gqa");
    let inp = inputs(&v, &odd(), &mut rng(20), (0.1, 0.9));
    assert_eq!(inp.k.shape, vec![2, 2, 13, 5], "k has the Hkv heads");
    let c = inv_sqrt(dqk_of(&inp));
    let want = closed_form(&inp, Norm::Softmax, |_, qk| qk * c, |_| true);
    check_forward(&v, &inp, &want, Some("lse"));
}

#[test]
fn softmax_gqa_is_block_invariant() {
    let v = example("softmax_gqa");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(21), (0.1, 0.9)));
}

#[test]
fn softmax_gqa_gradients_match_finite_differences() {
    let v = example("softmax_gqa");
    let mut r = rng(22);
    // Three query heads per kv head; multi-query (Hkv 1) in a second case.
    let inp = inputs(&v, &sizes(1, 6, 2, 3, 5, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
    let inp = inputs(&v, &sizes(2, 3, 1, 3, 4, 2, 3), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// softmax_causal

fn causal_closed(inp: &Inputs) -> Closed {
    let c = inv_sqrt(dqk_of(inp));
    closed_form(inp, Norm::Softmax, |_, qk| qk * c, |[_, _, i, j]| i >= j)
}

#[test]
fn softmax_causal_forward_matches_closed_form() {
    let v = example("softmax_causal");
    // Self-attention, Sq == Skv.
    let inp = inputs(&v, &sizes(2, 4, 4, 13, 13, 5, 3), &mut rng(30), (0.1, 0.9));
    check_forward(&v, &inp, &causal_closed(&inp), Some("lse"));
    // Sq < Skv: the mask is on absolute positions, so query i sees keys 0..=i
    // (top-left aligned) and keys j >= Sq are seen by no query.
    let inp = inputs(&v, &odd(), &mut rng(31), (0.1, 0.9));
    let want = causal_closed(&inp);
    check_forward(&v, &inp, &want, Some("lse"));
    let mut moved = inp.clone();
    for b in 0..2 {
        for h in 0..4 {
            for j in 7..13 {
                for d in 0..5 {
                    moved.k.set(&[b, h, j, d], 9.0);
                }
                for e in 0..3 {
                    moved.v.set(&[b, h, j, e], -9.0);
                }
            }
        }
    }
    let got = reference::forward(&v, &moved, Options::default()).unwrap();
    assert_close("keys past Sq are invisible", &got.o, &want.o, 1e-12);
    // Query 0 sees exactly key 0: its output is v_0.
    for e in 0..3 {
        assert!((got.o.get(&[1, 2, 0, e]) - inp.v.get(&[1, 2, 0, e])).abs() < 1e-15);
    }
}

#[test]
fn softmax_causal_is_block_invariant() {
    let v = example("softmax_causal");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(32), (0.1, 0.9)));
    check_blocks(
        &v,
        &inputs(&v, &sizes(1, 2, 2, 9, 9, 3, 2), &mut rng(33), (0.1, 0.9)),
    );
}

#[test]
fn softmax_causal_gradients_match_finite_differences() {
    let v = example("softmax_causal");
    let mut r = rng(34);
    let inp = inputs(&v, &sizes(2, 2, 2, 5, 5, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
    let inp = inputs(&v, &sizes(1, 2, 2, 3, 6, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// deepseek (Dqk 192, Dv 128) and diff_transformer (Dqk 128, Dv 256)

fn fixed_dims_case(name: &str, dqk: usize, dv: usize, seed: u64) -> (Variant, Inputs) {
    let v = example(name);
    let inp = inputs(
        &v,
        &[(Axis::B, 1), (Axis::H, 2), (Axis::Sq, 5), (Axis::Skv, 6)],
        &mut rng(seed),
        (0.1, 0.9),
    );
    assert_eq!(inp.q.shape, vec![1, 2, 5, dqk]);
    assert_eq!(inp.v.shape, vec![1, 2, 6, dv]);
    (v, inp)
}

#[test]
fn deepseek_forward_matches_closed_form() {
    let (v, inp) = fixed_dims_case("deepseek", 192, 128, 40);
    check_forward(&v, &inp, &causal_closed(&inp), Some("lse"));
}

#[test]
fn deepseek_is_block_invariant() {
    let (v, inp) = fixed_dims_case("deepseek", 192, 128, 41);
    check_blocks(&v, &inp);
}

#[test]
fn deepseek_gradients_match_finite_differences() {
    let v = example("deepseek");
    let mut r = rng(42);
    let inp = inputs(
        &v,
        &[(Axis::B, 1), (Axis::H, 1), (Axis::Sq, 3), (Axis::Skv, 4)],
        &mut r,
        (0.1, 0.9),
    );
    check_gradients(&v, &inp, 6, 1e-6, &mut r);
}

#[test]
fn diff_transformer_forward_matches_closed_form() {
    let (v, inp) = fixed_dims_case("diff_transformer", 128, 256, 50);
    check_forward(&v, &inp, &causal_closed(&inp), Some("lse"));
}

#[test]
fn diff_transformer_is_block_invariant() {
    let (v, inp) = fixed_dims_case("diff_transformer", 128, 256, 51);
    check_blocks(&v, &inp);
}

#[test]
fn diff_transformer_gradients_match_finite_differences() {
    let v = example("diff_transformer");
    let mut r = rng(52);
    let inp = inputs(
        &v,
        &[(Axis::B, 1), (Axis::H, 1), (Axis::Sq, 3), (Axis::Skv, 4)],
        &mut r,
        (0.1, 0.9),
    );
    check_gradients(&v, &inp, 6, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// sigmoid

#[test]
fn sigmoid_forward_matches_closed_form() {
    let v = example("sigmoid");
    let inp = inputs(&v, &odd(), &mut rng(60), (0.1, 0.9));
    let c = inv_sqrt(dqk_of(&inp));
    let n = inp.k.shape[2] as f64;
    let want = closed_form(
        &inp,
        Norm::Plain,
        |_, qk| 1.0 / (1.0 + (-(qk * c - n.ln())).exp()),
        |_| true,
    );
    check_forward(&v, &inp, &want, None);
}

#[test]
fn sigmoid_is_block_invariant() {
    let v = example("sigmoid");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(61), (0.1, 0.9)));
}

#[test]
fn sigmoid_gradients_match_finite_differences() {
    let v = example("sigmoid");
    let mut r = rng(62);
    let inp = inputs(&v, &sizes(2, 2, 2, 5, 7, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// relu

#[test]
fn relu_forward_matches_closed_form() {
    let v = example("relu");
    let inp = inputs(&v, &odd(), &mut rng(70), (0.1, 0.9));
    let c = inv_sqrt(dqk_of(&inp));
    let n = inp.k.shape[2] as f64;
    let want = closed_form(&inp, Norm::Plain, |_, qk| (qk * c).max(0.0) / n, |_| true);
    check_forward(&v, &inp, &want, None);
}

#[test]
fn relu_is_block_invariant() {
    let v = example("relu");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(71), (0.1, 0.9)));
}

#[test]
fn relu_gradients_match_finite_differences() {
    let v = example("relu");
    let mut r = rng(72);
    let inp = inputs(&v, &sizes(2, 2, 2, 5, 7, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// retnet_parallel

/// Sizes and decays for RetNet; q and k are scaled up so that some rows have
/// Σ|s| > 1 (normalised) and others Σ|s| < 1 (divided by 1).
fn retnet_case(sz: &[(Axis, usize)], seed: u64, qk_scale: f64) -> (Variant, Inputs) {
    let v = example("retnet_parallel");
    let mut inp = inputs(&v, sz, &mut rng(seed), (0.5, 0.95));
    for x in inp.q.data.iter_mut().chain(inp.k.data.iter_mut()) {
        *x *= qk_scale;
    }
    (v, inp)
}

#[test]
fn retnet_parallel_forward_matches_closed_form() {
    let (v, inp) = retnet_case(&odd(), 80, 1.0);
    let gamma = inp.customs["gamma"].clone();
    // D_ij = γ_h^(i − j) for i >= j, 0 otherwise.
    let want = closed_form(
        &inp,
        Norm::AbsSum,
        |[_, h, i, j], qk| qk * gamma.data[h].powi((i - j) as i32),
        |[_, _, i, j]| i >= j,
    );
    let clipped = want.scale.data.iter().filter(|&&n| n == 1.0).count();
    assert!(
        clipped > 0 && clipped < want.scale.data.len(),
        "the inputs should exercise both sides of max(Σ|s|, 1) ({clipped} rows clipped)"
    );
    check_forward(&v, &inp, &want, Some("scale"));
}

#[test]
fn retnet_parallel_is_block_invariant() {
    let (v, inp) = retnet_case(&odd(), 81, 1.0);
    check_blocks(&v, &inp);
}

#[test]
fn retnet_parallel_gradients_match_finite_differences() {
    let mut r = rng(82);
    // gamma in (0.5, 0.95); q, k scaled so that some rows normalise.
    let (v, inp) = retnet_case(&sizes(2, 3, 3, 5, 6, 3, 2), 83, 1.5);
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// sliding_window

fn window_closed(inp: &Inputs, window: usize) -> Closed {
    let c = inv_sqrt(dqk_of(inp));
    closed_form(
        inp,
        Norm::Softmax,
        |_, qk| qk * c,
        |[_, _, i, j]| i >= j && i - j < window,
    )
}

/// Long enough that the window of 256 cuts rows off; small everywhere else.
fn window_case(seed: u64) -> (Variant, Inputs) {
    let v = example("sliding_window");
    let inp = inputs(
        &v,
        &sizes(1, 1, 1, 300, 300, 2, 2),
        &mut rng(seed),
        (0.1, 0.9),
    );
    (v, inp)
}

#[test]
fn sliding_window_forward_matches_closed_form() {
    let (v, inp) = window_case(90);
    check_forward(&v, &inp, &window_closed(&inp, 256), Some("lse"));
    // The window matters: rows past 256 differ from plain causal attention,
    // the first 256 rows do not.
    let causal = window_closed(&inp, usize::MAX);
    let got = reference::forward(&v, &inp, Options::default()).unwrap();
    let row_err = |i: usize| {
        (0..2)
            .map(|e| (got.o.get(&[0, 0, i, e]) - causal.o.get(&[0, 0, i, e])).abs())
            .fold(0.0, f64::max)
    };
    assert!((0..256).all(|i| row_err(i) < 1e-12));
    assert!((256..300).all(|i| row_err(i) > 1e-9));
}

#[test]
fn sliding_window_is_block_invariant() {
    let (v, inp) = window_case(91);
    check_blocks(&v, &inp);
}

#[test]
fn sliding_window_gradients_match_finite_differences() {
    let v = example("sliding_window");
    let mut r = rng(92);
    let inp = inputs(&v, &sizes(1, 2, 2, 5, 7, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// alibi

#[test]
fn alibi_forward_matches_closed_form() {
    let v = example("alibi");
    let inp = inputs(&v, &odd(), &mut rng(100), (0.1, 0.9));
    let slopes = inp.customs["slopes"].clone();
    let c = inv_sqrt(dqk_of(&inp));
    let want = closed_form(
        &inp,
        Norm::Softmax,
        |[_, h, i, j], qk| qk * c - slopes.data[h] * (i as f64 - j as f64),
        |[_, _, i, j]| i >= j,
    );
    check_forward(&v, &inp, &want, Some("lse"));
}

#[test]
fn alibi_is_block_invariant() {
    let v = example("alibi");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(101), (0.1, 0.9)));
}

#[test]
fn alibi_gradients_match_finite_differences() {
    let v = example("alibi");
    let mut r = rng(102);
    let inp = inputs(&v, &sizes(2, 3, 3, 5, 6, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// softcap

/// q scaled so that scores reach well past the cap of 50.
fn softcap_case(sz: &[(Axis, usize)], seed: u64, q_scale: f64) -> (Variant, Inputs) {
    let v = example("softcap");
    let mut inp = inputs(&v, sz, &mut rng(seed), (0.1, 0.9));
    for x in inp.q.data.iter_mut() {
        *x *= q_scale;
    }
    (v, inp)
}

#[test]
fn softcap_forward_matches_closed_form() {
    let (v, inp) = softcap_case(&odd(), 110, 80.0);
    let c = inv_sqrt(dqk_of(&inp));
    let want = closed_form(
        &inp,
        Norm::Softmax,
        |_, qk| 50.0 * (qk * c / 50.0).tanh(),
        |_| true,
    );
    check_forward(&v, &inp, &want, Some("lse"));
    // The cap is active: some raw scores exceed 50 in magnitude, and the lse
    // stays below 50 + log(Skv).
    let got = reference::forward(&v, &inp, Options::default()).unwrap();
    assert!(
        got.scales["lse"]
            .data
            .iter()
            .all(|&x| x < 50.0 + 13f64.ln())
    );
    let uncapped = closed_form(&inp, Norm::Softmax, |_, qk| qk * c, |_| true);
    assert!(uncapped.scale.data.iter().any(|&x| x > 60.0));
}

#[test]
fn softcap_is_block_invariant() {
    let (v, inp) = softcap_case(&odd(), 111, 80.0);
    check_blocks(&v, &inp);
}

#[test]
fn softcap_gradients_match_finite_differences() {
    let mut r = rng(112);
    let (v, inp) = softcap_case(&sizes(2, 2, 2, 5, 6, 3, 2), 113, 20.0);
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// decode

#[test]
fn decode_forward_matches_closed_form() {
    let v = example("decode");
    let inp = inputs(&v, &odd(), &mut rng(120), (0.1, 0.9));
    assert_eq!(inp.q.shape, vec![2, 4, 1, 5], "Sq is fixed to 1");
    assert_eq!(inp.k.shape, vec![2, 2, 13, 5]);
    let c = inv_sqrt(dqk_of(&inp));
    let want = closed_form(&inp, Norm::Softmax, |_, qk| qk * c, |_| true);
    check_forward(&v, &inp, &want, Some("lse"));
}

#[test]
fn decode_is_block_invariant() {
    let v = example("decode");
    check_blocks(&v, &inputs(&v, &odd(), &mut rng(121), (0.1, 0.9)));
}

#[test]
fn decode_gradients_match_finite_differences() {
    let v = example("decode");
    let mut r = rng(122);
    let inp = inputs(&v, &sizes(2, 4, 2, 1, 7, 3, 2), &mut r, (0.1, 0.9));
    check_gradients(&v, &inp, 10, 1e-6, &mut r);
}

// ---------------------------------------------------------------------------
// document_mask

/// Two sequences of 11 packed tokens. Query 5 of sequence 0 carries a document
/// id (7) that no key has: that row is fully masked.
fn document_case(seed: u64, dqk: usize, dv: usize, h: usize) -> (Variant, Inputs) {
    let v = example("document_mask");
    let mut inp = inputs(
        &v,
        &sizes(2, h, h, 11, 11, dqk, dv),
        &mut rng(seed),
        (0.1, 0.9),
    );
    let docs: [[f64; 11]; 2] = [
        [0., 0., 0., 1., 1., 1., 1., 2., 2., 2., 2.],
        [0., 1., 1., 1., 1., 1., 2., 2., 3., 3., 3.],
    ];
    let ids = Tensor {
        shape: vec![2, 11],
        data: docs.concat(),
    };
    let (mut doc_q, doc_k) = (ids.clone(), ids);
    doc_q.set(&[0, 5], 7.0);
    inp.customs.insert("doc_q".into(), doc_q);
    inp.customs.insert("doc_k".into(), doc_k);
    (v, inp)
}

#[test]
fn document_mask_forward_matches_closed_form() {
    let (v, inp) = document_case(130, 5, 3, 4);
    let (dq, dk) = (inp.customs["doc_q"].clone(), inp.customs["doc_k"].clone());
    let c = inv_sqrt(dqk_of(&inp));
    let want = closed_form(
        &inp,
        Norm::Softmax,
        |_, qk| qk * c,
        |[b, _, i, j]| dq.get(&[b, i]) == dk.get(&[b, j]) && i >= j,
    );
    check_forward(&v, &inp, &want, Some("lse"));
    let got = reference::forward(&v, &inp, Options::default()).unwrap();
    assert!(got.o.data.iter().all(|x| !x.is_nan()));
    for h in 0..4 {
        for e in 0..3 {
            assert_eq!(
                got.o.get(&[0, h, 5, e]),
                0.0,
                "the fully masked row outputs exactly 0"
            );
        }
        // Its row scale is the epilogue's value for the initial state:
        // −inf + log(0) = −inf.
        assert_eq!(got.scales["lse"].get(&[0, h, 5]), f64::NEG_INFINITY);
    }
    // A document's first token sees only itself.
    for e in 0..3 {
        assert!((got.o.get(&[1, 2, 6, e]) - inp.v.get(&[1, 2, 6, e])).abs() < 1e-15);
    }
}

#[test]
fn document_mask_is_block_invariant() {
    let (v, inp) = document_case(131, 5, 3, 4);
    check_blocks(&v, &inp);
}

#[test]
fn document_mask_gradients_match_finite_differences() {
    let (v, inp) = document_case(132, 3, 2, 2);
    let mut r = rng(133);
    // Document ids are discrete: finite differences only for q, k, v.
    check_qkv_gradients(&v, &inp, 10, 1e-6, &mut r);
    // The fully masked row gets zero gradient; the ids get none.
    let d_o = random(&[2, 2, 11, 2], &mut r, -1.0, 1.0);
    let g = reference::backward(&v, &inp, &d_o).unwrap();
    for h in 0..2 {
        for d in 0..3 {
            assert_eq!(g.dq.get(&[0, h, 5, d]), 0.0);
        }
    }
    assert!(g.dq.norm() > 0.0);
    for name in ["doc_q", "doc_k"] {
        assert!(g.customs[name].data.iter().all(|&x| x == 0.0), "{name}");
    }
}

// ---------------------------------------------------------------------------
// The CLI over every example.

#[test]
fn aec_check_accepts_every_example() {
    let mut files: Vec<_> = std::fs::read_dir(examples_dir())
        .expect("examples/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 13,
        "expected the parallel examples, found {files:?}"
    );
    let mut failures = Vec::new();
    for f in &files {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_aec"))
            .arg("check")
            .arg(f)
            .output()
            .expect("run aec");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success()
            || !stdout.contains("forward graph:")
            || !stdout.contains("backward graph:")
        {
            failures.push(format!(
                "{}: {}\n{}",
                f.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "`aec check` failed on:\n{}",
        failures.join("\n")
    );
}
