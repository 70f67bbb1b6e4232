//! Broken on purpose (tests/cli.rs): a row reduction in an elementwise
//! closure. The variant is declared inside `main`.

use aec::prelude::*;

fn main() {
    attention! {
        pub struct Centered: parallel {
            q: [B, H, Sq, Dqk];
            k: [B, H, Skv, Dqk];
            v: [B, H, Skv, Dv];
            modify_scores = |s| s - rowmax(s);
        }
    }
}
