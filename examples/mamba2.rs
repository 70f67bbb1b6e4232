//! Mamba2's state-space duality (SSD) layer (Dao & Gu 2024) as a recurrence:
//! per head a scalar `A_h < 0` and per step a positive step size `dt_t`,
//! `h_t = exp(dt_t A_h) h_{t-1} + dt_t · B_t ⊗ x_t`, `y_t = C_t · h_t`.
//!
//! In aec's names `q` plays `C`, `k` plays `B` and `v` plays `x` (the state
//! dimension `N` is `Dk`, the head dimension `P` is `Dv`). The skip term
//! `D · x_t` and the gating are outside the recurrence and not part of it.
//!
//! `aec check examples/mamba2.rs` prints its forward and derived backward
//! graphs; `cargo run --example mamba2` prints them through the library.

use aec::prelude::*;

attention! {
    /// Mamba2 SSD: decay exp(dt · A), input scaled by dt.
    pub struct Mamba2: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        a: [H];
        dt: [B, H, S];
        modify_v = |v, b, h, t| v * dt;
        decay = |b, h, t| exp(dt * a);
    }
}

fn main() {
    let def = Mamba2::definition();
    println!("{}", aec::frontend::print::render(def));
}
