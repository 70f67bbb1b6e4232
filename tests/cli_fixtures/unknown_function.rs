//! Broken on purpose (tests/cli.rs): `expo` is not a DSL function. The comment
//! before it holds multi-byte characters, so columns must count characters.

use aec::prelude::*;

attention! {
    /// Softmax attention with a typo.
    pub struct Softmax: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = /* ∂é→ */ expo(s - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
        }
    }
}

fn main() {}
