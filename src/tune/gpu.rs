//! The profilers that measure on a CUDA device, of the parallel forward
//! ([`GpuProfiler`]) and backward ([`BackwardGpuProfiler`]) and of the
//! recurrent forward and backward ([`RecurrentGpuProfiler`]): every
//! plan compiled in parallel (NVRTC, through the kernel cache), its outputs
//! checked against the default plan's, then timed with events — warm-up
//! runs, the median of the timed ones, inputs rotated among copies so that
//! together they exceed the L2 cache and small shapes are not flattered by
//! it.

pub use super::RecurrentPass;
use super::{PlanResources, Profiler, TuneOptions, TuneProgress};
use crate::run::{
    ForwardOutput, HeadDims, KernelElement, KernelOptions, ParallelKernels, RecurrentDims,
    RecurrentKernels, RecurrentShape, Shape,
};
use aec_compiler::{BackwardConfig, ForwardConfig, Isa, RecurrentConfig};
use aec_frontend::Variant;
use aec_runtime::{Device, DeviceBuffer, Stream, time_ms};
use std::collections::HashMap;

/// Largest relative difference (‖o − o_default‖ / ‖o_default‖) a plan's
/// output may have from the default's: both are bf16 or f16 results of the
/// same sums in another order.
const MAX_REL_DIFF: f64 = 2e-2;

/// One copy of the inputs.
struct InputSet<T: KernelElement> {
    q: DeviceBuffer<T>,
    k: DeviceBuffer<T>,
    v: DeviceBuffer<T>,
    customs: Vec<(String, DeviceBuffer<f32>)>,
    /// The backward's dO (`None` for the forward's profiler).
    d_o: Option<DeviceBuffer<T>>,
}

/// Measures plans of one variant and shape on one device.
pub struct GpuProfiler<'a, T: KernelElement> {
    variant: &'a Variant,
    device: &'a Device,
    dims: HeadDims,
    shape: Shape,
    options: TuneOptions,
    nvrtc_flags: Vec<String>,
    stream: Stream,
    inputs: Vec<InputSet<T>>,
    /// The output, allocated by the first kernels measured (again when a
    /// plan's row outputs differ).
    out: Option<ForwardOutput<T>>,
    /// NaN for every element of `out.o`, written over it before each plan's
    /// correctness run (made once: the shape is the profiler's).
    nan_o: Vec<T>,
    kernels: PlanKernels<ForwardConfig, ParallelKernels>,
    /// The default plan's output (the first plan measured).
    reference: DefaultResults,
}

impl<T: KernelElement> std::fmt::Debug for GpuProfiler<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuProfiler")
            .field("variant", &self.variant.name)
            .field("shape", &self.shape)
            .field("input_copies", &self.inputs.len())
            .finish()
    }
}

/// A deterministic uniform generator (xorshift64*): inputs need only be
/// non-degenerate, not statistically strong.
struct Uniform(u64);

impl Uniform {
    fn next(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * x
    }
}

impl<'a, T: KernelElement> GpuProfiler<'a, T> {
    /// Allocates the inputs (q, k, v uniform in [-1, 1); custom inputs in
    /// [0.5, 1), a range every example's custom input means something in:
    /// slopes, decays, gates) and the output for `shape`.
    pub fn new(
        variant: &'a Variant,
        device: &'a Device,
        dims: HeadDims,
        shape: Shape,
        options: TuneOptions,
        nvrtc_flags: Vec<String>,
    ) -> Result<GpuProfiler<'a, T>, String> {
        let stream = device.stream();
        let lens = super::declared_lens(variant, dims, shape)?;
        let inputs = input_sets(&lens, &options.custom_ranges, &stream, 0)?;
        Ok(GpuProfiler {
            variant,
            device,
            dims,
            shape,
            options,
            nvrtc_flags,
            stream,
            inputs,
            out: None,
            nan_o: Vec::new(),
            kernels: PlanKernels::default(),
            reference: DefaultResults::default(),
        })
    }

    fn kernel_options(&self, config: ForwardConfig) -> KernelOptions {
        KernelOptions {
            elem: T::ELEM,
            config: Some(config),
            nvrtc_flags: self.nvrtc_flags.clone(),
            ..KernelOptions::default()
        }
    }

    fn run_once(&mut self, kernels: &ParallelKernels, set: usize) -> Result<(), String> {
        let inputs = &self.inputs[set % self.inputs.len()];
        let customs: Vec<(&str, &DeviceBuffer<f32>)> = inputs
            .customs
            .iter()
            .map(|(n, b)| (n.as_str(), b))
            .collect();
        let out = self.out.as_mut().expect("measure allocates the output");
        kernels
            .forward_into(&self.stream, &inputs.q, &inputs.k, &inputs.v, &customs, out)
            .map_err(|e| e.to_string())
    }
}

