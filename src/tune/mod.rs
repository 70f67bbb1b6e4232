//! Autotuning and dispatch of the parallel forward and backward and of the
//! recurrent forward and backward.
//!
//! [`tune_forward`] takes the scheduler's ranking
//! ([`aec_compiler::schedule::rank_forward`]), profiles the top plans and
//! the default with a [`Profiler`], and returns the winner as a
//! [`TunedEntry`] for the persistent tuning cache. [`tune_backward`] does
//! the same over [`BackwardConfig::space`] ranked by the backward's model
//! ([`aec_compiler::schedule::rank_backward`]); [`tune_recurrent`] (forward
//! or backward) over its tile spaces ([`RecurrentConfig::space`],
//! [`RecurrentConfig::backward_space`]), which have no cost model: the
//! candidates are profiled in the space's order. The selection logic is
//! independent of the GPU: [`gpu::GpuProfiler`],
//! [`gpu::BackwardGpuProfiler`] and [`gpu::RecurrentGpuProfiler`] measure
//! on a device, the tests use fake ones. [`dispatch`] answers, per call
//! shape, which configuration to run: the tuned one of the shape's bucket,
//! else the default; it never tunes by itself.

pub mod dispatch;
pub mod gpu;

use crate::run::{HeadDims, RecurrentDims, RecurrentShape, Shape};
use aec_compiler::schedule::{
    DeviceConfig, KernelConfig, Problem, Ranked, RankedBackward, VariantFacts, rank_backward,
    rank_forward, useful_backward_flops, useful_flops,
};
use aec_compiler::{BackwardConfig, Elem, ForwardConfig, Isa, RecurrentConfig};
use aec_frontend::Variant;
use aec_runtime::{Rejection, ShapeBucket, TunedEntry, TuningKey};
use std::time::Instant;

/// The kernel name tuning keys use for the parallel forward.
pub const PARALLEL_FORWARD: &str = "parallel_forward";

/// The kernel name tuning keys use for the parallel backward.
pub const PARALLEL_BACKWARD: &str = "parallel_backward";

/// The kernel name tuning keys use for the recurrent forward.
pub const RECURRENT_FORWARD: &str = "recurrent_forward";

/// The kernel name tuning keys use for the recurrent backward.
pub const RECURRENT_BACKWARD: &str = "recurrent_backward";

/// How much to profile.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Plans from the top of the model's ranking to profile (the default
    /// configuration is profiled in addition).
    pub top: usize,
    /// Untimed runs before timing each plan (at least; see `warmup_ms`).
    pub warmup: usize,
    /// Milliseconds of untimed runs before timing each plan (0: only
    /// `warmup` runs): long enough for the GPU to settle at its sustained
    /// clocks. Short bursts run at boost clocks, where plans that use more
    /// power look faster than they are in training.
    pub warmup_ms: f64,
    /// Timed runs per plan (the median is kept).
    pub reps: usize,
    /// The range of values drawn for named custom inputs, `(name, lo, hi)`;
    /// the others are drawn from [0.5, 1) (a range slopes, decays and gates
    /// take, but not for example Mamba2's `a`, whose decay `exp(dt · a)`
    /// needs it negative).
    pub custom_ranges: Vec<(String, f32, f32)>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            top: 8,
            warmup: 3,
            warmup_ms: 200.0,
            reps: 20,
            custom_ranges: Vec::new(),
        }
    }
}

/// Measures plans of configuration type `C` (the forward's by default).
/// `prepare` sees every plan first (a GPU profiler compiles them in
/// parallel there); `measure` returns a plan's median time in microseconds,
/// or why it cannot be used (it failed to compile, launch, or its output
/// differs from the default's).
pub trait Profiler<C = ForwardConfig> {
    fn prepare(&mut self, plans: &[C], progress: &mut dyn FnMut(TuneProgress));
    fn measure(&mut self, plan: &C) -> Result<f64, String>;
    /// What the compiler reported for `plan`'s kernels, where known.
    fn resources(&self, _plan: &C) -> Option<PlanResources> {
        None
    }
}

