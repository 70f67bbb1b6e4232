//! The tuner's selection and the dispatch, with a fake profiler (no GPU):
//! the default is always measured first and wins ties, the fastest plan is
//! chosen, failures are recorded with their reason, a failing default is an
//! error, and the stored result is found again for every shape of its
//! bucket and only there.

use aec::compiler::schedule::DeviceConfig;
use aec::compiler::{Elem, ForwardConfig, Isa};
use aec::frontend::{Variant, parse_file};
use aec::run::{HeadDims, Shape};
use aec::runtime::TuningCache;
use aec::tune::dispatch::ForwardDispatch;
use aec::tune::{
    KeyParts, Profiler, TuneOptions, TuneProgress, entry_config, forward_key, tune_forward,
    variant_hash,
};

fn example(name: &str) -> Variant {
    let src = std::fs::read_to_string(format!("{}/examples/{name}.rs", env!("CARGO_MANIFEST_DIR")))
        .unwrap();
    parse_file(&src).unwrap().remove(0).variant.unwrap()
}

const PARTS: KeyParts<'static> = KeyParts {
    gpu: "NVIDIA H100 80GB HBM3",
    target: "sm_90a",
    driver: "13.0",
    toolkit: "nvrtc 13.0",
};

/// Times from a rule; records what it was asked.
struct FakeProfiler<F: Fn(&ForwardConfig) -> Result<f64, String>> {
    time: F,
    prepared: Vec<ForwardConfig>,
    measured: Vec<ForwardConfig>,
}

impl<F: Fn(&ForwardConfig) -> Result<f64, String>> Profiler for FakeProfiler<F> {
    fn prepare(&mut self, plans: &[ForwardConfig], progress: &mut dyn FnMut(TuneProgress)) {
        self.prepared = plans.to_vec();
        progress(TuneProgress::Compiled {
            done: plans.len(),
            total: plans.len(),
        });
    }
    fn measure(&mut self, plan: &ForwardConfig) -> Result<f64, String> {
        self.measured.push(*plan);
        (self.time)(plan)
    }
}

fn tune_with(
    v: &Variant,
    shape: Shape,
    time: impl Fn(&ForwardConfig) -> Result<f64, String>,
) -> Result<(aec::tune::TuneReport, Vec<ForwardConfig>), String> {
    let h100 = DeviceConfig::named("h100").unwrap();
    let dims = HeadDims::square(128);
    let key = forward_key(v, &variant_hash(v), dims, shape, Elem::Bf16, &PARTS);
    let mut p = FakeProfiler {
        time,
        prepared: vec![],
        measured: vec![],
    };
    let mut events = 0;
    let options = TuneOptions {
        top: 5,
        ..TuneOptions::default()
    };
    let r = tune_forward(
        v,
        &h100,
        dims,
        shape,
        Elem::Bf16,
        key,
        &options,
        &mut p,
        &mut |_| events += 1,
    )?;
    assert_eq!(
        p.prepared, p.measured,
        "every prepared plan is measured once"
    );
    assert_eq!(events, 1 + p.measured.len());
    Ok((r, p.measured))
}

