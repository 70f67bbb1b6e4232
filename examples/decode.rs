//! Decoding (one new token per sequence against the KV cache, as in
//! FlashDecoding): a single query position, `Sq = 1`, with grouped-query kv
//! heads. Softmax as in `softmax.rs`; no mask, since the cache holds only
//! past keys.
//!
//! `aec check examples/decode.rs` prints its forward and derived backward graphs;
//! `cargo run --example decode` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Single-token decoding attention with grouped-query kv heads.
    pub struct Decode: parallel {
        q: [B, H, Sq = 1, Dqk];
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
    let def = Decode::definition();
    println!("{}", aec::frontend::print::render(def));
}
