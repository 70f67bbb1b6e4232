use aec::prelude::*;

attention! {
    pub struct Alibi: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_scores = |s, b, h, i, j| s - (i >= j);
    }
}

fn main() {}
