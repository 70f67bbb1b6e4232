use aec::prelude::*;

attention! {
    pub struct Causal: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        mask = |b, h, i| i >= 0;
    }
}

fn main() {}
