//! The recurrent examples against the reference interpreter:
//!
//! - (a) the forward against an independent closed form per model, written as
//!   the plain loops of the recurrence in that model's paper;
//! - (b) the step-by-step forward against the parallel (masked decay matrix)
//!   form, with and without an initial state;
//! - (c) with an initial state: the final state against the closed form, and
//!   continuing a prefix's final state gives the full run;
//! - (d) every gradient (q, k, v, each custom input, the initial state) against
//!   finite differences;
//! - (e) shape errors for a wrongly shaped initial state and a missing custom
//!   input name the tensor and its shape.
// The closed forms index states like the papers' equations (`S[i][j]`).
#![allow(clippy::needless_range_loop)]

mod common;
use aec::frontend::Variant;
use aec::frontend::ir::Axis;
use aec::frontend::reference::recurrent::forward_parallel_form;
use aec::frontend::reference::{self, Inputs, Options, Tensor};
use common::*;
use rand::rngs::StdRng;

/// Odd sizes: B 2, H 3, S 9, Dk 5, Dv 3.
const SIZES: [(Axis, usize); 5] = [
    (Axis::B, 2),
    (Axis::H, 3),
    (Axis::S, 9),
    (Axis::Dk, 5),
    (Axis::Dv, 3),
];
/// Where the prefix/suffix split happens (4 steps, then 5).
const SPLIT: usize = 4;
const TOL: f64 = 1e-12;

/// One recurrent example and its closed form.
struct Model {
    name: &'static str,
    /// The output and the final state, computed from the paper's recurrence.
    closed: fn(&Inputs) -> Closed,
    /// Overwrites custom inputs whose range must differ from the default one.
    fix_customs: fn(&mut Inputs, &mut StdRng),
    /// Range of the custom inputs drawn by `inputs`.
    custom_range: (f64, f64),
    has_normalize: bool,
}

struct Closed {
    o: Tensor,
    state: Tensor,
}

const RETNET: Model = Model {
    name: "retnet_recurrent",
    closed: retnet_closed,
    fix_customs: |_, _| {},
    custom_range: (0.0, 1.0),
    has_normalize: false,
};
const GATED_RETENTION: Model = Model {
    name: "gated_retention",
    closed: gated_retention_closed,
    fix_customs: |_, _| {},
    // Gate logits.
    custom_range: (-2.0, 2.0),
    has_normalize: false,
};
const MAMBA2: Model = Model {
    name: "mamba2",
    closed: mamba2_closed,
    // `A` is negative in Mamba2; `dt` keeps the default (0.1, 0.9).
    fix_customs: |x, r| {
        let shape = x.customs["a"].shape.clone();
        x.customs.insert("a".into(), random(&shape, r, -0.9, -0.1));
    },
    custom_range: (0.1, 0.9),
    has_normalize: false,
};
const RFA: Model = Model {
    name: "rfa",
    closed: rfa_closed,
    fix_customs: |_, _| {},
    // The gate g in (0, 1).
    custom_range: (0.1, 0.9),
    has_normalize: true,
};
const GLA: Model = Model {
    name: "gla",
    closed: gla_closed,
    fix_customs: |_, _| {},
    // The log-space gate, negative.
    custom_range: (-0.5, -0.05),
    has_normalize: false,
};

// ---------------------------------------------------------------------------
// Closed forms: plain loops of each paper's recurrence.

fn dims(x: &Inputs) -> (usize, usize, usize, usize, usize) {
    let (q, v) = (&x.q.shape, &x.v.shape);
    (q[0], q[1], q[2], q[3], v[3])
}

/// The state before the first step, `[Dk][Dv]` (zero without an initial state).
fn state0(x: &Inputs, b: usize, h: usize) -> Vec<Vec<f64>> {
    let (_, _, _, dk, dv) = dims(x);
    (0..dk)
        .map(|i| {
            (0..dv)
                .map(|j| {
                    x.initial_state
                        .as_ref()
                        .map_or(0.0, |s| s.get(&[b, h, i, j]))
                })
                .collect()
        })
        .collect()
}

