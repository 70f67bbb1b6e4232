//! Smoke test of the shared helpers on the softmax example (the full suites
//! live in parallel_reference.rs and recurrent_reference.rs).
mod common;
use aec::frontend::ir::Axis;
use common::*;

#[test]
fn softmax_gradients_match_finite_differences() {
    let v = example("softmax");
    let mut r = rng(1);
    let inp = inputs(
        &v,
        &[
            (Axis::B, 2),
            (Axis::H, 3),
            (Axis::Sq, 7),
            (Axis::Skv, 13),
            (Axis::Dqk, 5),
            (Axis::Dv, 4),
        ],
        &mut r,
        (0.1, 0.9),
    );
    check_gradients(&v, &inp, 12, 1e-6, &mut r);
}
