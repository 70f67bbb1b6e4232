use aec::prelude::*;

attention! {
    pub struct Causal: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        mask = |b, h, i, j| i - j;
    }
}

fn main() {}
