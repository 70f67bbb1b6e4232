//! The persistent tuning cache: bucketing, the file round trip, what a
//! corrupt or other-version file gives, several processes writing at once,
//! export/import, and the performance-portability metric. No GPU needed.

use aec_runtime::tuning::{
    ShapeBucket, TUNING_CACHE_VERSION, TunedEntry, TuningCache, TuningCacheError, TuningKey,
    bucket_len, performance_portability,
};
use std::path::Path;
use std::process::{Command, Stdio};

/// Tells a `child_writer` process which cache to write and which ids.
const CHILD_ENV: &str = "AEC_TUNING_TEST_CHILD";

fn entry(variant: &str, gpu: &str, sq: usize) -> TunedEntry {
    TunedEntry {
        key: TuningKey {
            variant: variant.into(),
            variant_hash: format!("{:016x}", variant.len() * 7919),
            kernel: "parallel_forward".into(),
            template_version: "0.1.0+0123abcd".into(),
            target: "sm_90a".into(),
            gpu: gpu.into(),
            driver: "580.65.06".into(),
            toolkit: "13.0".into(),
            dtype: "bf16".into(),
            dqk: 128,
            dv: 128,
            shape: ShapeBucket::of(4, 16, 16, sq, sq),
        },
        config: serde_json::json!({"block_m": 128, "block_n": 128, "warps": 8, "stages": 2}),
        config_label: "m128 n128 w8 s2 sm90a-ws".into(),
        // Values whose shortest decimal form has 17 digits, so an inexact
        // float parser would show in the round trip.
        best_us: 0.1 + 0.2 + 400.0,
        default_us: 512.25,
        median_us: 480.0 / 3.0,
        plans_tried: 24,
        rejected: vec![aec_runtime::tuning::Rejection {
            config: "m256 n128 w8 s3".into(),
            reason: "shared memory 260 KiB > 227 KiB".into(),
        }],
        tuning_seconds: 12.5,
        tflops: 532.1,
        efficiency: 1.0 / 3.0,
    }
}

fn read(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("read cache file")).expect("valid JSON")
}

#[test]
fn sequence_lengths_bucket_to_the_next_power_of_two() {
    assert_eq!(bucket_len(450), 512);
    assert_eq!(bucket_len(512), 512);
    assert_eq!(bucket_len(513), 1024);
    assert_eq!(bucket_len(1), 1);
    assert_eq!(bucket_len(0), 1);
    assert_eq!(bucket_len(4097), 8192);
    assert_eq!(bucket_len(usize::MAX), 1 << 31);
    assert_eq!(
        ShapeBucket::of(3, 32, 8, 450, 4097),
        ShapeBucket {
            b: 3,
            h: 32,
            hkv: 8,
            sq: 512,
            skv: 8192
        }
    );
}

#[test]
fn recorded_entries_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    // A directory that does not exist yet: the first record creates it.
    let path = dir.path().join("sub").join("tuning.json");
    let (mut cache, warning) = TuningCache::open(&path);
    assert_eq!(warning, None, "a missing file is an empty cache, silently");
    assert!(cache.is_empty());
    let (a, b) = (entry("softmax", "H100", 450), entry("causal", "H100", 4096));
    cache.record(vec![a.clone(), b.clone()]).unwrap();
    assert_eq!(cache.lookup(&a.key), Some(&a));

    let (reopened, warning) = TuningCache::open(&path);
    assert_eq!(warning, None);
    assert_eq!(reopened.path(), Some(path.as_path()));
    assert_eq!(reopened.len(), 2);
    assert_eq!(reopened.lookup(&a.key), Some(&a), "exact round trip");
    assert_eq!(reopened.lookup(&b.key), Some(&b));
    let order: Vec<&str> = reopened.entries().map(|e| e.key.variant.as_str()).collect();
    assert_eq!(order, ["causal", "softmax"], "sorted by key");

    let file = read(&path);
    assert_eq!(file["format"], "aec-tuning-cache");
    assert_eq!(file["version"], TUNING_CACHE_VERSION);
    assert_eq!(file["entries"].as_array().unwrap().len(), 2);

    // Replacing an entry keeps one per key, and rewriting is deterministic.
    let mut faster = a.clone();
    faster.best_us = 300.0;
    let mut cache = reopened;
    cache.record(vec![faster.clone()]).unwrap();
    assert_eq!(cache.len(), 2);
    assert_eq!(TuningCache::open(&path).0.lookup(&a.key), Some(&faster));
    let bytes = std::fs::read(&path).unwrap();
    cache.record(vec![]).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn another_bucket_misses() {
    let (mut cache, _) = TuningCache::open(tempfile::tempdir().unwrap().path().join("t.json"));
    let e = entry("softmax", "H100", 450);
    cache.record(vec![e.clone()]).unwrap();
    let mut same_bucket = e.key.clone();
    same_bucket.shape = ShapeBucket::of(4, 16, 16, 300, 512);
    assert!(
        cache.lookup(&same_bucket).is_some(),
        "300 and 450 share 512"
    );
    let mut other = e.key.clone();
    other.shape = ShapeBucket::of(4, 16, 16, 513, 513);
    assert!(cache.lookup(&other).is_none());
    let mut other_gpu = e.key.clone();
    other_gpu.gpu = "H200".into();
    assert!(cache.lookup(&other_gpu).is_none());
}

