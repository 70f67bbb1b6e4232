//! Prints the generated parallel backward kernels of a variant file.
//! `cargo run -p aec-compiler --example emit_backward -- examples/softmax.rs 128 128 [block_m warps [split_d [kv_groups]]]`
//! (`AEC_BWD_WS=0`: the wgmma kernel without its producer warpgroup;
//! `AEC_BWD_ISA=sm80`: the sm_80 defaults; `AEC_BWD_XS=0`: both warpgroups
//! computing both Sᵀ and dPᵀ)
use aec_compiler::{BackwardConfig, Elem, Isa, parallel_backward};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, dqk, dv, rest @ ..] = args.as_slice() else {
        eprintln!(
            "usage: emit_backward <variant.rs> <dqk> <dv> [block_m warps [split_d [kv_groups]]]"
        );
        std::process::exit(2);
    };
    let src = std::fs::read_to_string(file).expect("read variant file");
    let v = aec_frontend::parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant");
    let (dqk, dv): (u32, u32) = (dqk.parse().expect("dqk"), dv.parse().expect("dv"));
    let isa = if std::env::var("AEC_BWD_ISA").is_ok_and(|v| v == "sm80") {
        Isa::Sm80
    } else {
        Isa::Sm90a
    };
    let mut cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, isa);
    if let [bm, warps, more @ ..] = rest {
        cfg.block_m = bm.parse().expect("block_m");
        cfg.warps = warps.parse().expect("warps");
        cfg.split_d = more.first().map_or(1, |s| s.parse().expect("split_d"));
        cfg.kv_groups = more.get(1).map_or(1, |s| s.parse().expect("kv_groups"));
    }
    if std::env::var("AEC_BWD_XS").is_ok_and(|v| v == "0") {
        cfg.shared_scores = false;
    }
    // AEC_BWD_WS=0: without the producer warpgroup (for comparisons).
    if std::env::var("AEC_BWD_WS").is_ok_and(|v| v == "0") {
        cfg.warp_specialized = false;
    }
    let k = parallel_backward(&v, dqk, dv, &cfg).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "main {} threads {} smem_bytes {}",
        k.main.name, k.main.threads, k.main.smem_bytes
    );
    print!("{}", k.source);
}
