//! Broken on purpose (tests/cli.rs): `paralel` is not a pattern.

use aec::prelude::*;

attention! {
    pub struct Relu: paralel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_scores = |s| relu(s);
    }
}

fn main() {}