/// ptxas's report of a plan's kernels (NVRTC compiles them with
/// `--ptxas-options=-v`): the largest figures among its entry functions, so
/// that a plan that spills says so beside its time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanResources {
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

impl PlanResources {
    /// The most of each figure over `usage`'s entries; `None` for no report.
    pub fn of(usage: &[aec_runtime::ResourceUsage]) -> Option<PlanResources> {
        usage
            .iter()
            .map(|u| PlanResources {
                registers: u.registers,
                spill_store_bytes: u.spill_store_bytes,
                spill_load_bytes: u.spill_load_bytes,
            })
            .reduce(|a, b| PlanResources {
                registers: a.registers.max(b.registers),
                spill_store_bytes: a.spill_store_bytes.max(b.spill_store_bytes),
                spill_load_bytes: a.spill_load_bytes.max(b.spill_load_bytes),
            })
    }

    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// Progress of a tuning run, for a progress bar.
#[derive(Clone, Debug, PartialEq)]
pub enum TuneProgress {
    /// `done` of `total` plans compiled.
    Compiled { done: usize, total: usize },
    /// `done` of `total` plans measured; the last one's label and time.
    Measured {
        done: usize,
        total: usize,
        label: String,
        micros: Option<f64>,
    },
}

/// One profiled plan.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfiledPlan<C = ForwardConfig> {
    pub config: C,
    pub label: String,
    /// The model's estimate, µs (`None` for a default the space does not
    /// hold, and for the recurrent kernels, which have no model).
    pub model_micros: Option<f64>,
    /// The measured median, µs, or why there is none.
    pub measured: Result<f64, String>,
    /// Its kernels' registers and spills, where the profiler knows them.
    pub resources: Option<PlanResources>,
}

/// The outcome of tuning one kernel for one shape bucket.
#[derive(Clone, Debug)]
pub struct TuneReport<C = ForwardConfig> {
    /// What goes into the tuning cache.
    pub entry: TunedEntry,
    /// Every profiled plan, in the order measured (the default first).
    pub profiled: Vec<ProfiledPlan<C>>,
    /// Plans the space rejected before profiling, with why.
    pub space_rejected: Vec<Rejection>,
    /// Plans in the space that fit (profiled or not).
    pub space_size: usize,
}

/// What identifies a GPU and its toolchain in tuning keys: its name,
/// instruction set (`sm_90a`), driver and NVRTC versions.
#[derive(Clone, Copy, Debug)]
pub struct KeyParts<'a> {
    pub gpu: &'a str,
    pub target: &'a str,
    pub driver: &'a str,
    pub toolkit: &'a str,
}

/// A stable digest of a variant's definition: its traced regions as text.
pub fn variant_hash(variant: &Variant) -> String {
    aec_runtime::hex_digest(aec_frontend::print::render(variant).as_bytes())
}

/// aec's version and a digest of `text` (a kernel's template and the
/// preludes it includes): the template version part of tuning keys, so
/// results of other kernels are never reused.
fn version_of(text: &str) -> String {
    format!(
        "{}+{}",
        env!("CARGO_PKG_VERSION"),
        &aec_runtime::hex_digest(text.as_bytes())[..12]
    )
}

/// The template version part of the forward's tuning keys.
pub fn template_version() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| version_of(aec_compiler::cuda::forward::TEMPLATE_TEXT))
        .clone()
}

/// The template version part of the backward's tuning keys.
pub fn backward_template_version() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| version_of(aec_compiler::cuda::backward::TEMPLATE_TEXT))
        .clone()
}

/// The template version part of the recurrent forward's tuning keys.
pub fn recurrent_template_version() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| version_of(aec_compiler::cuda::recurrent::TEMPLATE_TEXT))
        .clone()
}

/// The template version part of the recurrent backward's tuning keys.
pub fn recurrent_backward_template_version() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| version_of(aec_compiler::cuda::recurrent::BACKWARD_TEMPLATE_TEXT))
        .clone()
}