fn store(fin: &mut Tensor, b: usize, h: usize, s: &[Vec<f64>]) {
    for (i, row) in s.iter().enumerate() {
        for (j, &x) in row.iter().enumerate() {
            fin.set(&[b, h, i, j], x);
        }
    }
}

/// RetNet (Sun et al. 2023), recurrent retention: `S_n = γ S_{n-1} + K_nᵀ V_n`,
/// `Retention(X_n) = Q_n S_n`, with `γ_h = 1 − 2^(−5−h)` and `Q` scaled by
/// `d_k^(−1/2)`.
fn retnet_closed(x: &Inputs) -> Closed {
    let (nb, nh, ns, dk, dv) = dims(x);
    let mut o = Tensor::zeros(&[nb, nh, ns, dv]);
    let mut fin = Tensor::zeros(&[nb, nh, dk, dv]);
    for b in 0..nb {
        for h in 0..nh {
            let gamma = 1.0 - 2f64.powi(-5 - h as i32);
            let mut s = state0(x, b, h);
            for n in 0..ns {
                for i in 0..dk {
                    for j in 0..dv {
                        s[i][j] = gamma * s[i][j] + x.k.get(&[b, h, n, i]) * x.v.get(&[b, h, n, j]);
                    }
                }
                for j in 0..dv {
                    let mut y = 0.0;
                    for i in 0..dk {
                        y += x.q.get(&[b, h, n, i]) / (dk as f64).sqrt() * s[i][j];
                    }
                    o.set(&[b, h, n, j], y);
                }
            }
            store(&mut fin, b, h, &s);
        }
    }
    Closed { o, state: fin }
}

/// Gated retention (YOCO, Sun et al. 2024): `γ_n = sigmoid(X_n W_γ)^(1/τ)` with
/// τ = 16, `S_n = γ_n S_{n-1} + K_nᵀ V_n`, `gRet(X_n) = Q_n S_n` (`Q` scaled by
/// `d_k^(−1/2)`).
fn gated_retention_closed(x: &Inputs) -> Closed {
    let (nb, nh, ns, dk, dv) = dims(x);
    let gate = &x.customs["gate"];
    let mut o = Tensor::zeros(&[nb, nh, ns, dv]);
    let mut fin = Tensor::zeros(&[nb, nh, dk, dv]);
    for b in 0..nb {
        for h in 0..nh {
            let mut s = state0(x, b, h);
            for n in 0..ns {
                let sig = 1.0 / (1.0 + (-gate.get(&[b, h, n])).exp());
                let gamma = sig.powf(1.0 / 16.0);
                for i in 0..dk {
                    for j in 0..dv {
                        s[i][j] = gamma * s[i][j] + x.k.get(&[b, h, n, i]) * x.v.get(&[b, h, n, j]);
                    }
                }
                for j in 0..dv {
                    let mut y = 0.0;
                    for i in 0..dk {
                        y += x.q.get(&[b, h, n, i]) * s[i][j];
                    }
                    o.set(&[b, h, n, j], y / (dk as f64).sqrt());
                }
            }
            store(&mut fin, b, h, &s);
        }
    }
    Closed { o, state: fin }
}

/// Mamba2 SSD (Dao & Gu 2024), the selective scan with scalar `A` per head:
/// `h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t ⊗ x_t` (`h: [N, P]`), `y_t = C_tᵀ h_t`;
/// `C = q`, `B = k`, `x = v`, `Δ = dt`.
fn mamba2_closed(x: &Inputs) -> Closed {
    let (nb, nh, ns, n_state, p_head) = dims(x);
    let (a, dt) = (&x.customs["a"], &x.customs["dt"]);
    let (c_, b_, x_) = (&x.q, &x.k, &x.v);
    let mut y = Tensor::zeros(&[nb, nh, ns, p_head]);
    let mut fin = Tensor::zeros(&[nb, nh, n_state, p_head]);
    for b in 0..nb {
        for h in 0..nh {
            let a_h = a.get(&[h]);
            let mut st = state0(x, b, h);
            for t in 0..ns {
                let delta = dt.get(&[b, h, t]);
                let a_bar = (delta * a_h).exp();
                for n in 0..n_state {
                    for p in 0..p_head {
                        st[n][p] = a_bar * st[n][p]
                            + delta * b_.get(&[b, h, t, n]) * x_.get(&[b, h, t, p]);
                    }
                }
                for p in 0..p_head {
                    let yt: f64 = (0..n_state).map(|n| c_.get(&[b, h, t, n]) * st[n][p]).sum();
                    y.set(&[b, h, t, p], yt);
                }
            }
            store(&mut fin, b, h, &st);
        }
    }
    Closed { o: y, state: fin }
}

