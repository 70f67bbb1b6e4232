use aec::prelude::*;

attention! {
    pub struct Scaled: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_q = |q| q * scale;
    }
}

fn main() {}
