use aec::prelude::*;

attention! {
    pub struct Relu: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        modify_scores = |s| relu(s);
    }
}

fn main() {}