/// The key of the parallel forward of a variant (by its hash) for a call.
pub fn forward_key(
    variant: &Variant,
    variant_hash: &str,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    parts: &KeyParts<'_>,
) -> TuningKey {
    let kernel = (PARALLEL_FORWARD, template_version());
    key_of(kernel, variant, variant_hash, dims, shape, elem, parts)
}

/// The key of the parallel backward of a variant (by its hash) for a call.
pub fn backward_key(
    variant: &Variant,
    variant_hash: &str,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    parts: &KeyParts<'_>,
) -> TuningKey {
    let kernel = (PARALLEL_BACKWARD, backward_template_version());
    key_of(kernel, variant, variant_hash, dims, shape, elem, parts)
}

/// The key of the recurrent forward of a variant (by its hash) for a call:
/// head dims Dk × Dv, the shape's bucket with `Hkv = H` and `Sq = Skv = S`.
pub fn recurrent_key(
    variant: &Variant,
    variant_hash: &str,
    dims: RecurrentDims,
    shape: RecurrentShape,
    elem: Elem,
    parts: &KeyParts<'_>,
) -> TuningKey {
    let kernel = (RECURRENT_FORWARD, recurrent_template_version());
    recurrent_key_of(kernel, variant, variant_hash, dims, shape, elem, parts)
}

/// The key of the recurrent backward of a variant (by its hash) for a
/// call, bucketed as [`recurrent_key`].
pub fn recurrent_backward_key(
    variant: &Variant,
    variant_hash: &str,
    dims: RecurrentDims,
    shape: RecurrentShape,
    elem: Elem,
    parts: &KeyParts<'_>,
) -> TuningKey {
    let kernel = (RECURRENT_BACKWARD, recurrent_backward_template_version());
    recurrent_key_of(kernel, variant, variant_hash, dims, shape, elem, parts)
}

/// [`key_of`] for a recurrent kernel: Dk × Dv as the head dims, the shape
/// bucketed as `B, H, H, S, S`.
fn recurrent_key_of(
    kernel: (&str, String),
    variant: &Variant,
    variant_hash: &str,
    dims: RecurrentDims,
    shape: RecurrentShape,
    elem: Elem,
    parts: &KeyParts<'_>,
) -> TuningKey {
    let dims = HeadDims::new(dims.dk, dims.dv);
    let shape = Shape::mha(shape.b, shape.h, shape.s, shape.s);
    key_of(kernel, variant, variant_hash, dims, shape, elem, parts)
}

/// The key of `kernel` (its name and template version) for a call.
fn key_of(
    (kernel, template_version): (&str, String),
    variant: &Variant,
    variant_hash: &str,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    parts: &KeyParts<'_>,
) -> TuningKey {
    TuningKey {
        variant: variant.name.clone(),
        variant_hash: variant_hash.to_string(),
        kernel: kernel.to_string(),
        template_version,
        target: parts.target.to_string(),
        gpu: parts.gpu.to_string(),
        driver: parts.driver.to_string(),
        toolkit: parts.toolkit.to_string(),
        dtype: elem.name().to_string(),
        dqk: dims.dqk,
        dv: dims.dv,
        shape: ShapeBucket::of(shape.b, shape.h, shape.hkv, shape.sq, shape.skv),
    }
}

/// The element counts of q, k, v and the custom inputs of `variant` for a
/// call (by their declared axes), as [`crate::run::check_shapes`] takes them.
pub fn declared_lens(
    variant: &Variant,
    dims: HeadDims,
    shape: Shape,
) -> Result<Vec<(String, usize)>, String> {
    use aec_frontend::ir::Axis;
    lens_by(variant, |a: Axis| match a {
        Axis::Dqk => Some(dims.dqk as usize),
        Axis::Dv => Some(dims.dv as usize),
        other => shape.size(other),
    })
}

