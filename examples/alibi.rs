//! ALiBi (Press et al. 2022, "Train Short, Test Long"): causal softmax
//! attention whose scores get the linear distance penalty `−m_h · (i − j)`,
//! with a per-head slope `m_h` (a geometric sequence in the paper, here an
//! input).
//!
//! `aec check examples/alibi.rs` prints its forward and derived backward graphs;
//! `cargo run --example alibi` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Causal softmax attention with ALiBi per-head slopes.
    pub struct Alibi: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        slopes: [H];
        modify_q = |q| q * rsqrt(Dqk);
        modify_scores = |s, b, h, i, j| s - slopes * (i - j);
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
    let def = Alibi::definition();
    println!("{}", aec::frontend::print::render(def));
}
