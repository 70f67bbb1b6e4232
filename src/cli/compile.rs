//! `aec compile <variant.rs>… --target <t>… -o <dir>`: generated kernel
//! sources, code objects and a manifest. NVIDIA targets get the forward and
//! backward as CUDA sources and cubins (through NVRTC, no GPU needed); AMD
//! targets (mi250: gfx90a, mi300x: gfx942) get the HIP forward and backward
//! and, where hipcc or clang-19 is installed, their code objects.
//!
//! Recurrent variants get their CUDA forward and backward: the backward is
//! two sources (the states pass and the backward kernels), each with its
//! cubins, in one record whose launch plan names the states pass's module.
//! Where the backward cannot be generated (e.g. Dk = 16) the manifest has a
//! skipped backward record with the reason. AMD targets get the HIP
//! recurrent forward and backward (the same two modules, as `.hip` sources
//! and code objects); where the HIP backward cannot be generated (e.g. Dk =
//! 16) a skipped backward record says why.
//!
//! Next to the kernels it writes the library's loaders: `include/` (the C
//! header generated from the launch plans and the header-only loader) and
//! `python/aec_library.py` (the PyTorch module); Rust programs open the
//! directory with `aec::Library::open`.

use super::EXIT_INPUT;
use super::workload_tiles::{self, Declared, ForwardOfLibrary, untuned_tiles};
use aec::compiler::hip::backward::{HipBackwardConfig, hip_parallel_backward};
use aec::compiler::hip::dialect::{Gfx, HipPrelude};
use aec::compiler::hip::forward::{HipForwardConfig, hip_parallel_forward};
use aec::compiler::hip::recurrent::{HipRecurrentConfig, hip_recurrent_forward};
use aec::compiler::hip::recurrent_bwd::hip_recurrent_backward;
use aec::compiler::launch_plan::{
    EntryPlan, Role, STATES_MODULE, SizeExpr, backward_plan, forward_plan, recurrent_backward_plan,
    recurrent_forward_plan,
};
use aec::compiler::{
    BackwardConfig, BackwardSource, CompileError, Elem, ForwardConfig, ForwardKind, Isa,
    KernelSource, RecurrentBackwardSource, RecurrentConfig, RecurrentSource, parallel_backward,
    parallel_forward, recurrent_backward, recurrent_forward, untuned_forward_config,
};
use aec::frontend::ir::Axis;
use aec::frontend::{Invocation, Variant};
use aec::library::tuning_table::{BUCKET_SIZES, BUCKETED, TunedFor, tuned_configs};
use aec::library::{c_header, python};
use aec::run::{HeadDims, Shape};
use aec::runtime::{
    CompileOptions, HIP_TOOLCHAIN_HINT, TuningCache, compile, find_hip_compiler, hip_compile,
    hip_resources, nvrtc_present, nvrtc_version,
};
use aec::tune::{KeyParts, backward_key, forward_key, variant_hash};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// GPUs a library can be built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Target {
    A100,
    H100,
    H200,
    Mi250,
    Mi300x,
}

impl Target {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Target::A100 => "a100",
            Target::H100 => "h100",
            Target::H200 => "h200",
            Target::Mi250 => "mi250",
            Target::Mi300x => "mi300x",
        }
    }

    /// The AMD architecture, or None for NVIDIA targets.
    fn gfx(self) -> Option<Gfx> {
        Gfx::for_target(self.name())
    }

    /// The NVRTC architecture, or None for AMD targets.
    fn cuda_arch(self) -> Option<&'static str> {
        match self {
            Target::A100 => Some("sm_80"),
            Target::H100 | Target::H200 => Some("sm_90a"),
            Target::Mi250 | Target::Mi300x => None,
        }
    }
}

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// Rust files with `attention! { … }` variants (e.g. examples/softmax.rs).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// GPUs to build for (repeat or comma-separate).
    #[arg(
        long = "target",
        short = 't',
        value_enum,
        value_delimiter = ',',
        required = true
    )]
    pub targets: Vec<Target>,
    /// Output directory of the library.
    #[arg(long, short = 'o', default_value = "aec-lib")]
    pub out: PathBuf,
    /// Head dimensions for variants that do not fix them: `128` or `192x128`
    /// (Dqk x Dv; for recurrent variants Dk x Dv).
    #[arg(long, default_value = "128")]
    pub head_dims: String,
    /// A workload to record in the manifest (FlashInfer-Bench style):
    /// values for the free sizes of a kernel, e.g. `B=4,H=16,Sq=4096,Skv=4096`
    /// (parallel) or `B=8,H=16,S=2048` (recurrent). Repeatable; each is
    /// recorded for every definition whose free sizes it names exactly.
    /// Where the tile aec's runtime would run untuned for a parallel
    /// forward's workload on a CUDA target differs from the default (small
    /// grids: the cost model's choice; few rows: the decoding rule's), that
    /// tile is built too and the loaders run it for calls in the workload's
    /// shape bucket on that product.
    #[arg(long = "workload", value_name = "SIZES")]
    pub workloads: Vec<String>,
    /// The tuning cache whose results become the library's tuning table
    /// (default: $AEC_TUNING_CACHE, else $XDG_CACHE_HOME/aec/tuning-v1.json,
    /// else ~/.cache/aec/tuning-v1.json; `aec tune` and `aec tune
    /// --backward` fill it). Each tuned forward configuration or backward
    /// tile that differs from the default is built as one more kernel (the
    /// backward's three), launched for its GPU and shape buckets.
    #[arg(long, value_name = "FILE")]
    pub tuning_cache: Option<PathBuf>,
    /// Build the default configurations only, without reading a tuning cache.
    #[arg(long, conflicts_with = "tuning_cache")]
    pub no_tuning: bool,
    /// The parallel variants' K and V share storage: V is the first Dv
    /// columns of each K row (multi-head latent attention's cache, e.g.
    /// examples/mla_decode.rs). The forward reads V from K's rows and its
    /// callers pass the cache as both k and v (CUDA: one tile serves both;
    /// AMD: V's columns are read a second time, from cache); no backward (it
    /// writes dK and dV separately).
    #[arg(long)]
    pub v_in_k: bool,
}

pub fn run(args: &CompileArgs) -> ExitCode {
    match build(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(EXIT_INPUT)
        }
    }
}

pub(crate) fn parse_dims(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--head-dims `{s}`: expected `D` or `DQKxDV`, e.g. `128` or `192x128`");
    let (a, b) = s.split_once('x').unwrap_or((s, s));
    Ok((
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    ))
}

