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
