//! The Rust loader of kernel libraries: [`Library::open`] reads a library
//! written by `aec compile` (its `manifest.json` and cubins), picks the
//! kernels built for the device's architecture and runs them from their
//! launch plans — no kernel generation or NVRTC at run time.
//!
//! ```no_run
//! use aec::library::{Library, Tensor};
//! use aec::runtime::{Device, bf16};
//!
//! fn main() -> Result<(), aec::Error> {
//!     let device = Device::open(0)?;
//!     let lib = Library::open("my_kernels", &device)?;
//!     let fwd = lib.entry("Alibi", "forward")?;
//!     let stream = device.stream();
//!     let (b, h, sq, skv) = (2, 8, 100, 100);
//!     let q = stream.upload(&vec![bf16::from_f32(0.1); b * h * sq * 128])?;
//!     let k = stream.upload(&vec![bf16::from_f32(0.2); b * h * skv * 128])?;
//!     let v = stream.upload(&vec![bf16::from_f32(0.3); b * h * skv * 64])?;
//!     let slopes = stream.upload(&vec![0.1f32; h])?;
//!     let out = fwd.run(
//!         &stream,
//!         &[("q", Tensor::from(&q)), ("k", (&k).into()), ("v", (&v).into()), ("slopes", (&slopes).into())],
//!         &[("B", b), ("H", h), ("Hkv", h), ("Sq", sq), ("Skv", skv)],
//!         &[],
//!     )?;
//!     let o: Vec<bf16> = stream.download(out.bf16("o")?)?; // [B, H, Sq, Dv]
//!     let lse_etc: Vec<f32> = stream.download(out.f32("row_outputs")?)?;
//!     println!("{} outputs, {} row values", o.len(), lse_etc.len());
//!
//!     // The backward reads the forward's `o` and `row_outputs`.
//!     let d_o = stream.upload(&vec![bf16::from_f32(1.0); b * h * sq * 64])?;
//!     let grads = lib.entry("Alibi", "backward")?.run(
//!         &stream,
//!         &[
//!             ("q", (&q).into()), ("k", (&k).into()), ("v", (&v).into()),
//!             ("slopes", (&slopes).into()),
//!             ("o", out.tensor("o")?), ("row_outputs", out.tensor("row_outputs")?),
//!             ("dout", (&d_o).into()),
//!         ],
//!         &[("B", b), ("H", h), ("Hkv", h), ("Sq", sq), ("Skv", skv)],
//!         &[],
//!     )?;
//!     let dslopes: Vec<f32> = stream.download(grads.f32("dslopes")?)?;
//!     println!("dslopes[0] = {}", dslopes[0]);
//!     Ok(())
//! }
//! ```
//!
//! Device buffers carry no shape, so a call names its sizes (`B`, `H`,
//! `Hkv`, `Sq`, `Skv` for parallel variants, `B`, `H`, `S` for recurrent
//! ones; a size the variant fixes may be left out). Every check —
//! sizes, constraints between them, each tensor's dtype and element count,
//! unknown and missing names, devices, CUDA's grid limits — happens before
//! anything is allocated or launched; [`check_call`] is the same check
//! without a GPU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use crate::compiler::Residency;
use crate::compiler::launch_plan::{ArgPlan, Condition, Role, SMS, SizeExpr};
pub use crate::compiler::launch_plan::{Dtype, EntryPlan};
use crate::frontend::diag::suggest;
use crate::library::tuning_table::in_bucket;
use crate::run::{Error, residency_of};
use crate::runtime::{
    Arg, DType, Device, DeviceBuffer, Kernel, Module, Param, Stream, TensorMap, bf16, f16,
};

/// The manifest format this loader reads (`"format"` in `manifest.json`).
pub const MANIFEST_FORMAT: u64 = 4;

/// The passes an entry point can be, in the manifest's spelling.
pub const PASSES: [&str; 2] = ["forward", "backward"];

/// The name the loader binds to the number of KV splits it computes.
const KV_SPLITS: &str = "kv_splits";

/// The largest grid x dimension CUDA launches.
const MAX_GRID_X: u64 = i32::MAX as u64;
/// The largest grid y and z dimension CUDA launches.
const MAX_GRID_YZ: u64 = 65_535;

// ------------------------------------------------------------------ manifest

/// One build of a kernel record for a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    /// The `--target` it was built for (`h100`, `a100`, `mi300x`, …).
    pub target: String,
    /// `sm_90a`, `sm_80` (CUDA) or `gfx90a`, `gfx942` (HIP).
    pub arch: String,
    /// CUDA: the cubin, relative to the library directory; `None` when the
    /// library was compiled without NVRTC (sources only).
    pub cubin: Option<PathBuf>,
    /// HIP: the code object, relative to the library directory (run by the
    /// C header and the Python module; this loader runs CUDA only).
    pub code_object: Option<PathBuf>,
    /// CUDA: the other modules of the record by key (the recurrent
    /// backward's `states` pass), each a cubin relative to the library
    /// directory, `None` without NVRTC; launches name them in
    /// [`LaunchPlan::module`](crate::compiler::launch_plan::LaunchPlan::module).
    pub modules: BTreeMap<String, Option<PathBuf>>,
}

/// One kernel record of a variant: an entry point (`forward` or
/// `backward`), its builds and launch plan — or why it was skipped.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRecord {
    /// `forward` or `backward`.
    pub pass: String,
    /// The source, relative to the library directory.
    pub source: Option<PathBuf>,
    pub builds: Vec<Build>,
    /// The head dims the kernels were generated for (`Dqk`, `Dv` or `Dk`,
    /// `Dv`).
    pub head_dims: Vec<(String, u64)>,
    /// A forward's row outputs, in the order of the `row_outputs` buffer's
    /// first axis (`scale.lse`, `state.m`, …); empty for other records.
    pub row_outputs: Vec<String>,
    /// The launch plan; `None` for a skipped record.
    pub plan: Option<EntryPlan>,
    /// Why nothing was generated (a backward the generator refused, an AMD
    /// target of a recurrent variant).
    pub skipped: Option<String>,
    /// The target a skipped record is about, where it names one.
    pub target: Option<String>,
    /// A tuning-table record (empty for the default ones): the GPUs and
    /// shape buckets `aec tune` chose this record's configuration for.
    pub tuned_for: Vec<TunedBucket>,
}

/// Where a tuning-table record runs: on the GPUs `gpu` names, for calls
/// whose sizes equal `sizes` after rounding those in `bucketed` up to powers
/// of two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunedBucket {
    pub gpu: TunedGpu,
    pub sizes: Vec<(String, u64)>,
    pub bucketed: Vec<String>,
}

/// The GPUs a `tuned_for` item is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TunedGpu {
    /// The driver's device name, exactly (`"gpu"`: what `aec tune`
    /// measured on).
    Named(String),
    /// Any GPU whose driver name contains `device` (ignoring case) and that
    /// has `sms` multiprocessors (`"device"` and `"sms"`: the untuned choice
    /// `aec compile` made for a declared workload on that product).
    Product { device: String, sms: u32 },
}

impl TunedGpu {
    /// Whether the GPU of driver name `name` with `sms` multiprocessors is
    /// one of these.
    pub fn matches(&self, name: &str, sms: u32) -> bool {
        match self {
            TunedGpu::Named(n) => n == name,
            TunedGpu::Product { device, sms: want } => {
                *want == sms
                    && name
                        .to_ascii_lowercase()
                        .contains(&device.to_ascii_lowercase())
            }
        }
    }
}

impl TunedBucket {
    /// Whether a call of `sizes` (by name) falls in this bucket (on any GPU).
    pub fn contains(&self, sizes: &[(&str, usize)]) -> bool {
        let bucketed: Vec<&str> = self.bucketed.iter().map(String::as_str).collect();
        in_bucket(&self.sizes, &bucketed, &|name: &str| {
            sizes
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, v)| v as u64)
        })
    }
}

/// One variant of a library.
#[derive(Clone, Debug, PartialEq)]
pub struct VariantRecord {
    pub name: String,
    /// The file it was compiled from.
    pub file: String,
    /// `parallel` or `recurrent`.
    pub pattern: String,
    pub kernels: Vec<KernelRecord>,
    /// Why the variant has no backward (recurrent variants), if it says.
    pub backward_note: Option<String>,
}

/// A library's `manifest.json`, read and checked: every plan deserialised
/// into [`EntryPlan`] and checked for consistency (every size it uses is
/// bound, every buffer it passes declared). Needs no GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    dir: PathBuf,
    /// The aec version that wrote it.
    pub aec_version: String,
    pub variants: Vec<VariantRecord>,
}

impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn read(dir: impl AsRef<Path>) -> Result<Manifest, Error> {
        let dir = dir.as_ref();
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Library {
            path: path.clone(),
            message: format!(
                "cannot read the library's manifest ({e}); a kernel library is a directory \
                 written by `aec compile … -o DIR`"
            ),
        })?;
        Manifest::parse(dir, &text)
    }

    /// Parses the text of a manifest of the library in `dir` (errors name
    /// `dir/manifest.json`).
    pub fn parse(dir: impl AsRef<Path>, text: &str) -> Result<Manifest, Error> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join("manifest.json");
        let fail = |message: String| Error::Library {
            path: path.clone(),
            message,
        };
        let json: Value =
            serde_json::from_str(text).map_err(|e| fail(format!("not valid JSON: {e}")))?;
        parse_manifest(&json)
            .map_err(fail)
            .map(|(aec_version, variants)| Manifest {
                dir,
                aec_version,
                variants,
            })
    }

    /// The library directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `dir/manifest.json`.
    pub fn path(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }

    /// The CUDA architectures the library has cubins for, sorted.
    pub fn cuda_archs(&self) -> Vec<&str> {
        self.archs_where(|b| b.cubin.is_some())
    }

    /// The AMD architectures the library has HIP code objects for, sorted
    /// (the C header and the Python module run them; this loader does not).
    pub fn hip_archs(&self) -> Vec<&str> {
        self.archs_where(|b| b.code_object.is_some())
    }

    /// The architectures of the builds `keep` accepts, sorted, once each.
    fn archs_where(&self, keep: impl Fn(&Build) -> bool) -> Vec<&str> {
        let mut archs: Vec<&str> = self
            .variants
            .iter()
            .flat_map(|v| &v.kernels)
            .flat_map(|k| &k.builds)
            .filter(|b| keep(b))
            .map(|b| b.arch.as_str())
            .collect();
        archs.sort_unstable();
        archs.dedup();
        archs
    }

    /// The variant `name`; the error lists the variants there are and
    /// suggests the closest.
    pub fn variant(&self, name: &str) -> Result<&VariantRecord, Error> {
        if let Some(v) = self.variants.iter().find(|v| v.name == name) {
            return Ok(v);
        }
        let names: Vec<&str> = self.variants.iter().map(|v| v.name.as_str()).collect();
        let hint = suggest(name, names.iter().copied())
            .or_else(|| names.iter().copied().find(|n| n.eq_ignore_ascii_case(name)))
            .map(|s| format!("; did you mean `{s}`?"))
            .unwrap_or_default();
        Err(Error::Library {
            path: self.dir.clone(),
            message: format!(
                "no variant `{name}` in this library: it has {}{hint}",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        })
    }

    /// The kernel record of `variant`'s `pass` with a cubin for the CUDA
    /// architecture `arch` (`sm_90a`, `sm_80`), and that build. The errors
    /// say why there is none: an unknown variant or pass, a recurrent
    /// variant's missing backward ([`Error::NotImplemented`] with the
    /// manifest's note), a pass the generator skipped (its reason), no build
    /// for `arch` (the archs there are) or a library compiled without NVRTC.
    pub fn select(
        &self,
        variant: &str,
        pass: &str,
        arch: &str,
    ) -> Result<(&VariantRecord, &KernelRecord, &Build), Error> {
        let v = self.variant(variant)?;
        let fail = |message: String| Error::Library {
            path: self.dir.clone(),
            message,
        };
        if !PASSES.contains(&pass) {
            let hint = suggest(pass, PASSES)
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_default();
            return Err(fail(format!(
                "no pass `{pass}`: an entry point is `forward` or `backward`{hint}"
            )));
        }
        // The tuning table's records are alternatives to these (see
        // `select_tuned`), never the default.
        let records: Vec<&KernelRecord> = v
            .kernels
            .iter()
            .filter(|k| k.pass == pass && k.tuned_for.is_empty())
            .collect();
        for k in &records {
            if k.plan.is_some()
                && let Some(b) = k
                    .builds
                    .iter()
                    .find(|b| b.arch == arch && b.cubin.is_some())
            {
                return Ok((v, k, b));
            }
        }
        let planned: Vec<&&KernelRecord> = records.iter().filter(|k| k.plan.is_some()).collect();
        if planned
            .iter()
            .any(|k| k.builds.iter().any(|b| b.arch == arch && b.cubin.is_none()))
        {
            return Err(fail(format!(
                "the {pass} of `{}` has no cubin for {arch}: the library was compiled without \
                 NVRTC (only CUDA sources were written); compile it again with NVRTC \
                 (libnvrtc.so.13) on the loader path",
                v.name
            )));
        }
        let skipped: Vec<String> = records
            .iter()
            .filter_map(|k| {
                k.skipped.as_ref().map(|s| match &k.target {
                    Some(t) => format!("{s} (target {t})"),
                    None => s.clone(),
                })
            })
            .collect();
        if planned.is_empty() {
            if pass == "backward"
                && let Some(note) = &v.backward_note
            {
                return Err(Error::NotImplemented(format!(
                    "`{}` has no backward in this library: {note}",
                    v.name
                )));
            }
            if !skipped.is_empty() {
                return Err(fail(format!(
                    "`{}` has no {pass} kernels: {}",
                    v.name,
                    skipped.join("; ")
                )));
            }
            return Err(fail(format!(
                "`{}` has no {pass} kernels in this library",
                v.name
            )));
        }
        let mut archs: Vec<&str> = planned
            .iter()
            .flat_map(|k| &k.builds)
            .map(|b| b.arch.as_str())
            .collect();
        archs.sort_unstable();
        archs.dedup();
        let also = if skipped.is_empty() {
            String::new()
        } else {
            format!(" (skipped: {})", skipped.join("; "))
        };
        Err(fail(format!(
            "the {pass} of `{}` has no build for {arch}: it is built for {}{also}; compile the \
             library for a target of {arch}",
            v.name,
            archs.join(", ")
        )))
    }
}

impl Manifest {
    /// The tuning table's records of `variant`'s `pass` with a cubin for
    /// `arch` and a bucket on the GPU of driver name `gpu` with `sms`
    /// multiprocessors, with those buckets, in manifest order (a call takes
    /// the first whose bucket holds it).
    pub fn select_tuned(
        &self,
        variant: &str,
        pass: &str,
        arch: &str,
        gpu: &str,
        sms: u32,
    ) -> Vec<(&KernelRecord, &Build, Vec<TunedBucket>)> {
        let Some(v) = self.variants.iter().find(|v| v.name == variant) else {
            return Vec::new();
        };
        v.kernels
            .iter()
            .filter(|k| k.pass == pass && k.plan.is_some())
            .filter_map(|k| {
                let buckets: Vec<TunedBucket> = k
                    .tuned_for
                    .iter()
                    .filter(|t| t.gpu.matches(gpu, sms))
                    .cloned()
                    .collect();
                let build = k
                    .builds
                    .iter()
                    .find(|b| b.arch == arch && b.cubin.is_some())?;
                (!buckets.is_empty()).then_some((k, build, buckets))
            })
            .collect()
    }
}

type Fields<'a> = &'a serde_json::Map<String, Value>;

fn object<'a>(v: &'a Value, at: &str) -> Result<Fields<'a>, String> {
    v.as_object()
        .ok_or_else(|| format!("{at}: expected an object, found {}", kind(v)))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string(o: Fields<'_>, key: &str, at: &str) -> Result<String, String> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!(
            "{at}.{key}: expected a string, found {}",
            kind(other)
        )),
        None => Err(format!("{at}: missing field `{key}`")),
    }
}

fn opt_string(o: Fields<'_>, key: &str, at: &str) -> Result<Option<String>, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "{at}.{key}: expected a string or null, found {}",
            kind(other)
        )),
    }
}

fn array<'a>(o: Fields<'a>, key: &str, at: &str) -> Result<&'a Vec<Value>, String> {
    match o.get(key) {
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(format!(
            "{at}.{key}: expected an array, found {}",
            kind(other)
        )),
        None => Err(format!("{at}: missing field `{key}`")),
    }
}

fn parse_manifest(json: &Value) -> Result<(String, Vec<VariantRecord>), String> {
    let top = object(json, "the manifest")?;
    let format = top
        .get("format")
        .ok_or("missing field `format`: not a manifest written by `aec compile`")?;
    if format.as_u64() != Some(MANIFEST_FORMAT) {
        return Err(format!(
            "manifest format {format}, but this aec ({}) reads format {MANIFEST_FORMAT}: compile \
             the library again with this version's `aec compile`",
            env!("CARGO_PKG_VERSION")
        ));
    }
    let version = string(top, "aec_version", "the manifest")?;
    let mut variants = Vec::new();
    for (i, v) in array(top, "variants", "the manifest")?.iter().enumerate() {
        let at = format!("variants[{i}]");
        let o = object(v, &at)?;
        let name = string(o, "name", &at)?;
        let at = format!("variants[{i}] (`{name}`)");
        let mut kernels = Vec::new();
        for (j, k) in array(o, "kernels", &at)?.iter().enumerate() {
            kernels.push(parse_kernel(k, &format!("{at}.kernels[{j}]"))?);
        }
        variants.push(VariantRecord {
            file: string(o, "file", &at)?,
            pattern: string(o, "pattern", &at)?,
            backward_note: opt_string(o, "backward_note", &at)?,
            name,
            kernels,
        });
    }
    for (i, v) in variants.iter().enumerate() {
        if variants[..i].iter().any(|w| w.name == v.name) {
            return Err(format!("variant `{}` appears twice", v.name));
        }
    }
    Ok((version, variants))
}