fn build(args: &CompileArgs) -> Result<(), String> {
    let (dqk, dv) = parse_dims(&args.head_dims)?;
    let declared = workload_tiles::parse(&args.workloads)?;
    let mut targets = args.targets.clone();
    targets.sort();
    targets.dedup();
    let mut variants: Vec<(String, Variant)> = Vec::new();
    for file in &args.files {
        let shown = file.display().to_string();
        let source = std::fs::read_to_string(file).map_err(|e| format!("{shown}: {e}"))?;
        let found = aec::frontend::parse_file(&source).map_err(|d| d.render(&shown, &source))?;
        if found.is_empty() {
            return Err(format!("no `attention! {{ … }}` found in {shown}"));
        }
        for Invocation { variant, .. } in found {
            let v = variant.map_err(|d| d.render(&shown, &source).trim_end().to_string())?;
            variants.push((shown.clone(), v));
        }
    }
    if args.v_in_k
        && let Some((file, v)) = variants.iter().find(|(_, v)| v.recurrent().is_some())
    {
        return Err(format!(
            "--v-in-k: `{}` ({file}) is a recurrent variant; shared K/V storage is for parallel variants",
            v.name
        ));
    }
    let with_nvrtc = nvrtc_present();
    let any_cuda = targets.iter().any(|t| t.cuda_arch().is_some());
    if any_cuda && !with_nvrtc {
        eprintln!(
            "note: NVRTC (libnvrtc.so.13) not found: writing CUDA sources only, no cubins; run `cargo xtask toolchains` and put its lib/ on LD_LIBRARY_PATH, or build on a machine with CUDA 13"
        );
    }
    let kernels_dir = args.out.join("kernels");
    std::fs::create_dir_all(&kernels_dir).map_err(|e| format!("{}: {e}", kernels_dir.display()))?;
    let cache = tuning_cache(args)?;
    let toolkit = nvrtc_version().ok().map(|(a, b)| format!("nvrtc {a}.{b}"));
    let mut tuned = TunedCounts::default();
    let mut workload_tiles = WorkloadTileCounts::default();
    let mut manifest_variants = Vec::new();
    for (file, v) in &variants {
        if v.recurrent().is_some() {
            manifest_variants.push(recurrent_variant(
                &kernels_dir,
                v,
                file,
                (dqk, dv),
                &targets,
                with_nvrtc,
            )?);
            continue;
        }
        let fixed = |a: Axis, d: u32| {
            v.fixed_sizes
                .iter()
                .find(|(x, _)| *x == a)
                .map(|(_, n)| *n as u32)
                .unwrap_or(d)
        };
        let (vq, vv) = (fixed(Axis::Dqk, dqk), fixed(Axis::Dv, dv));
        // One forward kernel per instruction set among the targets (Hopper
        // gets the wgmma template where the head dims allow it).
        let mut kernels = Vec::new();
        let mut isas: Vec<Isa> = targets
            .iter()
            .filter_map(|t| t.cuda_arch().map(Isa::for_arch))
            .collect();
        isas.dedup();
        let targets_of = |isa: Isa| -> Vec<Target> {
            targets
                .iter()
                .copied()
                .filter(|t| t.cuda_arch().map(Isa::for_arch) == Some(isa))
                .collect()
        };
        let hash = variant_hash(v);
        for &isa in &isas {
            let cfg = untuned_forward_config(
                ForwardConfig::default_for,
                v,
                vq,
                vv,
                Elem::Bf16,
                isa,
                args.v_in_k,
            );
            let k = parallel_forward(v, vq, vv, &cfg)
                .map_err(|e| format!("`{}` ({file}): {e}", v.name))?;
            let forward = CudaRecords {
                dir: &kernels_dir,
                variant: v,
                dims: (vq, vv),
                targets: &targets_of(isa),
                with_nvrtc,
            };
            kernels.push(forward.forward(&k, &cfg)?);
            // The tuning table: one more forward per tuned configuration,
            // launched for the GPUs and shape buckets it won.
            if let Some(cache) = &cache {
                let key = library_key(forward_key, v, &hash, (vq, vv), isa);
                let table = TunedTable {
                    cache,
                    toolkit: toolkit.as_deref(),
                    variant: &v.name,
                    what: "forward configuration",
                };
                let records = table.records(
                    &key,
                    &cfg,
                    &k.name,
                    |c| {
                        let c = ForwardConfig {
                            v_in_k: args.v_in_k,
                            ..*c
                        };
                        parallel_forward(v, vq, vv, &c).map(|k| (k.name.clone(), (k, c)))
                    },
                    |(k, c)| forward.forward(k, c),
                    &mut tuned.buckets,
                )?;
                tuned.forward += records.len();
                kernels.extend(records);
            }
            // The declared workloads' untuned tiles, after the measured
            // records (which win a bucket they share).
            let library_forward = ForwardOfLibrary {
                variant: v,
                dims: HeadDims::new(vq, vv),
                plan: &forward_plan(v, &k),
                default: &cfg,
                isa,
                targets: &targets_of(isa),
                v_in_k: args.v_in_k,
            };
            for tile in untuned_tiles(&library_forward, &declared)? {
                let label = tile.items[0]["config_label"].as_str().unwrap_or_default();
                let generated = match parallel_forward(v, vq, vv, &tile.config) {
                    Ok(g) if g.name != k.name => g,
                    Ok(_) => continue, // the default's kernel after all
                    Err(e) => {
                        eprintln!(
                            "warning: `{}`: the untuned tile {label} of a declared workload cannot be generated ({e}); those calls run the default",
                            v.name
                        );
                        continue;
                    }
                };
                for item in &tile.items {
                    eprintln!(
                        "workload tile: `{}` on {} at {}: {label} ({}{})",
                        v.name,
                        item["device"].as_str().unwrap_or_default(),
                        item["workload"].as_str().unwrap_or_default(),
                        item["chosen_by"].as_str().unwrap_or_default(),
                        item["model_speedup"]
                            .as_f64()
                            .map(|r| format!(", {r:.2}x the default by its estimate"))
                            .unwrap_or_default()
                    );
                }
                let mut record = forward.forward(&generated, &tile.config)?;
                workload_tiles.buckets += tile.items.len();
                record["tuned_for"] = Value::Array(tile.items);
                workload_tiles.kernels += 1;
                kernels.push(record);
            }
        }
        // The backward, per instruction set: three kernels in one source,
        // launched in order with the same arguments.
        for &isa in &isas {
            let bcfg = BackwardConfig::for_variant(v, vq, vv, Elem::Bf16, isa);
            let backward = CudaRecords {
                dir: &kernels_dir,
                variant: v,
                dims: (vq, vv),
                targets: &targets_of(isa),
                with_nvrtc,
            };
            let generated = if args.v_in_k {
                Err(CompileError(
                    "built with --v-in-k (K and V share storage): the backward writes dK and dV to separate tensors; build without --v-in-k for training".into(),
                ))
            } else {
                parallel_backward(v, vq, vv, &bcfg)
            };
            let default_name = match generated {
                Ok(b) => {
                    kernels.push(backward.backward(&b, &bcfg)?);
                    b.main.name
                }
                Err(e) => {
                    eprintln!(
                        "warning: `{}` ({file}): no backward kernels for {}: {e}",
                        v.name,
                        isa.arch()
                    );
                    kernels.push(json!({
                        "pass": "backward",
                        "arch": isa.arch(),
                        "targets": targets_of(isa).iter().map(|t| t.name()).collect::<Vec<_>>(),
                        "skipped": e.to_string(),
                    }));
                    continue;
                }
            };
            // The tuning table's backward tiles (`aec tune --backward`).
            let Some(cache) = &cache else { continue };
            let key = library_key(backward_key, v, &hash, (vq, vv), isa);
            let table = TunedTable {
                cache,
                toolkit: toolkit.as_deref(),
                variant: &v.name,
                what: "backward tile",
            };
            let records = table.records(
                &key,
                &bcfg,
                &default_name,
                |c| parallel_backward(v, vq, vv, c).map(|b| (b.main.name.clone(), (b, *c))),
                |(b, c)| backward.backward(b, c),
                &mut tuned.buckets,
            )?;
            tuned.backward += records.len();
            kernels.extend(records);
        }
        for t in targets.iter().filter(|t| t.gfx().is_some()) {
            kernels.extend(hip_kernels(
                &kernels_dir,
                v,
                file,
                (vq, vv),
                *t,
                args.v_in_k,
            )?);
        }
        manifest_variants.push(json!({
            "name": v.name,
            "file": file,
            "pattern": "parallel",
            "inputs": aec::frontend::print::to_json(v)["inputs"].clone(),
            "kernels": kernels,
        }));
    }
    let definitions: Vec<Value> = manifest_variants.iter().flat_map(definitions_of).collect();
    let workloads = workload_records(&declared, &definitions)?;
    let manifest = json!({
        "aec_version": env!("CARGO_PKG_VERSION"),
        "format": aec::library::MANIFEST_FORMAT,
        "contents": "generated sources and code objects (CUDA cubins for NVIDIA targets, HIP code objects for AMD targets) of the forward and backward of parallel variants and the CUDA and HIP forward and backward of recurrent variants (the recurrent backward is two modules: the backward kernels, each build's `cubin` or `code_object`, and the states pass, its `modules.states`; the HIP recurrent backward takes a scalar decay and no normaliser so far, other variants' AMD backward records say so); each kernel record carries its launch plan; include/ holds the C header and its header-only loader, python/ the PyTorch module",
        "tools": {
            "aec": env!("CARGO_PKG_VERSION"),
            "templates": format!("built into aec {}", env!("CARGO_PKG_VERSION")),
            "nvrtc": if with_nvrtc {
                nvrtc_version().map(|(a, b)| json!(format!("{a}.{b}"))).unwrap_or(Value::Null)
            } else {
                Value::Null
            },
        },
        "tuning": tuning_json(cache.as_ref(), &tuned, &workload_tiles),
        "definitions": definitions,
        "workloads": workloads,
        "variants": manifest_variants,
    });
    if let Some(cache) = &cache {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let kernels = tuned.forward + tuned.backward;
        eprintln!(
            "tuning table: {kernels} tuned kernel{} ({} forward, {} backward) for {} GPU and shape bucket{} from {}{}",
            plural(kernels),
            tuned.forward,
            tuned.backward,
            tuned.buckets,
            plural(tuned.buckets),
            cache_name(cache),
            if kernels == 0 {
                " (every kernel uses its default; `aec tune` and `aec tune --backward` fill the cache)"
            } else {
                ""
            }
        );
    }
    if !declared.is_empty() {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        eprintln!(
            "workload tiles: {} forward kernel{} for {} product and shape bucket{} of {} declared workload{}{}",
            workload_tiles.kernels,
            plural(workload_tiles.kernels),
            workload_tiles.buckets,
            plural(workload_tiles.buckets),
            declared.len(),
            plural(declared.len()),
            if workload_tiles.kernels == 0 {
                " (each runs the default tile there untuned)"
            } else {
                ""
            }
        );
    }
    let text = serde_json::to_string_pretty(&manifest).expect("JSON values serialise") + "\n";
    write(&args.out.join("manifest.json"), text.as_bytes())?;
    write_loaders(&args.out, &manifest)?;
    eprintln!(
        "wrote {} (with include/ for C and python/ for PyTorch)",
        args.out.join("manifest.json").display()
    );
    Ok(())
}

