//! The persistent tuning cache: the autotuner's results, one entry per
//! (variant, kernel, toolchain, device, dtype, head dims, shape bucket), kept
//! in one JSON file shared by every process on the machine.
//!
//! Reading never fails: a missing file is an empty cache, and a corrupt file
//! or one of another format version is an empty cache plus a warning (once
//! per path and process), because a lost tuning result only costs a re-tune.
//! Writing is safe against concurrent writers: [`TuningCache::record`] and
//! [`TuningCache::remove_where`] hold an exclusive lock on a sidecar
//! `<file>.lock`, re-read the file under it, and replace the file atomically
//! (temporary file, fsync, rename), so readers see the old file or the whole
//! new one and no writer loses another's entries.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The file format's version. Bumping it makes files of the old version be
/// reported once and ignored (and, being in the default file name, leaves
/// them in place for the aec that wrote them).
pub const TUNING_CACHE_VERSION: u32 = 1;

/// The `format` field of a tuning cache file, telling it apart from other
/// JSON files given by mistake.
const FORMAT: &str = "aec-tuning-cache";

/// The bucket of a sequence length: the next power of two (450 → 512,
/// 512 → 512, 1 → 1; 0 → 1). One tuned configuration serves every length of
/// its bucket, so the cache stays small and a new length rarely needs a
/// re-tune. Lengths above 2³¹ share the bucket 2³¹.
pub fn bucket_len(n: usize) -> u32 {
    const TOP: u32 = 1 << 31;
    match n.max(1).checked_next_power_of_two() {
        Some(p) => u32::try_from(p).map_or(TOP, |p| p.min(TOP)),
        None => TOP,
    }
}

/// The problem shape a tuning result is valid for: batch and head counts
/// exactly, sequence lengths by [`bucket_len`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct ShapeBucket {
    /// Batch size.
    pub b: u32,
    /// Query heads.
    pub h: u32,
    /// Key/value heads (below `h` for GQA).
    pub hkv: u32,
    /// Query length, bucketed.
    pub sq: u32,
    /// Key/value length, bucketed.
    pub skv: u32,
}

impl ShapeBucket {
    /// The bucket of a shape: `sq` and `skv` go through [`bucket_len`]; the
    /// counts are kept (saturated at `u32::MAX`, far beyond any real shape).
    pub fn of(b: usize, h: usize, hkv: usize, sq: usize, skv: usize) -> ShapeBucket {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        ShapeBucket {
            b: count(b),
            h: count(h),
            hkv: count(hkv),
            sq: bucket_len(sq),
            skv: bucket_len(skv),
        }
    }
}

/// Everything a tuned configuration depends on. Two runs with equal keys
/// may share a result; anything that changes the kernel, the compiler or the
/// device changes the key, so a stale result is never used.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct TuningKey {
    /// Variant name, for display.
    pub variant: String,
    /// Hex hash of the variant definition (a renamed or edited variant is a
    /// different key).
    pub variant_hash: String,
    /// Which kernel: `"parallel_forward"`, `"parallel_backward"`,
    /// `"recurrent_forward"`, …
    pub kernel: String,
    /// aec version and template hash, as given by the caller.
    pub template_version: String,
    /// Instruction set, e.g. `"sm_90a"`.
    pub target: String,
    /// Device name, e.g. `"NVIDIA H100 80GB HBM3"`.
    pub gpu: String,
    /// Driver version string.
    pub driver: String,
    /// NVRTC / toolkit version string.
    pub toolkit: String,
    /// Operand type: `"bf16"` or `"f16"`.
    pub dtype: String,
    /// Query/key head dimension.
    pub dqk: u32,
    /// Value head dimension.
    pub dv: u32,
    /// The shape bucket.
    pub shape: ShapeBucket,
}

/// A plan the tuner did not use because the search space or the profiler
/// rejected it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// The plan's label.
    pub config: String,
    /// Why it was rejected (resources, a compile error, a failed check, …).
    pub reason: String,
}

