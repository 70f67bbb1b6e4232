//! `aec tune <variant.rs> --shape B,H,Hkv,Sq,Skv --head-dims D`: tunes the
//! parallel forward for each shape on the GPU present (model ranking,
//! parallel compilation, profiling of the top plans and the default) and
//! stores the winners in the tuning cache, which `ParallelKernels::
//! compile_for_shape` reads. With `--backward` it tunes the backward's tile
//! the same way over its space (ranked by the backward's cost model), and
//! for a recurrent variant (`--shape B,H,S`) its chunked forward's tile
//! (with `--backward`, its backward's; no cost model: the space's order).
//! With `--target <device>` it only ranks the parallel forward's plans (with
//! `--backward`, the backward's tiles, CUDA targets) with the cost model,
//! which needs no GPU (AMD targets included for the forward).

use super::EXIT_INPUT;
use super::compile::Target;
use aec::compiler::schedule::{DeviceConfig, rank_forward};
use aec::compiler::{BackwardConfig, RecurrentConfig};
use aec::frontend::{Invocation, Variant};
use aec::run::{HeadDims, KernelElement, RecurrentDims, RecurrentShape, Shape};
use aec::runtime::{Device, TuningCache, bf16, f16, performance_portability};
use aec::tune::gpu::{BackwardGpuProfiler, GpuProfiler, RecurrentGpuProfiler, RecurrentPass};
use aec::tune::{
    TuneOptions, TuneProgress, TuneReport, backward_key, dispatch, forward_key, problem_of,
    tune_backward, tune_forward, tune_recurrent, variant_hash,
};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// A Rust file with `attention! { … }` (a parallel or recurrent variant).
    pub file: PathBuf,
    /// The variant to tune when the file holds several (by name).
    #[arg(long)]
    pub variant: Option<String>,
    /// A call shape (repeatable): `B,H,Hkv,Sq,Skv` for a parallel variant,
    /// `B,H,S` for a recurrent one. Tuning results are kept per shape
    /// bucket: sequence lengths rounded up to powers of two.
    #[arg(long = "shape", required = true, value_parser = parse_shape)]
    pub shapes: Vec<CallShape>,
    /// Head dims: `D` or `DQKxDV` (e.g. 128 or 192x128; for a recurrent
    /// variant `DKxDV`).
    #[arg(long, default_value = "128")]
    pub head_dims: String,
    /// The range of values drawn for a custom input while profiling,
    /// `NAME=LO,HI` (repeatable; others are drawn from [0.5, 1)): e.g.
    /// Mamba2's `a=-4,-0.5`, whose decay `exp(dt · a)` needs it negative.
    #[arg(long = "custom-range", value_parser = parse_custom_range)]
    pub custom_ranges: Vec<(String, f32, f32)>,
    /// fp16 operands instead of bf16.
    #[arg(long)]
    pub f16: bool,
    /// Rank with the cost model for this device instead of profiling on the
    /// GPU present (no GPU needed; the only way for AMD targets here).
    #[arg(long, value_enum)]
    pub target: Option<Target>,
    /// The CUDA device to tune on.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Tune the backward instead of the forward (a parallel variant's main
    /// kernel tile; a recurrent variant's backward tile).
    #[arg(long)]
    pub backward: bool,
    /// Plans from the top of the model's ranking to profile, besides the
    /// default (for the backwards and a recurrent forward: the first in
    /// their space's order).
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// Timed runs per plan (the median is kept).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Milliseconds of untimed runs before each plan is timed, so the GPU
    /// settles at its sustained clocks (0: three runs only).
    #[arg(long, default_value_t = 200.0)]
    pub warmup_ms: f64,
    /// The tuning cache file (default: $AEC_TUNING_CACHE, else
    /// $XDG_CACHE_HOME/aec/tuning-v1.json, else ~/.cache/aec/tuning-v1.json).
    #[arg(long)]
    pub file_cache: Option<PathBuf>,
    /// Tune and report without storing the results.
    #[arg(long)]
    pub no_save: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A `--shape`: five sizes for a parallel variant, three for a recurrent one.
