//! Broken on purpose (tests/cli.rs): `pow`'s exponent must be a constant.

use aec::prelude::*;

attention! {
    pub struct Power: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_scores = |s| pow(relu(s), s);
    }
}

fn main() {}