/// The element counts of q, k, v and the custom inputs of a recurrent
/// `variant` for a call of `shape` (as [`declared_lens`]).
pub fn recurrent_declared_lens(
    variant: &Variant,
    dims: RecurrentDims,
    shape: RecurrentShape,
) -> Result<Vec<(String, usize)>, String> {
    use aec_frontend::ir::Axis;
    lens_by(variant, |a: Axis| match a {
        Axis::Dk => Some(dims.dk as usize),
        Axis::Dv => Some(dims.dv as usize),
        other => shape.size(other),
    })
}

/// The element counts of `variant`'s inputs with axes sized by `size`.
fn lens_by(
    variant: &Variant,
    size: impl Fn(aec_frontend::ir::Axis) -> Option<usize>,
) -> Result<Vec<(String, usize)>, String> {
    [&variant.q, &variant.k, &variant.v]
        .into_iter()
        .chain(&variant.customs)
        .map(|d| {
            let n = d
                .axes
                .iter()
                .map(|&a| {
                    size(a).ok_or_else(|| {
                        format!("`{}` has an axis ({a}) a call shape does not size", d.name)
                    })
                })
                .try_fold(1usize, |acc, n| n.map(|n| acc.saturating_mul(n)))?;
            Ok((d.name.clone(), n))
        })
        .collect()
}

/// The scheduler's problem for a call.
pub fn problem_of(dims: HeadDims, shape: Shape, elem: Elem) -> Problem {
    Problem {
        b: shape.b,
        h: shape.h,
        hkv: shape.hkv,
        sq: shape.sq,
        skv: shape.skv,
        dqk: dims.dqk,
        dv: dims.dv,
        elem,
    }
}

/// The plans to profile: the default first, then the model's top `top`
/// (without repeating the default).
pub fn plans_to_profile(
    ranked: &[Ranked],
    default: ForwardConfig,
    top: usize,
) -> Vec<(ForwardConfig, Option<f64>)> {
    default_then_model_order(
        ranked.iter().filter_map(|r| match r.candidate.config {
            KernelConfig::Cuda(c) => Some((c, r.estimate.micros)),
            KernelConfig::Hip(_) => None,
        }),
        default,
        top,
    )
}

/// `default` with the model's time where `ranked` (plans with their
/// estimates, fastest first) holds it, then the first `top` other plans.
fn default_then_model_order<C: Copy + PartialEq>(
    ranked: impl Iterator<Item = (C, f64)>,
    default: C,
    top: usize,
) -> Vec<(C, Option<f64>)> {
    let ranked: Vec<(C, f64)> = ranked.collect();
    let model_of_default = ranked.iter().find(|(c, _)| *c == default).map(|r| r.1);
    std::iter::once((default, model_of_default))
        .chain(
            ranked
                .into_iter()
                .filter(|(c, _)| *c != default)
                .take(top)
                .map(|(c, micros)| (c, Some(micros))),
        )
        .collect()
}

/// Tunes the parallel forward of `variant` for `shape` on `device`: ranks
/// the space, profiles the default and the model's top plans with
/// `profiler`, and returns the fastest measured plan (the default when
/// nothing beats it). Fails only when the default itself cannot be measured.
#[allow(clippy::too_many_arguments)]
pub fn tune_forward(
    variant: &Variant,
    device: &DeviceConfig,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    key: TuningKey,
    options: &TuneOptions,
    profiler: &mut dyn Profiler,
    progress: &mut dyn FnMut(TuneProgress),
) -> Result<TuneReport, String> {
    let started = Instant::now();
    let problem = problem_of(dims, shape, elem);
    let (ranked, space_rejected) = rank_forward(variant, &problem, device);
    let Some(isa) = cuda_isa(device) else {
        return Err(format!(
            "{} is an AMD device: profiling there needs the HIP runtime, which cannot launch the forward yet",
            device.name
        ));
    };
    // What the call runs untuned (the shape's decoding or few-block tile
    // where it has one), so the speedup is over what tuning replaces.
    // (The ranking above is the model's, as untuned_choice would rank.)
    let default = crate::run::untuned_by_rule(variant, dims, shape, elem, isa, device, false)
        .unwrap_or_else(|plain| crate::run::untuned_by_model(plain, &ranked))
        .config;
    let plans = plans_to_profile(&ranked, default, options.top);
    let space_rejected = space_rejected
        .iter()
        .map(|r| Rejection {
            config: r.config.label(),
            reason: r.reason.clone(),
        })
        .collect();
    let flops = useful_flops(&problem, &VariantFacts::of(variant));
    let profiled = profile(plans, profiler, progress, |c| {
        KernelConfig::Cuda(*c).label()
    });
    select(
        key,
        profiled,
        space_rejected,
        ranked.len(),
        flops,
        device,
        started,
    )
}

