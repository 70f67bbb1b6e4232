//! Two variants (tests/cli.rs): the first is broken (`relux` is not a
//! function), the second is correct and must still be checked and printed.

use aec::prelude::*;

attention! {
    pub struct Broken: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_scores = |s| relux(s);
    }
}

attention! {
    pub struct Good: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_scores = |s| relu(s) / Skv;
    }
}

fn main() {}