/// One tuning result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunedEntry {
    /// What the result is for.
    pub key: TuningKey,
    /// The chosen tile configuration; opaque to the cache.
    pub config: serde_json::Value,
    /// Short human label of the configuration, e.g. `"m128 n128 w8 s2 sm90a-ws"`.
    pub config_label: String,
    /// Time of the best plan, microseconds.
    pub best_us: f64,
    /// Time of the default (untuned) configuration, microseconds.
    pub default_us: f64,
    /// Median time over the plans tried, microseconds.
    pub median_us: f64,
    /// How many plans were timed.
    pub plans_tried: u32,
    /// Plans the space or the profiler rejected, with why.
    pub rejected: Vec<Rejection>,
    /// Wall time the tuning took, seconds.
    pub tuning_seconds: f64,
    /// Throughput of the best plan, TFLOP/s.
    pub tflops: f64,
    /// Best achieved throughput over the device's peak, in [0, 1]; the input
    /// of [`performance_portability`].
    pub efficiency: f64,
}

impl TunedEntry {
    /// How much faster the tuned configuration is than the default one
    /// (`default_us / best_us`).
    pub fn speedup(&self) -> f64 {
        self.default_us / self.best_us
    }

    /// The tuning impact: how much faster the best plan is than the median
    /// plan (`median_us / best_us`), i.e. how much choosing well matters here.
    pub fn impact(&self) -> f64 {
        self.median_us / self.best_us
    }

    /// The first non-finite number, by field name. JSON has no NaN or
    /// infinity (serde_json writes `null`, which does not read back as a
    /// number), so one such entry would make the whole file unreadable.
    fn non_finite_field(&self) -> Option<&'static str> {
        [
            ("best_us", self.best_us),
            ("default_us", self.default_us),
            ("median_us", self.median_us),
            ("tuning_seconds", self.tuning_seconds),
            ("tflops", self.tflops),
            ("efficiency", self.efficiency),
        ]
        .into_iter()
        .find(|(_, v)| !v.is_finite())
        .map(|(name, _)| name)
    }
}

/// What reading or writing a tuning cache file can fail with; every message
/// names the file.
#[derive(Debug, thiserror::Error)]
pub enum TuningCacheError {
    /// A file could not be read, written, locked or renamed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. "read", "write", "lock".
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid JSON, not a tuning cache, or has malformed entries.
    #[error("{} is not a valid aec tuning cache: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },
    /// The file is a tuning cache of another format version.
    #[error(
        "{} is a tuning cache of format version {found}; this aec reads version {expected} \
         (its results must be re-tuned, or exported with the aec that wrote it)",
        path.display()
    )]
    Version {
        path: PathBuf,
        found: u64,
        expected: u32,
    },
    /// An entry to record holds a number JSON cannot store.
    #[error(
        "tuning result for `{variant}` ({kernel}) has a non-finite {field}; not recorded \
         (the cache file stores finite numbers only)"
    )]
    NonFinite {
        variant: String,
        kernel: String,
        field: &'static str,
    },
}

/// The tuning cache: a map from [`TuningKey`] to [`TunedEntry`] in memory,
/// backed by a file unless made by [`TuningCache::in_memory`].
#[derive(Debug)]
pub struct TuningCache {
    path: Option<PathBuf>,
    entries: HashMap<TuningKey, TunedEntry>,
}

/// Paths whose problem was already reported in this process, so a tuner
/// opening the cache once per kernel warns once, not once per kernel.
static WARNED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

