//! Broken on purpose (tests/cli.rs): `bias` varies over `Dv`, which
//! `modify_scores` does not iterate.

use aec::prelude::*;

attention! {
    pub struct Biased: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        bias: [H, Dv];
        modify_scores = |s| s + bias;
    }
}

fn main() {}