impl<T: KernelElement> Profiler for GpuProfiler<'_, T> {
    fn resources(&self, plan: &ForwardConfig) -> Option<PlanResources> {
        self.kernels.resources(plan)
    }

    fn prepare(&mut self, plans: &[ForwardConfig], progress: &mut dyn FnMut(TuneProgress)) {
        let (variant, device, dims) = (self.variant, self.device, self.dims);
        let opts: Vec<KernelOptions> = plans.iter().map(|c| self.kernel_options(*c)).collect();
        let source = |o: &KernelOptions| {
            crate::run::forward_source(variant, dims, o, Isa::for_arch(device.arch()))
                .map(|s| s.source)
        };
        let compile = |o: &KernelOptions| ParallelKernels::compile(variant, device, dims, o);
        self.kernels
            .prepare(device, plans, opts, progress, source, compile);
    }

    fn measure(&mut self, plan: &ForwardConfig) -> Result<f64, String> {
        let (variant, device, dims) = (self.variant, self.device, self.dims);
        let opts = self.kernel_options(*plan);
        let kernels = self.kernels.take(plan, &opts, |o| {
            ParallelKernels::compile(variant, device, dims, o)
        })?;
        // Plans of one variant share the row outputs; allocate once.
        let rows = self.shape.rows() * kernels.row_output_names().len().max(1);
        if self
            .out
            .as_ref()
            .is_none_or(|o| o.row_outputs.len() != rows)
        {
            self.out = Some(
                kernels
                    .alloc_output(&self.stream, self.shape)
                    .map_err(|e| e.to_string())?,
            );
        }
        // Correctness first: against the default's output, written over NaN
        // so that rows a plan leaves unwritten cannot pass on the output an
        // earlier plan left in the shared buffer.
        {
            let out = self.out.as_mut().expect("allocated above");
            if self.nan_o.len() != out.o.len() {
                self.nan_o = vec![T::from_f32(f32::NAN); out.o.len()];
            }
            self.stream
                .copy_to_device(&self.nan_o, &mut out.o)
                .map_err(|e| format!("fill: {e}"))?;
        }
        self.run_once(&kernels, 0)?;
        let o: Vec<f32> = self
            .stream
            .download(&self.out.as_ref().expect("allocated above").o)
            .map_err(|e| format!("download: {e}"))?
            .into_iter()
            .map(T::to_f32)
            .collect();
        self.reference.check(
            vec![("output".to_string(), o)],
            "output has NaN or infinite values",
        )?;
        let mut set = 0;
        let (stream, options) = (self.stream.clone(), self.options.clone());
        median_micros(&stream, &options, || {
            set += 1;
            self.run_once(&kernels, set)
        })
    }
}

/// The median time of `run` in microseconds: warm-up runs (at least
/// `options.warmup`, and as many as fill `options.warmup_ms`, so the GPU
/// reaches the clocks it holds under sustained load before anything is
/// timed; short bursts run at boost clocks and can rank plans otherwise
/// than training does), then `options.reps` runs each timed with events.
fn median_micros(
    stream: &Stream,
    options: &TuneOptions,
    mut run: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let invalid = aec_runtime::RuntimeError::Invalid;
    let timing_error = |e: aec_runtime::RuntimeError| format!("timing: {e}");
    let first = time_ms(stream, 0, 3, || run().map_err(invalid)).map_err(timing_error)?;
    let warmup = if options.warmup_ms > 0.0 {
        // At most 10,000 runs (kernels of a few microseconds).
        ((options.warmup_ms / first.median_ms.max(1e-3)).ceil() as usize).min(10_000)
    } else {
        0
    }
    .max(options.warmup);
    let timing =
        time_ms(stream, warmup, options.reps, || run().map_err(invalid)).map_err(timing_error)?;
    Ok(timing.median_ms * 1e3)
}