/// The tuning cache `aec compile` reads (`--tuning-cache`, else the default
/// file), or None with `--no-tuning` or when no default path is set. A
/// missing default file is an empty cache; a missing file given by name is
/// an error; an unreadable or outdated one is a warning and an empty cache.
fn tuning_cache(args: &CompileArgs) -> Result<Option<TuningCache>, String> {
    if args.no_tuning {
        return Ok(None);
    }
    let path = match &args.tuning_cache {
        Some(p) => {
            if !p.is_file() {
                return Err(format!(
                    "--tuning-cache {}: no such file (`aec tune --file-cache {}` writes one)",
                    p.display(),
                    p.display()
                ));
            }
            p.clone()
        }
        None => match TuningCache::default_path() {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let (cache, warning) = TuningCache::open(&path);
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    Ok(Some(cache))
}

/// The tuner's key (`key_of`: [`forward_key`] or [`backward_key`]) of a
/// bf16 kernel of `v` at head dims `dims` on any GPU, toolchain and shape of
/// `isa`: what the tuning table matches cache entries on.
fn library_key(
    key_of: fn(&Variant, &str, HeadDims, Shape, Elem, &KeyParts<'_>) -> aec::runtime::TuningKey,
    v: &Variant,
    hash: &str,
    (dqk, dv): (u32, u32),
    isa: Isa,
) -> aec::runtime::TuningKey {
    let shape = Shape::mha(1, 1, 1, 1);
    key_of(
        v,
        hash,
        HeadDims::new(dqk, dv),
        shape,
        Elem::Bf16,
        &any_gpu(isa),
    )
}

/// The tuner's key parts for a kernel on any GPU and toolchain of `isa`
/// (tuning-table lookups match the rest of the key).
fn any_gpu(isa: Isa) -> KeyParts<'static> {
    KeyParts {
        gpu: "",
        target: isa.arch(),
        driver: "",
        toolkit: "",
    }
}

/// Where a kernel library's tuning table comes from, for one variant.
struct TunedTable<'a> {
    cache: &'a TuningCache,
    /// The NVRTC the cubins are built with (its results win a bucket).
    toolkit: Option<&'a str>,
    variant: &'a str,
    /// What a configuration is, for warnings ("backward tile").
    what: &'a str,
}

impl TunedTable<'_> {
    /// The records of the tuned configurations of the kernel of `key` that
    /// differ from `default`: each generated (`generate`: its kernel's name
    /// and what `write` takes), written with its `tuned_for`; one that
    /// cannot be generated, or that names the default's kernel
    /// (`default_name`), is left out with a warning. Adds the GPU and shape
    /// buckets to `buckets`.
    fn records<C: serde::de::DeserializeOwned + PartialEq, K>(
        &self,
        key: &aec::runtime::TuningKey,
        default: &C,
        default_name: &str,
        generate: impl Fn(&C) -> Result<(String, K), CompileError>,
        write: impl Fn(&K) -> Result<Value, String>,
        buckets: &mut usize,
    ) -> Result<Vec<Value>, String> {
        let mut out = Vec::new();
        for (config, tuned_for) in tuned_configs(self.cache.entries(), key, default, self.toolkit) {
            let label = &tuned_for[0].config_label;
            let kernel = match generate(&config) {
                Ok((name, kernel)) if name != default_name => kernel,
                Ok(_) => {
                    eprintln!(
                        "warning: `{}`: the tuned {} {label} has the default's kernel names; left out of the tuning table",
                        self.variant, self.what
                    );
                    continue;
                }
                Err(e) => {
                    eprintln!(
                        "warning: `{}`: the tuned {} {label} from the tuning cache cannot be generated ({e}); left out of the tuning table",
                        self.variant, self.what
                    );
                    continue;
                }
            };
            let mut record = write(&kernel)?;
            record["tuned_for"] = tuned_for.iter().map(TunedFor::to_json).collect();
            *buckets += tuned_for.len();
            out.push(record);
        }
        Ok(out)
    }
}

