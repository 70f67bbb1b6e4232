//! End-to-end tests of `aec cache`: the real binary on cache files written
//! through the runtime's API in a temporary directory. No GPU needed.

use aec::runtime::tuning::{Rejection, ShapeBucket, TunedEntry, TuningCache, TuningKey};
use std::path::Path;
use std::process::Command;

/// Exit code for problems in the user's input.
const EXIT_INPUT: i32 = 2;

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `aec cache` with `args`, the environment's cache locations removed
/// so nothing outside the test is read or written, then `env` set.
fn aec_with_env(args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aec"));
    cmd.arg("cache")
        .args(args)
        .env_remove("AEC_TUNING_CACHE")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("HOME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the aec binary");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "aec cache {args:?} panicked:\n{}",
        run.stderr
    );
    run
}

/// Runs `aec cache --file <file> <args>`.
fn aec(file: &Path, args: &[&str]) -> Run {
    let mut all = vec!["--file", file.to_str().unwrap()];
    all.extend_from_slice(args);
    aec_with_env(&all, &[])
}

fn entry(variant: &str, gpu: &str, efficiency: f64) -> TunedEntry {
    TunedEntry {
        key: TuningKey {
            variant: variant.into(),
            variant_hash: "9f3c2a71d04be855".into(),
            kernel: "parallel_forward".into(),
            template_version: "0.1.0+5e1d".into(),
            target: "sm_90a".into(),
            gpu: gpu.into(),
            driver: "580.65.06".into(),
            toolkit: "13.0".into(),
            dtype: "bf16".into(),
            dqk: 128,
            dv: 64,
            shape: ShapeBucket::of(4, 16, 4, 450, 4000),
        },
        config: serde_json::json!({"block_m": 128, "block_n": 176}),
        config_label: "m128 n176 w8 s2 sm90a-ws".into(),
        best_us: 400.0,
        default_us: 500.0,
        median_us: 600.0,
        plans_tried: 24,
        rejected: vec![Rejection {
            config: "m256 n128 w8 s3".into(),
            reason: "shared memory 260 KiB > 227 KiB".into(),
        }],
        tuning_seconds: 12.5,
        tflops: 532.1,
        efficiency,
    }
}

/// A cache with softmax on two GPUs and causal on one.
fn populate(file: &Path) {
    let (mut cache, warning) = TuningCache::open(file);
    assert_eq!(warning, None);
    cache
        .record(vec![
            entry("softmax", "NVIDIA H100 80GB HBM3", 0.5),
            entry("softmax", "NVIDIA H200", 1.0),
            entry("causal", "NVIDIA H100 80GB HBM3", 0.4),
        ])
        .unwrap();
}

#[test]
fn list_of_an_empty_cache_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    let run = aec(&file, &["list"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains(&format!("the tuning cache {} is empty", file.display())),
        "{run:?}"
    );
    assert!(!file.exists(), "listing writes nothing");
}

