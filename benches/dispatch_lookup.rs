//! The warm dispatch lookup: the time from a call's shape to its tuned
//! configuration (bucketing, key, hash lookup, decoding the configuration)
//! in a cache of 2,000 entries. `cargo bench --bench dispatch_lookup`.

use aec::compiler::{Elem, ForwardConfig};
use aec::frontend::parse_file;
use aec::run::{HeadDims, Shape};
use aec::runtime::{ShapeBucket, TunedEntry, TuningCache};
use aec::tune::KeyParts;
use aec::tune::dispatch::KernelDispatch;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/softmax.rs"))
        .unwrap();
    let v = parse_file(&src).unwrap().remove(0).variant.unwrap();
    let parts = KeyParts {
        gpu: "NVIDIA H100 80GB HBM3",
        target: "sm_90a",
        driver: "13.0",
        toolkit: "nvrtc 13.0",
    };
    let dims = HeadDims::square(128);
    let d = KernelDispatch::forward(&v, dims, Elem::Bf16, &parts);
    let config = aec::compiler::ForwardConfig::default_for(
        &v,
        128,
        128,
        Elem::Bf16,
        aec::compiler::Isa::Sm90a,
    );
    let mut entries = Vec::new();
    for b in 1..=40 {
        for s in 0..50 {
            let shape = Shape::mha(b, 16, 1 << (s % 14), 1 << (s % 14));
            let mut key = d.key(shape);
            key.shape = ShapeBucket {
                b: b as u32,
                h: 16 + (s / 14) as u32,
                ..key.shape
            };
            entries.push(TunedEntry {
                key,
                config: serde_json::to_value(config).unwrap(),
                config_label: "m128 n128 w8 s3 wgmma-ws".into(),
                best_us: 1.0,
                default_us: 1.0,
                median_us: 1.0,
                plans_tried: 1,
                rejected: vec![],
                tuning_seconds: 1.0,
                tflops: 1.0,
                efficiency: 0.5,
            });
        }
    }
    let mut cache = TuningCache::in_memory();
    cache.record(entries).unwrap();
    let shapes: Vec<Shape> = (0..64)
        .map(|i| Shape::mha(1 + i % 40, 16, 300 + i * 97, 300 + i * 97))
        .collect();
    let n = 200_000;
    let mut hits = 0;
    let start = Instant::now();
    for i in 0..n {
        if black_box(d.lookup::<ForwardConfig>(&cache, shapes[i % shapes.len()])).is_some() {
            hits += 1;
        }
    }
    let per = start.elapsed().as_secs_f64() / n as f64 * 1e6;
    println!(
        "warm dispatch lookup: {per:.3} µs per call ({n} calls, {} entries, {hits} hits)",
        cache.len()
    );
}