/// φ(x) = elu(x) + 1.
fn elu1(x: f64) -> f64 {
    if x > 0.0 { x + 1.0 } else { x.exp() }
}

/// Gated RFA (Peng et al. 2021), causal: `S_t = g_t S_{t-1} + (1 − g_t) φ(k_t) ⊗ v_t`,
/// `z_t = g_t z_{t-1} + (1 − g_t) φ(k_t)`, `h_t = φ(q_t)ᵀ S_t / φ(q_t) · z_t`.
/// The normaliser starts at zero even when `S` does not.
fn rfa_closed(x: &Inputs) -> Closed {
    let (nb, nh, ns, dk, dv) = dims(x);
    let g = &x.customs["g"];
    let mut o = Tensor::zeros(&[nb, nh, ns, dv]);
    let mut fin = Tensor::zeros(&[nb, nh, dk, dv]);
    for b in 0..nb {
        for h in 0..nh {
            let mut s = state0(x, b, h);
            let mut z = vec![0.0; dk];
            for t in 0..ns {
                let gt = g.get(&[b, h, t]);
                let phi_k: Vec<f64> = (0..dk).map(|i| elu1(x.k.get(&[b, h, t, i]))).collect();
                let phi_q: Vec<f64> = (0..dk).map(|i| elu1(x.q.get(&[b, h, t, i]))).collect();
                for i in 0..dk {
                    for j in 0..dv {
                        s[i][j] = gt * s[i][j] + (1.0 - gt) * phi_k[i] * x.v.get(&[b, h, t, j]);
                    }
                    z[i] = gt * z[i] + (1.0 - gt) * phi_k[i];
                }
                let den: f64 = (0..dk).map(|i| phi_q[i] * z[i]).sum();
                for j in 0..dv {
                    let num: f64 = (0..dk).map(|i| phi_q[i] * s[i][j]).sum();
                    o.set(&[b, h, t, j], num / den);
                }
            }
            store(&mut fin, b, h, &s);
        }
    }
    Closed { o, state: fin }
}

/// GLA (Yang et al. 2024): `S_t = (α_tᵀ 1) ⊙ S_{t-1} + k_tᵀ v_t` with
/// `α_t = exp(alpha_t)` per key dimension, `o_t = q_t S_t` (`q` scaled by
/// `d_k^(−1/2)`).
fn gla_closed(x: &Inputs) -> Closed {
    let (nb, nh, ns, dk, dv) = dims(x);
    let alpha = &x.customs["alpha"];
    let mut o = Tensor::zeros(&[nb, nh, ns, dv]);
    let mut fin = Tensor::zeros(&[nb, nh, dk, dv]);
    for b in 0..nb {
        for h in 0..nh {
            let mut s = state0(x, b, h);
            for t in 0..ns {
                for i in 0..dk {
                    let a = alpha.get(&[b, h, t, i]).exp();
                    for j in 0..dv {
                        s[i][j] = a * s[i][j] + x.k.get(&[b, h, t, i]) * x.v.get(&[b, h, t, j]);
                    }
                }
                for j in 0..dv {
                    let y: f64 = (0..dk)
                        .map(|i| x.q.get(&[b, h, t, i]) * (dk as f64).powf(-0.5) * s[i][j])
                        .sum();
                    o.set(&[b, h, t, j], y);
                }
            }
            store(&mut fin, b, h, &s);
        }
    }
    Closed { o, state: fin }
}

