//! ReLU attention (Wortsman et al. 2023, "Replacing softmax with ReLU in
//! Vision Transformers"): weights `relu(q·k / sqrt(d)) / n` with `n` the key
//! count, no row normalisation, hence no online block.
//!
//! `aec check examples/relu.rs` prints its forward and derived backward graphs;
//! `cargo run --example relu` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// ReLU attention scaled by 1/n.
    pub struct Relu: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        modify_scores = |s| relu(s) / Skv;
    }
}

fn main() {
    let def = Relu::definition();
    println!("{}", aec::frontend::print::render(def));
}
