//! The kernel cache with fake compiled payloads: hits, persistence, corrupt
//! and unreadable entries (ignored, recompiled), atomic writes. No NVRTC needed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aec_runtime::{CacheKey, CompileOptions, Compiled, KernelCache, RuntimeError};

fn key(source: &str) -> CacheKey {
    let opts = CompileOptions {
        arch: "sm_80".into(),
        include_dirs: Vec::new(),
        flags: Vec::new(),
    };
    CacheKey::new(source, &opts, (13, 0))
}

fn payload(tag: u8) -> Compiled {
    Compiled {
        cubin: vec![0x7f, b'E', b'L', b'F', tag],
        ptx: format!("// fake ptx {tag}\n"),
        log: String::new(),
    }
}

/// A compile function that counts its calls.
struct Counter(AtomicUsize);

impl Counter {
    fn new() -> Self {
        Counter(AtomicUsize::new(0))
    }
    fn compile(&self, tag: u8) -> impl FnOnce() -> aec_runtime::Result<Compiled> + '_ {
        move || {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(payload(tag))
        }
    }
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn memory_hit_does_not_recompile() {
    let cache = KernelCache::new(None);
    let n = Counter::new();
    let a = cache.get_or_insert_with(key("k"), n.compile(1)).unwrap();
    let b = cache.get_or_insert_with(key("k"), n.compile(2)).unwrap();
    assert_eq!(n.calls(), 1);
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(*b, payload(1));
    cache
        .get_or_insert_with(key("other"), n.compile(3))
        .unwrap();
    assert_eq!(n.calls(), 2);
}

#[test]
fn disk_entry_survives_the_process_cache() {
    let dir = tempfile::tempdir().unwrap();
    let n = Counter::new();
    let first = KernelCache::new(Some(dir.path().to_path_buf()));
    first.get_or_insert_with(key("k"), n.compile(1)).unwrap();
    assert_eq!(files(dir.path()), [format!("{}.aeck", key("k").hex())]);

    // A new cache (as in the next process) reads it back without compiling.
    let second = KernelCache::new(Some(dir.path().to_path_buf()));
    let got = second.get_or_insert_with(key("k"), n.compile(2)).unwrap();
    assert_eq!(n.calls(), 1);
    assert_eq!(*got, payload(1));
}

#[test]
fn corrupt_entry_is_ignored_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let n = Counter::new();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let path = cache.entry_path(key("k")).unwrap();
    cache.get_or_insert_with(key("k"), n.compile(1)).unwrap();

    for corrupt in [b"garbage".to_vec(), Vec::new(), {
        // A valid entry cut short, as after a crash without atomic writes.
        let whole = std::fs::read(&path).unwrap();
        whole[..whole.len() / 2].to_vec()
    }] {
        std::fs::write(&path, &corrupt).unwrap();
        let fresh = KernelCache::new(Some(dir.path().to_path_buf()));
        let calls = n.calls();
        let got = fresh.get_or_insert_with(key("k"), n.compile(2)).unwrap();
        assert_eq!(n.calls(), calls + 1, "a corrupt entry must be recompiled");
        assert_eq!(*got, payload(2));
        // ... and replaced by a good one.
        let again = KernelCache::new(Some(dir.path().to_path_buf()));
        assert_eq!(
            *again.get_or_insert_with(key("k"), n.compile(3)).unwrap(),
            payload(2)
        );
        assert_eq!(n.calls(), calls + 1);
    }
}

#[test]
fn unreadable_and_unwritable_entries_are_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    // A directory where the entry file should be: reading and renaming fail.
    std::fs::create_dir(cache.entry_path(key("k")).unwrap()).unwrap();
    let n = Counter::new();
    assert_eq!(
        *cache.get_or_insert_with(key("k"), n.compile(1)).unwrap(),
        payload(1)
    );
    assert_eq!(n.calls(), 1);
    // No temporary file is left behind by the failed write.
    assert_eq!(files(dir.path()), [format!("{}.aeck", key("k").hex())]);

    // A cache directory that cannot be created (its parent is a file).
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let cache = KernelCache::new(Some(file.join("kernels")));
    assert_eq!(
        *cache.get_or_insert_with(key("k"), n.compile(2)).unwrap(),
        payload(2)
    );
}

#[test]
fn compile_errors_are_returned_and_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let err = cache
        .get_or_insert_with(key("k"), || {
            Err(RuntimeError::Compile {
                arch: "sm_80".into(),
                log: "error: nope".into(),
            })
        })
        .unwrap_err();
    assert!(err.to_string().contains("error: nope"));
    assert!(files(dir.path()).is_empty());
    let n = Counter::new();
    cache.get_or_insert_with(key("k"), n.compile(1)).unwrap();
    assert_eq!(n.calls(), 1);
}

#[test]
fn concurrent_writers_leave_one_complete_entry() {
    let dir = tempfile::tempdir().unwrap();
    let big = Compiled {
        cubin: (0..200_000u32).map(|i| i as u8).collect(),
        ptx: "x".repeat(100_000),
        log: String::new(),
    };
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                // Separate caches: each thread misses in memory and writes.
                let cache = KernelCache::new(Some(dir.path().to_path_buf()));
                let got = cache
                    .get_or_insert_with(key("big"), || Ok(big.clone()))
                    .unwrap();
                assert_eq!(*got, big);
            });
        }
    });
    assert_eq!(files(dir.path()), [format!("{}.aeck", key("big").hex())]);
    let fresh = KernelCache::new(Some(dir.path().to_path_buf()));
    let got = fresh
        .get_or_insert_with(key("big"), || panic!("the entry must be readable"))
        .unwrap();
    assert_eq!(*got, big);
}

#[test]
fn default_dir_follows_the_environment() {
    // Only reads the variables; asserts the documented precedence holds for
    // whatever this process has.
    let dir = aec_runtime::default_cache_dir();
    match std::env::var_os("AEC_CACHE_DIR").filter(|v| !v.is_empty()) {
        Some(v) => assert_eq!(dir, Some(v.into())),
        None => {
            if let Some(d) = dir {
                assert!(d.ends_with("aec/kernels"), "{}", d.display());
            }
        }
    }
}
