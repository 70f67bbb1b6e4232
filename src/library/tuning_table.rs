//! A library's tuning table: the forward and backward configurations the
//! tuning cache holds for a variant, grouped by configuration, each with the
//! GPUs and shape buckets where `aec tune` measured it fastest. `aec compile`
//! builds one extra kernel (a forward, or the backward's three) per
//! configuration; the loaders launch it for calls of that pass on a GPU of
//! that name whose sizes fall in one of its buckets, and the default kernel
//! otherwise.

use crate::runtime::{TunedEntry, TuningKey, bucket_len};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The sizes a bucket is matched on: B, H and Hkv exactly, the sequence
/// lengths after rounding up to a power of two (`bucket_len`).
pub const BUCKET_SIZES: [&str; 5] = ["B", "H", "Hkv", "Sq", "Skv"];
/// The sizes of [`BUCKET_SIZES`] that are rounded up to powers of two.
pub const BUCKETED: [&str; 2] = ["Sq", "Skv"];

/// Where one tuned configuration applies: a GPU (by its driver name) and a
/// shape bucket, with the times `aec tune` measured there.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedFor {
    pub gpu: String,
    /// `BUCKET_SIZES` in order; `Sq` and `Skv` are powers of two.
    pub sizes: [u64; 5],
    pub config_label: String,
    pub best_us: f64,
    pub default_us: f64,
    /// The driver and toolkit the measurement was made with.
    pub driver: String,
    pub toolkit: String,
}

impl TunedFor {
    /// The manifest form (a `tuned_for` item of a kernel record).
    pub fn to_json(&self) -> Value {
        let sizes: serde_json::Map<String, Value> = BUCKET_SIZES
            .iter()
            .zip(self.sizes)
            .map(|(n, v)| (n.to_string(), json!(v)))
            .collect();
        json!({
            "gpu": self.gpu,
            "sizes": sizes,
            "bucketed": BUCKETED,
            "config_label": self.config_label,
            "best_us": round3(self.best_us),
            "default_us": round3(self.default_us),
            "measured_with": { "driver": self.driver, "toolkit": self.toolkit },
        })
    }
}

/// Times to the nanosecond: enough for a reader, and stable text.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The tuned configurations among `entries` for the kernel of `key` (a key
/// as the tuner builds it — the forward's or the backward's; its GPU,
/// driver, toolkit and shape are ignored) that differ from `default`, each
/// with where it applies, in a deterministic order (by first GPU and
/// bucket). Where the cache has several results for one GPU and bucket
/// (other drivers or toolkits), the one measured with `toolkit` wins, else
/// the last in the cache's key order. Entries whose configuration this aec
/// cannot read as a `C` are left out.
pub fn tuned_configs<'e, C: DeserializeOwned + PartialEq>(
    entries: impl IntoIterator<Item = &'e TunedEntry>,
    key: &TuningKey,
    default: &C,
    toolkit: Option<&str>,
) -> Vec<(C, Vec<TunedFor>)> {
    // (gpu, sizes) -> the chosen entry and its config.
    let mut chosen: std::collections::BTreeMap<(String, [u64; 5]), (C, TunedFor)> =
        Default::default();
    for e in entries {
        let k = &e.key;
        if k.variant_hash != key.variant_hash
            || k.kernel != key.kernel
            || k.template_version != key.template_version
            || k.target != key.target
            || k.dtype != key.dtype
            || k.dqk != key.dqk
            || k.dv != key.dv
        {
            continue;
        }
        let Ok(config) = serde_json::from_value::<C>(e.config.clone()) else {
            continue;
        };
        let s = &k.shape;
        let sizes = [s.b, s.h, s.hkv, s.sq, s.skv].map(u64::from);
        let item = TunedFor {
            gpu: k.gpu.clone(),
            sizes,
            config_label: e.config_label.clone(),
            best_us: e.best_us,
            default_us: e.default_us,
            driver: k.driver.clone(),
            toolkit: k.toolkit.clone(),
        };
        let slot = (k.gpu.clone(), sizes);
        let keep_old = chosen
            .get(&slot)
            .is_some_and(|(_, old)| toolkit.is_some_and(|t| old.toolkit == t && k.toolkit != t));
        if !keep_old {
            chosen.insert(slot, (config, item));
        }
    }
    let mut out: Vec<(C, Vec<TunedFor>)> = Vec::new();
    for (config, item) in chosen.into_values() {
        if config == *default {
            continue;
        }
        match out.iter_mut().find(|(c, _)| *c == config) {
            Some((_, items)) => items.push(item),
            None => out.push((config, vec![item])),
        }
    }
    out
}