/// How many tuned kernels (forwards, backwards) and GPU and shape buckets
/// the tuning table adds.
#[derive(Default)]
struct TunedCounts {
    forward: usize,
    backward: usize,
    buckets: usize,
}

/// How many forwards the declared workloads' untuned tiles add, for how
/// many product and shape buckets.
#[derive(Default)]
struct WorkloadTileCounts {
    kernels: usize,
    buckets: usize,
}

/// The manifest's `tuning` section: where the table came from and what it
/// holds (the tuned records themselves carry `tuned_for`).
fn tuning_json(
    cache: Option<&TuningCache>,
    tuned: &TunedCounts,
    workload_tiles: &WorkloadTileCounts,
) -> Value {
    let mut section = tuned_section(cache, tuned);
    section["workload_tiles"] = json!({
        "kernels": workload_tiles.kernels,
        "buckets": workload_tiles.buckets,
        "note": "a forward record whose `tuned_for` item names a `device` and its `sms` (not a `gpu`) runs on any GPU whose driver name contains that product's name, ignoring case, and that has that many multiprocessors, for calls in the item's bucket: the tile aec's runtime runs untuned for the declared `workload` there (`chosen_by`: the cost model, for grids the default leaves short of a wave, or the decoding rule), which differs from the default; records measured by `aec tune` come first and win a bucket they share",
    });
    section
}

/// [`tuning_json`] without the declared workloads' tiles.
fn tuned_section(cache: Option<&TuningCache>, tuned: &TunedCounts) -> Value {
    let Some(cache) = cache else {
        return json!({
            "method": "defaults",
            "note": "built without a tuning cache: every kernel uses its tile configuration's default for its head dims and architecture (the `config` of each kernel record) for every shape, except the declared workloads' tiles (`workload_tiles`)",
        });
    };
    let from = cache_name(cache);
    json!({
        "method": "tuning cache",
        "cache": from,
        "tuned_kernels": tuned.forward + tuned.backward,
        "tuned_forward_kernels": tuned.forward,
        "tuned_backward_kernels": tuned.backward,
        "tuned_buckets": tuned.buckets,
        "bucket_sizes": BUCKET_SIZES,
        "bucketed": BUCKETED,
        "note": "a forward or backward record with `tuned_for` runs on the GPU named there (the driver's device name) for calls of its pass whose B, H and Hkv equal its sizes and whose Sq and Skv round up to its powers of two; every other call runs the pass's record without `tuned_for`, the default configuration",
    })
}

/// Where and for what a parallel variant's CUDA kernels (forward and
/// backward) of one instruction set are written.
struct CudaRecords<'a> {
    dir: &'a Path,
    variant: &'a Variant,
    dims: (u32, u32),
    targets: &'a [Target],
    with_nvrtc: bool,
}

impl CudaRecords<'_> {
    /// Writes the forward kernel `k` of configuration `cfg` (and its cubins)
    /// and returns its manifest record.
    fn forward(&self, k: &KernelSource, cfg: &ForwardConfig) -> Result<Value, String> {
        let builds = write_and_compile(
            self.dir,
            &k.name,
            &k.source,
            self.targets,
            self.with_nvrtc,
            &self.variant.name,
        )?;
        Ok(json!({
            "pass": "forward",
            "entry": k.name,
            "source": format!("kernels/{}.cu", k.name),
            "builds": builds,
            "head_dims": { "Dqk": self.dims.0, "Dv": self.dims.1 },
            "row_outputs": k.row_outputs,
            "config": forward_config_json(cfg),
            "plan": forward_plan(self.variant, k),
        }))
    }

    /// Writes the backward `b` of configuration `cfg` (three kernels in one
    /// source, launched in order with the same arguments; and its cubins)
    /// and returns its manifest record.
    fn backward(&self, b: &BackwardSource, cfg: &BackwardConfig) -> Result<Value, String> {
        let base = b.main.name.trim_end_matches("_main").to_string();
        let builds = write_and_compile(
            self.dir,
            &base,
            &b.source,
            self.targets,
            self.with_nvrtc,
            &self.variant.name,
        )?;
        Ok(backward_json(
            json!({
                "block_m": cfg.block_m, "warps": cfg.warps,
                "split_d": cfg.split_d, "wgmma": cfg.wgmma,
                "kv_groups": cfg.kv_groups, "shared_scores": cfg.shared_scores,
                "warp_specialized": cfg.warp_specialized, "tma_loads": cfg.tma_loads,
                "elem": cfg.elem.name(),
            }),
            format!("kernels/{base}.cu"),
            json!(builds),
            self.dims,
            backward_plan(self.variant, self.dims, Elem::Bf16, b.kernels()),
        ))
    }
}

