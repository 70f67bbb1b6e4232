//! Prints the generated parallel forward kernel of a variant file.
//! `cargo run -p aec-compiler --example emit_forward -- examples/softmax.rs 128 128 [block_m block_n warps]`
//! or, for a decoding variant, `… examples/decode.rs 128 128 shape B H Hkv Sq [v_in_k]`: the
//! untuned tile for that shape on 132 multiprocessors (`ForwardConfig::for_decoding_call`);
//! either way then the settings in `AEC_EMIT_SET` (`"block_n=64 stages=6"`).
use aec_compiler::{Elem, ForwardConfig, Isa, parallel_forward, untuned_forward_config};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, dqk, dv, rest @ ..] = args.as_slice() else {
        eprintln!("usage: emit_forward <variant.rs> <dqk> <dv> [block_m block_n warps]");
        std::process::exit(2);
    };
    let src = std::fs::read_to_string(file).expect("read variant file");
    let v = aec_frontend::parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant");
    let (dqk, dv): (u32, u32) = (dqk.parse().expect("dqk"), dv.parse().expect("dv"));
    let mut cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
    if let [shape, b, h, hkv, sq, storage @ ..] = rest
        && shape == "shape"
    {
        let n = |s: &String| s.parse::<usize>().expect("a size");
        let v_in_k = storage.first().is_some_and(|s| s == "v_in_k");
        cfg = untuned_forward_config(
            ForwardConfig::default_for,
            &v,
            dqk,
            dv,
            Elem::Bf16,
            Isa::Sm90a,
            v_in_k,
        );
        cfg = cfg.for_decoding_call(&v, [n(b), n(h), n(hkv), n(sq)], 132, dqk, dv, Isa::Sm90a);
    } else if let [bm, bn, warps, ..] = rest {
        cfg.block_m = bm.parse().expect("block_m");
        cfg.block_n = bn.parse().expect("block_n");
        cfg.warps = warps.parse().expect("warps");
    }
    // Then `name=value` overrides from AEC_EMIT_SET (e.g. "block_n=64 stages=6").
    for kv in std::env::var("AEC_EMIT_SET")
        .unwrap_or_default()
        .split_whitespace()
    {
        let (k, v) = kv.split_once('=').expect("name=value");
        let v: u32 = v.parse().expect("a number");
        match k {
            "block_m" => cfg.block_m = v,
            "block_n" => cfg.block_n = v,
            "warps" => cfg.warps = v,
            "key_warps" => cfg.key_warps = v,
            "stages" => cfg.stages = v,
            "dv_warps" => cfg.dv_warps = v,
            "dv_split" => cfg.dv_split = v,
            "fused_combine" => cfg.fused_combine = v != 0,
            "q_in_registers" => cfg.q_in_registers = v != 0,
            "persistent" => cfg.persistent = v != 0,
            "warp_specialized" => cfg.warp_specialized = v != 0,
            "tma_loads" => cfg.tma_loads = v != 0,
            other => panic!("unknown setting `{other}`"),
        }
    }
    eprintln!("{cfg:?}");
    let k = parallel_forward(&v, dqk, dv, &cfg).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("smem_bytes {} block_n {}", k.smem_bytes, k.block_n);
    print!("{}", k.source);
}
