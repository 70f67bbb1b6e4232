//! Packed-document (varlen) attention: several documents are packed into one
//! sequence and a token attends only to earlier tokens of its own document
//! (the block-diagonal causal mask of FlexAttention's document masking and
//! FlashAttention's varlen mode). `doc_q` and `doc_k` give each position's
//! document id (integer-valued); a query whose id no visible key shares
//! outputs 0.
//!
//! `aec check examples/document_mask.rs` prints its forward and derived backward graphs;
//! `cargo run --example document_mask` prints the same from the compiled definition.

use aec::prelude::*;

attention! {
    /// Causal softmax attention within packed documents.
    pub struct DocumentMask: parallel {
        q: [B, H, Sq, Dqk];
        k: [B, H, Skv, Dqk];
        v: [B, H, Skv, Dv];
        doc_q: [B, Sq];
        doc_k: [B, Skv];
        modify_q = |q| q * rsqrt(Dqk);
        mask = |b, h, i, j| doc_q == doc_k && i >= j;
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
    let def = DocumentMask::definition();
    println!("{}", aec::frontend::print::render(def));
}
