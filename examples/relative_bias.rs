//! Softmax attention with a learned relative-position bias (T5, Raffel et al.
//! 2020, without log-bucketing): a per-head table `rel` indexed by the clamped
//! distance `i - j`, so distances beyond ±16 share the table's end entries.
//!
//! `rel` shows a *user axis*: `R` is no axis any closure iterates, so the table
//! is read by explicit index (`rel[i - j + 16]`, clamped into `0..R`), while
//! its `H` axis is broadcast like any custom input. Its gradient is derived.

use aec::prelude::*;

attention! {
    /// Softmax with a per-head relative-position bias table.
    pub struct RelativeBias: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        rel: [H, R = 33];
        modify_q = |q| q * rsqrt(Dqk);
        modify_scores = |s, b, h, i, j| s + rel[i - j + 16];
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
    println!(
        "{}",
        aec::frontend::print::render(RelativeBias::definition())
    );
}
