//! Dispatch: the configuration a call runs with. The tuned configuration of
//! the call's shape bucket when the tuning cache has one for this variant,
//! kernel (forward or backward), toolchain and GPU; otherwise the default.
//! Nothing here tunes.

use super::{
    KeyParts, backward_key, entry_config, forward_key, recurrent_backward_key, recurrent_key,
    variant_hash,
};
use crate::run::{HeadDims, RecurrentDims, RecurrentShape, Shape};
use aec_compiler::Elem;
use aec_frontend::Variant;
use aec_runtime::{Device, ShapeBucket, TunedEntry, TuningCache, TuningKey};
use std::sync::{Mutex, OnceLock};

/// The tuning key of one kernel (the forward or the backward) with
/// everything but the shape filled in: built once per compiled kernel
/// (hashing the variant costs far more than a lookup), then
/// [`KernelDispatch::lookup`] per call.
#[derive(Clone, Debug)]
pub struct KernelDispatch {
    base: TuningKey,
}

impl KernelDispatch {
    /// The dispatch of the forward of `variant` for `dims` and `elem` on a
    /// GPU described by `parts`.
    pub fn forward(variant: &Variant, dims: HeadDims, elem: Elem, parts: &KeyParts<'_>) -> Self {
        let shape = Shape::mha(1, 1, 1, 1);
        KernelDispatch {
            base: forward_key(variant, &variant_hash(variant), dims, shape, elem, parts),
        }
    }

    /// The dispatch of the backward of `variant`, as [`Self::forward`].
    pub fn backward(variant: &Variant, dims: HeadDims, elem: Elem, parts: &KeyParts<'_>) -> Self {
        let shape = Shape::mha(1, 1, 1, 1);
        KernelDispatch {
            base: backward_key(variant, &variant_hash(variant), dims, shape, elem, parts),
        }
    }

    /// The dispatch of the recurrent forward of `variant` (its calls'
    /// shapes bucketed as `B, H, H, S, S`), as [`Self::forward`].
    pub fn recurrent(
        variant: &Variant,
        dims: RecurrentDims,
        elem: Elem,
        parts: &KeyParts<'_>,
    ) -> Self {
        Self::recurrent_with(recurrent_key, variant, dims, elem, parts)
    }

    /// The dispatch of the recurrent backward of `variant`, as
    /// [`Self::recurrent`].
    pub fn recurrent_backward(
        variant: &Variant,
        dims: RecurrentDims,
        elem: Elem,
        parts: &KeyParts<'_>,
    ) -> Self {
        Self::recurrent_with(recurrent_backward_key, variant, dims, elem, parts)
    }

    /// A recurrent kernel's dispatch with its key function (`key`).
    fn recurrent_with(
        key: fn(&Variant, &str, RecurrentDims, RecurrentShape, Elem, &KeyParts<'_>) -> TuningKey,
        variant: &Variant,
        dims: RecurrentDims,
        elem: Elem,
        parts: &KeyParts<'_>,
    ) -> Self {
        let shape = RecurrentShape::new(1, 1, 1);
        KernelDispatch {
            base: key(variant, &variant_hash(variant), dims, shape, elem, parts),
        }
    }

    /// The key for a call of `shape`.
    pub fn key(&self, shape: Shape) -> TuningKey {
        TuningKey {
            shape: ShapeBucket::of(shape.b, shape.h, shape.hkv, shape.sq, shape.skv),
            ..self.base.clone()
        }
    }

    /// The tuned entry and configuration of the recurrent forward (or
    /// backward) for a call of `shape` (as [`Self::lookup`]).
    pub fn lookup_recurrent<'c, C: serde::de::DeserializeOwned>(
        &self,
        cache: &'c TuningCache,
        shape: RecurrentShape,
    ) -> Option<(&'c TunedEntry, C)> {
        self.lookup(cache, Shape::mha(shape.b, shape.h, shape.s, shape.s))
    }

    /// The tuned entry and its configuration (`ForwardConfig` for the
    /// forward's dispatch, `BackwardConfig` for the backward's) for
    /// `shape`, if the cache has one this aec can read. One hash lookup, no
    /// I/O.
    pub fn lookup<'c, C: serde::de::DeserializeOwned>(
        &self,
        cache: &'c TuningCache,
        shape: Shape,
    ) -> Option<(&'c TunedEntry, C)> {
        let entry = cache.lookup(&self.key(shape))?;
        entry_config(entry).map(|c| (entry, c))
    }
}

/// What identifies a CUDA device and its toolchain in tuning keys, owned
/// (see [`KeyParts`] for the borrowed form keys are built from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceKeyParts {
    pub gpu: String,
    pub target: String,
    pub driver: String,
    pub toolkit: String,
}

impl DeviceKeyParts {
    /// The parts of `device`: its name, instruction set, driver and NVRTC
    /// versions (`unknown` where the library cannot say).
    pub fn of(device: &Device) -> DeviceKeyParts {
        DeviceKeyParts {
            gpu: device.name().to_string(),
            target: device.arch().to_string(),
            driver: aec_runtime::driver_version()
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_else(|_| "unknown".into()),
            toolkit: aec_runtime::nvrtc_version()
                .map(|(a, b)| format!("nvrtc {a}.{b}"))
                .unwrap_or_else(|_| "unknown".into()),
        }
    }

    pub fn parts(&self) -> KeyParts<'_> {
        KeyParts {
            gpu: &self.gpu,
            target: &self.target,
            driver: &self.driver,
            toolkit: &self.toolkit,
        }
    }
}

/// The process's tuning cache (read once, from
/// [`TuningCache::default_path`]; a warning about an unreadable file is
/// printed once and the cache is then empty).
pub fn process_cache() -> &'static Mutex<TuningCache> {
    static CACHE: OnceLock<Mutex<TuningCache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let cache = match TuningCache::default_path() {
            Some(path) => {
                let (cache, warning) = TuningCache::open(path);
                if let Some(w) = warning {
                    eprintln!("aec: warning: {w}");
                }
                cache
            }
            None => TuningCache::in_memory(),
        };
        Mutex::new(cache)
    })
}
