//! The profiler that measures on a CUDA device: every plan compiled in
//! parallel (NVRTC, through the kernel cache), its output checked against
//! the default plan's, then timed with events — warm-up runs, the median of
//! the timed ones, inputs rotated among copies so that together they exceed
//! the L2 cache and small shapes are not flattered by it.

use super::{Profiler, TuneOptions, TuneProgress};
use crate::run::{ForwardOutput, HeadDims, KernelElement, KernelOptions, ParallelKernels, Shape};
use aec_compiler::ForwardConfig;
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
    kernels: HashMap<ForwardConfig, Result<ParallelKernels, String>>,
    /// The default plan's output (the first plan measured).
    reference: Option<Vec<f32>>,
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
        let (nq, nk, nv) = (lens[0].1, lens[1].1, lens[2].1);
        // Copies of the inputs until they exceed twice a 50 MiB L2 (at most 4).
        let set_bytes = (nq + nk + nv) * std::mem::size_of::<T>();
        let copies = (100usize << 20).div_ceil(set_bytes.max(1)).clamp(1, 4);
        let mut rng = Uniform(0x9e37_79b9_7f4a_7c15);
        let mut inputs = Vec::with_capacity(copies);
        let gpu = |e: aec_runtime::RuntimeError| format!("allocating inputs: {e}");
        for _ in 0..copies {
            let mut host =
                |n: usize| -> Vec<T> { (0..n).map(|_| T::from_f32(rng.next(-1.0, 1.0))).collect() };
            let (hq, hk, hv) = (host(nq), host(nk), host(nv));
            let mut customs = Vec::new();
            for (name, n) in &lens[3..] {
                let values: Vec<f32> = (0..*n).map(|_| rng.next(0.5, 1.0)).collect();
                customs.push((name.clone(), stream.upload(&values).map_err(gpu)?));
            }
            inputs.push(InputSet {
                q: stream.upload(&hq).map_err(gpu)?,
                k: stream.upload(&hk).map_err(gpu)?,
                v: stream.upload(&hv).map_err(gpu)?,
                customs,
            });
        }
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
            kernels: HashMap::new(),
            reference: None,
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
    fn prepare(&mut self, plans: &[ForwardConfig], progress: &mut dyn FnMut(TuneProgress)) {
        // NVRTC runs in parallel; the kernel cache keeps the cubins, so the
        // loads below find them.
        let threads = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .min(plans.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        let variant = self.variant;
        let (device, dims) = (self.device, self.dims);
        let opts: Vec<KernelOptions> = plans.iter().map(|c| self.kernel_options(*c)).collect();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                let tx = tx.clone();
                let (next, opts) = (&next, &opts);
                scope.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(o) = opts.get(i) else { break };
                        let source = crate::run::forward_source(
                            variant,
                            dims,
                            o,
                            aec_compiler::Isa::for_arch(device.arch()),
                        );
                        if let Ok(src) = source {
                            // Errors surface again (with context) when loading.
                            let _ = crate::run::warm_kernel_cache(device, &src.source, o);
                        }
                        let _ = tx.send(i);
                    }
                });
            }
            drop(tx);
            for (done, _) in rx.iter().enumerate() {
                progress(TuneProgress::Compiled {
                    done: done + 1,
                    total: plans.len(),
                });
            }
        });
        for (config, o) in plans.iter().zip(opts) {
            let compiled = ParallelKernels::compile(self.variant, self.device, self.dims, &o)
                .map_err(|e| format!("compile: {e}"));
            self.kernels.insert(*config, compiled);
        }
    }

    fn measure(&mut self, plan: &ForwardConfig) -> Result<f64, String> {
        let kernels = match self.kernels.remove(plan) {
            Some(k) => k?,
            None => ParallelKernels::compile(
                self.variant,
                self.device,
                self.dims,
                &self.kernel_options(*plan),
            )
            .map_err(|e| format!("compile: {e}"))?,
        };
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
        // Correctness first: against the default's output.
        self.run_once(&kernels, 0)?;
        let o: Vec<f32> = self
            .stream
            .download(&self.out.as_ref().expect("allocated above").o)
            .map_err(|e| format!("download: {e}"))?
            .into_iter()
            .map(T::to_f32)
            .collect();
        if o.iter().any(|x| !x.is_finite()) {
            return Err("output has NaN or infinite values".into());
        }
        match &self.reference {
            None => self.reference = Some(o),
            Some(r) => {
                let (mut num, mut den) = (0.0f64, 0.0f64);
                for (a, b) in o.iter().zip(r) {
                    num += ((a - b) as f64).powi(2);
                    den += (*b as f64).powi(2);
                }
                let rel = (num / den.max(f64::MIN_POSITIVE)).sqrt();
                if rel > MAX_REL_DIFF {
                    return Err(format!(
                        "output differs from the default plan's: relative difference {rel:.2e}"
                    ));
                }
            }
        }
        let mut set = 0;
        let stream = self.stream.clone();
        let timing = time_ms(&stream, self.options.warmup, self.options.reps, || {
            set += 1;
            self.run_once(&kernels, set)
                .map_err(aec_runtime::RuntimeError::Invalid)
        })
        .map_err(|e| format!("timing: {e}"))?;
        Ok(timing.median_ms * 1e3)
    }
}