/// Tunes the parallel backward of `variant` for `shape` on `device`: every
/// candidate of [`BackwardConfig::space`] is generated (those the generator
/// refuses are reported with its reason), the rest ranked by the backward's
/// cost model ([`rank_backward`]), the default and the model's first `top`
/// others profiled with `profiler`, and the fastest measured plan is
/// returned (the default when nothing beats it). Fails only when the
/// default itself cannot be measured.
#[allow(clippy::too_many_arguments)]
pub fn tune_backward(
    variant: &Variant,
    device: &DeviceConfig,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    key: TuningKey,
    options: &TuneOptions,
    profiler: &mut dyn Profiler<BackwardConfig>,
    progress: &mut dyn FnMut(TuneProgress),
) -> Result<TuneReport<BackwardConfig>, String> {
    let started = Instant::now();
    let isa = profiled_isa(device, "the backward")?;
    let default = BackwardConfig::for_variant(variant, dims.dqk, dims.dv, elem, isa);
    let (ranked, space_rejected) = rank_backward_plans(variant, device, dims, shape, elem)?;
    let flops = useful_backward_flops(&problem_of(dims, shape, elem), &VariantFacts::of(variant));
    let plans = backward_plans_to_profile(&ranked, default, options.top);
    let profiled = profile(plans, profiler, progress, BackwardConfig::label);
    select(
        key,
        profiled,
        space_rejected,
        ranked.len(),
        flops,
        device,
        started,
    )
}

/// The backward's tile space on CUDA `device` for `shape` ([`BackwardConfig::space`]):
/// the tiles the generator takes, ordered by the backward's cost model
/// ([`rank_backward`]), and those it refuses with its reason. Needs no GPU
/// (what `aec tune --backward --target` prints).
pub fn rank_backward_plans(
    variant: &Variant,
    device: &DeviceConfig,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
) -> Result<(Vec<RankedBackward>, Vec<Rejection>), String> {
    let Some(isa) = cuda_isa(device) else {
        return Err(format!(
            "{} is an AMD device: the backward's tiles are CUDA's (the HIP backward has one configuration per head dims)",
            device.name
        ));
    };
    if variant.parallel().is_none() {
        return Err(format!(
            "`{}` is a recurrent variant: the backward's tile space is the parallel backward's",
            variant.name
        ));
    }
    // (The generator bounds the wgmma kernels' shared memory; an mma.sync
    // tile past the device's would fail at launch.)
    let (fit, refused) = generated(
        BackwardConfig::space(dims.dqk, dims.dv, elem, isa),
        |c| {
            let source = aec_compiler::parallel_backward(variant, dims.dqk, dims.dv, c)?;
            let smem = source.main.smem_bytes;
            if smem > device.smem_per_block {
                return Err(aec_compiler::CompileError(format!(
                    "the main kernel needs {smem} bytes of shared memory, more than the {} a block of {} may have",
                    device.smem_per_block, device.name
                )));
            }
            Ok(())
        },
        BackwardConfig::label,
    );
    let problem = problem_of(dims, shape, elem);
    let ranked = rank_backward(&problem, &VariantFacts::of(variant), fit, device);
    Ok((ranked, refused))
}

