//! Compiled kernels cached in memory and on disk, so a process (and the next
//! one) compiles each (source, options, NVRTC version) once. The disk cache
//! is an optimisation only: an unreadable or corrupt entry is recompiled with
//! a one-line warning, and a failed write is a warning too.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Result;
use crate::hash::{Fnv128, fnv128};
use crate::nvrtc::{self, CompileOptions, Compiled};

/// Identifies one compilation: a hash of the source, every option and the
/// NVRTC version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(u128);

impl CacheKey {
    pub fn new(source: &str, opts: &CompileOptions, nvrtc_version: (u32, u32)) -> CacheKey {
        let mut h = Fnv128::new();
        h.field(FORMAT_TAG)
            .field(source.as_bytes())
            .field(opts.arch.as_bytes());
        h.bytes(&(opts.include_dirs.len() as u64).to_le_bytes());
        for dir in &opts.include_dirs {
            h.field(dir.as_os_str().as_encoded_bytes());
        }
        h.bytes(&(opts.flags.len() as u64).to_le_bytes());
        for flag in &opts.flags {
            h.field(flag.as_bytes());
        }
        h.bytes(&nvrtc_version.0.to_le_bytes())
            .bytes(&nvrtc_version.1.to_le_bytes());
        CacheKey(h.finish())
    }

    /// 32 hex digits; the entry's file name stem.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// Bump when the key's inputs or the entry format change.
const FORMAT_TAG: &[u8] = b"aec-kernel-cache-v1";
const MAGIC: &[u8; 8] = b"AECKC001";
const EXT: &str = "aeck";

/// The cache: always in memory, on disk when it has a directory.
#[derive(Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<CacheKey, Arc<Compiled>>>,
}

impl KernelCache {
    /// A cache storing its entries in `dir` (created when first written), or
    /// in memory only when `dir` is `None`.
    pub fn new(dir: Option<PathBuf>) -> KernelCache {
        KernelCache {
            dir,
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// A cache in [`default_dir`].
    pub fn from_env() -> KernelCache {
        KernelCache::new(default_dir())
    }

    /// Where entries are stored, if on disk.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The entry file for `key` (whether or not it exists).
    pub fn entry_path(&self, key: CacheKey) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{}.{EXT}", key.hex())))
    }

    /// Compiles `source` through the cache.
    pub fn compile(&self, source: &str, opts: &CompileOptions) -> Result<Arc<Compiled>> {
        let key = CacheKey::new(source, opts, nvrtc::nvrtc_version()?);
        self.get_or_insert_with(key, || nvrtc::compile(source, opts))
    }

    /// The entry for `key`: from memory, else from disk, else made by
    /// `compile` and stored in both. Errors of `compile` are returned and
    /// nothing is stored.
    pub fn get_or_insert_with(
        &self,
        key: CacheKey,
        compile: impl FnOnce() -> Result<Compiled>,
    ) -> Result<Arc<Compiled>> {
        if let Some(hit) = self.lock().get(&key) {
            return Ok(hit.clone());
        }
        let path = self.entry_path(key);
        let from_disk = path.as_deref().and_then(|p| read_entry(p, key));
        let compiled = match from_disk {
            Some(c) => Arc::new(c),
            None => {
                let c = Arc::new(compile()?);
                if let Some(p) = &path
                    && let Err(e) = write_entry(p, key, &c)
                {
                    eprintln!(
                        "aec: warning: could not write kernel cache entry {}: {e}; continuing without it",
                        p.display()
                    );
                }
                c
            }
        };
        Ok(self.lock().entry(key).or_insert(compiled).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Compiled>>> {
        // A panic while holding the lock cannot leave the map inconsistent.
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `$AEC_CACHE_DIR`, else `$XDG_CACHE_HOME/aec/kernels`, else
/// `$HOME/.cache/aec/kernels`; `None` (memory only) when none is set.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("AEC_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("aec").join("kernels")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("aec").join("kernels")))
}

/// Reads an entry; `None` when absent, or (with a warning) when unreadable or
/// corrupt.
fn read_entry(path: &Path, key: CacheKey) -> Option<Compiled> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            eprintln!(
                "aec: warning: cannot read kernel cache entry {} ({e}); recompiling",
                path.display()
            );
            return None;
        }
    };
    match decode(&bytes, key) {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!(
                "aec: warning: ignoring corrupt kernel cache entry {} ({why}); recompiling",
                path.display()
            );
            None
        }
    }
}

