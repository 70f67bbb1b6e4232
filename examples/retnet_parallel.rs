//! RetNet retention, parallel form (Sun et al. 2023, "Retentive Network"):
//! `(Q Kᵀ ⊙ D) V` with the causal decay `D_ij = γ_h^(i − j)` for `i >= j`,
//! `γ_h` a per-head decay in (0, 1), and each row divided by
//! `max(Σ_j |(Q Kᵀ ⊙ D)_ij|, 1)`. (The paper normalises by the absolute value
//! of the row sum, `max(|Σ_j …|, 1)`; the absolute sum used here bounds it
//! and is what `rowabssum` gives.) No softmax: the weights are the decayed
//! scores; the online state accumulates the row normaliser.
//!
//! `aec check examples/retnet_parallel.rs` prints its forward and derived backward graphs;
//! `cargo run --example retnet_parallel` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// RetNet retention (parallel form) with per-head decay `gamma`.
    pub struct RetnetParallel: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        gamma: [H];
        mask = |b, h, i, j| i >= j;
        modify_scores = |s, b, h, i, j| s * exp((i - j) * log(gamma));
        online {
            state { a = 0.0 }
            fwd = |s, st| (s, State { a: st.a + rowabssum(s) }, 1.0)
            epilogue = |o, st| (o / max(st.a, 1.0), Scales { scale: max(st.a, 1.0) })
        }
    }
}

fn main() {
    let def = RetnetParallel::definition();
    println!("{}", aec::frontend::print::render(def));
}