/// Where a tuning cache lives, for the manifest and messages.
fn cache_name(cache: &TuningCache) -> String {
    cache
        .path()
        .map_or_else(|| "memory".to_string(), |p| p.display().to_string())
}

/// A forward configuration as the manifest records it.
fn forward_config_json(cfg: &ForwardConfig) -> Value {
    json!({
        "block_m": cfg.block_m, "block_n": cfg.block_n, "warps": cfg.warps,
        "stages": cfg.stages, "wgmma": cfg.wgmma,
        "warp_specialized": cfg.warp_specialized, "pack_gqa": cfg.pack_gqa,
        "persistent": cfg.persistent, "q_in_registers": cfg.q_in_registers,
        "dv_split": cfg.dv_split, "elem": cfg.elem.name(),
    })
}

/// The library's loaders next to its manifest: the Python module and the C
/// header generated from the launch plans, with the header-only loader it
/// includes.
fn write_loaders(dir: &Path, manifest: &Value) -> Result<(), String> {
    let python = dir.join(python::MODULE_PATH);
    let include = dir.join("include");
    for d in [
        python.parent().expect("a file in a folder"),
        include.as_path(),
    ] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    write(&python, python::MODULE.as_bytes())?;
    let header = c_header::generate(manifest).map_err(|e| format!("the C header: {e}"))?;
    write(&include.join("aec_library.h"), header.as_bytes())?;
    write(&include.join("aec_loader.h"), c_header::LOADER_H.as_bytes())
}

/// The instruction set in file names: `sm80`, `sm90a`.
fn isa_tag(isa: Isa) -> &'static str {
    match isa {
        Isa::Sm80 => "sm80",
        Isa::Sm90a => "sm90a",
    }
}

/// The CUDA architectures among `targets`, one instruction set each, with
/// the targets that share it.
fn cuda_isas(targets: &[Target]) -> Vec<(Isa, Vec<Target>)> {
    let mut out: Vec<(Isa, Vec<Target>)> = Vec::new();
    for &t in targets {
        let Some(isa) = t.cuda_arch().map(Isa::for_arch) else {
            continue;
        };
        match out.iter_mut().find(|(i, _)| *i == isa) {
            Some((_, ts)) => ts.push(t),
            None => out.push((isa, vec![t])),
        }
    }
    out
}

/// A recurrent variant's manifest record: its CUDA forward and backward per
/// instruction set among the targets (sources, cubins with NVRTC, launch
/// plans, configuration; a skipped backward record with the reason where
/// the backward cannot be generated), and skipped entries per AMD target.
fn recurrent_variant(
    dir: &Path,
    v: &Variant,
    file: &str,
    (dk, dv): (u32, u32),
    targets: &[Target],
    with_nvrtc: bool,
) -> Result<Value, String> {
    let fixed = |a: Axis, d: u32| {
        v.fixed_sizes
            .iter()
            .find(|(x, _)| *x == a)
            .map(|(_, n)| *n as u32)
            .unwrap_or(d)
    };
    let (dk, dv) = (fixed(Axis::Dk, dk), fixed(Axis::Dv, dv));
    // One kernel per configuration: where the instruction sets get the same
    // one (the template is sm_80-class), one source with a cubin per arch.
    let mut generated: Vec<(RecurrentSource, Vec<Target>)> = Vec::new();
    for (isa, isa_targets) in cuda_isas(targets) {
        let cfg = RecurrentConfig::for_variant(v, dk, dv, Elem::Bf16, isa);
        let k = recurrent_forward(v, dk, dv, &cfg)
            .map_err(|e| format!("`{}` ({file}): {e}", v.name))?;
        match generated
            .iter_mut()
            .find(|(g, _)| g.name == k.name && g.source == k.source)
        {
            Some((_, ts)) => ts.extend(isa_targets),
            None => generated.push((k, isa_targets)),
        }
    }
    let mut kernels = Vec::new();
    for (k, ts) in &generated {
        let builds = write_and_compile(dir, &k.name, &k.source, ts, with_nvrtc, &v.name)?;
        kernels.push(recurrent_json(
            k,
            "cu",
            builds,
            recurrent_forward_plan(v, k),
        ));
    }
    // The backward with the forward's configuration, per instruction set
    // (its shared memory decides the `_dv` kernel's buffers); one record
    // where the sources agree.
    let mut backwards: Vec<(RecurrentBackwardSource, Vec<Target>, Isa)> = Vec::new();
    for (isa, isa_targets) in cuda_isas(targets) {
        let cfg = RecurrentConfig::for_variant(v, dk, dv, Elem::Bf16, isa);
        let generated = recurrent_backward(v, dk, dv, &cfg, isa).and_then(|b| {
            let plan = recurrent_backward_plan(v, &b);
            aec::library::validate_plan(&plan).map_err(|e| {
                aec::compiler::CompileError(format!(
                    "its launch plan is inconsistent: {e} (a custom input named like one of \
                     the backward's buffers, or whose gradient `d<name>` is: rename it)"
                ))
            })?;
            Ok(b)
        });
        match generated {
            Ok(b) => match backwards.iter_mut().find(|(g, _, _)| {
                g.name == b.name
                    && g.source == b.source
                    && g.states.name == b.states.name
                    && g.states.source == b.states.source
            }) {
                Some((_, ts, _)) => ts.extend(isa_targets),
                None => backwards.push((b, isa_targets, isa)),
            },
            Err(e) => {
                eprintln!(
                    "warning: `{}` ({file}): no backward kernels for {}: {e}",
                    v.name,
                    isa.arch()
                );
                kernels.push(json!({
                    "pass": "backward",
                    "arch": isa.arch(),
                    "targets": isa_targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
                    "skipped": e.to_string(),
                }));
            }
        }
    }
    // The kernel names do not say everything the instruction set changes
    // (the `_dv` kernel's buffers): a source whose name another record's
    // different source shares gets the instruction set in its file name.
    let file_base = |name: &str,
                     source: &str,
                     isa: Isa,
                     of: &dyn Fn(&RecurrentBackwardSource) -> (&str, &str)| {
        let clash = backwards.iter().any(|(g, _, _)| {
            let (n, s) = of(g);
            n == name && s != source
        });
        if clash {
            format!("{name}_{}", isa_tag(isa))
        } else {
            name.to_string()
        }
    };
    for (b, ts, isa) in &backwards {
        let states_base = file_base(&b.states.name, &b.states.source, *isa, &|g| {
            (g.states.name.as_str(), g.states.source.as_str())
        });
        let base = file_base(&b.name, &b.source, *isa, &|g| {
            (g.name.as_str(), g.source.as_str())
        });
        let states =
            write_and_compile(dir, &states_base, &b.states.source, ts, with_nvrtc, &v.name)?;
        let mut builds = write_and_compile(dir, &base, &b.source, ts, with_nvrtc, &v.name)?;
        for (build, st) in builds.iter_mut().zip(&states) {
            build["modules"] = json!({ STATES_MODULE: st["cubin"] });
        }
        kernels.push(recurrent_backward_json(
            b,
            (&base, &states_base),
            "cu",
            builds,
            recurrent_backward_plan(v, b),
        ));
    }
    for t in targets.iter().copied().filter(|t| t.gfx().is_some()) {
        kernels.extend(hip_recurrent_kernels(dir, v, file, (dk, dv), t)?);
    }
    Ok(json!({
        "name": v.name,
        "file": file,
        "pattern": "recurrent",
        "inputs": aec::frontend::print::to_json(v)["inputs"].clone(),
        "kernels": kernels,
    }))
}

