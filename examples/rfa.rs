//! Gated random-feature attention (RFA-Gate, Peng et al. 2021), causal form:
//! with the feature map `φ(x) = elu(x) + 1` and a gate `g_t ∈ (0, 1)`,
//! `S_t = g_t S_{t-1} + (1 − g_t) φ(k_t) ⊗ v_t`,
//! `z_t = g_t z_{t-1} + (1 − g_t) φ(k_t)`,
//! `o_t = φ(q_t) · S_t / φ(q_t) · z_t`.
//!
//! The random projection itself (`x ↦ W x` with random `W`) is applied before
//! aec: `q` and `k` here are the inputs of the feature map, i.e. the already
//! projected queries and keys. `g` is the gate after its sigmoid.
//!
//! `aec check examples/rfa.rs` prints its forward and derived backward graphs;
//! `cargo run --example rfa` prints them through the library.

use aec::prelude::*;

attention! {
    /// Gated random-feature attention with φ(x) = elu(x) + 1 and its normaliser.
    pub struct Rfa: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        g: [B, H, S];
        modify_q = |q| select(q > 0.0, q + 1.0, exp(q));
        modify_k = |k, b, h, t| select(k > 0.0, k + 1.0, exp(k)) * (1.0 - g);
        decay = |b, h, t| g;
        normalize = |o, n| o / n;
    }
}

fn main() {
    let def = Rfa::definition();
    println!("{}", aec::frontend::print::render(def));
}