/// Each plan's loaded kernels: compiled in `prepare` (NVRTC in parallel into
/// the kernel cache first, then loaded one by one) and taken by `measure`.
struct PlanKernels<C, K> {
    compiled: HashMap<C, Result<K, String>>,
    /// ptxas's report of each prepared plan's kernels.
    resources: HashMap<C, PlanResources>,
}

impl<C, K> Default for PlanKernels<C, K> {
    fn default() -> Self {
        PlanKernels {
            compiled: HashMap::new(),
            resources: HashMap::new(),
        }
    }
}

impl<C: Copy + Eq + std::hash::Hash, K> PlanKernels<C, K> {
    /// Generates (`source`) and compiles every plan with its options
    /// (`opts`, in the order of `plans`), then loads each (`compile`, which
    /// finds the cubins in the kernel cache).
    fn prepare(
        &mut self,
        device: &Device,
        plans: &[C],
        opts: Vec<KernelOptions>,
        progress: &mut dyn FnMut(TuneProgress),
        source: impl Fn(&KernelOptions) -> Result<String, crate::run::Error> + Sync,
        compile: impl Fn(&KernelOptions) -> Result<K, crate::run::Error>,
    ) {
        let reports = warm_in_parallel(device, &opts, progress, source);
        for ((plan, o), report) in plans.iter().zip(&opts).zip(reports) {
            let loaded = compile(o).map_err(|e| format!("compile: {e}"));
            self.compiled.insert(*plan, loaded);
            if let Some(r) = PlanResources::of(&report) {
                self.resources.insert(*plan, r);
            }
        }
    }

    /// What ptxas reported for `plan`'s kernels, where `prepare` compiled it.
    fn resources(&self, plan: &C) -> Option<PlanResources> {
        self.resources.get(plan).copied()
    }

    /// `plan`'s kernels: those `prepare` made, else compiled now.
    fn take(
        &mut self,
        plan: &C,
        opts: &KernelOptions,
        compile: impl Fn(&KernelOptions) -> Result<K, crate::run::Error>,
    ) -> Result<K, String> {
        match self.compiled.remove(plan) {
            Some(k) => k,
            None => compile(opts).map_err(|e| format!("compile: {e}")),
        }
    }
}

/// The default plan's results (the first plan measured), by name, which
/// every later plan's must match.
#[derive(Default)]
struct DefaultResults(Option<Vec<(String, Vec<f32>)>>);

impl DefaultResults {
    /// Checks `got` (a plan's results by name): finite (else `non_finite`),
    /// and within [`MAX_REL_DIFF`] of the default's; the first call's are
    /// the default's.
    fn check(&mut self, got: Vec<(String, Vec<f32>)>, non_finite: &str) -> Result<(), String> {
        if got.iter().any(|(_, x)| x.iter().any(|x| !x.is_finite())) {
            return Err(non_finite.to_string());
        }
        let Some(reference) = &self.0 else {
            self.0 = Some(got);
            return Ok(());
        };
        for ((name, a), (_, b)) in got.iter().zip(reference) {
            let rel = rel_diff(a, b);
            if rel > MAX_REL_DIFF {
                return Err(format!(
                    "{name} differs from the default plan's: relative difference {rel:.2e}"
                ));
            }
        }
        Ok(())
    }
}