/// The candidates of `space` the generator takes (`generate`), in order,
/// and those it refuses, each with its reason.
fn generated<C>(
    space: Vec<C>,
    generate: impl Fn(&C) -> Result<(), aec_compiler::CompileError>,
    label: impl Fn(&C) -> String,
) -> (Vec<C>, Vec<Rejection>) {
    let mut fit = Vec::new();
    let mut refused = Vec::new();
    for config in space {
        match generate(&config) {
            Ok(()) => fit.push(config),
            Err(e) => refused.push(Rejection {
                config: label(&config),
                reason: e.to_string(),
            }),
        }
    }
    (fit, refused)
}

/// The instruction set of a CUDA `device`, or why `what` cannot be tuned
/// there (an AMD device: nothing launches HIP kernels for profiling here).
fn profiled_isa(device: &DeviceConfig, what: &str) -> Result<Isa, String> {
    cuda_isa(device).ok_or_else(|| {
        format!(
            "{} is an AMD device: {what} is tuned on CUDA GPUs only (AMD targets are ranked by the cost model, `--target`, for the parallel forward)",
            device.name
        )
    })
}

/// Profiles `default`, then the first `top` others of `candidates` in
/// their order (the recurrent tiles, which have no cost model).
fn profile_in_order<C: Clone + PartialEq>(
    default: C,
    candidates: &[C],
    top: usize,
    profiler: &mut dyn Profiler<C>,
    progress: &mut dyn FnMut(TuneProgress),
    label: impl Fn(&C) -> String,
) -> Vec<ProfiledPlan<C>> {
    let plans: Vec<(C, Option<f64>)> = std::iter::once(default.clone())
        .chain(
            candidates
                .iter()
                .filter(|c| **c != default)
                .take(top)
                .cloned(),
        )
        .map(|c| (c, None))
        .collect();
    profile(plans, profiler, progress, label)
}

/// The backward plans to profile: the default first (with the model's time
/// where the ranking holds it: the generator may have refused it), then the
/// model's top `top` others.
pub fn backward_plans_to_profile(
    ranked: &[RankedBackward],
    default: BackwardConfig,
    top: usize,
) -> Vec<(BackwardConfig, Option<f64>)> {
    default_then_model_order(
        ranked.iter().map(|r| (r.config, r.estimate.micros)),
        default,
        top,
    )
}

/// Which recurrent kernels [`tune_recurrent`] (and
/// [`gpu::RecurrentGpuProfiler`]) tune.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecurrentPass {
    /// The forward from a zero state: its output and final state are
    /// checked against the default plan's.
    Forward,
    /// The backward (the default forward's kernels, the plan's states pass
    /// and gradient kernels) from a zero state: dq, dk, dv and the custom
    /// inputs' gradients are checked against the default plan's.
    Backward,
}

impl RecurrentPass {
    /// The tuning key of this pass's kernel ([`recurrent_key`] or
    /// [`recurrent_backward_key`]).
    pub fn key(
        self,
        variant: &Variant,
        variant_hash: &str,
        dims: RecurrentDims,
        shape: RecurrentShape,
        elem: Elem,
        parts: &KeyParts<'_>,
    ) -> TuningKey {
        let key = match self {
            RecurrentPass::Forward => recurrent_key,
            RecurrentPass::Backward => recurrent_backward_key,
        };
        key(variant, variant_hash, dims, shape, elem, parts)
    }
}