fn parse_kernel(k: &Value, at: &str) -> Result<KernelRecord, String> {
    let o = object(k, at)?;
    let pass = string(o, "pass", at)?;
    if !PASSES.contains(&pass.as_str()) {
        return Err(format!(
            "{at}.pass: `{pass}` is neither `forward` nor `backward`"
        ));
    }
    let skipped = opt_string(o, "skipped", at)?;
    let target = opt_string(o, "target", at)?;
    let plan = match o.get("plan") {
        None | Some(Value::Null) => {
            if skipped.is_none() {
                return Err(format!(
                    "{at}: a kernel record needs a `plan` (or `skipped` with a reason)"
                ));
            }
            None
        }
        Some(p) => {
            let plan: EntryPlan = serde_json::from_value(p.clone())
                .map_err(|e| format!("{at}.plan: not a launch plan: {e}"))?;
            if plan.pass != pass {
                return Err(format!(
                    "{at}.plan: the plan is a {} plan in a {pass} record",
                    plan.pass
                ));
            }
            validate_plan(&plan).map_err(|e| format!("{at}.plan: {e}"))?;
            Some(plan)
        }
    };
    let mut builds = Vec::new();
    if let Some(planned) = &plan {
        for (b, build) in array(o, "builds", at)?.iter().enumerate() {
            let bat = format!("{at}.builds[{b}]");
            let bo = object(build, &bat)?;
            let mut modules = BTreeMap::new();
            if let Some(m) = bo.get("modules") {
                let mat = format!("{bat}.modules");
                let fields = object(m, &mat)?;
                for key in fields.keys() {
                    let path = opt_string(fields, key, &mat)?;
                    modules.insert(key.clone(), path.map(PathBuf::from));
                }
            }
            let build = Build {
                target: string(bo, "target", &bat)?,
                arch: string(bo, "arch", &bat)?,
                cubin: opt_string(bo, "cubin", &bat)?.map(PathBuf::from),
                code_object: opt_string(bo, "code_object", &bat)?.map(PathBuf::from),
                modules,
            };
            check_modules(planned, &build).map_err(|e| format!("{bat}: {e}"))?;
            builds.push(build);
        }
    }
    let head_dims = match o.get("head_dims") {
        None | Some(Value::Null) => Vec::new(),
        Some(h) => named_numbers(h, &format!("{at}.head_dims"))?,
    };
    let row_outputs = match o.get("row_outputs") {
        None | Some(Value::Null) => Vec::new(),
        Some(r) => strings(r, &format!("{at}.row_outputs"))?,
    };
    let tuned_for = match o.get("tuned_for") {
        None | Some(Value::Null) => Vec::new(),
        Some(t) => {
            let tat = format!("{at}.tuned_for");
            t.as_array()
                .ok_or_else(|| format!("{tat}: expected an array, found {}", kind(t)))?
                .iter()
                .enumerate()
                .map(|(i, item)| parse_tuned_bucket(item, &format!("{tat}[{i}]")))
                .collect::<Result<_, _>>()?
        }
    };
    if !tuned_for.is_empty() && plan.is_none() {
        return Err(format!("{at}: a tuning-table record needs a `plan`"));
    }
    Ok(KernelRecord {
        pass,
        source: opt_string(o, "source", at)?.map(PathBuf::from),
        builds,
        head_dims,
        row_outputs,
        plan,
        skipped,
        target,
        tuned_for,
    })
}

/// An object of numbers (`{"Dqk": 128, "Dv": 64}`) as (name, value) pairs.
fn named_numbers(v: &Value, at: &str) -> Result<Vec<(String, u64)>, String> {
    object(v, at)?
        .iter()
        .map(|(name, n)| {
            n.as_u64()
                .map(|n| (name.clone(), n))
                .ok_or_else(|| format!("{at}.{name}: expected a number, found {}", kind(n)))
        })
        .collect()
}

/// An array of strings.
fn strings(v: &Value, at: &str) -> Result<Vec<String>, String> {
    v.as_array()
        .and_then(|a| {
            a.iter()
                .map(|x| x.as_str().map(String::from))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| format!("{at}: expected an array of strings"))
}

/// A `tuned_for` item of a kernel record (also read by the C header's
/// generator).
pub(crate) fn parse_tuned_bucket(item: &Value, at: &str) -> Result<TunedBucket, String> {
    let o = object(item, at)?;
    let sizes = named_numbers(
        o.get("sizes")
            .ok_or_else(|| format!("{at}: missing field `sizes`"))?,
        &format!("{at}.sizes"),
    )?;
    let bucketed = match o.get("bucketed") {
        None | Some(Value::Null) => Vec::new(),
        Some(b) => strings(b, &format!("{at}.bucketed"))?,
    };
    let gpu = match (o.get("gpu"), o.get("device")) {
        (Some(_), None) => TunedGpu::Named(string(o, "gpu", at)?),
        (None, Some(_)) => {
            let sms = o.get("sms").ok_or_else(|| {
                format!("{at}: an item with `device` needs `sms` (the GPU's multiprocessors)")
            })?;
            let sms = sms
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| (1..=65535).contains(&n))
                .ok_or_else(|| {
                    format!(
                        "{at}.sms: expected a count of multiprocessors (1 to 65535), found {sms}"
                    )
                })?;
            TunedGpu::Product {
                device: string(o, "device", at)?,
                sms,
            }
        }
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: has both `gpu` (a driver name) and `device` (a product); an item names its GPUs one way"
            ));
        }
        (None, None) => {
            return Err(format!(
                "{at}: missing field `gpu` (the driver's device name) or `device` and `sms` (a product and its multiprocessors)"
            ));
        }
    };
    Ok(TunedBucket {
        gpu,
        sizes,
        bucketed,
    })
}

/// Checks that every module a launch of `plan` names is one of the build's
/// modules, with a cubin wherever the build has its own cubin (a build
/// without one, HIP or compiled without NVRTC, is never loaded).
fn check_modules(plan: &EntryPlan, build: &Build) -> Result<(), String> {
    if build.cubin.is_none() {
        return Ok(());
    }
    for (i, l) in plan.launches.iter().enumerate() {
        let Some(key) = &l.module else { continue };
        match build.modules.get(key) {
            None => {
                return Err(format!(
                    "launch {i} (`{}`) is in the module `{key}`, which the build does not list \
                     (it has: {})",
                    l.entry,
                    list(build.modules.keys().map(String::as_str))
                ));
            }
            Some(None) => {
                return Err(format!(
                    "launch {i} (`{}`): the module `{key}` has no cubin, but the build's own \
                     module has one",
                    l.entry
                ));
            }
            Some(Some(_)) => {}
        }
    }
    Ok(())
}