// ---------------------------------------------------------------------------
// Shared checks.

fn setup(m: &Model, seed: u64, initial_state: bool) -> (Variant, Inputs, StdRng) {
    let v = example(m.name);
    let mut r = rng(seed);
    let mut x = inputs(&v, &SIZES, &mut r, m.custom_range);
    (m.fix_customs)(&mut x, &mut r);
    if initial_state {
        x.initial_state = Some(random_state(&x, &mut r));
    }
    (v, x, r)
}

fn random_state(x: &Inputs, r: &mut StdRng) -> Tensor {
    let (nb, nh, _, dk, dv) = dims(x);
    random(&[nb, nh, dk, dv], r, -1.0, 1.0)
}

fn run(v: &Variant, x: &Inputs) -> reference::Forward {
    reference::forward(v, x, Options::default()).expect("forward")
}

/// (a) Forward and final state against the closed form, no initial state.
fn forward_matches_closed_form(m: &Model) {
    let (v, x, _) = setup(m, 11, false);
    let f = run(&v, &x);
    let want = (m.closed)(&x);
    assert_close(&format!("{}: output", m.name), &f.o, &want.o, TOL);
    let fin = f.final_state.expect("final state");
    assert_close(&format!("{}: final state", m.name), &fin, &want.state, TOL);
}

/// (b) Step by step equals the masked-decay-matrix form, with and without an
/// initial state.
fn step_matches_parallel_form(m: &Model) {
    for (seed, init) in [(21, false), (22, true)] {
        let (v, x, _) = setup(m, seed, init);
        let step = run(&v, &x).o;
        let par = forward_parallel_form(&v, &x).expect("parallel form");
        assert_close(
            &format!("{}: step vs parallel form (initial state: {init})", m.name),
            &step,
            &par,
            TOL,
        );
    }
}

/// (c) With an initial state: output and final state against the closed form.
fn initial_state_matches_closed_form(m: &Model) {
    let (v, x, _) = setup(m, 31, true);
    let f = run(&v, &x);
    let want = (m.closed)(&x);
    assert_close(
        &format!("{}: output, initial state", m.name),
        &f.o,
        &want.o,
        TOL,
    );
    let fin = f.final_state.expect("final state");
    assert_close(
        &format!("{}: final state, initial state", m.name),
        &fin,
        &want.state,
        TOL,
    );
    // The initial state matters: the closed form without it differs.
    let mut x0 = x.clone();
    x0.initial_state = None;
    assert!(
        (m.closed)(&x0).o.rel_err(&f.o) > 1e-3,
        "{}: initial state ignored",
        m.name
    );
}

/// Steps `from..to` of every tensor with an `S` axis.
fn steps(v: &Variant, x: &Inputs, from: usize, to: usize) -> Inputs {
    let mut out = x.clone();
    out.q = slice(&x.q, 2, from, to);
    out.k = slice(&x.k, 2, from, to);
    out.v = slice(&x.v, 2, from, to);
    for c in &v.customs {
        if let Some(ax) = c.axes.iter().position(|a| *a == Axis::S) {
            out.customs
                .insert(c.name.clone(), slice(&x.customs[&c.name], ax, from, to));
        }
    }
    out
}

fn slice(t: &Tensor, axis: usize, from: usize, to: usize) -> Tensor {
    let mut shape = t.shape.clone();
    shape[axis] = to - from;
    Tensor::from_fn(&shape, |idx| {
        let mut i = idx.to_vec();
        i[axis] += from;
        t.get(&i)
    })
}

/// Concatenates two `[B, H, S, Dv]` outputs along `S`.
fn concat_steps(a: &Tensor, b: &Tensor) -> Tensor {
    let mut shape = a.shape.clone();
    shape[2] += b.shape[2];
    Tensor::from_fn(&shape, |idx| {
        if idx[2] < a.shape[2] {
            a.get(idx)
        } else {
            let mut i = idx.to_vec();
            i[2] -= a.shape[2];
            b.get(&i)
        }
    })
}

