//! Prints the generated parallel forward kernel of a variant file.
//! `cargo run -p aec-compiler --example emit_forward -- examples/softmax.rs 128 128`
use aec_compiler::{Elem, ForwardConfig, parallel_forward};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, dqk, dv, rest @ ..] = args.as_slice() else {
        eprintln!("usage: emit_forward <variant.rs> <dqk> <dv> [block_m block_n]");
        std::process::exit(2);
    };
    let src = std::fs::read_to_string(file).expect("read variant file");
    let v = aec_frontend::parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant");
    let bm = rest
        .first()
        .map(|s| s.parse().expect("block_m"))
        .unwrap_or(128);
    let bn = rest
        .get(1)
        .map(|s| s.parse().expect("block_n"))
        .unwrap_or(64);
    let warps = rest.get(2).map(|s| s.parse().expect("warps")).unwrap_or(4);
    let k = parallel_forward(
        &v,
        dqk.parse().expect("dqk"),
        dv.parse().expect("dv"),
        &ForwardConfig {
            block_m: bm,
            block_n: bn,
            warps,
            elem: Elem::Bf16,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    print!("{}", k.source);
}