/// ‖a − b‖ / ‖b‖.
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        num += f64::from(x - y).powi(2);
        den += f64::from(*y).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Copies of the inputs (`lens`: q, k, v and the custom inputs by name and
/// element count) until they exceed twice a 50 MiB L2 (at most 4): q, k, v
/// uniform in [-1, 1) (and, with `extra` > 0, a tensor of `extra`
/// elements alike per copy, the backward's dO); custom inputs in their
/// `ranges` entry, else [0.5, 1), a range the parallel examples' custom
/// inputs mean something in: slopes, decays, gates.
fn input_sets<T: KernelElement>(
    lens: &[(String, usize)],
    ranges: &[(String, f32, f32)],
    stream: &Stream,
    extra: usize,
) -> Result<Vec<InputSet<T>>, String> {
    let (nq, nk, nv) = (lens[0].1, lens[1].1, lens[2].1);
    let set_bytes = (nq + nk + nv + extra) * std::mem::size_of::<T>();
    let copies = (100usize << 20).div_ceil(set_bytes.max(1)).clamp(1, 4);
    let mut rng = Uniform(0x9e37_79b9_7f4a_7c15);
    let mut sets = Vec::with_capacity(copies);
    let gpu = |e: aec_runtime::RuntimeError| format!("allocating inputs: {e}");
    for _ in 0..copies {
        let mut host =
            |n: usize| -> Vec<T> { (0..n).map(|_| T::from_f32(rng.next(-1.0, 1.0))).collect() };
        let (hq, hk, hv) = (host(nq), host(nk), host(nv));
        let hx = (extra > 0).then(|| host(extra));
        let mut customs = Vec::new();
        for (name, n) in &lens[3..] {
            let (lo, hi) = ranges
                .iter()
                .find(|(r, _, _)| r == name)
                .map_or((0.5, 1.0), |&(_, lo, hi)| (lo, hi));
            let values: Vec<f32> = (0..*n).map(|_| rng.next(lo, hi)).collect();
            customs.push((name.clone(), stream.upload(&values).map_err(gpu)?));
        }
        sets.push(InputSet {
            q: stream.upload(&hq).map_err(gpu)?,
            k: stream.upload(&hk).map_err(gpu)?,
            v: stream.upload(&hv).map_err(gpu)?,
            customs,
            d_o: match hx {
                Some(h) => Some(stream.upload(&h).map_err(gpu)?),
                None => None,
            },
        });
    }
    Ok(sets)
}

/// Generates (`source`) and compiles each of `opts` into the kernel cache,
/// NVRTC in parallel, reporting each one done; returns ptxas's report of
/// each (empty where it failed: errors are left to the loads that follow,
/// which report them with context).
fn warm_in_parallel(
    device: &Device,
    opts: &[KernelOptions],
    progress: &mut dyn FnMut(TuneProgress),
    source: impl Fn(&KernelOptions) -> Result<String, crate::run::Error> + Sync,
) -> Vec<Vec<aec_runtime::ResourceUsage>> {
    let mut reports = vec![Vec::new(); opts.len()];
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(opts.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, source) = (&next, &source);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(o) = opts.get(i) else { break };
                    let report = source(o)
                        .ok()
                        .and_then(|src| crate::run::warm_kernel_cache(device, &src, o).ok())
                        .unwrap_or_default();
                    let _ = tx.send((i, report));
                }
            });
        }
        drop(tx);
        for (done, (i, report)) in rx.iter().enumerate() {
            reports[i] = report;
            progress(TuneProgress::Compiled {
                done: done + 1,
                total: opts.len(),
            });
        }
    });
    reports
}

/// One copy of the backward's inputs: the forward's inputs, its output by
/// the default forward kernels, and dO.
struct BackwardSet<T: KernelElement> {
    inputs: InputSet<T>,
    forward: ForwardOutput<T>,
    d_o: DeviceBuffer<T>,
}

/// Measures backward plans of one variant and shape on one device, each
/// through [`ParallelKernels::backward`] (which also allocates the
/// gradients and zeroes dQ's accumulator: the same for every plan), its
/// dQ, dK and dV checked against the default plan's.
pub struct BackwardGpuProfiler<'a, T: KernelElement> {
    variant: &'a Variant,
    device: &'a Device,
    dims: HeadDims,
    options: TuneOptions,
    nvrtc_flags: Vec<String>,
    stream: Stream,
    sets: Vec<BackwardSet<T>>,
    kernels: PlanKernels<BackwardConfig, ParallelKernels>,
    /// The default plan's dQ, dK and dV on the first copy.
    reference: DefaultResults,
}

impl<T: KernelElement> std::fmt::Debug for BackwardGpuProfiler<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackwardGpuProfiler")
            .field("variant", &self.variant.name)
            .field("input_copies", &self.sets.len())
            .finish()
    }
}

