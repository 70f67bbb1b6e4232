//! Sigmoid attention (Ramapuram et al. 2024, "Theory, Analysis, and Best
//! Practices for Sigmoid Self-Attention"; FlashSigmoid): each weight is
//! `sigmoid(q·k / sqrt(d) − log(n))` with `n` the key count, no row
//! normalisation, hence no online block.
//!
//! `aec check examples/sigmoid.rs` prints its forward and derived backward graphs;
//! `cargo run --example sigmoid` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Sigmoid attention with the −log(n) bias.
    pub struct Sigmoid: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        modify_scores = |s| sigmoid(s - log(Skv));
    }
}

fn main() {
    let def = Sigmoid::definition();
    println!("{}", aec::frontend::print::render(def));
}