impl TuningCache {
    /// `$AEC_TUNING_CACHE` (a file path) if set and non-empty, else
    /// `$XDG_CACHE_HOME/aec/tuning-v{VERSION}.json`, else
    /// `$HOME/.cache/aec/tuning-v{VERSION}.json`; `None` when none is set.
    pub fn default_path() -> Option<PathBuf> {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let file = format!("tuning-v{TUNING_CACHE_VERSION}.json");
        var("AEC_TUNING_CACHE")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("aec").join(&file)))
            .or_else(|| var("HOME").map(|d| d.join(".cache").join("aec").join(&file)))
    }

    /// Opens the cache stored at `path`; a missing file is an empty cache.
    /// A file that cannot be read, is corrupt, or is of another format or
    /// version also gives an empty cache (the next [`record`] replaces it),
    /// with a warning naming the file. The warning is returned only the first
    /// time `path` is opened in this process; callers print it (e.g. after
    /// `aec: warning: `). This never fails: the cache is an optimisation.
    ///
    /// [`record`]: TuningCache::record
    pub fn open(path: impl Into<PathBuf>) -> (TuningCache, Option<String>) {
        let path = path.into();
        let (entries, warning) = match read_file(&path) {
            Ok(entries) => (entries, None),
            Err(TuningCacheError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                (HashMap::new(), None)
            }
            Err(e) => {
                let message = format!(
                    "{e}; ignoring it and starting from an empty tuning cache \
                     (the next tuning result replaces the file)"
                );
                (HashMap::new(), first_warning(&path).then_some(message))
            }
        };
        (
            TuningCache {
                path: Some(path),
                entries,
            },
            warning,
        )
    }

    /// A cache without a file: [`record`](TuningCache::record) keeps entries
    /// in memory only.
    pub fn in_memory() -> TuningCache {
        TuningCache {
            path: None,
            entries: HashMap::new(),
        }
    }

    /// The backing file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The entry for `key`, from memory (no I/O).
    pub fn lookup(&self, key: &TuningKey) -> Option<&TunedEntry> {
        self.entries.get(key)
    }

    /// Every entry, sorted by key, so listings and files are deterministic.
    pub fn entries(&self) -> impl Iterator<Item = &TunedEntry> {
        sorted(&self.entries).into_iter()
    }

    /// How many entries the cache holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds `entries`, replacing those with equal keys, and persists them.
    ///
    /// Under an exclusive lock on `<file>.lock`, the file is read again so
    /// entries other processes wrote since this cache was opened are kept
    /// (and entries they removed stay removed; a corrupt or other-version
    /// file is replaced), the new entries are merged in, and the result is
    /// written to a temporary file in the same directory, fsynced and renamed
    /// over the file. Memory is updated to the written contents only once the
    /// write succeeded. Entries with a non-finite number are refused before
    /// anything is written.
    pub fn record(&mut self, entries: Vec<TunedEntry>) -> Result<(), TuningCacheError> {
        for e in &entries {
            if let Some(field) = e.non_finite_field() {
                return Err(TuningCacheError::NonFinite {
                    variant: e.key.variant.clone(),
                    kernel: e.key.kernel.clone(),
                    field,
                });
            }
        }
        self.update(|map| {
            for e in entries {
                map.insert(e.key.clone(), e);
            }
            true
        })
    }

    /// Removes the entries for which `pred` is true and persists the result
    /// (same locking and atomic replacement as [`record`]); returns how many
    /// were removed from the file (from memory for an in-memory cache).
    ///
    /// [`record`]: TuningCache::record
    pub fn remove_where(
        &mut self,
        pred: impl Fn(&TunedEntry) -> bool,
    ) -> Result<usize, TuningCacheError> {
        // Nothing to remove from a missing file: return without creating
        // its directory and lock file (e.g. `aec cache clear` on a fresh
        // machine). Memory follows the file, as after any update.
        if let Some(path) = &self.path
            && !path.exists()
        {
            self.entries.clear();
            return Ok(0);
        }
        let mut removed = 0;
        self.update(|map| {
            let before = map.len();
            map.retain(|_, e| !pred(e));
            removed = before - map.len();
            removed > 0
        })?;
        Ok(removed)
    }

    /// Writes this cache's entries to `to` in the cache file format (a file
    /// another machine can [`import`](TuningCache::import)); returns how many.
    pub fn export(&self, to: &Path) -> Result<usize, TuningCacheError> {
        write_atomic(to, &self.entries)?;
        Ok(self.entries.len())
    }

    /// Reads the cache file `from` and merges its entries into this cache
    /// through [`record`](TuningCache::record); returns how many it held.
    /// Unlike [`open`](TuningCache::open), a missing, corrupt or
    /// other-version file is an error naming it: the user asked for it.
    pub fn import(&mut self, from: &Path) -> Result<usize, TuningCacheError> {
        let entries = read_file(from)?;
        let n = entries.len();
        self.record(entries.into_values().collect())?;
        Ok(n)
    }

    /// Applies `change` to the entries on disk under the lock and writes
    /// them back when `change` says it changed something (or the file was
    /// unreadable and must be replaced); for an in-memory cache, to memory.
    fn update(
        &mut self,
        change: impl FnOnce(&mut HashMap<TuningKey, TunedEntry>) -> bool,
    ) -> Result<(), TuningCacheError> {
        let Some(path) = self.path.clone() else {
            change(&mut self.entries);
            return Ok(());
        };
        let _lock = lock(&path)?;
        let (mut map, replace) = match read_file(&path) {
            Ok(map) => (map, false),
            // Missing: nothing to replace; write only if `change` adds.
            Err(TuningCacheError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                (HashMap::new(), false)
            }
            // Unreadable, corrupt or another version: `open` already warned
            // (or will, for a cache opened before the file went bad); its
            // contents are lost either way, so replace it.
            Err(_) => (HashMap::new(), true),
        };
        if change(&mut map) || replace {
            write_atomic(&path, &map)?;
        }
        self.entries = map;
        Ok(())
    }
}