#[derive(Clone, Copy, Debug)]
pub enum CallShape {
    Parallel(Shape),
    Recurrent(RecurrentShape),
}

impl std::fmt::Display for CallShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallShape::Parallel(s) => s.fmt(f),
            CallShape::Recurrent(s) => s.fmt(f),
        }
    }
}

fn parse_shape(s: &str) -> Result<CallShape, String> {
    let n: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            format!("`{s}`: expected B,H,Hkv,Sq,Skv (or B,H,S for a recurrent variant), e.g. 8,32,32,2048,2048")
        })?;
    if n.contains(&0) {
        return Err(format!("`{s}`: every size must be at least 1"));
    }
    match n[..] {
        [b, h, hkv, sq, skv] => Ok(CallShape::Parallel(Shape::new(b, h, hkv, sq, skv))),
        [b, h, steps] => Ok(CallShape::Recurrent(RecurrentShape::new(b, h, steps))),
        _ => Err(format!(
            "`{s}`: expected five sizes B,H,Hkv,Sq,Skv (a parallel variant) or three B,H,S (a recurrent one)"
        )),
    }
}

fn parse_custom_range(s: &str) -> Result<(String, f32, f32), String> {
    let bad = || format!("`{s}`: expected NAME=LO,HI with LO < HI, e.g. a=-4,-0.5");
    let (name, range) = s.split_once('=').ok_or_else(bad)?;
    let (lo, hi) = range.split_once(',').ok_or_else(bad)?;
    let (lo, hi): (f32, f32) = (
        lo.trim().parse().map_err(|_| bad())?,
        hi.trim().parse().map_err(|_| bad())?,
    );
    if name.trim().is_empty() || lo >= hi || !lo.is_finite() || !hi.is_finite() {
        return Err(bad());
    }
    Ok((name.trim().to_string(), lo, hi))
}

pub fn run(args: &TuneArgs) -> ExitCode {
    match tune(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(EXIT_INPUT)
        }
    }
}

fn load_variant(args: &TuneArgs) -> Result<Variant, String> {
    let shown = args.file.display().to_string();
    let source = std::fs::read_to_string(&args.file).map_err(|e| format!("{shown}: {e}"))?;
    let found = aec::frontend::parse_file(&source).map_err(|d| d.render(&shown, &source))?;
    let mut variants = Vec::new();
    for Invocation { variant, .. } in found {
        variants.push(variant.map_err(|d| d.render(&shown, &source).trim_end().to_string())?);
    }
    let names: Vec<String> = variants.iter().map(|v| v.name.clone()).collect();
    let v = match &args.variant {
        Some(name) => variants
            .into_iter()
            .find(|v| &v.name == name)
            .ok_or_else(|| {
                format!(
                    "{shown} has no variant `{name}` (it has: {})",
                    names.join(", ")
                )
            })?,
        None if variants.len() == 1 => variants.remove(0),
        None if variants.is_empty() => {
            return Err(format!("no `attention! {{ … }}` found in {shown}"));
        }
        None => {
            return Err(format!(
                "{shown} has several variants ({}): choose one with --variant",
                names.join(", ")
            ));
        }
    };
    Ok(v)
}