/// (c) Running the first `SPLIT` steps, then the rest from the prefix's final
/// state, equals running all steps (the hidden state `S` carries everything
/// when there is no normaliser).
fn prefix_continuation(m: &Model) {
    let (v, x, _) = setup(m, 41, true);
    let ns = x.q.shape[2];
    let full = run(&v, &x);
    let pre = run(&v, &steps(&v, &x, 0, SPLIT));
    let mut rest = steps(&v, &x, SPLIT, ns);
    rest.initial_state = pre.final_state.clone();
    let post = run(&v, &rest);
    let full_state = full.final_state.expect("final state");
    assert_close(
        &format!("{}: final state after prefix + rest", m.name),
        post.final_state.as_ref().expect("final state"),
        &full_state,
        TOL,
    );
    let joined = concat_steps(&pre.o, &post.o);
    if !m.has_normalize {
        assert_close(
            &format!("{}: prefix + rest outputs", m.name),
            &joined,
            &full.o,
            TOL,
        );
    } else {
        // Without `initial_normalizer` the key sum z restarts at 0, so the
        // continued outputs are those of the closed form with z_{-1} = 0, not
        // those of the full run (carrying z is tested separately).
        let pre_want = (m.closed)(&steps(&v, &x, 0, SPLIT));
        assert_close(
            &format!("{}: prefix outputs", m.name),
            &pre.o,
            &pre_want.o,
            TOL,
        );
        let rest_want = (m.closed)(&rest);
        assert_close(
            &format!("{}: rest outputs", m.name),
            &post.o,
            &rest_want.o,
            TOL,
        );
        assert!(
            joined.rel_err(&full.o) > 1e-6,
            "{}: continued outputs unexpectedly equal the full run (z carried?)",
            m.name
        );
    }
}

/// (d) Every gradient against finite differences, with an initial state.
fn gradients_match_finite_differences(m: &Model) {
    let (v, x, mut r) = setup(m, 51, true);
    check_gradients(&v, &x, 10, 1e-6, &mut r);
    // With the final state (and normaliser) also feeding the loss.
    check_gradients_with(&v, &x, 10, 1e-6, &mut r, true);
}

fn forward_err(v: &Variant, x: &Inputs) -> String {
    match reference::forward(v, x, Options::default()) {
        Ok(_) => panic!("{}: forward accepted bad inputs", v.name),
        Err(e) => e.to_string(),
    }
}

/// The same message from the forward, the backward and the parallel form.
fn all_errors(v: &Variant, x: &Inputs) -> String {
    let msg = forward_err(v, x);
    let d_o = Tensor::zeros(&[2, 3, 9, 3]);
    let bwd = reference::backward(v, x, &d_o).expect_err("backward accepted bad inputs");
    assert_eq!(bwd.to_string(), msg, "{}: backward error", v.name);
    let par = forward_parallel_form(v, x).expect_err("parallel form accepted bad inputs");
    assert_eq!(par.to_string(), msg, "{}: parallel form error", v.name);
    msg
}

/// (e) A wrongly shaped initial state and a missing custom input are
/// `ShapeError`s that name the tensor and its shape.
fn bad_inputs(m: &Model) {
    let (v, x, _) = setup(m, 61, false);

    let mut bad = x.clone();
    bad.initial_state = Some(Tensor::zeros(&[2, 3, 5, 4]));
    let msg = all_errors(&v, &bad);
    assert_eq!(
        msg,
        "tensor `initial_state` has shape [2, 3, 5, 4], expected [B, H, Dk, Dv] = [2, 3, 5, 3]",
        "{}",
        m.name
    );

    let mut bad = x.clone();
    bad.initial_state = Some(Tensor::zeros(&[2, 3, 5]));
    let msg = all_errors(&v, &bad);
    assert_eq!(
        msg, "tensor `initial_state` has shape [2, 3, 5], expected [B, H, Dk, Dv] = [2, 3, 5, 3]",
        "{}",
        m.name
    );

    for decl in &v.customs {
        let mut bad = x.clone();
        bad.customs.shift_remove(&decl.name);
        let msg = all_errors(&v, &bad);
        let axes: Vec<&str> = decl.axes.iter().map(|a| a.name()).collect();
        assert_eq!(
            msg,
            format!(
                "missing custom input `{}` (declared as [{}])",
                decl.name,
                axes.join(", ")
            ),
            "{}",
            m.name
        );
    }
}

