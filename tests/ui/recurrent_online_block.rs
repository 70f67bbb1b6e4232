use aec::prelude::*;

attention! {
    pub struct Retention: recurrent {
        q: [B, H, S, Dk];
        k: [B, H, S, Dk];
        v: [B, H, S, Dv];
        decay = |b, h, t| 0.9;
        online {
            state { l = 0.0 }
            fwd = |s, st| (s, State { l: st.l + rowsum(s) }, 1.0)
            epilogue = |o, st| o / st.l
        }
    }
}

fn main() {}