#[test]
fn corrupt_files_give_an_empty_cache_and_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, [0xff, 0x00, 0x13, b'{', 0x80]).unwrap();
    let truncated = dir.path().join("truncated.json");
    {
        let (mut c, _) = TuningCache::open(&truncated);
        c.record(vec![entry("softmax", "H100", 1024)]).unwrap();
    }
    let full = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    let other_json = dir.path().join("other.json");
    std::fs::write(&other_json, r#"{"entries": []}"#).unwrap();

    for path in [&garbage, &truncated, &other_json] {
        let (cache, warning) = TuningCache::open(path);
        assert!(cache.is_empty(), "{}", path.display());
        let warning = warning.unwrap_or_else(|| panic!("no warning for {}", path.display()));
        assert!(
            warning.contains(&path.display().to_string()),
            "warning names the file: {warning}"
        );
        let (again, second) = TuningCache::open(path);
        assert!(again.is_empty());
        assert_eq!(second, None, "warned once per process");
    }

    // The next record replaces the corrupt file.
    let (mut cache, _) = TuningCache::open(&garbage);
    let e = entry("softmax", "H100", 64);
    cache.record(vec![e.clone()]).unwrap();
    let (reopened, warning) = TuningCache::open(&garbage);
    assert_eq!(warning, None);
    assert_eq!(reopened.lookup(&e.key), Some(&e));
}

#[test]
fn files_of_another_version_are_reported_ignored_and_replaced() {
    for version in [0, 2] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.json");
        // An entry the current format could even read: ignored all the same.
        let text = serde_json::json!({
            "format": "aec-tuning-cache",
            "version": version,
            "entries": [entry("softmax", "H100", 128)],
        });
        std::fs::write(&path, text.to_string()).unwrap();
        let (mut cache, warning) = TuningCache::open(&path);
        assert!(cache.is_empty(), "version {version} ignored");
        let warning = warning.expect("a warning");
        assert!(warning.contains(&path.display().to_string()), "{warning}");
        assert!(
            warning.contains(&format!("version {version}")),
            "names the version: {warning}"
        );

        let e = entry("causal", "H100", 256);
        cache.record(vec![e.clone()]).unwrap();
        let file = read(&path);
        assert_eq!(file["version"], TUNING_CACHE_VERSION);
        let (reopened, warning) = TuningCache::open(&path);
        assert_eq!(warning, None);
        assert_eq!(reopened.len(), 1, "the old entries are gone");
        assert_eq!(reopened.lookup(&e.key), Some(&e));
    }
}

#[test]
fn remove_where_removes_only_matches_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let (mut cache, _) = TuningCache::open(&path);
    cache
        .record(vec![
            entry("softmax", "H100", 64),
            entry("softmax", "H200", 64),
            entry("causal", "H100", 64),
        ])
        .unwrap();
    let n = cache
        .remove_where(|e| e.key.variant == "softmax" && e.key.gpu == "H100")
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(cache.len(), 2);
    assert_eq!(TuningCache::open(&path).0.len(), 2);
    assert_eq!(cache.remove_where(|_| false).unwrap(), 0);
    assert_eq!(cache.remove_where(|_| true).unwrap(), 2);
    assert!(TuningCache::open(&path).0.is_empty());

    // Clearing a cache that was never written creates nothing.
    let fresh = dir.path().join("fresh").join("t.json");
    let (mut cache, _) = TuningCache::open(&fresh);
    assert_eq!(cache.remove_where(|_| true).unwrap(), 0);
    assert!(!dir.path().join("fresh").exists());
}

#[test]
fn a_second_handle_keeps_the_first_ones_entries() {
    // Two caches opened on one file before either writes: the second
    // write must merge with the file, not overwrite it with its own view.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let (mut one, _) = TuningCache::open(&path);
    let (mut two, _) = TuningCache::open(&path);
    one.record(vec![entry("softmax", "H100", 64)]).unwrap();
    two.record(vec![entry("causal", "H100", 64)]).unwrap();
    assert_eq!(two.len(), 2, "memory follows the merged file");
    assert_eq!(TuningCache::open(&path).0.len(), 2);
}

#[test]
fn in_memory_cache_writes_nothing() {
    let mut cache = TuningCache::in_memory();
    assert_eq!(cache.path(), None);
    let e = entry("softmax", "H100", 64);
    cache.record(vec![e.clone()]).unwrap();
    assert_eq!(cache.lookup(&e.key), Some(&e));
    assert_eq!(cache.remove_where(|_| true).unwrap(), 1);
    assert!(cache.is_empty());
}

/// How many processes write at once, and how many entries each.
const WRITERS: usize = 6;
const PER_WRITER: usize = 10;

