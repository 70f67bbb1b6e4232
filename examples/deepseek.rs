//! DeepSeek-V2 multi-head latent attention (MLA, DeepSeek-AI 2024) in its
//! training form: after up-projection each head has a 192-wide query/key
//! (128 "nope" + 64 decoupled RoPE dims) and a 128-wide value, so `Dqk` and `Dv`
//! differ. Causal softmax attention scaled by 1/sqrt(192).
//!
//! `aec check examples/deepseek.rs` prints its forward and derived backward graphs;
//! `cargo run --example deepseek` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Causal softmax attention with DeepSeek-V2 head dims (Dqk 192, Dv 128).
    pub struct Deepseek: parallel {
        q: [B, H, Sq, Dqk = 192];
        k: [B, H, Skv, Dqk = 192];
        v: [B, H, Skv, Dv = 128];
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
    let def = Deepseek::definition();
    println!("{}", aec::frontend::print::render(def));
}
