//! Logit softcapping (Gemma 2, Gemma Team 2024; also Grok-1): scores are
//! squashed to (−50, 50) by `50 · tanh(s / 50)` before the softmax.
//!
//! `aec check examples/softcap.rs` prints its forward and derived backward graphs;
//! `cargo run --example softcap` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Softmax attention with scores softcapped at 50.
    pub struct Softcap: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        modify_scores = |s| 50.0 * tanh(s / 50.0);
        online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = exp(s - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
        }
    }
}

fn main() {
    let def = Softcap::definition();
    println!("{}", aec::frontend::print::render(def));
}