/// Tunes the recurrent forward or backward (`pass`) of `variant` for
/// `shape` on `device`. The forward's space ([`RecurrentConfig::space`]) is
/// already the tiles the generator and the shared memory take; every
/// candidate of the backward's ([`RecurrentConfig::backward_space`]) is
/// generated, and those the generator refuses are reported with its
/// reason. The default (for the backward, that of the default forward) and
/// the first `top` others are profiled with `profiler` in that order (no
/// cost model), and the fastest measured plan is returned (the default
/// when nothing beats it). Fails only when the default itself cannot be
/// generated or measured.
#[allow(clippy::too_many_arguments)]
pub fn tune_recurrent(
    variant: &Variant,
    device: &DeviceConfig,
    dims: RecurrentDims,
    shape: RecurrentShape,
    elem: Elem,
    pass: RecurrentPass,
    key: TuningKey,
    options: &TuneOptions,
    profiler: &mut dyn Profiler<RecurrentConfig>,
    progress: &mut dyn FnMut(TuneProgress),
) -> Result<TuneReport<RecurrentConfig>, String> {
    let started = Instant::now();
    let what = match pass {
        RecurrentPass::Forward => "the recurrent forward",
        RecurrentPass::Backward => "the recurrent backward",
    };
    let isa = profiled_isa(device, what)?;
    if variant.recurrent().is_none() {
        return Err(format!(
            "`{}` is a parallel variant: `tune_recurrent` tunes {what}",
            variant.name
        ));
    }
    let (default, fit, space_rejected, label, flops): (_, _, _, fn(&RecurrentConfig) -> String, _) =
        match pass {
            RecurrentPass::Forward => (
                RecurrentConfig::for_variant(variant, dims.dk, dims.dv, elem, isa),
                RecurrentConfig::space(variant, dims.dk, dims.dv, elem, isa),
                Vec::new(),
                RecurrentConfig::label,
                recurrent_flops(dims, shape),
            ),
            RecurrentPass::Backward => {
                let space = RecurrentConfig::backward_space(variant, dims.dk, dims.dv, elem, isa);
                let default = space[0];
                let (fit, refused) = generated(
                    space,
                    |c| {
                        aec_compiler::recurrent_backward(variant, dims.dk, dims.dv, c, isa)
                            .map(drop)
                    },
                    RecurrentConfig::backward_label,
                );
                if fit.first() != Some(&default) {
                    let why = refused
                        .first()
                        .map_or_else(String::new, |r| r.reason.clone());
                    return Err(format!(
                        "`{}` has no recurrent backward at {}x{}: {why}",
                        variant.name, dims.dk, dims.dv
                    ));
                }
                // The backward's useful work, counted as twice the forward's.
                let flops = 2.0 * recurrent_flops(dims, shape);
                (
                    default,
                    fit,
                    refused,
                    RecurrentConfig::backward_label,
                    flops,
                )
            }
        };
    let profiled = profile_in_order(default, &fit, options.top, profiler, progress, label);
    select(
        key,
        profiled,
        space_rejected,
        fit.len(),
        flops,
        device,
        started,
    )
}

/// The recurrent forward's useful FLOPs, as the benchmark's anchors count
/// them: within 64-step chunks `2·B·H·S·64·(Dk + Dv)`, across chunks
/// `4·B·H·S·Dk·Dv`.
pub fn recurrent_flops(dims: RecurrentDims, shape: RecurrentShape) -> f64 {
    let (b, h, s) = (shape.b as f64, shape.h as f64, shape.s as f64);
    let (dk, dv) = (f64::from(dims.dk), f64::from(dims.dv));
    2.0 * b * h * s * 64.0 * (dk + dv) + 4.0 * b * h * s * dk * dv
}

/// Prepares and measures `plans` in order, reporting progress.
fn profile<C: Clone>(
    plans: Vec<(C, Option<f64>)>,
    profiler: &mut dyn Profiler<C>,
    progress: &mut dyn FnMut(TuneProgress),
    label: impl Fn(&C) -> String,
) -> Vec<ProfiledPlan<C>> {
    let configs: Vec<C> = plans.iter().map(|(c, _)| c.clone()).collect();
    profiler.prepare(&configs, progress);
    let mut profiled = Vec::with_capacity(plans.len());
    for (i, (config, model_micros)) in plans.into_iter().enumerate() {
        let measured = profiler.measure(&config);
        let label = label(&config);
        progress(TuneProgress::Measured {
            done: i + 1,
            total: configs.len(),
            label: label.clone(),
            micros: measured.as_ref().ok().copied(),
        });
        let resources = profiler.resources(&config);
        profiled.push(ProfiledPlan {
            config,
            label,
            model_micros,
            measured,
            resources,
        });
    }
    confirm_the_lead(&mut profiled, profiler);
    profiled
}

