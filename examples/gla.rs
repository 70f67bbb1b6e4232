//! Gated linear attention (GLA, Yang et al. 2024): a data-dependent decay per
//! key dimension, `S_t = diag(exp(α_t)) S_{t-1} + k_t ⊗ v_t`,
//! `o_t = (q_t / √Dk) · S_t`. `alpha` is the gate in log space (negative; the
//! model computes it as `log sigmoid(x_t W_α) / τ`).
//!
//! `aec check examples/gla.rs` prints its forward and derived backward graphs;
//! `cargo run --example gla` prints them through the library.

use aec::prelude::*;

attention! {
    /// Gated linear attention: per-key-dimension decay exp(alpha).
    pub struct Gla: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        alpha: [B, H, S, Dk];
        modify_q = |q| q * rsqrt(Dk);
        decay = |b, h, t, d| exp(alpha);
    }
}

fn main() {
    let def = Gla::definition();
    println!("{}", aec::frontend::print::render(def));
}
