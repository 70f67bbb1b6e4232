//! The attention maps of the Differential Transformer (Ye et al. 2024):
//! `DiffAttn = (softmax(Q1 K1ᵀ) − λ softmax(Q2 K2ᵀ)) V`, where each of the two
//! causal softmax maps has 128-wide queries/keys and the shared value is twice
//! as wide (256). Each map is this kernel; the λ-weighted difference is taken
//! on the two outputs.
//!
//! `aec check examples/diff_transformer.rs` prints its forward and derived backward graphs;
//! `cargo run --example diff_transformer` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Causal softmax attention with Differential Transformer head dims (Dqk 128, Dv 256).
    pub struct DiffTransformer: parallel {
        q: [B, H, Sq, Dqk = 128];
        k: [B, H, Skv, Dqk = 128];
        v: [B, H, Skv, Dv = 256];
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
    let def = DiffTransformer::definition();
    println!("{}", aec::frontend::print::render(def));
}