/// Measures the default (the first plan) and the fastest other plan once
/// more where the latter leads, each keeping the lower of its two times: a
/// transient slowdown during one plan's timing must not crown another plan
/// (on an H100 one forward kernel timed 47.8 µs and 88.9 µs in two runs of
/// one session; bench/NOTES.md, session 42).
fn confirm_the_lead<C>(profiled: &mut [ProfiledPlan<C>], profiler: &mut dyn Profiler<C>) {
    let time = |p: &ProfiledPlan<C>| p.measured.as_ref().ok().copied();
    let Some(default_us) = profiled.first().and_then(time) else {
        return;
    };
    let lead = (1..profiled.len())
        .filter_map(|i| time(&profiled[i]).map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let Some((lead, lead_us)) = lead.filter(|&(_, t)| t < default_us) else {
        return;
    };
    for (i, before) in [(0, default_us), (lead, lead_us)] {
        if let Ok(again) = profiler.measure(&profiled[i].config) {
            profiled[i].measured = Ok(before.min(again));
        }
    }
}

/// The report of profiled plans (the default first): the first of the
/// fastest wins (the default wins ties); an unmeasurable default is an
/// error.
fn select<C: serde::Serialize>(
    key: TuningKey,
    profiled: Vec<ProfiledPlan<C>>,
    space_rejected: Vec<Rejection>,
    space_size: usize,
    flops: f64,
    device: &DeviceConfig,
    started: Instant,
) -> Result<TuneReport<C>, String> {
    let default_us = match &profiled[0].measured {
        Ok(t) => *t,
        Err(e) => {
            return Err(format!(
                "the default plan {} failed: {e}",
                profiled[0].label
            ));
        }
    };
    let mut sorted: Vec<f64> = profiled
        .iter()
        .filter_map(|p| p.measured.as_ref().ok().copied())
        .collect();
    sorted.sort_by(f64::total_cmp);
    let best = profiled
        .iter()
        .filter_map(|p| p.measured.as_ref().ok().map(|t| (p, *t)))
        .fold(None::<(&ProfiledPlan<C>, f64)>, |acc, (p, t)| match acc {
            Some((_, bt)) if bt <= t => acc,
            _ => Some((p, t)),
        })
        .expect("the default was measured");
    let median_us = sorted[sorted.len() / 2];
    let tflops = flops / (best.1 * 1e-6) / 1e12;
    let rejected = space_rejected
        .iter()
        .cloned()
        .chain(profiled.iter().filter_map(|p| {
            p.measured.as_ref().err().map(|e| Rejection {
                config: p.label.clone(),
                reason: e.clone(),
            })
        }))
        .collect();
    let entry = TunedEntry {
        key,
        config: serde_json::to_value(&best.0.config).expect("configs serialise"),
        config_label: best.0.label.clone(),
        best_us: best.1,
        default_us,
        median_us,
        plans_tried: profiled.len() as u32,
        rejected,
        tuning_seconds: started.elapsed().as_secs_f64(),
        tflops,
        efficiency: tflops / device.peak_tflops,
    };
    Ok(TuneReport {
        entry,
        profiled,
        space_rejected,
        space_size,
    })
}

/// The configuration a tuning entry holds, if it is one this aec reads
/// (a forward configuration, or with `C = BackwardConfig` the backward's).
pub fn entry_config<C: serde::de::DeserializeOwned>(entry: &TunedEntry) -> Option<C> {
    serde_json::from_value(entry.config.clone()).ok()
}

/// The instruction set of a device config (CUDA devices only).
pub fn cuda_isa(device: &DeviceConfig) -> Option<Isa> {
    match device.target {
        aec_compiler::schedule::Target::Cuda(isa) => Some(isa),
        aec_compiler::schedule::Target::Hip(_) => None,
    }
}
