use aec::prelude::*;

attention! {
    pub struct Softmax: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        temp: [H];
        online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = exp(s / temp - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| o / st.l
        }
    }
}

fn main() {}
