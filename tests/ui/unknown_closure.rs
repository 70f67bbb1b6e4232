use aec::prelude::*;

attention! {
    pub struct Relu: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_score = |s| relu(s);
    }
}

fn main() {}