/// Whether `path`'s problem has not been reported yet in this process
/// (and marks it reported).
fn first_warning(path: &Path) -> bool {
    // The same file opened through another spelling is the same file.
    let id = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    WARNED
        .lock()
        // A panic while holding the lock cannot leave the set inconsistent.
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id)
}

/// The entries sorted by key.
fn sorted(map: &HashMap<TuningKey, TunedEntry>) -> Vec<&TunedEntry> {
    let mut v: Vec<&TunedEntry> = map.values().collect();
    v.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    v
}

/// Reads and checks a cache file.
fn read_file(path: &Path) -> Result<HashMap<TuningKey, TunedEntry>, TuningCacheError> {
    let bytes = std::fs::read(path).map_err(|source| TuningCacheError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    parse(&bytes).map_err(|p| match p {
        ParseError::Corrupt(detail) => TuningCacheError::Corrupt {
            path: path.to_path_buf(),
            detail,
        },
        ParseError::Version(found) => TuningCacheError::Version {
            path: path.to_path_buf(),
            found,
            expected: TUNING_CACHE_VERSION,
        },
    })
}

enum ParseError {
    Corrupt(String),
    Version(u64),
}

/// Parses a cache file's bytes. The header is checked on an untyped value
/// first, so a file of another version is reported as such even when its
/// entries have another shape.
fn parse(bytes: &[u8]) -> Result<HashMap<TuningKey, TunedEntry>, ParseError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ParseError::Corrupt(format!("{e}")))?;
    let serde_json::Value::Object(mut top) = value else {
        return Err(ParseError::Corrupt("not a JSON object".into()));
    };
    match top.get("format").and_then(|f| f.as_str()) {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(ParseError::Corrupt(format!(
                "format is \"{other}\", expected \"{FORMAT}\""
            )));
        }
        None => {
            return Err(ParseError::Corrupt(format!(
                "no \"format\": \"{FORMAT}\" field"
            )));
        }
    }
    match top.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(TUNING_CACHE_VERSION) => {}
        Some(v) => return Err(ParseError::Version(v)),
        None => return Err(ParseError::Corrupt("no numeric \"version\" field".into())),
    }
    let entries = top
        .remove("entries")
        .ok_or_else(|| ParseError::Corrupt("no \"entries\" field".into()))?;
    let entries: Vec<TunedEntry> = serde_json::from_value(entries)
        .map_err(|e| ParseError::Corrupt(format!("entries: {e}")))?;
    // Later duplicates win, as if recorded in file order.
    Ok(entries.into_iter().map(|e| (e.key.clone(), e)).collect())
}

/// The file's contents: pretty JSON, entries sorted by key, a final newline.
fn render(map: &HashMap<TuningKey, TunedEntry>) -> Vec<u8> {
    #[derive(Serialize)]
    struct File<'a> {
        format: &'static str,
        version: u32,
        entries: Vec<&'a TunedEntry>,
    }
    let file = File {
        format: FORMAT,
        version: TUNING_CACHE_VERSION,
        entries: sorted(map),
    };
    // Serialising plain data with string keys and finite numbers cannot fail.
    let mut out = serde_json::to_vec_pretty(&file).expect("tuning cache serialises");
    out.push(b'\n');
    out
}