fn tune(args: &TuneArgs) -> Result<(), String> {
    let variant = load_variant(args)?;
    let (dqk, dv) = super::compile::parse_dims(&args.head_dims)?;
    let dims = HeadDims::new(dqk, dv);
    let elem = if args.f16 {
        aec::compiler::Elem::F16
    } else {
        aec::compiler::Elem::Bf16
    };
    let recurrent = variant.recurrent().is_some();
    let rdims = RecurrentDims::new(dqk, dv);
    for shape in &args.shapes {
        let at = |e: String| format!("--shape {shape}: {e}");
        match *shape {
            CallShape::Parallel(s) if !recurrent => {
                let lens = aec::tune::declared_lens(&variant, dims, s).map_err(at)?;
                let lens: Vec<(&str, usize)> = lens.iter().map(|(n, l)| (n.as_str(), *l)).collect();
                aec::run::check_shapes(&variant, dims, s, &lens).map_err(|e| at(e.to_string()))?;
            }
            CallShape::Recurrent(s) if recurrent => {
                let lens = aec::tune::recurrent_declared_lens(&variant, rdims, s).map_err(at)?;
                let lens: Vec<(&str, usize)> = lens.iter().map(|(n, l)| (n.as_str(), *l)).collect();
                aec::run::check_recurrent_shapes(&variant, rdims, s, &lens, None, None)
                    .map_err(|e| at(e.to_string()))?;
            }
            CallShape::Parallel(_) => {
                return Err(at(format!(
                    "`{}` is a recurrent variant: give its shapes as B,H,S",
                    variant.name
                )));
            }
            CallShape::Recurrent(_) => {
                return Err(at(format!(
                    "`{}` is a parallel variant: give its shapes as B,H,Hkv,Sq,Skv",
                    variant.name
                )));
            }
        }
    }
    if let Some(target) = args.target {
        if recurrent {
            return Err(format!(
                "--target with a recurrent variant: the {} has no cost model, so its plans are only measured; tune it on a GPU (without --target)",
                kernel_name(args.backward, recurrent)
            ));
        }
        let shapes: Vec<Shape> = args
            .shapes
            .iter()
            .filter_map(|s| match s {
                CallShape::Parallel(p) => Some(*p),
                CallShape::Recurrent(_) => None,
            })
            .collect();
        return rank_only(args, &shapes, &variant, dims, elem, target);
    }
    if !aec::runtime::driver_present() || Device::count().unwrap_or(0) == 0 {
        return Err(if args.backward || recurrent {
            "no CUDA GPU found: the backward and recurrent kernels are tuned by measuring their plans on a GPU".into()
        } else {
            "no CUDA GPU found: tuning measures plans on a GPU; pass --target <device> to rank them with the cost model only"
                .into()
        });
    }
    let device = Device::open(args.device).map_err(|e| e.to_string())?;
    let config = DeviceConfig::detect(
        device.name(),
        device.compute_capability(),
        device.sm_count(),
    );
    let key_parts = dispatch::DeviceKeyParts::of(&device);
    let parts = key_parts.parts();
    let hash = variant_hash(&variant);
    let mut cache = open_cache(args)?;
    eprintln!(
        "tuning the {} of `{}` ({}x{}, {}) on {} ({}, model entry `{}`)",
        kernel_name(args.backward, recurrent),
        variant.name,
        dims.dqk,
        dims.dv,
        elem.name(),
        device.name(),
        key_parts.target,
        config.name
    );
    let options = TuneOptions {
        top: args.top,
        reps: args.reps,
        warmup_ms: args.warmup_ms.max(0.0),
        custom_ranges: args.custom_ranges.clone(),
        ..TuneOptions::default()
    };
    let doc = if recurrent {
        let tune_with = match elem {
            aec::compiler::Elem::Bf16 => tune_recurrent_on::<bf16>,
            aec::compiler::Elem::F16 => tune_recurrent_on::<f16>,
        };
        let pass = if args.backward {
            RecurrentPass::Backward
        } else {
            RecurrentPass::Forward
        };
        tune_shapes(args, &mut cache, |shape, progress| {
            let CallShape::Recurrent(shape) = shape else {
                return Err(format!("--shape {shape}: B,H,S expected"));
            };
            let key = pass.key(&variant, &hash, rdims, shape, elem, &parts);
            tune_with(
                &variant, &device, &config, rdims, shape, pass, key, &options, progress,
            )
        })?
    } else if args.backward {
        let tune_with = match elem {
            aec::compiler::Elem::Bf16 => tune_backward_on::<bf16>,
            aec::compiler::Elem::F16 => tune_backward_on::<f16>,
        };
        tune_shapes(args, &mut cache, |shape, progress| {
            let CallShape::Parallel(shape) = shape else {
                return Err(format!("--shape {shape}: B,H,Hkv,Sq,Skv expected"));
            };
            let key = backward_key(&variant, &hash, dims, shape, elem, &parts);
            tune_with(
                &variant, &device, &config, dims, shape, key, &options, progress,
            )
        })?
    } else {
        let tune_with = match elem {
            aec::compiler::Elem::Bf16 => tune_on::<bf16>,
            aec::compiler::Elem::F16 => tune_on::<f16>,
        };
        tune_shapes(args, &mut cache, |shape, progress| {
            let CallShape::Parallel(shape) = shape else {
                return Err(format!("--shape {shape}: B,H,Hkv,Sq,Skv expected"));
            };
            let key = forward_key(&variant, &hash, dims, shape, elem, &parts);
            tune_with(
                &variant, &device, &config, dims, shape, key, &options, progress,
            )
        })?
    };
    if let Some(path) = &args.json {
        let doc = json!({
            "variant": variant.name, "kernel": kernel_name(args.backward, recurrent),
            "dqk": dims.dqk, "dv": dims.dv, "dtype": elem.name(),
            "gpu": key_parts.gpu, "target": key_parts.target,
            "driver": key_parts.driver, "toolkit": key_parts.toolkit,
            "shapes": doc,
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&doc).expect("json") + "\n",
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// What `aec tune` tunes, for messages and the JSON report.
fn kernel_name(backward: bool, recurrent: bool) -> &'static str {
    match (backward, recurrent) {
        (true, true) => "recurrent backward",
        (false, true) => "recurrent forward",
        (true, false) => "backward",
        (false, false) => "forward",
    }
}

/// Tunes each of `args.shapes` with `tune_one` behind a progress bar,
/// prints and (unless `--no-save`) stores each result; returns the
/// reports as JSON rows.
fn tune_shapes<C>(
    args: &TuneArgs,
    cache: &mut TuningCache,
    mut tune_one: impl FnMut(CallShape, &mut dyn FnMut(TuneProgress)) -> Result<TuneReport<C>, String>,
) -> Result<Vec<serde_json::Value>, String> {
    let mut reports = Vec::new();
    for &shape in &args.shapes {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} (ETA {eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{shape}"));
        let mut progress = |p: TuneProgress| match p {
            TuneProgress::Compiled { done, total } => {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
                bar.set_message("compiling");
            }
            TuneProgress::Measured {
                done,
                total,
                label,
                micros,
            } => {
                if done == 1 {
                    bar.reset_eta();
                }
                bar.set_length(total as u64);
                bar.set_position(done as u64);
                bar.set_message(match micros {
                    Some(t) => format!("measured {label}: {t:.1} µs"),
                    None => format!("rejected {label}"),
                });
            }
        };
        let report = tune_one(shape, &mut progress)?;
        bar.finish_and_clear();
        print_report(shape, &report);
        if !args.no_save {
            cache
                .record(vec![report.entry.clone()])
                .map_err(|e| e.to_string())?;
        }
        reports.push((shape, report));
    }
    if !args.no_save {
        match cache.path() {
            Some(p) => println!("stored {} result(s) in {}", reports.len(), p.display()),
            None => println!(
                "no tuning cache location (set AEC_TUNING_CACHE or HOME): results not stored"
            ),
        }
        print_portability(cache, &reports);
    }
    Ok(reports.iter().map(|(s, r)| report_json(*s, r)).collect())
}

/// Tunes one shape with operands of type `T` on `device`.
#[allow(clippy::too_many_arguments)]
fn tune_on<T: KernelElement>(
    variant: &Variant,
    device: &Device,
    config: &DeviceConfig,
    dims: HeadDims,
    shape: Shape,
    key: aec::runtime::TuningKey,
    options: &TuneOptions,
    progress: &mut dyn FnMut(TuneProgress),
) -> Result<TuneReport, String> {
    let mut profiler =
        GpuProfiler::<T>::new(variant, device, dims, shape, options.clone(), Vec::new())?;
    tune_forward(
        variant,
        config,
        dims,
        shape,
        T::ELEM,
        key,
        options,
        &mut profiler,
        progress,
    )
}

/// Tunes the backward of one shape with operands of type `T` on `device`.
#[allow(clippy::too_many_arguments)]
fn tune_backward_on<T: KernelElement>(
    variant: &Variant,
    device: &Device,
    config: &DeviceConfig,
    dims: HeadDims,
    shape: Shape,
    key: aec::runtime::TuningKey,
    options: &TuneOptions,
    progress: &mut dyn FnMut(TuneProgress),
) -> Result<TuneReport<BackwardConfig>, String> {
    let mut profiler =
        BackwardGpuProfiler::<T>::new(variant, device, dims, shape, options.clone(), Vec::new())?;
    tune_backward(
        variant,
        config,
        dims,
        shape,
        T::ELEM,
        key,
        options,
        &mut profiler,
        progress,
    )
}

/// Tunes the recurrent forward or backward (`pass`) of one shape with
/// operands of type `T` on `device`.
#[allow(clippy::too_many_arguments)]
fn tune_recurrent_on<T: KernelElement>(
    variant: &Variant,
    device: &Device,
    config: &DeviceConfig,
    dims: RecurrentDims,
    shape: RecurrentShape,
    pass: RecurrentPass,
    key: aec::runtime::TuningKey,
    options: &TuneOptions,
    progress: &mut dyn FnMut(TuneProgress),
) -> Result<TuneReport<RecurrentConfig>, String> {
    let mut profiler = RecurrentGpuProfiler::<T>::new(
        variant,
        device,
        dims,
        shape,
        pass,
        options.clone(),
        Vec::new(),
    )?;
    tune_recurrent(
        variant,
        config,
        dims,
        shape,
        T::ELEM,
        pass,
        key,
        options,
        &mut profiler,
        progress,
    )
}

fn open_cache(args: &TuneArgs) -> Result<TuningCache, String> {
    let path = args.file_cache.clone().or_else(TuningCache::default_path);
    Ok(match path {
        Some(p) => {
            let (cache, warning) = TuningCache::open(p);
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            cache
        }
        None => TuningCache::in_memory(),
    })
}

fn print_report<C>(shape: CallShape, r: &TuneReport<C>) {
    let e = &r.entry;
    println!(
        "{shape}: best {} at {:.1} µs ({:.0} TFLOP/s), default {:.1} µs: {:.3}x; tuning impact (median / best) {:.3}; {} plans fit, {} profiled, {} rejected; {:.1} s",
        e.config_label,
        e.best_us,
        e.tflops,
        e.default_us,
        e.speedup(),
        e.impact(),
        r.space_size,
        e.plans_tried,
        e.rejected.len(),
        e.tuning_seconds
    );
    for p in &r.profiled {
        let model = p
            .model_micros
            .map_or("     -".to_string(), |m| format!("{m:6.1}"));
        let resources = p.resources.map_or(String::new(), |r| {
            if r.spills() {
                format!(
                    "  {} registers, spills {} B stored / {} B loaded",
                    r.registers, r.spill_store_bytes, r.spill_load_bytes
                )
            } else {
                format!("  {} registers", r.registers)
            }
        });
        match &p.measured {
            Ok(t) => println!(
                "  {:<40} model {model} µs  measured {t:8.1} µs{resources}",
                p.label
            ),
            Err(e) => println!("  {:<40} model {model} µs  rejected: {e}", p.label),
        }
    }
    // Rejections by the space, grouped by what did not fit (or the
    // template's own reason).
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for x in &r.space_rejected {
        let group = if x.reason.contains("registers per thread needed") {
            "too many registers"
        } else if x.reason.contains("bytes of shared memory needed") {
            "too much shared memory"
        } else {
            x.reason.split(';').next().unwrap_or(&x.reason)
        };
        *reasons.entry(group).or_default() += 1;
    }
    for (reason, n) in reasons {
        println!("  rejected before profiling ({n}): {reason}");
    }
}

fn report_json<C>(shape: CallShape, r: &TuneReport<C>) -> serde_json::Value {
    let e = &r.entry;
    let sizes: Vec<usize> = match shape {
        CallShape::Parallel(s) => vec![s.b, s.h, s.hkv, s.sq, s.skv],
        CallShape::Recurrent(s) => vec![s.b, s.h, s.s],
    };
    json!({
        "shape": sizes,
        "best": e.config_label, "best_us": e.best_us, "default_us": e.default_us,
        "speedup": e.speedup(), "impact": e.impact(), "tflops": e.tflops,
        "efficiency": e.efficiency, "tuning_seconds": e.tuning_seconds,
        "space_size": r.space_size, "plans_tried": e.plans_tried,
        "rejected_before_profiling": r.space_rejected.len(),
        "profiled": r.profiled.iter().map(|p| json!({
            "config": p.label, "model_us": p.model_micros,
            "measured_us": p.measured.as_ref().ok(),
            "rejected": p.measured.as_ref().err(),
            "registers": p.resources.map(|r| r.registers),
            "spill_store_bytes": p.resources.map(|r| r.spill_store_bytes),
            "spill_load_bytes": p.resources.map(|r| r.spill_load_bytes),
        })).collect::<Vec<_>>(),
    })
}

/// Φ over the GPUs in the cache for each tuned problem (same variant,
/// kernel, dtype, dims, shape) that more than one GPU has results for.
fn print_portability<C>(cache: &TuningCache, reports: &[(CallShape, TuneReport<C>)]) {
    for (_, r) in reports {
        let k = &r.entry.key;
        let mut by_gpu: BTreeMap<&str, f64> = BTreeMap::new();
        for e in cache.entries() {
            let o = &e.key;
            if (&o.variant_hash, &o.kernel, &o.dtype, o.dqk, o.dv, &o.shape)
                == (&k.variant_hash, &k.kernel, &k.dtype, k.dqk, k.dv, &k.shape)
            {
                let best = by_gpu.entry(o.gpu.as_str()).or_insert(0.0);
                *best = best.max(e.efficiency);
            }
        }
        if by_gpu.len() > 1 {
            let eff: Vec<f64> = by_gpu.values().copied().collect();
            println!(
                "performance portability over {} GPUs: {:.3}",
                eff.len(),
                performance_portability(&eff)
            );
        }
    }
}

/// `--target`: the model's ranking of the parallel forward (with
/// `--backward`, of the backward's tiles) for `shapes`, no GPU.
fn rank_only(
    args: &TuneArgs,
    shapes: &[Shape],
    variant: &Variant,
    dims: HeadDims,
    elem: aec::compiler::Elem,
    target: Target,
) -> Result<(), String> {
    let device = DeviceConfig::named(target.name()).expect("every target has a device entry");
    let mut doc = Vec::new();
    for &shape in shapes {
        // (label, model µs, TFLOP/s, bound) per plan, and the rejections.
        let (ranked, rejected): (Vec<_>, Vec<(String, String)>) = if args.backward {
            let (ranked, refused) =
                aec::tune::rank_backward_plans(variant, &device, dims, shape, elem)
                    .map_err(|e| format!("--backward --target {}: {e}", target.name()))?;
            (
                ranked
                    .iter()
                    .map(|r| (r.config.label(), r.estimate))
                    .collect(),
                refused.into_iter().map(|r| (r.config, r.reason)).collect(),
            )
        } else {
            let (ranked, rejected) = rank_forward(variant, &problem_of(dims, shape, elem), &device);
            (
                ranked
                    .iter()
                    .map(|r| (r.candidate.config.label(), r.estimate))
                    .collect(),
                rejected
                    .into_iter()
                    .map(|r| (r.config.label(), r.reason))
                    .collect(),
            )
        };
        println!(
            "{shape}, the {} on {} (cost model only, nothing measured): {} plans fit, {} rejected",
            kernel_name(args.backward, false),
            device.name,
            ranked.len(),
            rejected.len()
        );
        for (label, estimate) in ranked.iter().take(args.top.max(1)) {
            println!(
                "  {:<40} model {:8.1} µs  {:5.0} TFLOP/s  bound: {}",
                label, estimate.micros, estimate.tflops, estimate.bound
            );
        }
        doc.push(json!({
            "shape": [shape.b, shape.h, shape.hkv, shape.sq, shape.skv],
            "ranked": ranked.iter().map(|(label, e)| json!({
                "config": label, "model_us": e.micros, "bound": e.bound,
            })).collect::<Vec<_>>(),
            "rejected": rejected.iter().map(|(config, reason)| json!({
                "config": config, "reason": reason,
            })).collect::<Vec<_>>(),
        }));
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "variant": variant.name, "kernel": kernel_name(args.backward, false),
            "device": device.name, "shapes": doc,
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&doc).expect("json") + "\n",
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