/// Writes to a unique temporary file in the same directory, then renames it
/// over the entry, so readers see the old entry or the whole new one.
fn write_entry(path: &Path, key: CacheKey, c: &Compiled) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        key.hex(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&encode(key, c))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `MAGIC, key, (len, bytes) × {cubin, ptx, log}, checksum`, integers
/// little-endian; the checksum covers everything before it.
fn encode(key: CacheKey, c: &Compiled) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + c.cubin.len() + c.ptx.len() + c.log.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&key.0.to_le_bytes());
    for part in [&c.cubin[..], c.ptx.as_bytes(), c.log.as_bytes()] {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part);
    }
    let sum = fnv128(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn decode(bytes: &[u8], key: CacheKey) -> std::result::Result<Compiled, String> {
    let body_len = bytes
        .len()
        .checked_sub(16)
        .ok_or("truncated: shorter than a checksum")?;
    let (body, sum) = bytes.split_at(body_len);
    let sum = u128::from_le_bytes(sum.try_into().map_err(|_| "bad checksum field")?);
    if fnv128(body) != sum {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader(body);
    if r.take(MAGIC.len())? != MAGIC {
        return Err("not a kernel cache entry (bad magic)".into());
    }
    let stored = u128::from_le_bytes(r.take(16)?.try_into().map_err(|_| "bad key field")?);
    if stored != key.0 {
        return Err("entry is for another key".into());
    }
    let cubin = r.part()?.to_vec();
    let ptx = String::from_utf8(r.part()?.to_vec()).map_err(|_| "PTX is not UTF-8")?;
    let log = String::from_utf8(r.part()?.to_vec()).map_err(|_| "log is not UTF-8")?;
    if !r.0.is_empty() {
        return Err("trailing bytes".into());
    }
    Ok(Compiled { cubin, ptx, log })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("truncated".into());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn part(&mut self) -> std::result::Result<&'a [u8], String> {
        let len = u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| "bad length")?);
        let len = usize::try_from(len).map_err(|_| "length overflows")?;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Compiled {
        Compiled {
            cubin: vec![0x7f, b'E', b'L', b'F', 0, 1, 2],
            ptx: ".version 9.0\n.target sm_80\n".into(),
            log: String::new(),
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let key = CacheKey(42);
        assert_eq!(decode(&encode(key, &sample()), key), Ok(sample()));
    }

    #[test]
    fn decode_rejects_every_truncation_and_bit_flip() {
        let key = CacheKey(7);
        let bytes = encode(key, &sample());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n], key).is_err(), "truncated to {n}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(decode(&b, key).is_err(), "flipped byte {i}");
        }
        assert!(decode(&bytes, CacheKey(8)).is_err());
    }

    #[test]
    fn key_depends_on_every_input() {
        let opts = CompileOptions {
            arch: "sm_80".into(),
            include_dirs: vec!["/inc".into()],
            flags: vec!["-DX=1".into()],
        };
        let base = CacheKey::new("src", &opts, (13, 0));
        assert_eq!(base, CacheKey::new("src", &opts.clone(), (13, 0)));
        assert_ne!(base, CacheKey::new("src2", &opts, (13, 0)));
        assert_ne!(base, CacheKey::new("src", &opts, (13, 1)));
        let mut o = opts.clone();
        o.arch = "sm_90a".into();
        assert_ne!(base, CacheKey::new("src", &o, (13, 0)));
        let mut o = opts.clone();
        o.flags.push("-DY=2".into());
        assert_ne!(base, CacheKey::new("src", &o, (13, 0)));
        let mut o = opts.clone();
        o.include_dirs.clear();
        assert_ne!(base, CacheKey::new("src", &o, (13, 0)));
        assert_eq!(base.hex().len(), 32);
    }
}