// ---------------------------------------------------------------------------
// RetNet.

#[test]
fn retnet_forward_matches_closed_form() {
    forward_matches_closed_form(&RETNET);
}

#[test]
fn retnet_step_matches_parallel_form() {
    step_matches_parallel_form(&RETNET);
}

#[test]
fn retnet_initial_state_matches_closed_form() {
    initial_state_matches_closed_form(&RETNET);
}

#[test]
fn retnet_prefix_continuation() {
    prefix_continuation(&RETNET);
}

#[test]
fn retnet_gradients_match_finite_differences() {
    gradients_match_finite_differences(&RETNET);
}

#[test]
fn retnet_bad_inputs() {
    bad_inputs(&RETNET);
    // RetNet has no custom inputs: an extra one is an error naming it.
    let (v, mut x, _) = setup(&RETNET, 62, false);
    x.customs.insert("gate".into(), Tensor::zeros(&[2, 3, 9]));
    assert_eq!(
        forward_err(&v, &x),
        "unknown custom input `gate`; the variant declares none"
    );
}

// ---------------------------------------------------------------------------
// Gated retention.

#[test]
fn gated_retention_forward_matches_closed_form() {
    forward_matches_closed_form(&GATED_RETENTION);
}

#[test]
fn gated_retention_step_matches_parallel_form() {
    step_matches_parallel_form(&GATED_RETENTION);
}

#[test]
fn gated_retention_initial_state_matches_closed_form() {
    initial_state_matches_closed_form(&GATED_RETENTION);
}

#[test]
fn gated_retention_prefix_continuation() {
    prefix_continuation(&GATED_RETENTION);
}

#[test]
fn gated_retention_gradients_match_finite_differences() {
    gradients_match_finite_differences(&GATED_RETENTION);
}

#[test]
fn gated_retention_bad_inputs() {
    bad_inputs(&GATED_RETENTION);
}

// ---------------------------------------------------------------------------
// Mamba2.

#[test]
fn mamba2_forward_matches_closed_form() {
    forward_matches_closed_form(&MAMBA2);
}

#[test]
fn mamba2_step_matches_parallel_form() {
    step_matches_parallel_form(&MAMBA2);
}

#[test]
fn mamba2_initial_state_matches_closed_form() {
    initial_state_matches_closed_form(&MAMBA2);
}

#[test]
fn mamba2_prefix_continuation() {
    prefix_continuation(&MAMBA2);
}

#[test]
fn mamba2_gradients_match_finite_differences() {
    gradients_match_finite_differences(&MAMBA2);
}

#[test]
fn mamba2_bad_inputs() {
    bad_inputs(&MAMBA2);
    // `a: [H]` with the wrong head count names the tensor and the clash.
    let (v, mut x, _) = setup(&MAMBA2, 63, false);
    x.customs.insert("a".into(), Tensor::zeros(&[4]));
    assert_eq!(
        forward_err(&v, &x),
        "tensor `a` has shape [4]: axis H is 4, but `q` gives H = 3"
    );
}

// ---------------------------------------------------------------------------
// Gated random-feature attention.

#[test]
fn rfa_forward_matches_closed_form() {
    forward_matches_closed_form(&RFA);
}

#[test]
fn rfa_step_matches_parallel_form() {
    step_matches_parallel_form(&RFA);
}

#[test]
fn rfa_initial_state_matches_closed_form() {
    initial_state_matches_closed_form(&RFA);
}

#[test]
fn rfa_prefix_continuation_restarts_normaliser() {
    prefix_continuation(&RFA);
}

