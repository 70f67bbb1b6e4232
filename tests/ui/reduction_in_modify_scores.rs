use aec::prelude::*;

attention! {
    pub struct Centered: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        modify_scores = |s| s - rowmax(s);
    }
}

fn main() {}
