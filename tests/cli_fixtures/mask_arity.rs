//! Broken on purpose (tests/cli.rs): `mask` takes `|b, h, i, j|`. The variant
//! sits in an inline module.

use aec::prelude::*;

mod variants {
    use super::*;

    attention! {
        pub struct Causal: parallel {
            q: [B, H, Sq, Dqk];
            k: [B, H, Skv, Dqk];
            v: [B, H, Skv, Dv];
            mask = |b, h, i| i >= 0;
        }
    }
}

fn main() {}