/// Whether a call of `sizes` (by name) falls in the bucket `bucket` (by
/// name; the sizes in `bucketed` as powers of two). A size the call lacks
/// never matches.
pub fn in_bucket(
    bucket: &[(String, u64)],
    bucketed: &[&str],
    sizes: &dyn Fn(&str) -> Option<u64>,
) -> bool {
    bucket.iter().all(|(name, want)| {
        sizes(name).is_some_and(|n| {
            let n = if bucketed.contains(&name.as_str()) {
                u64::from(bucket_len(usize::try_from(n).unwrap_or(usize::MAX)))
            } else {
                n
            };
            n == *want
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::{Elem, ForwardConfig};
    use crate::runtime::ShapeBucket;

    fn config(block_n: u32, persistent: bool) -> ForwardConfig {
        ForwardConfig {
            block_m: 128,
            block_n,
            warps: 8,
            elem: Elem::Bf16,
            pack_gqa: false,
            wgmma: true,
            warp_specialized: true,
            stages: 2,
            q_in_registers: false,
            dv_split: 1,
            split_kv: false,
            fused_combine: false,
            persistent,
            v_in_k: false,
            key_warps: 1,
            dv_warps: 1,
            tma_loads: false,
            late_epilogue: false,
            kv_multicast: false,
        }
    }

    fn entry(gpu: &str, sq: usize, toolkit: &str, cfg: ForwardConfig) -> TunedEntry {
        TunedEntry {
            key: TuningKey {
                variant: "Softmax".into(),
                variant_hash: "abc".into(),
                kernel: "parallel_forward".into(),
                template_version: "0.1.0+t".into(),
                target: "sm_90a".into(),
                gpu: gpu.into(),
                driver: "580".into(),
                toolkit: toolkit.into(),
                dtype: "bf16".into(),
                dqk: 128,
                dv: 128,
                shape: ShapeBucket::of(2, 3, 3, sq, sq),
            },
            config: serde_json::to_value(cfg).unwrap(),
            config_label: format!("n{}", cfg.block_n),
            best_us: 1.0,
            default_us: 1.5,
            median_us: 2.0,
            plans_tried: 3,
            rejected: vec![],
            tuning_seconds: 1.0,
            tflops: 1.0,
            efficiency: 0.5,
        }
    }

    /// The key the entries are matched against (its GPU and shape do not
    /// matter).
    fn key() -> TuningKey {
        entry("any", 1, "any", config(128, true)).key
    }

    #[test]
    fn configurations_are_grouped_and_the_default_left_out() {
        let default = config(128, true);
        let (x, y) = (config(64, true), config(128, false));
        let mut other_variant = entry("H100", 300, "nvrtc 13.0", y);
        other_variant.key.variant_hash = "def".into();
        let mut other_dims = entry("H100", 300, "nvrtc 13.0", y);
        other_dims.key.dv = 64;
        let mut unreadable = entry("H100", 100, "nvrtc 13.0", y);
        unreadable.config = serde_json::json!({"block_m": "wide"});
        let entries = [
            entry("H100", 1000, "nvrtc 13.0", x),
            entry("H200", 1000, "nvrtc 13.0", x),
            entry("H100", 4000, "nvrtc 13.0", y),
            entry("H100", 8000, "nvrtc 13.0", default),
            other_variant,
            other_dims,
            unreadable,
        ];
        let table = tuned_configs(&entries, &key(), &default, Some("nvrtc 13.0"));
        assert_eq!(table.len(), 2, "{table:?}");
        let (cfg, items) = &table[0];
        assert_eq!(*cfg, x);
        let at: Vec<(&str, u64)> = items.iter().map(|t| (t.gpu.as_str(), t.sizes[3])).collect();
        assert_eq!(at, [("H100", 1024), ("H200", 1024)]);
        assert_eq!(items[0].sizes, [2, 3, 3, 1024, 1024]);
        assert_eq!(table[1].0, y);
        assert_eq!(table[1].1.len(), 1);
        assert_eq!(table[1].1[0].sizes[3], 4096);
        let json = items[0].to_json();
        assert_eq!(json["sizes"]["Skv"], 1024);
        assert_eq!(json["bucketed"], serde_json::json!(["Sq", "Skv"]));
    }

    #[test]
    fn the_result_of_the_matching_toolkit_wins_a_bucket() {
        let default = config(128, true);
        let (x, y) = (config(64, true), config(128, false));
        // Cache order is key order: "nvrtc 12.8" < "nvrtc 13.0".
        let entries = [
            entry("H100", 1000, "nvrtc 12.8", x),
            entry("H100", 1000, "nvrtc 13.0", y),
        ];
        let pick = |toolkit| tuned_configs(&entries, &key(), &default, toolkit)[0].0;
        assert_eq!(pick(Some("nvrtc 12.8")), x);
        assert_eq!(pick(Some("nvrtc 13.0")), y);
        assert_eq!(pick(None), y, "without NVRTC the last in key order");
        let reversed = [entries[1].clone(), entries[0].clone()];
        assert_eq!(
            tuned_configs(&reversed, &key(), &default, Some("nvrtc 12.8"))[0].0,
            x,
            "the matching toolkit wins whatever the order"
        );
    }

    #[test]
    fn buckets_match_counts_exactly_and_lengths_by_power_of_two() {
        let bucket: Vec<(String, u64)> = [("B", 2), ("H", 3), ("Sq", 512), ("Skv", 1024)]
            .iter()
            .map(|(n, v)| (n.to_string(), *v))
            .collect();
        let call = |b, h, sq, skv| {
            move |n: &str| match n {
                "B" => Some(b),
                "H" => Some(h),
                "Sq" => Some(sq),
                "Skv" => Some(skv),
                _ => None,
            }
        };
        assert!(in_bucket(&bucket, &BUCKETED, &call(2, 3, 450, 1000)));
        assert!(in_bucket(&bucket, &BUCKETED, &call(2, 3, 512, 513 + 511)));
        assert!(
            !in_bucket(&bucket, &BUCKETED, &call(2, 3, 256, 1000)),
            "Sq 256 is bucket 256"
        );
        assert!(
            !in_bucket(&bucket, &BUCKETED, &call(2, 3, 450, 1025)),
            "Skv 1025 is bucket 2048"
        );
        assert!(
            !in_bucket(&bucket, &BUCKETED, &call(3, 3, 450, 1000)),
            "B is exact"
        );
        let no_skv = |n: &str| {
            if n == "Skv" {
                None
            } else {
                call(2, 3, 450, 1000)(n)
            }
        };
        assert!(
            !in_bucket(&bucket, &BUCKETED, &no_skv),
            "a missing size never matches"
        );
    }
}
