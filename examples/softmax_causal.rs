//! Causal softmax attention (decoder self-attention, GPT-style): query `i`
//! sees keys `j <= i`. The mask is written on absolute positions, so with
//! `Sq < Skv` query `i` still sees only keys `0..=i` (top-left aligned), not the
//! last `i + 1 + Skv - Sq` keys; offset the index in the mask for bottom-right
//! alignment.
//!
//! `aec check examples/softmax_causal.rs` prints its forward and derived backward graphs;
//! `cargo run --example softmax_causal` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Causal softmax attention.
    pub struct SoftmaxCausal: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        mask = |b, h, i, j| i >= j;
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
    let def = SoftmaxCausal::definition();
    println!("{}", aec::frontend::print::render(def));
}