#[test]
fn list_shows_every_entry_and_portability() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    populate(&file);
    let run = aec(&file, &["list"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    // Sorted by key: causal first, then softmax on H100, then on H200.
    let row = |i: usize| {
        lines
            .iter()
            .find(|l| l.trim_start().starts_with(&format!("{i} ")))
            .unwrap_or_else(|| panic!("no row {i}:\n{}", run.stdout))
    };
    for (i, variant, gpu) in [
        (0, "causal", "NVIDIA H100 80GB HBM3"),
        (1, "softmax", "NVIDIA H100 80GB HBM3"),
        (2, "softmax", "NVIDIA H200"),
    ] {
        let line = row(i);
        for want in [
            variant,
            gpu,
            "parallel_forward",
            "sm_90a",
            "bf16",
            "128/64",
            "b4 h16/4 sq512 skv4096",
            "m128 n176 w8 s2 sm90a-ws",
            "400.00",
            "1.25x",
        ] {
            assert!(line.contains(want), "row {i} lacks {want:?}: {line}");
        }
    }
    let phi: Vec<&&str> = lines.iter().filter(|l| l.contains("Φ =")).collect();
    assert_eq!(phi.len(), 1, "only softmax is on two GPUs:\n{}", run.stdout);
    assert!(phi[0].contains("softmax"), "{}", phi[0]);
    assert!(
        phi[0].contains("Φ = 0.667 over 2 GPUs"),
        "harmonic mean of 0.5 and 1.0: {}",
        phi[0]
    );
}

#[test]
fn show_by_index_and_by_variant() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    populate(&file);
    let run = aec(&file, &["show", "0"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    for want in [
        "[0] causal (parallel_forward)",
        "9f3c2a71d04be855",
        "580.65.06",
        "Sq ≤ 512, Skv ≤ 4096",
        "\"block_n\":176",
        "speedup 1.25x",
        "tuning impact median/best 1.50x",
        "24 in 12.5 s",
        "m256 n128 w8 s3: shared memory 260 KiB > 227 KiB",
    ] {
        assert!(run.stdout.contains(want), "lacks {want:?}:\n{}", run.stdout);
    }

    let run = aec(&file, &["show", "softmax"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("[1] softmax"), "{}", run.stdout);
    assert!(run.stdout.contains("[2] softmax"), "{}", run.stdout);
    assert!(!run.stdout.contains("causal"), "{}", run.stdout);

    let run = aec(&file, &["show", "7"]);
    assert_eq!(run.code, Some(EXIT_INPUT), "{run:?}");
    assert!(run.stderr.contains("no entry 7"), "{}", run.stderr);
    let run = aec(&file, &["show", "retnet"]);
    assert_eq!(run.code, Some(EXIT_INPUT), "{run:?}");
    assert!(run.stderr.contains("causal, softmax"), "{}", run.stderr);
}

#[test]
fn clear_by_variant_by_gpu_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    populate(&file);
    let run = aec(&file, &["clear", "--variant", "softmax", "--gpu", "h200"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("removed 1 entry"), "{}", run.stdout);
    let left = TuningCache::open(&file).0;
    assert_eq!(left.len(), 2);
    assert!(left.entries().all(|e| e.key.gpu.contains("H100")));

    let run = aec(&file, &["clear", "--variant", "causal"]);
    assert!(run.stdout.contains("removed 1 entry"), "{}", run.stdout);
    let left = TuningCache::open(&file).0;
    assert_eq!(
        left.entries()
            .map(|e| e.key.variant.as_str())
            .collect::<Vec<_>>(),
        ["softmax"]
    );

    populate(&file);
    let run = aec(&file, &["clear"]);
    assert!(run.stdout.contains("removed 3 entries"), "{}", run.stdout);
    assert!(TuningCache::open(&file).0.is_empty());
}

#[test]
fn export_then_import() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    populate(&file);
    let exported = dir.path().join("export.json");
    let run = aec(&file, &["export", exported.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("exported 3 entries"), "{}", run.stdout);

    let other = dir.path().join("other").join("tuning.json");
    let run = aec(&other, &["import", exported.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("imported 3 entries"), "{}", run.stdout);
    let (a, b) = (TuningCache::open(&file).0, TuningCache::open(&other).0);
    assert_eq!(
        a.entries().collect::<Vec<_>>(),
        b.entries().collect::<Vec<_>>()
    );
}

#[test]
fn import_of_a_corrupt_or_newer_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    populate(&file);
    let corrupt = dir.path().join("corrupt.json");
    std::fs::write(&corrupt, "{\"format\": \"aec-tuning-cache\", \"entr").unwrap();
    let newer = dir.path().join("newer.json");
    std::fs::write(
        &newer,
        r#"{"format": "aec-tuning-cache", "version": 2, "entries": []}"#,
    )
    .unwrap();
    for bad in [&corrupt, &newer] {
        let run = aec(&file, &["import", bad.to_str().unwrap()]);
        assert_eq!(run.code, Some(EXIT_INPUT), "{run:?}");
        assert!(
            run.stderr.contains(&bad.display().to_string()),
            "names the file: {}",
            run.stderr
        );
    }
    assert!(
        aec(&file, &["import", "missing.json"])
            .stderr
            .contains("missing.json")
    );
    assert_eq!(
        TuningCache::open(&file).0.len(),
        3,
        "the cache is untouched"
    );
}

#[test]
fn a_corrupt_cache_is_listed_empty_after_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    std::fs::write(&file, b"\x00\x01 not json").unwrap();
    let run = aec(&file, &["list"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stderr.matches("warning:").count(),
        1,
        "one warning:\n{}",
        run.stderr
    );
    assert!(run.stderr.contains(&file.display().to_string()));
    assert!(run.stdout.contains("is empty"), "{}", run.stdout);
}

#[test]
fn the_default_location_comes_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("env.json");
    populate(&file);
    let run = aec_with_env(&["list"], &[("AEC_TUNING_CACHE", &file)]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains(&file.display().to_string()), "{run:?}");
    assert!(run.stdout.contains("3 entries"), "{run:?}");

    let run = aec_with_env(&["list"], &[("HOME", dir.path())]);
    let under_home = dir.path().join(".cache").join("aec").join("tuning-v1.json");
    assert!(
        run.stdout.contains(&under_home.display().to_string()),
        "{run:?}"
    );

    let run = aec_with_env(&["list"], &[]);
    assert_eq!(run.code, Some(EXIT_INPUT), "{run:?}");
    assert!(
        run.stderr
            .contains("no tuning cache location: set AEC_TUNING_CACHE or HOME"),
        "{}",
        run.stderr
    );
}