/// A recurrent variant's kernels for one AMD target: the HIP forward and the
/// HIP backward (sources, code objects with their resources, launch plans,
/// configuration), or a skipped backward record saying why there is none.
fn hip_recurrent_kernels(
    dir: &Path,
    v: &Variant,
    file: &str,
    (dk, dv): (u32, u32),
    target: Target,
) -> Result<Vec<Value>, String> {
    let gfx = target.gfx().expect("AMD target");
    let cfg = HipRecurrentConfig::default_for(dk, dv, ForwardKind::of(v), Elem::Bf16);
    let k = hip_recurrent_forward(v, dk, dv, &cfg, gfx, HipPrelude::Amdgcn)
        .map_err(|e| format!("`{}` ({file}): {e}", v.name))?;
    let build = hip_build(
        dir,
        &k.name,
        &k.source,
        &k.name,
        cfg.waves(),
        target,
        &v.name,
    )?;
    let forward = recurrent_json(&k, "hip", vec![build], recurrent_forward_plan(v, &k));
    let backward = hip_recurrent_backward(v, dk, dv, &cfg, gfx, HipPrelude::Amdgcn).and_then(|b| {
        let plan = recurrent_backward_plan(v, &b);
        aec::library::validate_plan(&plan).map_err(|e| {
            aec::compiler::CompileError(format!("its launch plan is inconsistent: {e}"))
        })?;
        Ok((b, plan))
    });
    let backward = match backward {
        Ok((b, plan)) => {
            // Resources of the widest kernel (`_dqk`); the states pass is a forward.
            let dqk = b.kernels.iter().find(|k| k.name.ends_with("_dqk"));
            let entry = dqk.map_or(b.name.clone(), |k| k.name.clone());
            let states = hip_build(
                dir,
                &b.states.name,
                &b.states.source,
                &b.states.name,
                cfg.waves(),
                target,
                &v.name,
            )?;
            let mut build = hip_build(dir, &b.name, &b.source, &entry, 4, target, &v.name)?;
            build["modules"] = json!({ STATES_MODULE: states["code_object"] });
            recurrent_backward_json(&b, (&b.name, &b.states.name), "hip", vec![build], plan)
        }
        Err(e) => {
            eprintln!(
                "warning: `{}` ({file}): no HIP backward for {}: {e}",
                v.name,
                target.name()
            );
            json!({ "pass": "backward", "target": target.name(), "skipped": e.to_string() })
        }
    };
    Ok(vec![forward, backward])
}

/// The manifest record of a recurrent backward: the backward kernels'
/// source (each build's `cubin` or `code_object`) and the states pass's
/// (`sources.states`, each build's `modules.states`), files
/// `kernels/<base>.<ext>`, the kernels in launch order, the plan.
fn recurrent_backward_json(
    b: &RecurrentBackwardSource,
    (base, states_base): (&str, &str),
    ext: &str,
    builds: Vec<Value>,
    plan: EntryPlan,
) -> Value {
    json!({
        "pass": "backward",
        "entry": b.name,
        "source": format!("kernels/{base}.{ext}"),
        "sources": { STATES_MODULE: format!("kernels/{states_base}.{ext}") },
        "builds": builds,
        "head_dims": { "Dk": b.dk, "Dv": b.dv },
        "config": recurrent_config_json(&b.config),
        "normalized": b.normalized,
        "decay": b.decay,
        "kernels": b.kernels.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
        "plan": plan,
    })
}

/// A recurrent tile configuration as the manifest writes it.
fn recurrent_config_json(c: &RecurrentConfig) -> Value {
    let RecurrentConfig {
        chunk,
        dv_tile,
        warps,
        stages,
        blocks_per_sm,
        wgmma,
        elem,
    } = *c;
    json!({ "chunk": chunk, "dv_tile": dv_tile, "warps": warps, "stages": stages, "blocks_per_sm": blocks_per_sm, "wgmma": wgmma, "elem": elem.name() })
}

/// The manifest record of a recurrent forward (its source
/// `kernels/<entry>.<ext>`).
fn recurrent_json(k: &RecurrentSource, ext: &str, builds: Vec<Value>, plan: EntryPlan) -> Value {
    json!({
        "pass": "forward",
        "entry": k.name,
        "source": format!("kernels/{}.{ext}", k.name),
        "builds": builds,
        "head_dims": { "Dk": k.dk, "Dv": k.dv },
        "config": recurrent_config_json(&k.config),
        "normalized": k.normalized,
        "plan": plan,
    })
}

/// The manifest record of a backward (either target): its source, builds
/// and launch plan.
fn backward_json(
    config: Value,
    source: String,
    builds: Value,
    (dqk, dv): (u32, u32),
    plan: EntryPlan,
) -> Value {
    json!({
        "pass": "backward",
        "config": config,
        "source": source,
        "builds": builds,
        "head_dims": { "Dqk": dqk, "Dv": dv },
        "plan": plan,
    })
}

