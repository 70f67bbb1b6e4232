//! Causal sliding-window attention (local attention as in Longformer and
//! Mistral 7B, whose window is 4096): query `i` sees the 256 keys
//! `i - 255 ..= i`. Softmax as in `softmax.rs`.
//!
//! `aec check examples/sliding_window.rs` prints its forward and derived backward graphs;
//! `cargo run --example sliding_window` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Causal softmax attention over a sliding window of 256 keys.
    pub struct SlidingWindow: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        mask = |b, h, i, j| i >= j && i - j < 256;
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
    let def = SlidingWindow::definition();
    println!("{}", aec::frontend::print::render(def));
}