impl<'a, T: KernelElement> BackwardGpuProfiler<'a, T> {
    /// Allocates the inputs (as [`GpuProfiler::new`], with dO like q, k,
    /// v) and runs the default forward on each copy for the outputs the
    /// backward reads.
    pub fn new(
        variant: &'a Variant,
        device: &'a Device,
        dims: HeadDims,
        shape: Shape,
        options: TuneOptions,
        nvrtc_flags: Vec<String>,
    ) -> Result<BackwardGpuProfiler<'a, T>, String> {
        let stream = device.stream();
        let forward_opts = KernelOptions {
            elem: T::ELEM,
            nvrtc_flags: nvrtc_flags.clone(),
            ..KernelOptions::default()
        };
        let forward = ParallelKernels::compile(variant, device, dims, &forward_opts)
            .map_err(|e| format!("the default forward: {e}"))?;
        let d_o_len = shape.rows() * dims.dv as usize;
        let lens = super::declared_lens(variant, dims, shape)?;
        let mut sets = Vec::new();
        for mut inputs in input_sets::<T>(&lens, &options.custom_ranges, &stream, d_o_len)? {
            let d_o = inputs.d_o.take().expect("input_sets makes dO when asked");
            let customs: Vec<(&str, &DeviceBuffer<f32>)> = inputs
                .customs
                .iter()
                .map(|(n, b)| (n.as_str(), b))
                .collect();
            let out = forward
                .forward(&stream, &inputs.q, &inputs.k, &inputs.v, &customs, shape)
                .map_err(|e| format!("the default forward: {e}"))?;
            sets.push(BackwardSet {
                inputs,
                forward: out,
                d_o,
            });
        }
        Ok(BackwardGpuProfiler {
            variant,
            device,
            dims,
            options,
            nvrtc_flags,
            stream,
            sets,
            kernels: PlanKernels::default(),
            reference: DefaultResults::default(),
        })
    }

    fn kernel_options(&self, config: BackwardConfig) -> KernelOptions {
        KernelOptions {
            elem: T::ELEM,
            backward_config: Some(config),
            nvrtc_flags: self.nvrtc_flags.clone(),
            ..KernelOptions::default()
        }
    }

    fn run_once(
        &self,
        kernels: &ParallelKernels,
        set: usize,
    ) -> Result<crate::run::Gradients<T>, String> {
        let s = &self.sets[set % self.sets.len()];
        let customs: Vec<(&str, &DeviceBuffer<f32>)> = s
            .inputs
            .customs
            .iter()
            .map(|(n, b)| (n.as_str(), b))
            .collect();
        kernels
            .backward(
                &self.stream,
                &s.inputs.q,
                &s.inputs.k,
                &s.inputs.v,
                &customs,
                &s.forward,
                &s.d_o,
            )
            .map_err(|e| e.to_string())
    }
}

impl<T: KernelElement> Profiler<BackwardConfig> for BackwardGpuProfiler<'_, T> {
    fn resources(&self, plan: &BackwardConfig) -> Option<PlanResources> {
        self.kernels.resources(plan)
    }

    fn prepare(&mut self, plans: &[BackwardConfig], progress: &mut dyn FnMut(TuneProgress)) {
        let (variant, device, dims) = (self.variant, self.device, self.dims);
        let opts: Vec<KernelOptions> = plans.iter().map(|c| self.kernel_options(*c)).collect();
        let source = |o: &KernelOptions| {
            crate::run::backward_source(variant, dims, o, Isa::for_arch(device.arch()))
                .map(|s| s.source)
        };
        let compile = |o: &KernelOptions| ParallelKernels::compile(variant, device, dims, o);
        self.kernels
            .prepare(device, plans, opts, progress, source, compile);
    }

    fn measure(&mut self, plan: &BackwardConfig) -> Result<f64, String> {
        let (variant, device, dims) = (self.variant, self.device, self.dims);
        let opts = self.kernel_options(*plan);
        let kernels = self.kernels.take(plan, &opts, |o| {
            ParallelKernels::compile(variant, device, dims, o)
        })?;
        // Correctness first: against the default's gradients.
        let grads = self.run_once(&kernels, 0)?;
        let download = |b: &DeviceBuffer<T>| -> Result<Vec<f32>, String> {
            Ok(self
                .stream
                .download(b)
                .map_err(|e| format!("download: {e}"))?
                .into_iter()
                .map(T::to_f32)
                .collect())
        };
        let got = vec![
            ("dq".to_string(), download(&grads.dq)?),
            ("dk".to_string(), download(&grads.dk)?),
            ("dv".to_string(), download(&grads.dv)?),
        ];
        drop(grads);
        self.reference
            .check(got, "gradients have NaN or infinite values")?;
        let mut set = 0;
        let (stream, options) = (self.stream.clone(), self.options.clone());
        median_micros(&stream, &options, || {
            set += 1;
            self.run_once(&kernels, set).map(drop)
        })
    }
}