/// Writes `<base>.hip` and, where a HIP compiler is installed, its code
/// object `<base>.co`; returns the manifest's build record, with the
/// resources of `entry` (a workgroup of `waves` waves) read back.
fn hip_build(
    dir: &Path,
    base: &str,
    source: &str,
    entry: &str,
    waves: u32,
    target: Target,
    variant: &str,
) -> Result<Value, String> {
    let gfx = target.gfx().expect("AMD target");
    write(&dir.join(format!("{base}.hip")), source.as_bytes())?;
    let (code_object, report) = match find_hip_compiler(gfx.name()) {
        Ok(_) => {
            eprintln!("compiling {base} for {} …", gfx.name());
            let co = hip_compile(source, gfx.name()).map_err(|e| format!("`{variant}`: {e}"))?;
            // The kernel names already end in the architecture.
            let name = format!("{base}.co");
            write(&dir.join(&name), &co.elf)?;
            let usage = hip_resources(&co.elf).ok().and_then(|r| {
                r.into_iter().find(|r| r.name == entry).map(|r| {
                    if r.scratch_bytes > 0 {
                        eprintln!(
                            "note: `{variant}`: {entry} uses {} bytes of scratch per work-item on {} \
                             ({} VGPRs; spills or a stack; the build's `report` in the manifest has its resources)",
                            r.scratch_bytes,
                            gfx.name(),
                            r.vgprs
                        );
                    }
                    json!({ "entry": entry, "vgprs": r.vgprs, "agprs": r.agprs, "sgprs": r.sgprs, "lds_bytes": r.lds_bytes,
                            "scratch_bytes": r.scratch_bytes, "waves_per_simd": r.waves_per_simd(waves) })
                })
            });
            (
                json!(format!("kernels/{name}")),
                json!({ "compiler": co.compiler, "usage": usage }),
            )
        }
        Err(e) => {
            eprintln!("note: {e}: writing the HIP source of `{variant}` only");
            (
                Value::Null,
                json!({ "missing_toolchain": HIP_TOOLCHAIN_HINT }),
            )
        }
    };
    Ok(
        json!({ "target": target.name(), "arch": gfx.name(), "code_object": code_object, "report": report }),
    )
}

/// The HIP kernels of a parallel variant for one AMD target: the forward
/// and the three backward kernels, as sources and (with a HIP compiler)
/// code objects with their resources.
fn hip_kernels(
    dir: &Path,
    v: &Variant,
    file: &str,
    (dqk, dv): (u32, u32),
    target: Target,
    v_in_k: bool,
) -> Result<Vec<Value>, String> {
    let gfx = target.gfx().expect("AMD target");
    let cfg = HipForwardConfig {
        v_in_k,
        ..HipForwardConfig::default_for(v, dqk, dv, Elem::Bf16)
    };
    let k = hip_parallel_forward(v, dqk, dv, &cfg, gfx, HipPrelude::Amdgcn)
        .map_err(|e| format!("`{}` ({file}): {e}", v.name))?;
    let build = hip_build(dir, &k.name, &k.source, &k.name, cfg.waves, target, &v.name)?;
    let mut kernels = vec![json!({
        "pass": "forward",
        "entry": k.name,
        "source": format!("kernels/{}.hip", k.name),
        "builds": [build],
        "head_dims": { "Dqk": dqk, "Dv": dv },
        "row_outputs": k.row_outputs,
        "config": json!({
            "block_m": cfg.block_m, "block_n": cfg.block_n, "waves": cfg.waves,
            "pack_gqa": cfg.pack_gqa, "elem": cfg.elem.name(), "v_in_k": cfg.v_in_k,
        }),
        "plan": forward_plan(v, &k),
    })];
    let bcfg = HipBackwardConfig::default_for(dqk, dv, Elem::Bf16);
    let backward = if v_in_k {
        Err(CompileError(
            "built with --v-in-k (K and V share storage): the backward writes dK and dV to separate tensors; build without --v-in-k for training".into(),
        ))
    } else {
        hip_parallel_backward(v, dqk, dv, &bcfg, gfx, HipPrelude::Amdgcn)
    };
    match backward {
        Ok(b) => {
            let base = b.main.name.trim_end_matches("_main").to_string();
            let build = hip_build(
                dir,
                &base,
                &b.source,
                &b.main.name,
                bcfg.waves,
                target,
                &v.name,
            )?;
            kernels.push(backward_json(
                json!({ "block_m": bcfg.block_m, "waves": bcfg.waves, "split_d": bcfg.split_d, "elem": bcfg.elem.name() }),
                format!("kernels/{base}.hip"),
                json!([build]),
                (dqk, dv),
                backward_plan(v, (dqk, dv), Elem::Bf16, b.kernels()),
            ));
        }
        Err(e) => {
            eprintln!(
                "warning: `{}` ({file}): no HIP backward kernels for {}: {e}",
                v.name,
                target.name()
            );
            kernels.push(
                json!({ "pass": "backward", "target": target.name(), "skipped": e.to_string() }),
            );
        }
    }
    Ok(kernels)
}

/// Writes `<name>.cu` and, with NVRTC, one cubin per architecture (h100 and
/// h200 share sm_90a); returns the manifest's `builds`, each with ptxas's
/// report of its entry functions (registers, spills, shared memory), and
/// warns where an entry spills.
fn write_and_compile(
    dir: &Path,
    name: &str,
    source: &str,
    targets: &[Target],
    with_nvrtc: bool,
    variant: &str,
) -> Result<Vec<Value>, String> {
    write(&dir.join(format!("{name}.cu")), source.as_bytes())?;
    let mut builds = Vec::new();
    let mut built: Vec<(&str, Value, Value)> = Vec::new();
    for t in targets {
        let arch = t.cuda_arch().expect("CUDA target");
        let (cubin, report) = match built.iter().find(|(a, ..)| *a == arch) {
            Some((_, c, r)) => (c.clone(), r.clone()),
            None if with_nvrtc => {
                eprintln!("compiling {name} for {arch} …");
                let compiled = compile(source, &CompileOptions::new(arch).with_resource_usage())
                    .map_err(|e| format!("`{variant}`: {e}"))?;
                let file = format!("{name}.{arch}.cubin");
                write(&dir.join(&file), &compiled.cubin)?;
                let usage = compiled.resources();
                for u in usage.iter().filter(|u| u.spills()) {
                    eprintln!(
                        "note: `{variant}`: {} spills on {arch}: {} bytes stored and {} loaded per thread \
                         at {} registers (each build's `report` in the manifest lists its entries' resources)",
                        u.function, u.spill_store_bytes, u.spill_load_bytes, u.registers
                    );
                }
                let compiler = nvrtc_version()
                    .map(|(a, b)| format!("nvrtc {a}.{b}"))
                    .unwrap_or_else(|_| "nvrtc".into());
                (
                    Value::String(format!("kernels/{file}")),
                    json!({ "compiler": compiler, "usage": usage.iter().map(usage_json).collect::<Vec<_>>() }),
                )
            }
            None => (Value::Null, Value::Null),
        };
        built.push((arch, cubin.clone(), report.clone()));
        let mut build = json!({ "target": t.name(), "arch": arch, "cubin": cubin });
        if !report.is_null() {
            build["report"] = report;
        }
        builds.push(build);
    }
    Ok(builds)
}

