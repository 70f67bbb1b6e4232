//! Softmax attention (multi-head), FlashAttention semantics: the online
//! softmax keeps a running row maximum `m` and sum `l`; the final row scale is
//! the log-sum-exp that the backward pass needs.
//!
//! `aec check examples/softmax.rs` prints its forward and derived backward graphs;
//! `cargo run --example softmax` runs the reference interpreter on it.

use aec::prelude::*;

attention! {
    /// Softmax attention, multi-head.
    pub struct Softmax: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
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
    let def = Softmax::definition();
    println!("{}", aec::frontend::print::render(def));
}