/// Checks that a plan is consistent: unique sizes and buffers, every size
/// an expression reads bound (a call size or `kv_splits`, which the split
/// rule itself may not read), every buffer an argument names declared, no
/// written buffer passed twice to one launch.
pub fn validate_plan(plan: &EntryPlan) -> Result<(), String> {
    let mut sizes: Vec<&str> = Vec::new();
    for s in &plan.sizes {
        if s.name == KV_SPLITS || s.name == SMS {
            return Err(format!(
                "`{}` is computed by the loader, not a size of the call",
                s.name
            ));
        }
        if sizes.contains(&s.name.as_str()) {
            return Err(format!("size `{}` is declared twice", s.name));
        }
        sizes.push(&s.name);
    }
    // `kv_splits` where `with_splits`, the multiprocessor count in grids.
    let known = |e: &SizeExpr, with_splits: bool, grid: bool, what: &str| -> Result<(), String> {
        for v in e.vars() {
            let bound = sizes.contains(&v) || (with_splits && v == KV_SPLITS) || (grid && v == SMS);
            if !bound {
                return Err(format!(
                    "{what} reads `{v}`, which is not a size of the plan"
                ));
            }
        }
        Ok(())
    };
    for [a, b] in plan.multiple_of.iter().chain(&plan.equal) {
        for n in [a, b] {
            known(&SizeExpr::var(n), false, false, "a constraint")?;
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for b in &plan.buffers {
        if names.contains(&b.name.as_str()) {
            return Err(format!("buffer `{}` is declared twice", b.name));
        }
        names.push(&b.name);
        for e in &b.shape {
            known(e, true, false, &format!("the shape of `{}`", b.name))?;
        }
    }
    if let Some(k) = &plan.kv_splits {
        known(&k.blocks, false, false, "the split rule")?;
        known(&k.key_blocks, false, false, "the split rule")?;
    }
    if plan.launches.is_empty() {
        return Err("the plan has no launches".to_string());
    }
    for (i, l) in plan.launches.iter().enumerate() {
        let what = format!("launch {i} (`{}`)", l.entry);
        if l.threads == 0 {
            return Err(format!("{what} has 0 threads"));
        }
        for e in &l.grid {
            known(e, true, true, &format!("the grid of {what}"))?;
        }
        let mut written: Vec<&str> = Vec::new();
        for a in &l.args {
            match a {
                ArgPlan::Ptr(n) => {
                    let b = plan
                        .buffer(n)
                        .ok_or_else(|| format!("{what} passes `{n}`, which is not a buffer"))?;
                    if !matches!(b.role, Role::Input | Role::OptionalInput) {
                        if written.contains(&n.as_str()) {
                            return Err(format!("{what} passes the written buffer `{n}` twice"));
                        }
                        written.push(n);
                    }
                }
                ArgPlan::I32(e) => known(e, true, false, &format!("an argument of {what}"))?,
                ArgPlan::Null(_) => {}
                ArgPlan::TensorMap(m) => {
                    let b = plan.buffer(&m.buffer).ok_or_else(|| {
                        format!("{what} maps `{}`, which is not a buffer", m.buffer)
                    })?;
                    if b.role != Role::Input || b.dtype == Dtype::F32 {
                        return Err(format!(
                            "{what} maps `{}`, which is not a 16-bit input",
                            m.buffer
                        ));
                    }
                    for e in &m.dims {
                        known(e, false, false, &format!("a tensor-map extent of {what}"))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The CUDA architecture whose cubins a device of compute capability
/// `(major, minor)` loads: `sm_90a` for 9.0, `sm_80` for 8.x; `None`
/// otherwise (aec builds for no other).
pub fn cuda_arch_for(major: u32, minor: u32) -> Option<&'static str> {
    match (major, minor) {
        (9, 0) => Some("sm_90a"),
        (8, _) => Some("sm_80"),
        _ => None,
    }
}

// ------------------------------------------------------------ call checks

/// A bound call: every size (the plan's and `kv_splits`), each buffer's
/// element count and presence, and the launches to make, with their grids
/// and arguments. Made by [`check_call`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallPlan {
    /// Every size of the plan, the fixed ones included, and `kv_splits`.
    pub sizes: BTreeMap<String, u64>,
    /// The KV splits of the call (1 without split-KV).
    pub kv_splits: u64,
    /// Per buffer of the plan, in its order.
    pub buffers: Vec<BufferCall>,
    /// The launches that run, in order (those whose `when` holds).
    pub launches: Vec<LaunchCall>,
}

impl CallPlan {
    /// The value of size `name` (`B`, `Skv`, `kv_splits`, …).
    pub fn size(&self, name: &str) -> Option<u64> {
        self.sizes.get(name).copied()
    }
}

/// One buffer of a bound call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferCall {
    /// Its element count.
    pub elements: u64,
    /// Whether it is passed (a given input, an allocated output or
    /// workspace); absent buffers are null pointers.
    pub present: bool,
    /// For inputs: the index of the tensor that gives it.
    pub given: Option<usize>,
}

/// One launch of a bound call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchCall {
    /// The index of the launch in the plan.
    pub index: usize,
    pub grid: (u32, u32, u32),
    pub args: Vec<CallArg>,
}

/// One argument of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallArg {
    /// The buffer with this index in the plan.
    Buffer(usize),
    /// A null pointer (an absent buffer).
    Null,
    I32(i32),
    /// A tensor map of the buffer with this index in the plan (an input),
    /// encoded at launch ([`TensorMapPlan`](crate::compiler::launch_plan::TensorMapPlan)).
    TensorMap {
        buffer: usize,
        dims: [u64; 3],
        box_dims: [u32; 3],
    },
}

/// A list of names for messages: `a, b, c` or `none`.
fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let v: Vec<&str> = names.into_iter().collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    suggest(name, candidates)
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default()
}

/// The sizes of a plan as a message lists them: `B, H, Sq (fixed: 1)`.
fn sizes_list(plan: &EntryPlan) -> String {
    let v: Vec<String> = plan
        .sizes
        .iter()
        .map(|s| match s.fixed {
            Some(n) => format!("{} (fixed: {n})", s.name),
            None => s.name.clone(),
        })
        .collect();
    v.join(", ")
}

/// Binds and checks the sizes of a call of `plan`: each given once, a size
/// of the plan, at least 1 and within 32 bits; the fixed ones equal to
/// their value (they may be left out); every free one given; the plan's
/// `multiple_of` and `equal` constraints. Returns every size of the plan.
pub fn bind_sizes(
    plan: &EntryPlan,
    sizes: &[(&str, usize)],
) -> Result<BTreeMap<String, u64>, Error> {
    let bad = |m: String| Err(Error::Shape(m));
    let mut bound = BTreeMap::new();
    for (i, &(name, n)) in sizes.iter().enumerate() {
        if sizes[..i].iter().any(|(m, _)| *m == name) {
            return bad(format!("size `{name}` is given twice"));
        }
        let Some(decl) = plan.sizes.iter().find(|s| s.name == name) else {
            if name == KV_SPLITS {
                return bad(format!(
                    "`{KV_SPLITS}` is not a size of the call: the loader computes it from the \
                     sizes and the device; the call binds {}",
                    sizes_list(plan)
                ));
            }
            return bad(format!(
                "unknown size `{name}`: the call binds {}{}",
                sizes_list(plan),
                did_you_mean(name, plan.sizes.iter().map(|s| s.name.as_str()))
            ));
        };
        if n == 0 {
            return bad(format!("size `{name}` = 0: every size must be at least 1"));
        }
        if i32::try_from(n).is_err() {
            return bad(format!(
                "size `{name}` = {n} does not fit the kernels' 32-bit sizes (at most {}): split \
                 the call",
                i32::MAX
            ));
        }
        if let Some(f) = decl.fixed
            && f != n as u64
        {
            return bad(format!(
                "size `{name}` = {n}, but the variant fixes {name} = {f}"
            ));
        }
        bound.insert(name.to_string(), n as u64);
    }
    for s in &plan.sizes {
        if bound.contains_key(&s.name) {
            continue;
        }
        match s.fixed {
            Some(f) => {
                bound.insert(s.name.clone(), f);
            }
            None => {
                return bad(format!(
                    "size `{}` is missing: the call binds {} (fixed sizes may be left out)",
                    s.name,
                    sizes_list(plan)
                ));
            }
        }
    }
    let get = |n: &str| bound.get(n).copied().unwrap_or(0);
    for [a, b] in &plan.multiple_of {
        let (x, y) = (get(a), get(b));
        if y == 0 || !x.is_multiple_of(y) {
            return bad(format!("{a} = {x} is not a multiple of {b} = {y}"));
        }
    }
    for [a, b] in &plan.equal {
        let (x, y) = (get(a), get(b));
        if x != y {
            return bad(format!(
                "{a} = {x} must equal {b} = {y} (this variant's k and v have {b} heads)"
            ));
        }
    }
    Ok(bound)
}

/// `[B, H, Sq, 128] = [2, 8, 100, 128]`.
fn shape_text(shape: &[SizeExpr], vars: &dyn Fn(&str) -> Option<u64>) -> String {
    let names: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
    let values: Vec<String> = shape
        .iter()
        .map(|e| e.eval(vars).map_or("?".to_string(), |n| n.to_string()))
        .collect();
    if names == values {
        format!("[{}]", names.join(", "))
    } else {
        format!("[{}] = [{}]", names.join(", "), values.join(", "))
    }
}

/// Checks a call of `plan` without a GPU and binds it: `sizes` (see
/// [`bind_sizes`]), `tensors` the given inputs as (name, dtype, element
/// count), `want` the optional outputs asked for, `sms` the device's
/// multiprocessor count (for the KV split rule and persistent grids).
///
/// Errors ([`Error::Shape`]), in order: the sizes; a tensor given twice,
/// unknown, or an output or workspace given as input; a required input
/// missing; a tensor of another dtype or element count than the plan's
/// shape (naming the shape with its names and values); an output asked for
/// that the entry does not return, or twice; a buffer too large; a grid
/// beyond CUDA's limits or an argument beyond 32 bits.
pub fn check_call(
    plan: &EntryPlan,
    sizes: &[(&str, usize)],
    tensors: &[(&str, Dtype, usize)],
    want: &[&str],
    sms: u32,
) -> Result<CallPlan, Error> {
    check_call_on(plan, sizes, tensors, want, sms, Residency::Unknown)
}

/// [`check_call`] on a device where a multiprocessor holds `residency` of
/// the split launch's blocks at once: the KV split rule then also caps the
/// splits at one wave of them
/// ([`KvSplitPlan`](crate::compiler::launch_plan::KvSplitPlan);
/// [`Residency::Unknown`]: no cap, as `check_call`).
pub fn check_call_on(
    plan: &EntryPlan,
    sizes: &[(&str, usize)],
    tensors: &[(&str, Dtype, usize)],
    want: &[&str],
    sms: u32,
    residency: Residency,
) -> Result<CallPlan, Error> {
    let bad = |m: String| Err(Error::Shape(m));
    let mut vars = bind_sizes(plan, sizes)?;
    let kv_splits = plan.kv_splits.as_ref().map_or(1, |k| {
        k.splits(&|n: &str| vars.get(n).copied(), u64::from(sms), residency)
    });
    vars.insert(KV_SPLITS.to_string(), kv_splits);
    vars.insert(SMS.to_string(), u64::from(sms.max(1)));
    let lookup = |n: &str| vars.get(n).copied();

    let inputs = || {
        plan.buffers.iter().filter_map(|b| match b.role {
            Role::Input => Some(b.name.clone()),
            Role::OptionalInput => Some(format!("{} (optional)", b.name)),
            _ => None,
        })
    };
    let is_input = |r: Role| matches!(r, Role::Input | Role::OptionalInput);
    let is_output = |r: Role| matches!(r, Role::Output | Role::OptionalOutput);
    for (i, &(name, _, _)) in tensors.iter().enumerate() {
        if tensors[..i].iter().any(|(m, _, _)| *m == name) {
            return bad(format!("tensor `{name}` is given twice"));
        }
        match plan.buffer(name) {
            Some(b) if is_input(b.role) => {}
            Some(b) => {
                return bad(format!(
                    "`{name}` is {} of this entry, not an input: the library allocates it{}",
                    if b.role == Role::Workspace {
                        "a workspace"
                    } else {
                        "an output"
                    },
                    if b.role == Role::OptionalOutput {
                        " (ask for it in `want`)"
                    } else {
                        ""
                    }
                ));
            }
            None => {
                let names: Vec<String> = inputs().collect();
                return bad(format!(
                    "unknown tensor `{name}`: this entry takes {}{}",
                    names.join(", "),
                    did_you_mean(
                        name,
                        plan.buffers
                            .iter()
                            .filter(|b| is_input(b.role))
                            .map(|b| b.name.as_str())
                    )
                ));
            }
        }
    }
    let mut buffers = Vec::with_capacity(plan.buffers.len());
    for b in &plan.buffers {
        let shape = || shape_text(&b.shape, &lookup);
        let elements = b.elements(&lookup).ok_or_else(|| {
            Error::Shape(format!(
                "`{}` would have {} elements, more than 64 bits count: split the call",
                b.name,
                shape()
            ))
        })?;
        if usize::try_from(elements).is_err() {
            return bad(format!(
                "`{}` would have {} = {elements} elements, more than this machine can address: \
                 split the call",
                b.name,
                shape()
            ));
        }
        let given = tensors.iter().position(|(n, _, _)| *n == b.name);
        if let Some(t) = given {
            let (_, dtype, len) = tensors[t];
            if dtype != b.dtype {
                return bad(format!(
                    "tensor `{}`: expected {} elements, got {}",
                    b.name,
                    b.dtype.name(),
                    dtype.name()
                ));
            }
            if len as u64 != elements {
                return bad(format!(
                    "tensor `{}`: expected {} = {elements} elements, got {len}",
                    b.name,
                    shape()
                ));
            }
        } else if b.role == Role::Input {
            return bad(format!(
                "tensor `{}` is missing: expected {} {} = {elements} elements ({})",
                b.name,
                b.dtype.name(),
                shape(),
                b.doc
            ));
        }
        buffers.push(BufferCall {
            elements,
            present: false,
            given,
        });
    }
    for (i, &name) in want.iter().enumerate() {
        if want[..i].contains(&name) {
            return bad(format!("output `{name}` is asked for twice"));
        }
        if !plan
            .buffer(name)
            .is_some_and(|b| b.role == Role::OptionalOutput || b.role == Role::Output)
        {
            let outputs: Vec<String> = plan
                .buffers
                .iter()
                .filter_map(|b| match b.role {
                    Role::Output => Some(b.name.clone()),
                    Role::OptionalOutput => Some(format!("{} (optional)", b.name)),
                    _ => None,
                })
                .collect();
            return bad(format!(
                "cannot return `{name}`: this entry returns {}{}",
                outputs.join(", "),
                did_you_mean(
                    name,
                    plan.buffers
                        .iter()
                        .filter(|b| is_output(b.role))
                        .map(|b| b.name.as_str())
                )
            ));
        }
    }
    let holds = |w: Option<Condition>| match w {
        None => true,
        Some(Condition::SplitKv) => kv_splits > 1,
    };
    for (b, call) in plan.buffers.iter().zip(buffers.iter_mut()) {
        call.present = holds(b.when)
            && match b.role {
                Role::Input | Role::Output | Role::Workspace => true,
                Role::OptionalInput => call.given.is_some(),
                Role::OptionalOutput => want.contains(&b.name.as_str()),
            };
    }
    let mut launches = Vec::new();
    for (index, l) in plan.launches.iter().enumerate() {
        if !holds(l.when) {
            continue;
        }
        let what = || format!("launch {index} (`{}`)", l.entry);
        let dims: Vec<Option<u64>> = l.grid.iter().map(|e| e.eval(&lookup)).collect();
        let fits = dims.iter().enumerate().all(|(d, n)| {
            n.is_some_and(|n| n >= 1 && n <= if d == 0 { MAX_GRID_X } else { MAX_GRID_YZ })
        });
        if !fits {
            return bad(format!(
                "{}: the grid {} exceeds CUDA's limits (x ≤ {MAX_GRID_X}, y and z ≤ \
                 {MAX_GRID_YZ}): split the call",
                what(),
                shape_text(&l.grid, &lookup)
            ));
        }
        let g: Vec<u32> = dims
            .iter()
            .map(|n| u32::try_from(n.unwrap_or(0)).unwrap_or(u32::MAX))
            .collect();
        let mut args = Vec::with_capacity(l.args.len());
        for a in &l.args {
            args.push(match a {
                ArgPlan::Ptr(n) => {
                    let i = plan
                        .buffers
                        .iter()
                        .position(|b| &b.name == n)
                        .ok_or_else(|| {
                            Error::Shape(format!(
                                "{} passes `{n}`, which the plan does not declare",
                                what()
                            ))
                        })?;
                    if buffers[i].present {
                        CallArg::Buffer(i)
                    } else {
                        CallArg::Null
                    }
                }
                ArgPlan::Null(_) => CallArg::Null,
                ArgPlan::TensorMap(m) => {
                    let i = plan
                        .buffers
                        .iter()
                        .position(|b| b.name == m.buffer)
                        .ok_or_else(|| {
                            Error::Shape(format!(
                                "{} maps `{}`, which the plan does not declare",
                                what(),
                                m.buffer
                            ))
                        })?;
                    let mut dims = [0u64; 3];
                    for (d, e) in dims.iter_mut().zip(&m.dims) {
                        *d = e.eval(&lookup).unwrap_or(0);
                    }
                    CallArg::TensorMap {
                        buffer: i,
                        dims,
                        box_dims: m.box_dims,
                    }
                }
                ArgPlan::I32(e) => {
                    let v = e.eval(&lookup).and_then(|v| i32::try_from(v).ok());
                    match v {
                        Some(v) => CallArg::I32(v),
                        None => {
                            return bad(format!(
                                "{}: the argument {e} = {} does not fit the kernels' 32-bit \
                                 sizes: split the call",
                                what(),
                                e.eval(&lookup).map_or("?".to_string(), |n| n.to_string())
                            ));
                        }
                    }
                }
            });
        }
        launches.push(LaunchCall {
            index,
            grid: (g[0], g[1], g[2]),
            args,
        });
    }
    Ok(CallPlan {
        sizes: vars,
        kv_splits,
        buffers,
        launches,
    })
}

// ---------------------------------------------------------------- tensors

/// A given tensor: a device buffer of one of the plans' dtypes. Made with
/// `Tensor::from(&buffer)` or `(&buffer).into()`. A buffer is a whole
/// device allocation (256-byte aligned), so it meets the kernels' 16-byte
/// access alignment that the C header and the Python module check.
#[derive(Clone, Copy, Debug)]
pub enum Tensor<'a> {
    Bf16(&'a DeviceBuffer<bf16>),
    F16(&'a DeviceBuffer<f16>),
    F32(&'a DeviceBuffer<f32>),
}

impl<'a> Tensor<'a> {
    pub fn dtype(&self) -> Dtype {
        match self {
            Tensor::Bf16(_) => Dtype::Bf16,
            Tensor::F16(_) => Dtype::F16,
            Tensor::F32(_) => Dtype::F32,
        }
    }

    /// Whether `other` is this very buffer.
    pub fn is_same(&self, other: &Tensor<'_>) -> bool {
        match (self, other) {
            (Tensor::Bf16(a), Tensor::Bf16(b)) => std::ptr::eq(*a, *b),
            (Tensor::F16(a), Tensor::F16(b)) => std::ptr::eq(*a, *b),
            (Tensor::F32(a), Tensor::F32(b)) => std::ptr::eq(*a, *b),
            _ => false,
        }
    }

    /// Its element count.
    pub fn len(&self) -> usize {
        match self {
            Tensor::Bf16(b) => b.len(),
            Tensor::F16(b) => b.len(),
            Tensor::F32(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ordinal of the device it lives on.
    pub fn ordinal(&self) -> usize {
        match self {
            Tensor::Bf16(b) => b.ordinal(),
            Tensor::F16(b) => b.ordinal(),
            Tensor::F32(b) => b.ordinal(),
        }
    }

    fn arg(self) -> Arg<'a> {
        match self {
            Tensor::Bf16(b) => Arg::from(b),
            Tensor::F16(b) => Arg::from(b),
            Tensor::F32(b) => Arg::from(b),
        }
    }

    /// A tensor map over it (`name` in messages; see [`TensorMap::tiled_3d`]).
    fn tensor_map(
        &self,
        stream: &Stream,
        name: &str,
        dims: [u64; 3],
        box_dims: [u32; 3],
    ) -> crate::runtime::Result<TensorMap> {
        match self {
            Tensor::Bf16(b) => TensorMap::tiled_3d(stream, b, name, dims, box_dims),
            Tensor::F16(b) => TensorMap::tiled_3d(stream, b, name, dims, box_dims),
            Tensor::F32(b) => TensorMap::tiled_3d(stream, b, name, dims, box_dims),
        }
    }
}

impl<'a> From<&'a DeviceBuffer<bf16>> for Tensor<'a> {
    fn from(b: &'a DeviceBuffer<bf16>) -> Self {
        Tensor::Bf16(b)
    }
}

impl<'a> From<&'a DeviceBuffer<f16>> for Tensor<'a> {
    fn from(b: &'a DeviceBuffer<f16>) -> Self {
        Tensor::F16(b)
    }
}

impl<'a> From<&'a DeviceBuffer<f32>> for Tensor<'a> {
    fn from(b: &'a DeviceBuffer<f32>) -> Self {
        Tensor::F32(b)
    }
}

/// An output buffer a call allocated (owned).
#[derive(Debug)]
pub enum Output {
    Bf16(DeviceBuffer<bf16>),
    F16(DeviceBuffer<f16>),
    F32(DeviceBuffer<f32>),
}

impl Output {
    pub fn dtype(&self) -> Dtype {
        self.as_tensor().dtype()
    }

    pub fn len(&self) -> usize {
        self.as_tensor().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer as an input of another call (a backward reads the
    /// forward's `o` and `row_outputs`).
    pub fn as_tensor(&self) -> Tensor<'_> {
        match self {
            Output::Bf16(b) => Tensor::Bf16(b),
            Output::F16(b) => Tensor::F16(b),
            Output::F32(b) => Tensor::F32(b),
        }
    }

    fn alloc(stream: &Stream, dtype: Dtype, len: usize) -> crate::runtime::Result<Output> {
        Ok(match dtype {
            Dtype::Bf16 => Output::Bf16(stream.alloc_zeros(len)?),
            Dtype::F16 => Output::F16(stream.alloc_zeros(len)?),
            Dtype::F32 => Output::F32(stream.alloc_zeros(len)?),
        })
    }

    fn arg_mut(&mut self) -> Arg<'_> {
        match self {
            Output::Bf16(b) => Arg::from(b),
            Output::F16(b) => Arg::from(b),
            Output::F32(b) => Arg::from(b),
        }
    }
}

/// What [`Entry::run`] returns: the outputs by name (every `output` of the
/// plan and the optional outputs asked for), owned. The buffers are filled
/// once the stream reaches the launches; [`Stream::download`] waits for
/// that.
#[derive(Debug)]
pub struct Outputs {
    label: String,
    buffers: Vec<(String, Output)>,
    kv_splits: u64,
}

impl Outputs {
    /// The names of the outputs, in the plan's order.
    pub fn names(&self) -> Vec<&str> {
        self.buffers.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The KV splits the call launched with (1 without split-KV).
    pub fn kv_splits(&self) -> u64 {
        self.kv_splits
    }

    fn missing(&self, name: &str) -> Error {
        Error::Shape(format!(
            "{}: no output `{name}`; the call returned {}{}",
            self.label,
            list(self.names()),
            did_you_mean(name, self.names())
        ))
    }

    /// The output `name`.
    pub fn get(&self, name: &str) -> Result<&Output, Error> {
        self.buffers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| self.missing(name))
    }

    /// Takes the output `name` out (a later `get` of it fails).
    pub fn take(&mut self, name: &str) -> Result<Output, Error> {
        match self.buffers.iter().position(|(n, _)| n == name) {
            Some(i) => Ok(self.buffers.remove(i).1),
            None => Err(self.missing(name)),
        }
    }

    /// The output `name` as an input of another call.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>, Error> {
        Ok(self.get(name)?.as_tensor())
    }

    fn wrong_dtype(&self, name: &str, found: Dtype, asked: Dtype) -> Error {
        Error::Shape(format!(
            "{}: output `{name}` holds {} elements, not {}: use outputs.{}(\"{name}\")",
            self.label,
            found.name(),
            asked.name(),
            found.name()
        ))
    }

    /// The bf16 output `name`.
    pub fn bf16(&self, name: &str) -> Result<&DeviceBuffer<bf16>, Error> {
        match self.get(name)? {
            Output::Bf16(b) => Ok(b),
            other => Err(self.wrong_dtype(name, other.dtype(), Dtype::Bf16)),
        }
    }

    /// The f16 output `name`.
    pub fn f16(&self, name: &str) -> Result<&DeviceBuffer<f16>, Error> {
        match self.get(name)? {
            Output::F16(b) => Ok(b),
            other => Err(self.wrong_dtype(name, other.dtype(), Dtype::F16)),
        }
    }

    /// The f32 output `name`.
    pub fn f32(&self, name: &str) -> Result<&DeviceBuffer<f32>, Error> {
        match self.get(name)? {
            Output::F32(b) => Ok(b),
            other => Err(self.wrong_dtype(name, other.dtype(), Dtype::F32)),
        }
    }
}

// ------------------------------------------------------------------ library

fn runtime_dtype(d: Dtype) -> DType {
    match d {
        Dtype::Bf16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
    }
}

/// The kernels of one launch, one per parameter list: a null pointer is a
/// `u64` parameter, so an absent buffer changes the list.
#[derive(Debug)]
struct LaunchKernels {
    entry: String,
    /// The index of its module in [`Entry::modules`].
    module: usize,
    kernels: Mutex<Vec<(Vec<Param>, Arc<Kernel>)>>,
}

/// One entry point of a variant (its forward or backward) loaded on the
/// library's device: the plan and the modules of its cubins (the build's
/// own, then those its launches name).
#[derive(Debug)]
pub struct Entry {
    variant: String,
    pass: String,
    arch: String,
    cubin: PathBuf,
    head_dims: Vec<(String, u64)>,
    row_outputs: Vec<String>,
    plan: EntryPlan,
    device: Device,
    /// The build's own module first, then the named ones.
    modules: Vec<Module>,
    launches: Vec<LaunchKernels>,
    /// The KV-split rule's wave cap on the device ([`Residency`]).
    residency: Residency,
    /// This record's tuning-table buckets on the device (empty: a default).
    tuned_for: Vec<TunedBucket>,
    /// A default entry's tuning-table alternatives for the device's GPU.
    tuned: Vec<Entry>,
}

/// The wave cap of `plan`'s KV-split rule on `device`: how many of the split
/// launch's blocks ([`EntryPlan::split_launch`]) one multiprocessor holds
/// ([`residency_of`]); without split-KV none.
fn split_launch_residency(
    plan: &EntryPlan,
    launches: &[LaunchKernels],
    device: &Device,
) -> Residency {
    let by_smem = Residency::SharedMemory(u64::from(device.shared_memory_per_sm()));
    if plan.kv_splits.is_none() {
        return Residency::Unknown;
    }
    let Some(index) = plan.split_launch() else {
        return by_smem;
    };
    let (l, slot) = (&plan.launches[index], &launches[index]);
    let kernels = slot.kernels.lock().unwrap_or_else(PoisonError::into_inner);
    kernels.first().map_or(by_smem, |(_, k)| {
        residency_of(device, k, l.threads, l.dynamic_smem_bytes)
    })
}

impl Entry {
    fn load(
        device: &Device,
        dir: &Path,
        variant: &VariantRecord,
        record: &KernelRecord,
        build: &Build,
    ) -> Result<Entry, Error> {
        let plan = record.plan.clone().expect("select returns planned records");
        let rel = build
            .cubin
            .as_ref()
            .expect("select returns builds with a cubin");
        let cubin = dir.join(rel);
        let label = format!("the {} of `{}`", record.pass, variant.name);
        let load_module = |path: &Path| -> Result<Module, Error> {
            let bytes = std::fs::read(path).map_err(|e| Error::Library {
                path: path.to_path_buf(),
                message: format!("cannot read the cubin of {label} ({e})"),
            })?;
            Module::load(device, &bytes).map_err(|e| Error::Runtime {
                during: format!(
                    "loading {} ({label}) onto device {} ({})",
                    path.display(),
                    device.ordinal(),
                    device.name()
                ),
                source: e,
            })
        };
        let mut modules = vec![load_module(&cubin)?];
        let mut module_paths = vec![(None, cubin.clone())];
        let mut launches = Vec::new();
        for l in &plan.launches {
            let at = match &l.module {
                None => 0,
                Some(key) => match module_paths
                    .iter()
                    .position(|(k, _)| k.as_ref() == Some(key))
                {
                    Some(i) => i,
                    None => {
                        let rel = build.modules.get(key).cloned().flatten().ok_or_else(|| {
                            Error::Library {
                                path: cubin.clone(),
                                message: format!(
                                    "{label}: launch `{}` is in the module `{key}`, for which \
                                     the {} build has no cubin",
                                    l.entry, build.arch
                                ),
                            }
                        })?;
                        let path = dir.join(rel);
                        modules.push(load_module(&path)?);
                        module_paths.push((Some(key.clone()), path));
                        modules.len() - 1
                    }
                },
            };
            let module = &modules[at];
            let loading = || {
                format!(
                    "loading {} ({label}) onto device {} ({})",
                    module_paths[at].1.display(),
                    device.ordinal(),
                    device.name()
                )
            };
            // Every buffer present: the parameter list of the usual call.
            let params: Vec<Param> = l
                .args
                .iter()
                .map(|a| match a {
                    ArgPlan::I32(_) => Param::I32,
                    ArgPlan::Null(_) => Param::U64,
                    ArgPlan::TensorMap(_) => Param::TensorMap,
                    ArgPlan::Ptr(n) => {
                        let b = plan.buffer(n).expect("validate_plan checked the buffers");
                        param(b.role, b.dtype)
                    }
                })
                .collect();
            let kernel = module
                .kernel(&l.entry, &params)
                .map_err(|e| Error::Runtime {
                    during: loading(),
                    source: e,
                })?;
            if l.dynamic_smem_bytes > kernel.max_dynamic_shared_bytes() {
                return Err(Error::Library {
                    path: module_paths[at].1.clone(),
                    message: format!(
                        "kernel `{}` ({label}) needs {} bytes of dynamic shared memory, but \
                         device {} ({}) allows at most {}",
                        l.entry,
                        l.dynamic_smem_bytes,
                        device.ordinal(),
                        device.name(),
                        kernel.max_dynamic_shared_bytes()
                    ),
                });
            }
            launches.push(LaunchKernels {
                entry: l.entry.clone(),
                module: at,
                kernels: Mutex::new(vec![(params, Arc::new(kernel))]),
            });
        }
        let residency = split_launch_residency(&plan, &launches, device);
        Ok(Entry {
            variant: variant.name.clone(),
            pass: record.pass.clone(),
            arch: build.arch.clone(),
            cubin,
            head_dims: record.head_dims.clone(),
            row_outputs: record.row_outputs.clone(),
            plan,
            device: device.clone(),
            modules,
            launches,
            residency,
            tuned_for: Vec::new(),
            tuned: Vec::new(),
        })
    }

    /// The entry a call of `sizes` runs: the first of the tuning table's
    /// alternatives for this GPU whose bucket holds the sizes, else this one.
    pub fn for_sizes(&self, sizes: &[(&str, usize)]) -> &Entry {
        self.tuned
            .iter()
            .find(|t| t.tuned_for.iter().any(|b| b.contains(sizes)))
            .unwrap_or(self)
    }

    /// The tuning table's buckets this entry was loaded for (on the
    /// library's GPU); empty for the default configuration.
    pub fn tuned_for(&self) -> &[TunedBucket] {
        &self.tuned_for
    }

    /// The tuning table's alternatives to this default entry on the
    /// library's GPU (see [`for_sizes`](Self::for_sizes)).
    pub fn tuned(&self) -> &[Entry] {
        &self.tuned
    }

    /// The kernel the plan launches first (the forward's kernel name, which
    /// spells its configuration).
    pub fn kernel_name(&self) -> &str {
        self.plan.launches.first().map_or("", |l| l.entry.as_str())
    }

    /// The launch plan: sizes, buffers (names, roles, dtypes, shapes) and
    /// launches.
    pub fn plan(&self) -> &EntryPlan {
        &self.plan
    }

    /// The variant's name.
    pub fn variant(&self) -> &str {
        &self.variant
    }

    /// `forward` or `backward`.
    pub fn pass(&self) -> &str {
        &self.pass
    }

    /// The architecture of the loaded cubin (`sm_90a`, `sm_80`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The cubin's path.
    pub fn cubin(&self) -> &Path {
        &self.cubin
    }

    /// The head dims the kernels were generated for (`Dqk`, `Dv` or `Dk`,
    /// `Dv`).
    pub fn head_dims(&self) -> &[(String, u64)] {
        &self.head_dims
    }

    /// A forward's row outputs in the order of the `row_outputs` buffer's
    /// first axis (`scale.lse`, `state.m`, `state.l`); empty otherwise.
    pub fn row_output_names(&self) -> &[String] {
        &self.row_outputs
    }

    fn label(&self) -> String {
        format!("`{}` {}", self.variant, self.pass)
    }

    fn context(&self, e: Error) -> Error {
        match e {
            Error::Shape(m) => Error::Shape(format!("{}: {m}", self.label())),
            other => other,
        }
    }

    /// [`check_call`] for this entry on its device (its multiprocessor
    /// count), with messages naming the variant and pass.
    pub fn check(
        &self,
        sizes: &[(&str, usize)],
        tensors: &[(&str, Dtype, usize)],
        want: &[&str],
    ) -> Result<CallPlan, Error> {
        let e = self.for_sizes(sizes);
        check_call_on(
            &e.plan,
            sizes,
            tensors,
            want,
            e.device.sm_count(),
            e.residency,
        )
        .map_err(|err| e.context(err))
    }

    /// The KV splits a call with `sizes` launches with on this device (1
    /// without split-KV).
    pub fn kv_splits(&self, sizes: &[(&str, usize)]) -> Result<u64, Error> {
        let e = self.for_sizes(sizes);
        let vars = bind_sizes(&e.plan, sizes).map_err(|err| e.context(err))?;
        Ok(e.plan.kv_splits.as_ref().map_or(1, |k| {
            k.splits(
                &|n: &str| vars.get(n).copied(),
                u64::from(e.device.sm_count()),
                e.residency,
            )
        }))
    }

    fn kernel(&self, index: usize, params: &[Param]) -> Result<Arc<Kernel>, Error> {
        let slot = &self.launches[index];
        let mut kernels = slot.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, k)) = kernels.iter().find(|(p, _)| p == params) {
            return Ok(k.clone());
        }
        let k = Arc::new(
            self.modules[slot.module]
                .kernel(&slot.entry, params)
                .map_err(|e| Error::Runtime {
                    during: format!("loading `{}` ({})", slot.entry, self.label()),
                    source: e,
                })?,
        );
        kernels.push((params.to_vec(), k.clone()));
        Ok(k)
    }

    /// Runs the entry on `stream`: checks the call ([`check_call`]; the
    /// stream and every tensor on the library's device), allocates the
    /// outputs and workspaces (zero-filled), computes the KV splits, and
    /// queues the plan's launches in order, passing null for absent
    /// optional inputs, optional outputs not in `want` and buffers whose
    /// condition does not hold.
    ///
    /// - `tensors`: every input by name (`q`, `k`, `v`, custom inputs; a
    ///   parallel backward also `o`, `row_outputs` and `dout`, a recurrent
    ///   one `do`; optional inputs such as `state_in` or a recurrent
    ///   backward's `d_state_out` when there are), each exactly the plan's
    ///   dtype and shape, contiguous.
    /// - `sizes`: every size of the plan by name (fixed ones may be left
    ///   out).
    /// - `want`: the optional outputs to return (`state_out`, a recurrent
    ///   backward's `d_state_in`); the others are always returned.
    ///
    /// Nothing is allocated or launched when a check fails.
    pub fn run(
        &self,
        stream: &Stream,
        tensors: &[(&str, Tensor<'_>)],
        sizes: &[(&str, usize)],
        want: &[&str],
    ) -> Result<Outputs, Error> {
        let chosen = self.for_sizes(sizes);
        if !std::ptr::eq(chosen, self) {
            return chosen.run(stream, tensors, sizes, want);
        }
        let ordinal = self.device.ordinal();
        if stream.ordinal() != ordinal {
            return Err(Error::Device(format!(
                "{}: the stream belongs to device {}, but the library is loaded on device \
                 {ordinal}: use a stream of that device",
                self.label(),
                stream.ordinal()
            )));
        }
        for (name, t) in tensors {
            if t.ordinal() != ordinal {
                return Err(Error::Device(format!(
                    "{}: tensor `{name}` lives on device {}, but the library is loaded on device \
                     {ordinal}: upload it with a stream of that device",
                    self.label(),
                    t.ordinal()
                )));
            }
        }
        for [one, other] in &self.plan.same_tensor {
            let find = |name: &str| tensors.iter().find(|(n, _)| *n == name).map(|(_, t)| t);
            if let (Some(a), Some(b)) = (find(one), find(other))
                && !a.is_same(b)
            {
                let doc = self.plan.buffer(one).map_or("", |b| b.doc.as_str());
                return Err(Error::Shape(format!(
                    "{}: `{one}` must be the tensor given as `{other}`: {doc}",
                    self.label()
                )));
            }
        }
        let triples: Vec<(&str, Dtype, usize)> = tensors
            .iter()
            .map(|(n, t)| (*n, t.dtype(), t.len()))
            .collect();
        let call = self.check(sizes, &triples, want)?;

        let mut owned: Vec<Option<Output>> = Vec::with_capacity(self.plan.buffers.len());
        for (b, c) in self.plan.buffers.iter().zip(&call.buffers) {
            let allocated = c.present && !matches!(b.role, Role::Input | Role::OptionalInput);
            owned.push(if allocated {
                let len = usize::try_from(c.elements).expect("check_call bounded the size");
                Some(
                    Output::alloc(stream, b.dtype, len).map_err(|e| Error::Runtime {
                        during: format!(
                            "allocating `{}` ({} {} elements) for {}",
                            b.name,
                            len,
                            b.dtype.name(),
                            self.label()
                        ),
                        source: e,
                    })?,
                )
            } else {
                None
            });
        }
        for launch in &call.launches {
            let lp = &self.plan.launches[launch.index];
            // The tensor maps of this launch, encoded for the given tensors
            // (they hold their addresses) before the arguments borrow them.
            let mut maps = Vec::new();
            for a in &launch.args {
                if let CallArg::TensorMap {
                    buffer,
                    dims,
                    box_dims,
                } = *a
                {
                    let b = &self.plan.buffers[buffer];
                    let t = call.buffers[buffer]
                        .given
                        .expect("validate_plan maps inputs only");
                    let map = tensors[t]
                        .1
                        .tensor_map(stream, &b.name, dims, box_dims)
                        .map_err(|e| Error::Runtime {
                            during: format!("encoding a tensor map for {}", self.label()),
                            source: e,
                        })?;
                    maps.push(map);
                }
            }
            let mut maps = maps.iter();
            let mut slots: Vec<Option<&mut Output>> =
                owned.iter_mut().map(Option::as_mut).collect();
            let mut args: Vec<Arg<'_>> = Vec::with_capacity(launch.args.len());
            let mut params: Vec<Param> = Vec::with_capacity(launch.args.len());
            for a in &launch.args {
                match *a {
                    CallArg::I32(v) => {
                        args.push(Arg::from(v));
                        params.push(Param::I32);
                    }
                    CallArg::Null => {
                        args.push(Arg::from(0u64));
                        params.push(Param::U64);
                    }
                    CallArg::TensorMap { .. } => {
                        args.push(Arg::from(
                            maps.next().expect("one map per tensor-map argument"),
                        ));
                        params.push(Param::TensorMap);
                    }
                    CallArg::Buffer(i) => {
                        let b = &self.plan.buffers[i];
                        params.push(param(b.role, b.dtype));
                        match call.buffers[i].given {
                            Some(t) => args.push(tensors[t].1.arg()),
                            None => {
                                let out = slots[i].take().ok_or_else(|| Error::Library {
                                    path: self.cubin.clone(),
                                    message: format!(
                                        "the plan of {} passes `{}` twice to `{}`",
                                        self.label(),
                                        b.name,
                                        lp.entry
                                    ),
                                })?;
                                args.push(out.arg_mut());
                            }
                        }
                    }
                }
            }
            let kernel = self.kernel(launch.index, &params)?;
            kernel
                .launch(
                    stream,
                    launch.grid,
                    (lp.threads, 1, 1),
                    lp.dynamic_smem_bytes,
                    &mut args,
                )
                .map_err(|e| Error::Runtime {
                    during: format!("launching `{}` ({})", lp.entry, self.label()),
                    source: e,
                })?;
        }
        let buffers = self
            .plan
            .buffers
            .iter()
            .zip(owned)
            .filter(|(b, _)| matches!(b.role, Role::Output | Role::OptionalOutput))
            .filter_map(|(b, o)| o.map(|o| (b.name.clone(), o)))
            .collect();
        Ok(Outputs {
            label: self.label(),
            buffers,
            kv_splits: call.kv_splits,
        })
    }
}

/// The kernel parameter of a present buffer: read for inputs, written for
/// the rest.
fn param(role: Role, dtype: Dtype) -> Param {
    match role {
        Role::Input | Role::OptionalInput => Param::In(runtime_dtype(dtype)),
        Role::Output | Role::OptionalOutput | Role::Workspace => Param::Out(runtime_dtype(dtype)),
    }
}

/// A kernel library loaded on one device: for each variant and pass, the
/// kernels built for the device's architecture.
#[derive(Debug)]
pub struct Library {
    manifest: Manifest,
    device: Device,
    arch: &'static str,
    entries: Vec<Entry>,
}

impl Library {
    /// Opens the library in `dir` on `device`: reads and checks its
    /// manifest, picks per variant and pass the kernels built for the
    /// device (compute capability 9.0: `sm_90a`; 8.x: `sm_80`) and loads
    /// their cubins.
    ///
    /// Errors: [`Error::Library`] for a missing or malformed manifest or
    /// cubin, a device whose architecture the library has no cubins for
    /// (listing those it has), a kernel needing more shared memory than the
    /// device has; [`Error::Runtime`] where the driver refuses a cubin.
    pub fn open(dir: impl AsRef<Path>, device: &Device) -> Result<Library, Error> {
        let manifest = Manifest::read(dir)?;
        Library::load(manifest, device)
    }

    /// [`open`](Self::open) on device `ordinal`, which it opens: without a
    /// CUDA driver or with fewer devices, an [`Error::Runtime`] naming the
    /// library (after the manifest has been read and checked).
    pub fn open_device(dir: impl AsRef<Path>, ordinal: usize) -> Result<Library, Error> {
        let manifest = Manifest::read(dir)?;
        let device = Device::open(ordinal).map_err(|e| Error::Runtime {
            during: format!(
                "opening CUDA device {ordinal} for the kernel library {}",
                manifest.dir().display()
            ),
            source: e,
        })?;
        Library::load(manifest, &device)
    }

    fn load(manifest: Manifest, device: &Device) -> Result<Library, Error> {
        let (major, minor) = device.compute_capability();
        let present = manifest.cuda_archs();
        let hip = manifest.hip_archs();
        let has = match (present.is_empty(), hip.is_empty()) {
            (false, _) => present.join(", "),
            (true, true) => "none (it was compiled without NVRTC or for AMD targets only)".into(),
            // The AMD side of a library is for the C header and the Python
            // module (both load HIP code objects); this loader is CUDA's.
            (true, false) => format!(
                "none: it has HIP code objects for {}, which this Rust loader does not run \
                 (it runs CUDA cubins); on AMD GPUs call them through include/aec_library.h \
                 or python/aec_library.py under PyTorch for ROCm",
                hip.join(", ")
            ),
        };
        let Some(arch) = cuda_arch_for(major, minor) else {
            return Err(Error::Library {
                path: manifest.dir().to_path_buf(),
                message: format!(
                    "device {} ({}) has compute capability {major}.{minor}, for which aec builds \
                     no kernels (sm_90a for 9.0, sm_80 for 8.x); the library has cubins for {has}",
                    device.ordinal(),
                    device.name()
                ),
            });
        };
        if !present.contains(&arch) {
            return Err(Error::Library {
                path: manifest.dir().to_path_buf(),
                message: format!(
                    "device {} ({}, compute capability {major}.{minor}) needs {arch} cubins, but \
                     the library has cubins for {has}: compile it with a target of that \
                     architecture ({})",
                    device.ordinal(),
                    device.name(),
                    if arch == "sm_90a" {
                        "h100 or h200"
                    } else {
                        "a100"
                    }
                ),
            });
        }
        let mut entries = Vec::new();
        for v in &manifest.variants {
            for pass in PASSES {
                if let Ok((v, record, build)) = manifest.select(&v.name, pass, arch) {
                    let mut entry = Entry::load(device, manifest.dir(), v, record, build)?;
                    for (record, build, buckets) in
                        manifest.select_tuned(&v.name, pass, arch, device.name(), device.sm_count())
                    {
                        let mut tuned = Entry::load(device, manifest.dir(), v, record, build)?;
                        tuned.tuned_for = buckets;
                        entry.tuned.push(tuned);
                    }
                    entries.push(entry);
                }
            }
        }
        Ok(Library {
            manifest,
            device: device.clone(),
            arch,
            entries,
        })
    }

    /// The names of the library's variants, in the manifest's order.
    pub fn variants(&self) -> Vec<&str> {
        self.manifest
            .variants
            .iter()
            .map(|v| v.name.as_str())
            .collect()
    }

    /// The entry point `pass` (`forward` or `backward`) of `variant`.
    /// Errors name the variants there are (suggesting the closest), or say
    /// why the pass is missing (a recurrent variant's backward:
    /// [`Error::NotImplemented`]; a skipped kernel: its reason; no build
    /// for this device's architecture).
    pub fn entry(&self, variant: &str, pass: &str) -> Result<&Entry, Error> {
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.variant == variant && e.pass == pass)
        {
            return Ok(e);
        }
        self.manifest.select(variant, pass, self.arch)?;
        Err(Error::Library {
            path: self.manifest.dir().to_path_buf(),
            message: format!("the {pass} of `{variant}` was not loaded; this is a bug in aec"),
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The device the kernels are loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The architecture of the loaded cubins (`sm_90a`, `sm_80`).
    pub fn arch(&self) -> &str {
        self.arch
    }

    /// The library directory.
    pub fn dir(&self) -> &Path {
        self.manifest.dir()
    }
}