#[test]
fn the_fastest_measured_plan_wins_and_failures_are_recorded() {
    let v = example("softmax");
    let shape = Shape::mha(4, 16, 1000, 1000);
    let default = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    // Key blocks shorter than the default's are the fastest (fewer stages
    // faster still); non-warp-specialised plans fail.
    let fast = |c: &ForwardConfig| c.warp_specialized && c.block_n < default.block_n;
    let (r, measured) = tune_with(&v, shape, |c| {
        if !c.warp_specialized {
            Err("launch failed".into())
        } else if fast(c) {
            Ok(50.0 + c.stages as f64)
        } else {
            Ok(100.0)
        }
    })
    .unwrap();
    assert_eq!(measured[0], default, "the default is measured first");
    assert_eq!(measured.len(), 6, "the default and the top 5");
    assert!(measured.iter().any(fast), "{measured:?}");
    let best = entry_config(&r.entry).unwrap();
    assert!(fast(&best), "{best:?}");
    assert!(
        measured
            .iter()
            .all(|c| !fast(c) || 50.0 + c.stages as f64 >= r.entry.best_us)
    );
    assert_eq!(r.entry.default_us, 100.0);
    assert!((r.entry.speedup() - 100.0 / r.entry.best_us).abs() < 1e-12);
    assert_eq!(r.entry.plans_tried, 6);
    let failed = measured.iter().filter(|c| !c.warp_specialized).count();
    let launch_failures = r
        .entry
        .rejected
        .iter()
        .filter(|x| x.reason == "launch failed")
        .count();
    assert_eq!(launch_failures, failed);
    // Rejections by the space come with their reasons too.
    assert!(r.entry.rejected.len() > failed);
    assert!(r.entry.tflops > 0.0 && r.entry.efficiency > 0.0 && r.entry.efficiency < 1.0);
}

#[test]
fn the_default_wins_ties_and_a_failing_default_is_an_error() {
    let v = example("softmax");
    let shape = Shape::mha(4, 16, 1000, 1000);
    let default = ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a);
    let (r, _) = tune_with(&v, shape, |_| Ok(10.0)).unwrap();
    assert_eq!(entry_config(&r.entry), Some(default));
    assert_eq!(r.entry.speedup(), 1.0);
    let err = tune_with(&v, shape, |c| {
        if *c == default {
            Err("compile: boom".into())
        } else {
            Ok(1.0)
        }
    })
    .unwrap_err();
    assert!(
        err.contains("the default plan") && err.contains("boom"),
        "{err}"
    );
}

#[test]
fn dispatch_finds_the_tuned_plan_for_its_bucket_only() {
    let v = example("softmax");
    let dir = tempfile::tempdir().unwrap();
    let (mut cache, warning) = TuningCache::open(dir.path().join("tuning.json"));
    assert!(warning.is_none());
    let (r, _) = tune_with(&v, Shape::mha(4, 16, 450, 450), |c| {
        Ok(if c.block_n == 64 { 5.0 } else { 9.0 })
    })
    .unwrap();
    let tuned = entry_config(&r.entry).unwrap();
    cache.record(vec![r.entry]).unwrap();
    let (cache, _) = TuningCache::open(dir.path().join("tuning.json"));
    let d = ForwardDispatch::new(&v, HeadDims::square(128), Elem::Bf16, &PARTS);
    // 450 and 500 share the bucket 512.
    for s in [450, 500, 512] {
        let (_, c) = d.lookup(&cache, Shape::mha(4, 16, s, s)).expect("tuned");
        assert_eq!(c, tuned);
    }
    // Another bucket, batch, dtype or GPU: nothing.
    assert!(d.lookup(&cache, Shape::mha(4, 16, 513, 513)).is_none());
    assert!(d.lookup(&cache, Shape::mha(8, 16, 450, 450)).is_none());
    let f16 = ForwardDispatch::new(&v, HeadDims::square(128), Elem::F16, &PARTS);
    assert!(f16.lookup(&cache, Shape::mha(4, 16, 450, 450)).is_none());
    let h200 = KeyParts {
        gpu: "NVIDIA H200",
        ..PARTS
    };
    let other = ForwardDispatch::new(&v, HeadDims::square(128), Elem::Bf16, &h200);
    assert!(other.lookup(&cache, Shape::mha(4, 16, 450, 450)).is_none());
    // Another variant (a different definition) does not share results.
    let causal = ForwardDispatch::new(
        &example("softmax_causal"),
        HeadDims::square(128),
        Elem::Bf16,
        &PARTS,
    );
    assert!(causal.lookup(&cache, Shape::mha(4, 16, 450, 450)).is_none());
}