#[test]
fn concurrent_writers_from_several_processes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared").join("tuning.json");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WRITERS)
        .map(|w| {
            let ids: Vec<String> = (w * PER_WRITER..(w + 1) * PER_WRITER)
                .map(|i| i.to_string())
                .collect();
            Command::new(&exe)
                .args(["--exact", "child_writer", "--nocapture"])
                .env(CHILD_ENV, format!("{}|{}", path.display(), ids.join(",")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                // `spawn`, not `output`: the writers must overlap.
                .spawn()
                .expect("spawn the test binary")
        })
        .collect();
    for (w, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "writer {w} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (cache, warning) = TuningCache::open(&path);
    assert_eq!(warning, None, "the file parses");
    assert_eq!(cache.len(), WRITERS * PER_WRITER);
    for i in 0..WRITERS * PER_WRITER {
        let key = entry(&format!("v{i}"), "H100", i + 1).key;
        assert!(cache.lookup(&key).is_some(), "entry {i} kept");
    }
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// One writer of `concurrent_writers_from_several_processes_lose_nothing`,
/// run in its own process; does nothing without the variable naming its
/// work (i.e. in a normal test run).
#[test]
fn child_writer() {
    let Ok(job) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (path, ids) = job.split_once('|').expect("path|ids");
    let (mut cache, warning) = TuningCache::open(path);
    assert_eq!(warning, None);
    for id in ids.split(',') {
        let i: usize = id.parse().unwrap();
        // One record per entry: as many lock/read/merge/write rounds as
        // possible, interleaved with the other writers'.
        cache
            .record(vec![entry(&format!("v{i}"), "H100", i + 1)])
            .unwrap();
    }
}

#[test]
fn export_then_import_round_trips_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, _) = TuningCache::open(dir.path().join("a.json"));
    let (x, y) = (entry("softmax", "H100", 64), entry("causal", "H200", 8192));
    source.record(vec![x.clone(), y.clone()]).unwrap();
    let exported = dir.path().join("export.json");
    assert_eq!(source.export(&exported).unwrap(), 2);
    assert_eq!(
        std::fs::read(&exported).unwrap(),
        std::fs::read(dir.path().join("a.json")).unwrap(),
        "the same file format"
    );

    let target_path = dir.path().join("b.json");
    let (mut target, _) = TuningCache::open(&target_path);
    let z = entry("alibi", "H100", 64);
    target.record(vec![z.clone()]).unwrap();
    assert_eq!(target.import(&exported).unwrap(), 2);
    assert_eq!(target.len(), 3);
    let reopened = TuningCache::open(&target_path).0;
    for e in [&x, &y, &z] {
        assert_eq!(reopened.lookup(&e.key), Some(e));
    }

    // The in-memory cache exports too.
    let mut mem = TuningCache::in_memory();
    mem.record(vec![z.clone()]).unwrap();
    let mem_file = dir.path().join("mem.json");
    assert_eq!(mem.export(&mem_file).unwrap(), 1);
    assert_eq!(TuningCache::open(&mem_file).0.lookup(&z.key), Some(&z));
}

#[test]
fn import_of_a_bad_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cache, _) = TuningCache::open(dir.path().join("t.json"));

    let corrupt = dir.path().join("corrupt.json");
    std::fs::write(&corrupt, "{\"format\": \"aec-tuning-cache\", \"vers").unwrap();
    let err = cache.import(&corrupt).unwrap_err();
    assert!(matches!(err, TuningCacheError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains(&corrupt.display().to_string()));

    let newer = dir.path().join("newer.json");
    std::fs::write(
        &newer,
        r#"{"format": "aec-tuning-cache", "version": 2, "entries": []}"#,
    )
    .unwrap();
    let err = cache.import(&newer).unwrap_err();
    assert!(
        matches!(
            err,
            TuningCacheError::Version {
                found: 2,
                expected: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains(&newer.display().to_string()));

    let missing = dir.path().join("missing.json");
    let err = cache.import(&missing).unwrap_err();
    assert!(matches!(err, TuningCacheError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains(&missing.display().to_string()));
    assert!(cache.is_empty());
}

#[test]
fn performance_portability_is_the_harmonic_mean() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(close(performance_portability(&[0.5, 1.0]), 2.0 / 3.0));
    assert!(close(performance_portability(&[0.8]), 0.8));
    assert!(close(performance_portability(&[0.6, 0.6, 0.6]), 0.6));
    assert!(close(
        performance_portability(&[0.2, 0.4, 0.8]),
        3.0 / (5.0 + 2.5 + 1.25)
    ));
    assert_eq!(performance_portability(&[]), 0.0);
    assert_eq!(performance_portability(&[0.5, 0.0]), 0.0);
    assert_eq!(performance_portability(&[0.5, f64::NAN]), 0.0);
}

#[test]
fn speedup_and_impact() {
    let mut e = entry("softmax", "H100", 64);
    (e.best_us, e.default_us, e.median_us) = (100.0, 150.0, 250.0);
    assert_eq!(e.speedup(), 1.5);
    assert_eq!(e.impact(), 2.5);
}