#[test]
fn rfa_gradients_match_finite_differences() {
    gradients_match_finite_differences(&RFA);
}

#[test]
fn rfa_bad_inputs() {
    bad_inputs(&RFA);
}

// ---------------------------------------------------------------------------
// Gated linear attention.

#[test]
fn gla_forward_matches_closed_form() {
    forward_matches_closed_form(&GLA);
}

#[test]
fn gla_step_matches_parallel_form() {
    step_matches_parallel_form(&GLA);
}

#[test]
fn gla_initial_state_matches_closed_form() {
    initial_state_matches_closed_form(&GLA);
}

#[test]
fn gla_prefix_continuation() {
    prefix_continuation(&GLA);
}

#[test]
fn gla_gradients_match_finite_differences() {
    gradients_match_finite_differences(&GLA);
}

#[test]
fn gla_bad_inputs() {
    bad_inputs(&GLA);
    // A per-key-dimension gate with the wrong Dk names the axis.
    let (v, mut x, _) = setup(&GLA, 64, false);
    x.customs
        .insert("alpha".into(), Tensor::zeros(&[2, 3, 9, 4]));
    assert_eq!(
        forward_err(&v, &x),
        "tensor `alpha` has shape [2, 3, 9, 4]: axis Dk is 4, but `q` gives Dk = 5"
    );
}

// ---------------------------------------------------------------------------
// Carrying the normaliser z across calls (variants with `normalize`).

#[test]
fn rfa_prefix_continuation_carrying_normaliser() {
    let (v, x, _) = setup(&RFA, 43, true);
    let ns = x.q.shape[2];
    let full = run(&v, &x);
    let pre = run(&v, &steps(&v, &x, 0, SPLIT));
    let mut rest = steps(&v, &x, SPLIT, ns);
    rest.initial_state = pre.final_state.clone();
    rest.initial_normalizer = pre.final_normalizer.clone();
    let post = run(&v, &rest);
    assert_close(
        "rfa: prefix + rest outputs with z carried",
        &concat_steps(&pre.o, &post.o),
        &full.o,
        TOL,
    );
    assert_close(
        "rfa: final normaliser after prefix + rest",
        post.final_normalizer.as_ref().expect("final normaliser"),
        full.final_normalizer.as_ref().expect("final normaliser"),
        TOL,
    );
}

#[test]
fn rfa_initial_normaliser_in_both_forms_and_gradients() {
    let (v, mut x, mut r) = setup(&RFA, 47, true);
    let (nb, nh, _, dk, _) = dims(&x);
    // z sums positive features, so a realistic initial one is positive.
    x.initial_normalizer = Some(random(&[nb, nh, dk], &mut r, 0.5, 2.0));
    let step = run(&v, &x).o;
    let parallel = forward_parallel_form(&v, &x).expect("parallel form");
    assert_close(
        "rfa: step vs parallel form with an initial normaliser",
        &step,
        &parallel,
        TOL,
    );
    let without = {
        let mut y = x.clone();
        y.initial_normalizer = None;
        run(&v, &y).o
    };
    assert!(
        step.rel_err(&without) > 1e-6,
        "the initial normaliser must change the output"
    );
    check_gradients(&v, &x, 10, 1e-6, &mut r);
}

#[test]
fn initial_normaliser_bad_inputs() {
    let (v, mut x, _) = setup(&RFA, 53, false);
    x.initial_normalizer = Some(Tensor::zeros(&[2, 3, 4]));
    assert_eq!(
        all_errors(&v, &x),
        "tensor `initial_normalizer` has shape [2, 3, 4], expected [B, H, Dk] = [2, 3, 5]"
    );
    let (v, mut x, _) = setup(&RETNET, 53, false);
    x.initial_normalizer = Some(Tensor::zeros(&[2, 3, 5]));
    assert_eq!(
        all_errors(&v, &x),
        "an initial normaliser is only taken by recurrent variants with `normalize`; `RetNetRecurrent` has none"
    );
}
