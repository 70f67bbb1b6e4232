//! Every generated CUDA kernel forms its shared-memory addresses as a 32-bit
//! base plus an offset (`smem_at(base, index)`, barriers through
//! `smem_at(bars, i)` or `smem_u32(&bar)`), never as `smem_u32(pointer +
//! offset)`. NVRTC, which the runtime and `aec compile` build with, does
//! that pointer arithmetic in 64 bits and narrows the sum (nvcc does it in
//! 32): the 64-bit form cost NVRTC builds up to 10% on sm_90a
//! (bench/NOTES.md session 71 item 1).

use aec_compiler::{
    BackwardConfig, Elem, ForwardConfig, Isa, RecurrentConfig, parallel_backward, parallel_forward,
    recurrent_backward, recurrent_forward, untuned_forward_config,
};
use aec_frontend::Variant;
use aec_frontend::ir::Axis;

mod common;
use common::examples;

/// The variant's fixed head dims, else 128.
fn dims(v: &Variant) -> (u32, u32) {
    let fixed = |a: Axis| {
        v.fixed_sizes
            .iter()
            .find(|(x, _)| *x == a)
            .map_or(128, |(_, n)| *n as u32)
    };
    (fixed(Axis::Dqk), fixed(Axis::Dv))
}

/// Each `smem_u32(...)` argument of `source` that forms an address by
/// pointer arithmetic: an offset (`+`, `-`), an index (`&bars[i]`) or a
/// `TILE_AT` element pointer. (A pointer variable, such as a stage's `sKc`,
/// passes: it is converted once per stage.)
fn offset_pointers(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("smem_u32") {
        let after = &rest[at + "smem_u32".len()..];
        let Some(open) = after.trim_start().strip_prefix('(') else {
            rest = after;
            continue;
        };
        let mut depth = 1;
        let mut end = open.len();
        for (i, c) in open.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = i;
                break;
            }
        }
        let arg = &open[..end];
        if arg.contains(['+', '-', '[']) || arg.contains("TILE_AT") {
            found.push(arg.to_string());
        }
        rest = &open[end..];
    }
    found
}

/// Asserts `source` (kernel `name`) forms no shared address in 64 bits and
/// does form them with `smem_at`.
fn check(name: &str, source: &str) {
    let bad = offset_pointers(source);
    assert!(
        bad.is_empty(),
        "{name}: shared addresses formed as smem_u32(pointer + offset): {bad:?}"
    );
    assert!(source.contains("smem_at("), "{name}: no smem_at address");
}

#[test]
fn the_checker_finds_pointer_arithmetic_inside_smem_u32() {
    assert_eq!(
        offset_pointers("a = smem_u32(sK + (st) * BN); b = smem_u32(&bar_q); c = smem_at(sV, 8);"),
        vec!["sK + (st) * BN".to_string()]
    );
    assert_eq!(
        offset_pointers("ldmatrix_x4(smem_u32(TILE_AT(sQ, BM, DQK, r, c)), q);"),
        vec!["TILE_AT(sQ, BM, DQK, r, c)".to_string()]
    );
    assert_eq!(
        offset_pointers("mbar_wait(smem_u32 (&bar_full[cur]), 0); smem_u32(p - 8);"),
        vec!["&bar_full[cur]".to_string(), "p - 8".to_string()]
    );
    assert!(offset_pointers("smem_u32(smem_raw) & 1023u; smem_u32(sKc)").is_empty());
}

#[test]
fn parallel_kernels_form_shared_addresses_in_32_bits() {
    let (mut forwards, mut backwards) = (0, 0);
    let mut no_backward = Vec::new();
    for (_, v) in examples() {
        if v.parallel().is_none() {
            continue;
        }
        let (dqk, dv) = dims(&v);
        for isa in [Isa::Sm80, Isa::Sm90a] {
            let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, isa);
            let k = parallel_forward(&v, dqk, dv, &cfg)
                .unwrap_or_else(|e| panic!("{} forward on {isa:?}: {e}", v.name));
            check(&k.name, &k.source);
            forwards += 1;
            match parallel_backward(
                &v,
                dqk,
                dv,
                &BackwardConfig::for_variant(&v, dqk, dv, Elem::Bf16, isa),
            ) {
                Ok(b) => {
                    check(&format!("{} backward on {isa:?}", v.name), &b.source);
                    backwards += 1;
                }
                Err(_) => no_backward.push(v.name.clone()),
            }
        }
    }
    assert_eq!(forwards, 2 * 15, "the 15 parallel examples on two ISAs");
    // The latent cache (V stored in K) has no backward; every other one does.
    no_backward.dedup();
    assert_eq!(no_backward, ["MlaDecode"]);
    assert_eq!(backwards, 2 * 14);
}

/// The decoding tiles the runtime picks per call (split-KV, key warps, the
/// producer and key warpgroups on sm_90a), the latent cache's with V in K.
#[test]
fn decoding_kernels_form_shared_addresses_in_32_bits() {
    let mut checked = 0;
    for (name, shapes) in [
        (
            "decode",
            &[[64, 32, 8, 1], [1, 32, 8, 1], [16, 128, 1, 1]][..],
        ),
        ("mla_decode", &[[64, 16, 1, 1], [16, 128, 1, 1]][..]),
    ] {
        let v = common::example(name);
        let (dqk, dv) = dims(&v);
        let v_in_k = name == "mla_decode";
        for isa in [Isa::Sm80, Isa::Sm90a] {
            for &shape in shapes {
                let cfg = untuned_forward_config(
                    ForwardConfig::default_for,
                    &v,
                    dqk,
                    dv,
                    Elem::Bf16,
                    isa,
                    v_in_k,
                )
                .for_decoding_call(&v, shape, 132, dqk, dv, isa);
                let k = parallel_forward(&v, dqk, dv, &cfg)
                    .unwrap_or_else(|e| panic!("{name} at {shape:?} on {isa:?}: {e}"));
                check(&format!("{} at {shape:?}", k.name), &k.source);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * (3 + 2));
}

#[test]
fn recurrent_kernels_form_shared_addresses_in_32_bits() {
    let mut checked = 0;
    for (_, v) in examples() {
        if v.recurrent().is_none() {
            continue;
        }
        for (dk, dv) in [(128, 128), (256, 256), (64, 96)] {
            for isa in [Isa::Sm80, Isa::Sm90a] {
                let cfg = RecurrentConfig::default_for(dk, dv, Elem::Bf16, isa);
                let k = recurrent_forward(&v, dk, dv, &cfg)
                    .unwrap_or_else(|e| panic!("{} at {dk}/{dv} on {isa:?}: {e}", v.name));
                check(&k.name, &k.source);
                let b = recurrent_backward(&v, dk, dv, &cfg, isa)
                    .unwrap_or_else(|e| panic!("{} backward at {dk}/{dv} on {isa:?}: {e}", v.name));
                check(&b.name, &b.source);
                check(&b.states.name, &b.states.source);
                checked += 3;
            }
        }
    }
    // RetNet, gated retention, GLA, Mamba2, RFA.
    assert_eq!(checked, 5 * 3 * 2 * 3);
}