/// Measures recurrent forward or backward plans ([`RecurrentPass`]) of one
/// variant and shape on one device, through [`RecurrentKernels::forward`]
/// or [`RecurrentKernels::backward`], each plan's results checked against
/// the default plan's.
pub struct RecurrentGpuProfiler<'a, T: KernelElement> {
    variant: &'a Variant,
    device: &'a Device,
    dims: RecurrentDims,
    shape: RecurrentShape,
    pass: RecurrentPass,
    options: TuneOptions,
    nvrtc_flags: Vec<String>,
    stream: Stream,
    inputs: Vec<InputSet<T>>,
    kernels: PlanKernels<RecurrentConfig, RecurrentKernels>,
    /// The default plan's results on the first copy, by name.
    reference: DefaultResults,
}

impl<T: KernelElement> std::fmt::Debug for RecurrentGpuProfiler<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecurrentGpuProfiler")
            .field("variant", &self.variant.name)
            .field("shape", &self.shape)
            .field("pass", &self.pass)
            .field("input_copies", &self.inputs.len())
            .finish()
    }
}

impl<'a, T: KernelElement> RecurrentGpuProfiler<'a, T> {
    /// Allocates the inputs as [`GpuProfiler::new`] does (custom inputs in
    /// `options.custom_ranges`, else [0.5, 1); for the backward a dO like
    /// v).
    pub fn new(
        variant: &'a Variant,
        device: &'a Device,
        dims: RecurrentDims,
        shape: RecurrentShape,
        pass: RecurrentPass,
        options: TuneOptions,
        nvrtc_flags: Vec<String>,
    ) -> Result<RecurrentGpuProfiler<'a, T>, String> {
        let stream = device.stream();
        let lens = super::recurrent_declared_lens(variant, dims, shape)?;
        let d_o_len = match pass {
            RecurrentPass::Forward => 0,
            RecurrentPass::Backward => lens[2].1,
        };
        let inputs = input_sets(&lens, &options.custom_ranges, &stream, d_o_len)?;
        Ok(RecurrentGpuProfiler {
            variant,
            device,
            dims,
            shape,
            pass,
            options,
            nvrtc_flags,
            stream,
            inputs,
            kernels: PlanKernels::default(),
            reference: DefaultResults::default(),
        })
    }

    fn kernel_options(&self, config: RecurrentConfig) -> KernelOptions {
        let (recurrent_config, recurrent_backward_config) = match self.pass {
            RecurrentPass::Forward => (Some(config), None),
            RecurrentPass::Backward => (None, Some(config)),
        };
        KernelOptions {
            elem: T::ELEM,
            recurrent_config,
            recurrent_backward_config,
            nvrtc_flags: self.nvrtc_flags.clone(),
            ..KernelOptions::default()
        }
    }

    /// The plan's kernels (for the backward, with its modules loaded).
    fn compile(
        variant: &Variant,
        device: &Device,
        dims: RecurrentDims,
        options: &KernelOptions,
    ) -> Result<RecurrentKernels, crate::run::Error> {
        let kernels = RecurrentKernels::compile(variant, device, dims, options)?;
        if options.recurrent_backward_config.is_some() {
            kernels.backward_source()?;
        }
        Ok(kernels)
    }

    /// One run of the pass on input copy `set`; with `keep`, its results by
    /// name (downloaded, as f32).
    fn run_once(
        &self,
        kernels: &RecurrentKernels,
        set: usize,
        keep: bool,
    ) -> Result<Vec<(String, Vec<f32>)>, String> {
        let inputs = &self.inputs[set % self.inputs.len()];
        let customs: Vec<(&str, &DeviceBuffer<f32>)> = inputs
            .customs
            .iter()
            .map(|(n, b)| (n.as_str(), b))
            .collect();
        let (stream, shape) = (&self.stream, self.shape);
        let elems = |name: &str, b: &DeviceBuffer<T>| -> Result<(String, Vec<f32>), String> {
            let host = stream.download(b).map_err(|e| format!("download: {e}"))?;
            Ok((name.to_string(), host.into_iter().map(T::to_f32).collect()))
        };
        let f32s = |name: String, b: &DeviceBuffer<f32>| -> Result<(String, Vec<f32>), String> {
            Ok((
                name,
                stream.download(b).map_err(|e| format!("download: {e}"))?,
            ))
        };
        let (q, k, v) = (&inputs.q, &inputs.k, &inputs.v);
        let fail = |e: crate::run::Error| e.to_string();
        match self.pass {
            RecurrentPass::Forward => {
                let out = kernels
                    .forward(stream, q, k, v, &customs, shape, None, None)
                    .map_err(fail)?;
                if !keep {
                    return Ok(Vec::new());
                }
                Ok(vec![
                    elems("output", &out.o)?,
                    f32s("final state".into(), &out.final_state)?,
                ])
            }
            RecurrentPass::Backward => {
                let d_o = inputs.d_o.as_ref().expect("input_sets makes dO when asked");
                let g = kernels
                    .backward(
                        stream, q, k, v, &customs, shape, None, None, d_o, None, None,
                    )
                    .map_err(fail)?;
                if !keep {
                    return Ok(Vec::new());
                }
                let mut out = vec![
                    elems("dq", &g.dq)?,
                    elems("dk", &g.dk)?,
                    elems("dv", &g.dv)?,
                ];
                for (name, b) in &g.customs {
                    out.push(f32s(format!("d{name}"), b)?);
                }
                Ok(out)
            }
        }
    }
}