/// The sidecar lock file's path: `<file>.lock`.
fn lock_path(path: &Path) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// Takes the exclusive lock for `path`, creating its directory; released
/// when the returned file is dropped. A sidecar is locked rather than the
/// cache file itself because the cache file is replaced by rename, and a
/// lock on a replaced inode would not exclude the next writer.
fn lock(path: &Path) -> Result<std::fs::File, TuningCacheError> {
    let lock_path = lock_path(path);
    let io = |action, source| TuningCacheError::Io {
        action,
        path: lock_path.clone(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| TuningCacheError::Io {
            action: "create the directory of",
            path: path.to_path_buf(),
            source: e,
        })?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io("open", e))?;
    file.lock().map_err(|e| io("lock", e))?;
    Ok(file)
}

/// Writes `map` to a unique temporary file next to `path`, fsyncs it and
/// renames it over `path`, so readers see the old file or the whole new one.
fn write_atomic(path: &Path, map: &HashMap<TuningKey, TunedEntry>) -> Result<(), TuningCacheError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let io = |action, p: &Path, source| TuningCacheError::Io {
        action,
        path: p.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", path, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tuning".into());
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
        f.write_all(&render(map))
            .and_then(|()| f.sync_all())
            .map_err(|e| io("write", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("replace", path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // Make the rename itself durable; best effort, since not every
    // filesystem lets a directory be opened and synced, and the data is
    // already safe in the file.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Performance portability Φ of a kernel over a set of devices (paper 001):
/// the harmonic mean of its efficiencies (achieved over peak) on them.
/// 0 when the set is empty or the kernel does not run on one of them
/// (an efficiency that is 0, negative or not a number): the harmonic mean
/// punishes the worst device, which is the point of the metric.
pub fn performance_portability(efficiencies: &[f64]) -> f64 {
    if efficiencies.is_empty() || efficiencies.iter().any(|&e| e.is_nan() || e <= 0.0) {
        return 0.0;
    }
    efficiencies.len() as f64 / efficiencies.iter().map(|e| 1.0 / e).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(variant: &str, sq: usize) -> TunedEntry {
        TunedEntry {
            key: TuningKey {
                variant: variant.into(),
                variant_hash: "abc".into(),
                kernel: "parallel_forward".into(),
                template_version: "0.1.0+t".into(),
                target: "sm_90a".into(),
                gpu: "GPU".into(),
                driver: "1".into(),
                toolkit: "13.0".into(),
                dtype: "bf16".into(),
                dqk: 128,
                dv: 128,
                shape: ShapeBucket::of(1, 8, 8, sq, sq),
            },
            config: serde_json::json!({"m": 128}),
            config_label: "m128".into(),
            best_us: 10.0,
            default_us: 12.0,
            median_us: 15.0,
            plans_tried: 3,
            rejected: vec![],
            tuning_seconds: 1.0,
            tflops: 100.0,
            efficiency: 0.1 + 0.2,
        }
    }

    #[test]
    fn render_parse_round_trip_is_exact_and_deterministic() {
        let map: HashMap<_, _> = [entry("b", 100), entry("a", 3000), entry("a", 10)]
            .into_iter()
            .map(|e| (e.key.clone(), e))
            .collect();
        let bytes = render(&map);
        let back = parse(&bytes).ok().expect("parses");
        assert_eq!(back, map);
        assert_eq!(render(&back), bytes);
        let text = String::from_utf8(bytes).unwrap();
        let (a10, a3000, b) = (
            text.find("\"sq\": 16").unwrap(),
            text.find("\"sq\": 4096").unwrap(),
            text.find("\"variant\": \"b\"").unwrap(),
        );
        assert!(a10 < a3000 && a3000 < b, "entries sorted by key");
    }

    #[test]
    fn non_finite_entries_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let (mut cache, _) = TuningCache::open(&path);
        let mut bad = entry("a", 1);
        bad.efficiency = f64::NAN;
        let err = cache.record(vec![entry("b", 1), bad]).unwrap_err();
        assert!(err.to_string().contains("efficiency"), "{err}");
        assert!(!path.exists());
        assert!(cache.is_empty());
    }

    #[test]
    fn lock_path_is_a_sidecar() {
        assert_eq!(
            lock_path(Path::new("/x/tuning-v1.json")),
            Path::new("/x/tuning-v1.json.lock")
        );
    }
}
