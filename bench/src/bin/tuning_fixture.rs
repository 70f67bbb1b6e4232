//! `tuning_fixture OUT.json`: a tuning cache for the GPU checks of kernel
//! libraries' tuning tables (`bench/library_gpu.sh`). Its entries are not
//! measurements: each names a non-default Softmax forward configuration
//! (128-row blocks of 64 keys, two stages, not persistent) or backward tile
//! (the first of the backward's tile space after the default that
//! generates) for the H100's and the H200's device names and for the shape
//! buckets of the library checks' calls, so that `aec compile
//! --tuning-cache OUT.json` gives libraries whose tuning-table kernels
//! those checks run and check. Their labels and times say they are a
//! fixture.
//!
//! Built here (it needs the variant hash and template version of this aec):
//! `cargo build --release -p aec-bench --bin tuning_fixture`.

use aec::compiler::{BackwardConfig, Elem, ForwardConfig, Isa, parallel_backward};
use aec::runtime::{ShapeBucket, TunedEntry, TuningCache, TuningKey};
use aec::tune::{
    PARALLEL_BACKWARD, PARALLEL_FORWARD, backward_template_version, template_version, variant_hash,
};
use std::path::{Path, PathBuf};

/// The GPUs the device machines lend, by driver name.
const GPUS: [&str; 2] = ["NVIDIA H100 80GB HBM3", "NVIDIA H200"];

/// (head dims, call shapes B, H, Sq, Skv) of the library checks: the
/// PyTorch module's and the C header's softmax at 128, the Rust loader's at
/// 128x64 (bench/library_check.py, bench/library_c_check.sh,
/// tests/gpu_library.rs).
const CALLS: [((u32, u32), [usize; 4]); 3] = [
    ((128, 128), [2, 4, 200, 200]),
    ((128, 128), [2, 4, 200, 333]),
    ((128, 64), [2, 3, 97, 133]),
];

fn main() {
    let Some(out) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: tuning_fixture OUT.json");
        std::process::exit(2);
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let source =
        std::fs::read_to_string(root.join("examples/softmax.rs")).expect("softmax example");
    let softmax = aec::frontend::parse_file(&source)
        .expect("examples/softmax.rs parses")
        .remove(0)
        .variant
        .expect("Softmax traces");
    let hash = variant_hash(&softmax);
    let mut entries = Vec::new();
    for ((dqk, dv), [b, h, sq, skv]) in CALLS {
        let default = ForwardConfig::default_for(&softmax, dqk, dv, Elem::Bf16, Isa::Sm90a);
        let config = ForwardConfig {
            block_m: 128,
            block_n: 64,
            warps: 8,
            stages: 2,
            persistent: false,
            q_in_registers: false,
            ..default
        };
        assert!(
            config != default,
            "the fixture's configuration is the default"
        );
        let bwd_default = BackwardConfig::default_for(dqk, dv, Elem::Bf16, Isa::Sm90a);
        let bwd = BackwardConfig::space(dqk, dv, Elem::Bf16, Isa::Sm90a)
            .into_iter()
            .find(|c| *c != bwd_default && parallel_backward(&softmax, dqk, dv, c).is_ok())
            .expect("the backward's space holds another tile");
        let passes = [
            (
                PARALLEL_FORWARD,
                template_version(),
                serde_json::to_value(config).expect("configs serialise"),
                "m128 n64 w8 s2 wgmma-ws".to_string(),
            ),
            (
                PARALLEL_BACKWARD,
                backward_template_version(),
                serde_json::to_value(bwd).expect("configs serialise"),
                bwd.label(),
            ),
        ];
        for gpu in GPUS {
            for (kernel, template_version, config, label) in &passes {
                entries.push(TunedEntry {
                    key: TuningKey {
                        variant: softmax.name.clone(),
                        variant_hash: hash.clone(),
                        kernel: (*kernel).into(),
                        template_version: template_version.clone(),
                        target: Isa::Sm90a.arch().into(),
                        gpu: gpu.into(),
                        driver: "fixture".into(),
                        toolkit: "fixture".into(),
                        dtype: Elem::Bf16.name().into(),
                        dqk,
                        dv,
                        shape: ShapeBucket::of(b, h, h, sq, skv),
                    },
                    config: config.clone(),
                    config_label: format!("fixture (not measured): {label}"),
                    best_us: 1.0,
                    default_us: 1.0,
                    median_us: 1.0,
                    plans_tried: 0,
                    rejected: vec![],
                    tuning_seconds: 0.0,
                    tflops: 0.0,
                    efficiency: 0.0,
                });
            }
        }
    }
    let _ = std::fs::remove_file(&out);
    let (mut cache, warning) = TuningCache::open(&out);
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    let n = entries.len();
    cache.record(entries).expect("write the fixture");
    eprintln!("wrote {} ({n} entries)", out.display());
}