impl<T: KernelElement> Profiler<RecurrentConfig> for RecurrentGpuProfiler<'_, T> {
    fn resources(&self, plan: &RecurrentConfig) -> Option<PlanResources> {
        self.kernels.resources(plan)
    }

    fn prepare(&mut self, plans: &[RecurrentConfig], progress: &mut dyn FnMut(TuneProgress)) {
        let (variant, device, dims) = (self.variant, self.device, self.dims);
        let isa = Isa::for_arch(device.arch());
        let opts: Vec<KernelOptions> = plans.iter().map(|c| self.kernel_options(*c)).collect();
        // The forward's source, or the backward's gradient kernels (its
        // states pass, the smaller module, compiles as each plan loads).
        let source = |o: &KernelOptions| match o.recurrent_backward_config {
            None => crate::run::recurrent_source(variant, dims, o, isa).map(|s| s.source),
            Some(cfg) => aec_compiler::recurrent_backward(variant, dims.dk, dims.dv, &cfg, isa)
                .map(|s| s.source)
                .map_err(|source| crate::run::Error::Compile {
                    variant: variant.name.clone(),
                    kernel: "recurrent backward",
                    source,
                }),
        };
        let compile = |o: &KernelOptions| Self::compile(variant, device, dims, o);
        self.kernels
            .prepare(device, plans, opts, progress, source, compile);
    }

    fn measure(&mut self, plan: &RecurrentConfig) -> Result<f64, String> {
        let (variant, device, dims) = (self.variant, self.device, self.dims);
        let opts = self.kernel_options(*plan);
        let kernels = self
            .kernels
            .take(plan, &opts, |o| Self::compile(variant, device, dims, o))?;
        let got = self.run_once(&kernels, 0, true)?;
        let non_finite = format!(
            "{} NaN or infinite values: give the custom inputs ranges the variant means \
             (`--custom-range NAME=LO,HI`)",
            match self.pass {
                RecurrentPass::Forward => "output or final state has",
                RecurrentPass::Backward => "gradients have",
            }
        );
        self.reference.check(got, &non_finite)?;
        let mut set = 0;
        let (stream, options) = (self.stream.clone(), self.options.clone());
        median_micros(&stream, &options, || {
            set += 1;
            self.run_once(&kernels, set, false).map(drop)
        })
    }
}
