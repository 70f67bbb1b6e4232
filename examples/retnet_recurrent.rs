//! RetNet retention, recurrent form (Sun et al. 2023): each head `h` keeps a
//! `Dk × Dv` state decayed by the fixed factor `γ_h = 1 − 2^(−5−h)`,
//! `S_t = γ_h S_{t-1} + k_t ⊗ v_t`, `o_t = (q_t / √Dk) · S_t`.
//!
//! `aec check examples/retnet_recurrent.rs` prints its forward and derived
//! backward graphs; `cargo run --example retnet_recurrent` prints them through
//! the library.

use aec::prelude::*;

attention! {
    /// RetNet retention with the fixed per-head decay γ_h = 1 − 2^(−5−h).
    pub struct RetNetRecurrent: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        modify_q = |q| q * rsqrt(Dk);
        decay = |b, h, t| 1.0 - exp2(-5.0 - h);
    }
}

fn main() {
    let def = RetNetRecurrent::definition();
    println!("{}", aec::frontend::print::render(def));
}
