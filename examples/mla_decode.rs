//! Multi-head latent attention decoding (DeepSeek-V2/V3, MLA in its
//! inference form): the KV cache holds one compressed latent row per token,
//! 512 latent columns followed by 64 decoupled-RoPE columns. With the
//! up-projections absorbed into the query and the output, every query head
//! attends over that one cache: `Dqk = 576` (latent + RoPE), `Dv = 512`
//! (the latent part), all query heads sharing one KV head (`Hkv = 1`).
//! Softmax scaled by 1/sqrt(192), the head dim the model was trained with
//! (128 "nope" + 64 RoPE).
//!
//! K and V share storage: V is the first 512 columns of each K row. Compile
//! with `KernelOptions { v_in_k: true, .. }` and pass the cache as both `k`
//! and `v`; the kernel then loads each cache tile once.
//!
//! `aec check examples/mla_decode.rs` prints its forward graph;
//! `cargo run --example mla_decode` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Single-token MLA decoding over a latent KV cache (Dqk 576, Dv 512).
    pub struct MlaDecode: parallel {
        q: [B, H, Sq = 1, Dqk = 576];
        k: [B, Hkv, Skv, Dqk = 576];
        v: [B, Hkv, Skv, Dv = 512];
        modify_q = |q| q * rsqrt(192.0);
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
    let def = MlaDecode::definition();
    println!("{}", aec::frontend::print::render(def));
}
