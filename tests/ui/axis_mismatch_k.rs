use aec::prelude::*;

attention! {
    pub struct Linear: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dv];
        v: [B, H, Skv, Dv];
    }
}

fn main() {}
