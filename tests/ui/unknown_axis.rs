use aec::prelude::*;

attention! {
    pub struct Relu: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dvv];
        modify_scores = |s| relu(s);
    }
}

fn main() {}
