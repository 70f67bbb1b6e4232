//! Gated retention (gRet, the YOCO self-decoder's retention; Sun et al. 2024):
//! a data-dependent scalar decay per head and step,
//! `γ_t = sigmoid(gate_t)^(1/16)`, with `S_t = γ_t S_{t-1} + k_t ⊗ v_t` and
//! `o_t = (q_t / √Dk) · S_t`. `gate` holds the pre-activation logits (the
//! model computes them as `x_t W_γ`).
//!
//! `aec check examples/gated_retention.rs` prints its forward and derived
//! backward graphs; `cargo run --example gated_retention` prints them through
//! the library.

use aec::prelude::*;

attention! {
    /// Gated retention: decay sigmoid(gate)^(1/16) per head and step.
    pub struct GatedRetention: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        gate: [B, H, S];
        modify_q = |q| q * rsqrt(Dk);
        decay = |b, h, t| pow(sigmoid(gate), 1.0 / 16.0);
    }
}

fn main() {
    let def = GatedRetention::definition();
    println!("{}", aec::frontend::print::render(def));
}
