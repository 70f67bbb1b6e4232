//! Grouped-query softmax attention (GQA, Ainslie et al. 2023, as in Llama 2/3
//! and Mistral): `H` query heads share `Hkv` key/value heads, query head `h`
//! reading kv head `h / (H / Hkv)`. Multi-query attention is `Hkv = 1`. The
//! online softmax is the FlashAttention one of `softmax.rs`.
//!
//! `aec check examples/softmax_gqa.rs` prints its forward and derived backward graphs;
//! `cargo run --example softmax_gqa` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Softmax attention with grouped-query key/value heads.
    pub struct SoftmaxGqa: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, Hkv, Skv, Dqk];
        v: [B, Hkv, Skv, Dv];
        modify_q = |q| q * rsqrt(Dqk);
        online {
            state { m = -inf, l = 0.0 }
            fwd = |s, st| {
                let m = max(st.m, rowmax(s));
                let p = exp(s - m);
                (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
            }
            epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
        }
    }
}

fn main() {
    let def = SoftmaxGqa::definition();
    println!("{}", aec::frontend::print::render(def));
}