/// One entry function's resources in a CUDA build's `report`.
fn usage_json(u: &aec::runtime::ResourceUsage) -> Value {
    json!({
        "entry": u.function, "registers": u.registers,
        "spill_store_bytes": u.spill_store_bytes, "spill_load_bytes": u.spill_load_bytes,
        "stack_frame_bytes": u.stack_frame_bytes, "shared_bytes": u.shared_bytes,
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The kernel definitions of a variant's manifest record, one per pass, in
/// the spirit of FlashInfer Trace: the axes (free `var` ones and `const` ones
/// with their values), the inputs and outputs with shapes and dtypes, and
/// where the reference semantics live.
fn definitions_of(variant: &Value) -> Vec<Value> {
    let name = variant["name"].as_str().unwrap_or_default();
    let mut out: Vec<Value> = Vec::new();
    let kernels = variant["kernels"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for k in kernels {
        let Some(plan) = k
            .get("plan")
            .and_then(|p| serde_json::from_value::<EntryPlan>(p.clone()).ok())
        else {
            continue;
        };
        let def_name = definition_name(name, &plan.pass, &k["head_dims"]);
        if out.iter().any(|d| d["name"] == def_name.as_str()) {
            continue; // the same definition, another architecture
        }
        let mut axes = serde_json::Map::new();
        for s in &plan.sizes {
            let alias = plan
                .equal
                .iter()
                .find(|[a, _]| *a == s.name)
                .map(|[_, b]| b);
            axes.insert(
                s.name.clone(),
                match (s.fixed, alias) {
                    (Some(n), _) => json!({ "type": "const", "value": n }),
                    // Hkv of a variant without grouped-query heads: H.
                    (None, Some(b)) => json!({ "type": "alias", "of": b }),
                    (None, None) => json!({ "type": "var" }),
                },
            );
        }
        if let Some(dims) = k["head_dims"].as_object() {
            for (d, n) in dims {
                axes.insert(d.clone(), json!({ "type": "const", "value": n }));
            }
        }
        let tensors = |roles: &[Role]| -> serde_json::Map<String, Value> {
            plan.buffers
                .iter()
                .filter(|b| roles.contains(&b.role))
                .map(|b| {
                    let shape: Vec<Value> = b
                        .shape
                        .iter()
                        .map(|e| match e {
                            SizeExpr::Const(n) => json!(n),
                            other => json!(other.to_string()),
                        })
                        .collect();
                    let mut t =
                        json!({ "shape": shape, "dtype": b.dtype.name(), "description": b.doc });
                    if matches!(b.role, Role::OptionalInput | Role::OptionalOutput) {
                        t["optional"] = json!(true);
                    }
                    (b.name.clone(), t)
                })
                .collect()
        };
        out.push(json!({
            "name": def_name,
            "op_type": format!("attention_{}", variant["pattern"].as_str().unwrap_or_default()),
            "variant": name,
            "pass": plan.pass,
            "axes": axes,
            "inputs": tensors(&[Role::Input, Role::OptionalInput]),
            "outputs": tensors(&[Role::Output, Role::OptionalOutput]),
            "reference": format!(
                "aec::reference::{} (the f64 reference interpreter) on `{name}` as declared in {}",
                plan.pass,
                variant["file"].as_str().unwrap_or_default()
            ),
        }));
    }
    out
}

/// `softmax_forward_dqk128_dv128`: the variant in snake case, the pass and
/// the head dims.
fn definition_name(variant: &str, pass: &str, dims: &Value) -> String {
    let mut snake = String::new();
    for (i, ch) in variant.char_indices() {
        if ch.is_uppercase() && i > 0 && !variant[..i].ends_with(|c: char| c.is_uppercase()) {
            snake.push('_');
        }
        snake.extend(ch.to_lowercase());
    }
    let mut name = format!("{snake}_{pass}");
    if let Some(dims) = dims.as_object() {
        for (d, n) in dims {
            name.push_str(&format!("_{}{n}", d.to_lowercase()));
        }
    }
    name
}

/// The manifest's workload records: each `--workload` for every definition
/// whose free sizes it names exactly; one that fits no definition is an
/// error naming the free sizes the definitions have.
fn workload_records(given: &[Declared], definitions: &[Value]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for Declared {
        text: w,
        sizes: axes,
    } in given
    {
        let mut matched = false;
        for d in definitions {
            let free: Vec<&String> = d["axes"]
                .as_object()
                .map(|a| {
                    a.iter()
                        .filter(|(_, t)| t["type"] == "var")
                        .map(|(k, _)| k)
                        .collect()
                })
                .unwrap_or_default();
            if free.len() == axes.len() && free.iter().all(|k| axes.contains_key(*k)) {
                matched = true;
                let inputs: serde_json::Map<String, Value> = d["inputs"]
                    .as_object()
                    .map(|i| {
                        i.keys()
                            .map(|k| {
                                // The backward reads what the forward wrote.
                                let from_forward = d["pass"] == "backward"
                                    && matches!(k.as_str(), "o" | "row_outputs");
                                let kind = if from_forward { "forward" } else { "random" };
                                (k.clone(), json!({ "type": kind }))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(json!({
                    "definition": d["name"],
                    "workload": { "axes": axes.clone(), "inputs": inputs },
                }));
            }
        }
        if !matched {
            let mut kinds: Vec<String> = definitions
                .iter()
                .map(|d| {
                    let free: Vec<&str> = d["axes"]
                        .as_object()
                        .map(|a| {
                            a.iter()
                                .filter(|(_, t)| t["type"] == "var")
                                .map(|(k, _)| k.as_str())
                                .collect()
                        })
                        .unwrap_or_default();
                    free.join(",")
                })
                .collect();
            kinds.sort();
            kinds.dedup();
            return Err(format!(
                "--workload `{w}` fits no kernel of this library: the free sizes are {}",
                kinds
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ));
        }
    }
    Ok(out)
}
