//! Running a recurrent variant's forward kernel (chunked linear attention)
//! on an NVIDIA GPU.
//!
//! [`RecurrentKernels::compile`] (or
//! [`Variant::compile_recurrent`](crate::Variant::compile_recurrent) for a
//! variant declared with [`attention!`](crate::attention)) generates the
//! recurrent forward of a variant for head dims `Dk`, `Dv`, compiles it with
//! NVRTC for the device through the same kernel cache as
//! [`ParallelKernels`](super::ParallelKernels) and loads it.
//! [`RecurrentKernels::forward`] checks every input — element counts, custom
//! inputs, the initial state and normaliser, the variant's fixed sizes,
//! 32-bit and grid limits — and only then allocates the outputs and
//! launches. It returns the output and the final state (and, for variants
//! with `normalize`, the final key sum), so a sequence can be continued by a
//! later call.
//!
//! ```no_run
//! use aec::prelude::*;
//!
//! attention! {
//!     /// RetNet retention, recurrent form.
//!     pub struct Retention: recurrent {
//!         q: [B, H, S, Dk], k: [B, H, S, Dk], v: [B, H, S, Dv];
//!         modify_q = |q| q * rsqrt(Dk);
//!         decay = |b, h, t| 1.0 - exp2(-5.0 - h);
//!     }
//! }
//!
//! fn main() -> Result<(), aec::Error> {
//!     let device = Device::open(0)?;
//!     let stream = device.stream();
//!     let dims = RecurrentDims::new(128, 128); // Dk, Dv
//!     let kernels = Retention::compile_recurrent(&device, dims, &KernelOptions::default())?;
//!
//!     let shape = RecurrentShape::new(2, 8, 1000); // B, H, S
//!     let q = stream.upload(&vec![bf16::from_f32(0.1); 2 * 8 * 1000 * 128])?; // [B, H, S, Dk]
//!     let k = stream.upload(&vec![bf16::from_f32(0.2); 2 * 8 * 1000 * 128])?; // [B, H, S, Dk]
//!     let v = stream.upload(&vec![bf16::from_f32(0.3); 2 * 8 * 1000 * 128])?; // [B, H, S, Dv]
//!     let first = kernels.forward(&stream, &q, &k, &v, &[], shape, None, None)?;
//!     // The next 1000 steps continue from the first call's final state.
//!     let next = kernels.forward(&stream, &q, &k, &v, &[], shape, Some(&first.final_state), None)?;
//!     let o: Vec<bf16> = stream.download(&next.o)?; // [B, H, S, Dv]
//!     let state: Vec<f32> = stream.download(&next.final_state)?; // [B, H, Dk, Dv]
//!     println!("{} outputs, state[0] = {}", o.len(), state[0]);
//!     Ok(())
//! }
//! ```
//!
//! [`RecurrentKernels::backward`] runs the chunked backward: the states
//! pass, the state gradient walked backwards, per-chunk dq/dk and dv kernels
//! and the decay's gradient, giving dq, dk, dv, every custom input's gradient
//! and, where an initial state was given, its gradient.

use super::{
    Error, KernelElement, KernelOptions, check_boundaries, check_declared_tensors, check_devices,
    check_elem, compile_and_load, dtype_of, loading_error, upload_i32,
};
use crate::compiler::cuda::recurrent::RECURRENT_CHUNKS;
use crate::compiler::{
    ArgKind, CompileError, Elem, Isa, RecurrentConfig, RecurrentSource, SegmentSplit,
    recurrent_forward,
};
use crate::frontend::ir::Axis;
use crate::frontend::{self, Pattern};
use crate::runtime::{Arg, DType, Device, DeviceBuffer, Kernel, Module, Param, Stream, bf16};

/// The head dimensions a recurrent kernel is generated for: `Dk` (q and k,
/// the rows of the state) and `Dv` (v, the output and the state's columns).
/// The CUDA template takes Dk = 16, 32, 64, 128 or 256 and Dv a multiple of
/// 32 up to 512.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecurrentDims {
    pub dk: u32,
    pub dv: u32,
}

impl RecurrentDims {
    pub const fn new(dk: u32, dv: u32) -> RecurrentDims {
        RecurrentDims { dk, dv }
    }

    /// `Dk = Dv = d`.
    pub const fn square(d: u32) -> RecurrentDims {
        RecurrentDims { dk: d, dv: d }
    }
}

/// The sizes of one recurrent forward call (the head dims are the kernel's):
/// `q, k: [B, H, S, Dk]`, `v` and the output `[B, H, S, Dv]`, the state
/// `[B, H, Dk, Dv]`, the normaliser `[B, H, Dk]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecurrentShape {
    /// Batch.
    pub b: usize,
    /// Heads (each with its own state).
    pub h: usize,
    /// Steps (positions) of this call.
    pub s: usize,
}

impl RecurrentShape {
    /// `B, H, S`.
    pub const fn new(b: usize, h: usize, s: usize) -> RecurrentShape {
        RecurrentShape { b, h, s }
    }

    /// The size of `axis` (B, H or S); `None` for head dims and parallel
    /// axes.
    pub fn size(&self, axis: Axis) -> Option<usize> {
        match axis {
            Axis::B => Some(self.b),
            Axis::H => Some(self.h),
            Axis::S => Some(self.s),
            _ => None,
        }
    }

    fn axes(&self) -> [(Axis, usize); 3] {
        [(Axis::B, self.b), (Axis::H, self.h), (Axis::S, self.s)]
    }
}

impl std::fmt::Display for RecurrentShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[B = {}, H = {}, S = {}]", self.b, self.h, self.s)
    }
}

/// Refuses a parallel variant where recurrent kernels are asked for.
fn require_recurrent(variant: &frontend::Variant) -> Result<(), Error> {
    if variant.pattern != Pattern::Recurrent {
        return Err(Error::Pattern(format!(
            "`{}` is a parallel variant: RecurrentKernels runs recurrent variants only; compile \
             it with ParallelKernels::compile (or `Variant::compile` for a variant declared \
             with attention!)",
            variant.name
        )));
    }
    Ok(())
}

/// Whether the variant has a normaliser (`normalize`).
fn normalized(variant: &frontend::Variant) -> bool {
    variant.recurrent().is_some_and(|r| r.normalize.is_some())
}

/// Zero head dims and head dims that contradict the variant's fixed `Dk`/`Dv`.
fn check_recurrent_dims(variant: &frontend::Variant, dims: RecurrentDims) -> Result<(), Error> {
    for (axis, d) in [(Axis::Dk, dims.dk), (Axis::Dv, dims.dv)] {
        if d == 0 {
            return Err(Error::Shape(format!(
                "{axis} = 0 in the head dims: every size must be at least 1"
            )));
        }
    }
    let fixed = |axis: Axis| {
        variant
            .fixed_sizes
            .iter()
            .find(|(a, _)| *a == axis)
            .map(|&(_, n)| n)
    };
    let want = (
        fixed(Axis::Dk).unwrap_or(dims.dk as usize),
        fixed(Axis::Dv).unwrap_or(dims.dv as usize),
    );
    for (axis, d) in [(Axis::Dk, dims.dk), (Axis::Dv, dims.dv)] {
        if let Some(n) = fixed(axis)
            && n != d as usize
        {
            return Err(Error::Shape(format!(
                "`{}` fixes {axis} = {n}, but the head dims ask for {axis} = {d}: compile with \
                 RecurrentDims {{ dk: {}, dv: {} }}",
                variant.name, want.0, want.1
            )));
        }
    }
    Ok(())
}

/// Generates the recurrent forward of `variant` for `dims` and the
/// instruction set `isa` without compiling it: the CUDA source and its launch
/// facts. Needs no GPU; this is the first step of
/// [`RecurrentKernels::compile`] (which passes the device's instruction
/// set), with the same errors.
pub fn recurrent_source(
    variant: &frontend::Variant,
    dims: RecurrentDims,
    options: &KernelOptions,
    isa: Isa,
) -> Result<RecurrentSource, Error> {
    require_recurrent(variant)?;
    check_recurrent_dims(variant, dims)?;
    let cfg = options.recurrent_config.unwrap_or_else(|| {
        RecurrentConfig::for_variant(variant, dims.dk, dims.dv, options.elem, isa)
    });
    if cfg.elem != options.elem {
        return Err(Error::Shape(format!(
            "the recurrent tile configuration asks for {} elements but the kernel options for \
             {}: set `KernelOptions::elem` and the configuration's `elem` alike",
            cfg.elem.name(),
            options.elem.name()
        )));
    }
    let compile_error = |source: CompileError| Error::Compile {
        variant: variant.name.clone(),
        kernel: "recurrent forward",
        source,
    };
    let source = recurrent_forward(variant, dims.dk, dims.dv, &cfg).map_err(compile_error)?;
    if source.smem_bytes > isa.max_dynamic_smem() {
        return Err(compile_error(CompileError(format!(
            "the tile configuration needs {} bytes of shared memory per block, more than the {} \
             an {isa:?} block may use: use `stages: 1` or a smaller `dv_tile`, or leave \
             `KernelOptions::recurrent_config` to the default",
            source.smem_bytes,
            isa.max_dynamic_smem()
        ))));
    }
    Ok(source)
}

/// The largest `S` the kernel's 32-bit step arithmetic takes (it rounds `S`
/// up to whole chunks).
fn max_steps() -> usize {
    let chunk = RECURRENT_CHUNKS.iter().copied().max().unwrap_or(64) as usize;
    i32::MAX as usize - (chunk - 1)
}

/// The largest grid y (heads) and z (batch) dimension CUDA allows.
const MAX_GRID_YZ: usize = 65_535;

/// Checks, without a GPU, that tensors with the given element counts fit the
/// recurrent forward of `variant` with head dims `dims` for `shape`.
///
/// `tensors` lists `q`, `k`, `v` and every custom input by name with its
/// element count; `initial_state` and `initial_normalizer` are the element
/// counts of the initial state and normaliser, where given. In order, it
/// checks: the variant is recurrent; no size is 0; sizes fit the kernel's
/// 32-bit sizes and CUDA's grid (`H`, `B` ≤ 65535); the variant's fixed
/// sizes; no tensor given twice, none unknown, none missing; every element
/// count equal to the product of its expected shape; the initial state
/// `[B, H, Dk, Dv]`; the initial normaliser `[B, H, Dk]`, which only variants
/// with `normalize` take.
pub fn check_recurrent_shapes(
    variant: &frontend::Variant,
    dims: RecurrentDims,
    shape: RecurrentShape,
    tensors: &[(&str, usize)],
    initial_state: Option<usize>,
    initial_normalizer: Option<usize>,
) -> Result<(), Error> {
    require_recurrent(variant)?;
    let bad = |m: String| Err(Error::Shape(m));
    for (axis, n) in shape.axes() {
        if n == 0 {
            return bad(format!(
                "{axis} = 0 in the shape {shape}: every size must be at least 1"
            ));
        }
        let max = if axis == Axis::S {
            max_steps()
        } else {
            i32::MAX as usize
        };
        if n > max {
            return bad(format!(
                "{axis} = {n} in the shape {shape} does not fit the kernel's 32-bit sizes \
                 (at most {max}): split the call{}",
                if axis == Axis::S {
                    ", passing each call's final state as the next one's initial state"
                } else {
                    ""
                }
            ));
        }
    }
    for (axis, n) in [(Axis::H, shape.h), (Axis::B, shape.b)] {
        if n > MAX_GRID_YZ {
            return bad(format!(
                "{axis} = {n} in the shape {shape} exceeds CUDA's grid limit of {MAX_GRID_YZ} \
                 (the grid is (Dv / dv_tile, H, B)): split the call"
            ));
        }
    }
    check_recurrent_dims(variant, dims)?;
    for &(axis, fixed) in &variant.fixed_sizes {
        if let Some(n) = shape.size(axis)
            && n != fixed
        {
            return bad(format!(
                "`{}` fixes {axis} = {fixed}, but the shape {shape} has {axis} = {n}",
                variant.name
            ));
        }
    }

    let size = |a: Axis| -> Option<usize> {
        match a {
            Axis::Dk => Some(dims.dk as usize),
            Axis::Dv => Some(dims.dv as usize),
            other => shape.size(other),
        }
    };
    check_declared_tensors(variant, tensors, &size, "recurrent forward")?;
    let count = |sizes: &[usize]| sizes.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));

    let (b, h, s) = (shape.b, shape.h, shape.s);
    let (dk, dv) = (dims.dk as usize, dims.dv as usize);
    let state = [b, h, dk, dv];
    let Some(state_len) = count(&state) else {
        return bad(format!(
            "the state would have [B, H, Dk, Dv] = {state:?} elements, more than this machine \
             can address: split the batch"
        ));
    };
    if let Some(len) = initial_state
        && len != state_len
    {
        return bad(format!(
            "tensor `initial_state` has {len} elements, expected [B, H, Dk, Dv] = {state:?} = \
             {state_len} (f32)"
        ));
    }
    if let Some(len) = initial_normalizer {
        if !normalized(variant) {
            return bad(format!(
                "`{}` has no normaliser (no `normalize`), so it takes no `initial_normalizer`: \
                 pass None",
                variant.name
            ));
        }
        let z = [b, h, dk];
        let expected = b * h * dk; // ≤ the state's element count
        if len != expected {
            return bad(format!(
                "tensor `initial_normalizer` has {len} elements, expected [B, H, Dk] = {z:?} = \
                 {expected} (f32)"
            ));
        }
    }
    let o = [b, h, s, dv];
    if count(&o).is_none() {
        return bad(format!(
            "the output `o` would have [B, H, S, Dv] = {o:?} elements, more than this machine \
             can address: split the call"
        ));
    }
    Ok(())
}

/// The forward's parameter list for one combination of given initial state
/// and normaliser: an absent one is passed as a null pointer (`U64` 0),
/// which the kernel reads as "start from zero".
fn recurrent_params(
    variant: &frontend::Variant,
    source: &RecurrentSource,
    with_state_in: bool,
    with_norm_in: bool,
    with_cu_seqlens: bool,
    segmented: bool,
) -> Result<Vec<Param>, Error> {
    let elem = dtype_of(source.config.elem);
    let declared = |name: &String| variant.customs.iter().any(|c| &c.name == name);
    let input = |given: bool| {
        if given {
            Param::In(DType::F32)
        } else {
            Param::U64
        }
    };
    source
        .args
        .iter()
        .map(|a| match a {
            ArgKind::Tensor("q" | "k" | "v") => Ok(Param::In(elem)),
            ArgKind::Tensor("o") => Ok(Param::Out(elem)),
            ArgKind::Custom(name) if declared(name) => Ok(Param::In(DType::F32)),
            ArgKind::State("state_in") => Ok(input(with_state_in)),
            ArgKind::State("norm_in") => Ok(input(with_norm_in)),
            ArgKind::State("state_out" | "norm_out") => Ok(Param::Out(DType::F32)),
            ArgKind::CuSeqlens if with_cu_seqlens => Ok(Param::In(DType::I32)),
            ArgKind::CuSeqlens => Ok(Param::U64),
            // The segment schedule: null (and its sizes ignored) when every
            // chain is whole.
            ArgKind::Workspace("sched") if segmented => Ok(Param::Out(DType::I32)),
            ArgKind::Workspace("carry") if segmented => Ok(Param::Out(DType::F32)),
            ArgKind::Workspace("sched" | "carry") => Ok(Param::U64),
            ArgKind::Segments(_) => Ok(Param::I32),
            ArgKind::Size(Axis::B | Axis::H | Axis::S) => Ok(Param::I32),
            other => Err(Error::Compile {
                variant: variant.name.clone(),
                kernel: "recurrent forward",
                source: CompileError(format!(
                    "the generated kernel takes an argument this API does not know ({other:?}); \
                     aec's run module and kernel generator disagree, which is a bug in aec"
                )),
            }),
        })
        .collect()
}

/// The compiled recurrent forward of one variant for one pair of head dims
/// on one device. See [`forward`](Self::forward).
#[derive(Debug)]
pub struct RecurrentKernels {
    variant: frontend::Variant,
    dims: RecurrentDims,
    source: RecurrentSource,
    device: Device,
    /// The forward, looked up once per combination of given initial state,
    /// normaliser, sequence boundaries and segment schedule (each absent one
    /// is a null pointer): index `state_in | cu_seqlens << 1 | norm_in << 2
    /// | segmented << 3`; `norm_in` only for variants with a normaliser, the
    /// schedule only for kernels with segments.
    launches: Vec<Option<Kernel>>,
    _module: Module,
    pub(super) options: KernelOptions,
    /// The backward's two modules, compiled on the first
    /// [`backward`](Self::backward).
    pub(super) backward: std::sync::OnceLock<super::recurrent_backward::BackwardModules>,
}

impl RecurrentKernels {
    /// Generates the recurrent forward of `variant` for `dims` (with
    /// `options.recurrent_config`, else [`RecurrentConfig::for_variant`]),
    /// compiles it with NVRTC for `device.arch()` through the kernel cache
    /// and loads it onto `device`.
    ///
    /// Errors: a parallel variant ([`Error::Pattern`]: use
    /// [`ParallelKernels`](super::ParallelKernels)); head dims that
    /// contradict the variant's fixed `Dk`/`Dv` ([`Error::Shape`]); head
    /// dims, decays or tiles the template does not support
    /// ([`Error::Compile`]); NVRTC or the driver failing
    /// ([`Error::Runtime`]).
    pub fn compile(
        variant: &frontend::Variant,
        device: &Device,
        dims: RecurrentDims,
        options: &KernelOptions,
    ) -> Result<RecurrentKernels, Error> {
        let source = recurrent_source(variant, dims, options, Isa::for_arch(device.arch()))?;
        let what = format!(
            "`{}` (the recurrent forward kernel of `{}`)",
            source.name, variant.name
        );
        let module = compile_and_load(device, &source.source, options, &what)?;
        let loading = loading_error(device, &what);
        let mut launches = Vec::with_capacity(16);
        for c in 0..16 {
            let (norm_in, segmented) = (c & 4 != 0, c & 8 != 0);
            if (norm_in && !source.normalized) || (segmented && !source.segments) {
                launches.push(None);
                continue;
            }
            let params =
                recurrent_params(variant, &source, c & 1 != 0, norm_in, c & 2 != 0, segmented)?;
            launches.push(Some(
                module.kernel(&source.name, &params).map_err(&loading)?,
            ));
        }
        Ok(RecurrentKernels {
            variant: variant.clone(),
            dims,
            source,
            device: device.clone(),
            launches,
            _module: module,
            options: options.clone(),
            backward: std::sync::OnceLock::new(),
        })
    }

    /// [`compile`](Self::compile) for calls of `shape`'s bucket: where
    /// `options` names no `recurrent_config` (or no
    /// `recurrent_backward_config`), the one `aec tune` (`aec tune
    /// --backward`) stored in the tuning cache for this variant, GPU,
    /// toolchain and shape bucket (`B`, `H` exact, `S` rounded up to a power
    /// of two), else the default. It never tunes; a missing or unreadable
    /// cache means the default.
    pub fn compile_for_shape(
        variant: &frontend::Variant,
        device: &Device,
        dims: RecurrentDims,
        shape: RecurrentShape,
        options: &KernelOptions,
    ) -> Result<RecurrentKernels, Error> {
        let mut options = options.clone();
        if options.recurrent_config.is_none() || options.recurrent_backward_config.is_none() {
            use crate::tune::dispatch::{self, KernelDispatch};
            let parts = dispatch::DeviceKeyParts::of(device);
            let parts = parts.parts();
            let cache = dispatch::process_cache()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if options.recurrent_config.is_none() {
                let plan = KernelDispatch::recurrent(variant, dims, options.elem, &parts);
                options.recurrent_config = plan.lookup_recurrent(&cache, shape).map(|(_, c)| c);
            }
            if options.recurrent_backward_config.is_none() {
                let plan = KernelDispatch::recurrent_backward(variant, dims, options.elem, &parts);
                options.recurrent_backward_config =
                    plan.lookup_recurrent(&cache, shape).map(|(_, c)| c);
            }
        }
        RecurrentKernels::compile(variant, device, dims, &options)
    }

    /// The variant the kernel was generated from.
    pub fn variant(&self) -> &frontend::Variant {
        &self.variant
    }

    pub fn dims(&self) -> RecurrentDims {
        self.dims
    }

    /// The device the kernel is loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The generated source and its launch facts (kernel name, threads,
    /// shared memory, argument order, tile configuration).
    pub fn forward_source(&self) -> &RecurrentSource {
        &self.source
    }

    /// The element type the kernel was compiled for.
    pub fn elem(&self) -> Elem {
        self.source.config.elem
    }

    /// Whether the variant has a normaliser (`normalize`): then
    /// [`forward`](Self::forward) takes an optional initial normaliser and
    /// returns the final one.
    pub fn normalized(&self) -> bool {
        self.source.normalized
    }

    /// The launch grid for `shape`: `(Dv / dv_tile, H, B)`; `None` when it
    /// exceeds what CUDA launches.
    pub fn grid(&self, shape: RecurrentShape) -> Option<(u32, u32, u32)> {
        self.source.grid_for(shape.b, shape.h)
    }

    /// Checks, without touching the GPU, that tensors with the given element
    /// counts fit this kernel for `shape`: [`check_recurrent_shapes`] with
    /// the kernel's variant and head dims.
    pub fn check(
        &self,
        shape: RecurrentShape,
        tensors: &[(&str, usize)],
        initial_state: Option<usize>,
        initial_normalizer: Option<usize>,
    ) -> Result<(), Error> {
        check_recurrent_shapes(
            &self.variant,
            self.dims,
            shape,
            tensors,
            initial_state,
            initial_normalizer,
        )
    }

    /// Runs the forward on `stream`, queued (download on the same stream, or
    /// synchronise, before reading).
    ///
    /// - `q`, `k`: `[B, H, S, Dk]`, `v`: `[B, H, S, Dv]`, in the kernel's
    ///   element type (bf16 unless [`KernelOptions::elem`] says f16),
    ///   contiguous (row-major).
    /// - `customs`: every custom input the variant declares, by name, f32,
    ///   contiguous in its declared axis order (`dt: [B, H, S]`).
    /// - `initial_state`: the state before the first step, f32
    ///   `[B, H, Dk, Dv]`; `None` starts from zero.
    /// - `initial_normalizer`: for variants with `normalize` only, the key
    ///   sum before the first step, f32 `[B, H, Dk]`; `None` starts from zero.
    ///
    /// Every check happens before anything is allocated or launched; a
    /// failing one returns [`Error::Shape`] (or [`Error::Device`] for a
    /// buffer of another device) naming the tensor, its expected shape and
    /// what was given. Passing the returned final state (and normaliser) to
    /// the next call continues the sequence.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: RecurrentShape,
        initial_state: Option<&DeviceBuffer<f32>>,
        initial_normalizer: Option<&DeviceBuffer<f32>>,
    ) -> Result<RecurrentOutput<T>, Error> {
        let inputs = ForwardInputs {
            q,
            k,
            v,
            customs,
            initial_state,
            initial_normalizer,
        };
        self.check_buffers(stream, &inputs)?;
        self.check(
            shape,
            &inputs.lens(),
            initial_state.map(DeviceBuffer::len),
            initial_normalizer.map(DeviceBuffer::len),
        )?;
        self.launch(stream, &inputs, shape, shape.b, shape.s, None)
    }

    /// Runs the forward over a packed batch of sequences of different
    /// lengths (variable-length batches, as serving assembles them).
    ///
    /// - `cu_seqlens`: the sequence boundaries, `[N + 1]` increasing from 0:
    ///   sequence `n` is steps `cu_seqlens[n] … cu_seqlens[n + 1] − 1`; the
    ///   last entry is the total number of steps `T`.
    /// - `q`, `k`: `[1, H, T, Dk]`, `v`: `[1, H, T, Dv]`, the sequences one
    ///   after another; `customs` likewise with `B = 1`, `S = T`.
    /// - `initial_state`: f32 `[N, H, Dk, Dv]`, one per sequence (`None`:
    ///   zero); `initial_normalizer`: f32 `[N, H, Dk]`.
    ///
    /// Returns the output `[1, H, T, Dv]` and the final state of each
    /// sequence, `[N, H, Dk, Dv]` (and normaliser `[N, H, Dk]`). Each
    /// sequence starts from its own initial state, so the result equals N
    /// separate [`forward`](Self::forward) calls. Variants whose closures
    /// read the batch index or the step (`b`, `t`, `B`, `S`) as values are
    /// refused: in a packed batch those are the packed coordinates.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        heads: usize,
        cu_seqlens: &[usize],
        initial_state: Option<&DeviceBuffer<f32>>,
        initial_normalizer: Option<&DeviceBuffer<f32>>,
    ) -> Result<RecurrentOutput<T>, Error> {
        let inputs = ForwardInputs {
            q,
            k,
            v,
            customs,
            initial_state,
            initial_normalizer,
        };
        self.check_buffers(stream, &inputs)?;
        let shape = check_varlen(
            &self.variant,
            self.dims,
            heads,
            cu_seqlens,
            &inputs.lens(),
            initial_state.map(DeviceBuffer::len),
            initial_normalizer.map(DeviceBuffer::len),
        )?;
        // bounded by check_varlen
        let cu = upload_i32(stream, "cu_seqlens", cu_seqlens.iter().copied())?;
        let longest = cu_seqlens
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        self.launch(
            stream,
            &inputs,
            shape,
            cu_seqlens.len() - 1,
            longest,
            Some(&cu),
        )
    }

    /// Checks that the stream and every buffer are on the kernels' device
    /// and of their element type.
    fn check_buffers<T: KernelElement>(
        &self,
        stream: &Stream,
        inputs: &ForwardInputs<'_, T>,
    ) -> Result<(), Error> {
        let name = &self.variant.name;
        check_elem::<T>(name, self.elem(), "q, k and v")?;
        check_devices(&self.device, name, stream, inputs.ordinals())
    }

    /// How the sm_90a forward spreads its chains for `sequences` sequences
    /// of at most `longest` steps (every chain whole for kernels without
    /// segments or when the options say so).
    pub fn segment_split(&self, sequences: usize, heads: usize, longest: usize) -> SegmentSplit {
        let chains =
            (self.dims.dv / self.source.config.dv_tile) as u64 * sequences as u64 * heads as u64;
        if !self.source.segments || self.options.whole_recurrent_chains {
            return SegmentSplit::for_launch(chains, 0, 1);
        }
        let chunks = longest.div_ceil(self.source.config.chunk as usize) as u64;
        SegmentSplit::for_launch(chains, chunks, self.device.sm_count())
    }

    /// Allocates the outputs and launches, after the checks: `shape` is the
    /// inputs' (B, H, S), `sequences` the number of states (B, or N of a
    /// packed batch given by `cu_seqlens`), `longest` the longest one's steps.
    fn launch<T: KernelElement>(
        &self,
        stream: &Stream,
        inputs: &ForwardInputs<'_, T>,
        shape: RecurrentShape,
        sequences: usize,
        longest: usize,
        cu_seqlens: Option<&DeviceBuffer<i32>>,
    ) -> Result<RecurrentOutput<T>, Error> {
        let name = &self.variant.name;
        let too_large = || {
            Error::Shape(format!(
                "the shape {shape} needs a grid for `{}` larger than CUDA launches: split the call",
                self.source.name
            ))
        };
        let grid = self
            .source
            .grid_for(sequences, shape.h)
            .ok_or_else(too_large)?;
        let split = self.segment_split(sequences, shape.h, longest);
        let grid = if split.segments > 1 {
            (
                u32::try_from(split.blocks()).map_err(|_| too_large())?,
                1,
                1,
            )
        } else {
            grid
        };
        let launching = || format!("launching `{}`", self.source.name);
        let runtime = |e| Error::Runtime {
            during: launching(),
            source: e,
        };
        let (b, h, s) = (shape.b, shape.h, shape.s);
        let (dk, dv) = (self.dims.dk as usize, self.dims.dv as usize);
        // The kernel writes every element of the outputs: no fill.
        let mut o = stream.alloc_scratch::<T>(b * h * s * dv).map_err(runtime)?;
        let mut final_state = stream
            .alloc_scratch::<f32>(sequences * h * dk * dv)
            .map_err(runtime)?;
        // The segment schedule's counter and flags start at zero each launch.
        let (mut sched, mut carry) = if split.segments > 1 {
            (
                Some(
                    stream
                        .alloc_zeros::<i32>(split.sched_len())
                        .map_err(runtime)?,
                ),
                Some(
                    stream
                        .alloc_scratch::<f32>(split.carry_len(self.dims.dk))
                        .map_err(runtime)?,
                ),
            )
        } else {
            (None, None)
        };
        let mut final_normalizer = if self.source.normalized {
            Some(
                stream
                    .alloc_scratch::<f32>(sequences * h * dk)
                    .map_err(runtime)?,
            )
        } else {
            None
        };
        {
            let twice = |what: &str| Error::Compile {
                variant: name.clone(),
                kernel: "recurrent forward",
                source: CompileError(format!(
                    "the generated kernel takes `{what}` {}; this is a bug in aec",
                    if what == "norm_out" {
                        "twice or without a normaliser"
                    } else {
                        "twice"
                    }
                )),
            };
            let mut o_slot = Some(&mut o);
            let mut state_slot = Some(&mut final_state);
            let mut norm_slot = final_normalizer.as_mut();
            let (mut sched_slot, mut carry_slot) = (sched.as_mut(), carry.as_mut());
            let size = |n: usize| {
                // The checks bounded B, H and S by i32::MAX.
                Arg::from(i32::try_from(n).unwrap_or(i32::MAX))
            };
            let null = || Arg::from(0u64); // an absent input: start from zero
            let mut args: Vec<Arg<'_>> = Vec::with_capacity(self.source.args.len());
            for a in &self.source.args {
                args.push(match a {
                    ArgKind::Tensor("q") => T::arg(inputs.q),
                    ArgKind::Tensor("k") => T::arg(inputs.k),
                    ArgKind::Tensor("v") => T::arg(inputs.v),
                    ArgKind::Tensor("o") => T::arg_mut(o_slot.take().ok_or_else(|| twice("o"))?),
                    ArgKind::Custom(c) => {
                        let buf = inputs
                            .customs
                            .iter()
                            .find(|(n, _)| n == c)
                            .map(|(_, b)| *b)
                            .ok_or_else(|| Error::Shape(format!("missing custom input `{c}`")))?;
                        Arg::from(buf)
                    }
                    ArgKind::State("state_in") => inputs.initial_state.map_or_else(null, Arg::from),
                    ArgKind::State("norm_in") => {
                        inputs.initial_normalizer.map_or_else(null, Arg::from)
                    }
                    ArgKind::State("state_out") => {
                        Arg::from(state_slot.take().ok_or_else(|| twice("state_out"))?)
                    }
                    ArgKind::State("norm_out") => {
                        Arg::from(norm_slot.take().ok_or_else(|| twice("norm_out"))?)
                    }
                    ArgKind::CuSeqlens => cu_seqlens.map_or_else(null, Arg::from),
                    ArgKind::Workspace("sched") => sched_slot.take().map_or_else(null, Arg::from),
                    ArgKind::Workspace("carry") => carry_slot.take().map_or_else(null, Arg::from),
                    ArgKind::Segments(n) => size(split.arg(n).unwrap_or(0) as usize),
                    ArgKind::Size(Axis::B) => size(b),
                    ArgKind::Size(Axis::H) => size(h),
                    ArgKind::Size(Axis::S) => size(s),
                    other => {
                        return Err(Error::Compile {
                            variant: name.clone(),
                            kernel: "recurrent forward",
                            source: CompileError(format!(
                                "the generated kernel takes an argument this API does not know \
                                 ({other:?}); this is a bug in aec"
                            )),
                        });
                    }
                });
            }
            let which = usize::from(inputs.initial_state.is_some())
                | usize::from(cu_seqlens.is_some()) << 1
                | usize::from(inputs.initial_normalizer.is_some()) << 2
                | usize::from(split.segments > 1) << 3;
            let kernel = self
                .launches
                .get(which)
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    Error::Shape(format!(
                        "`{name}` has no normaliser, so it takes no initial normaliser: pass None"
                    ))
                })?;
            kernel
                .launch(
                    stream,
                    grid,
                    (self.source.threads, 1, 1),
                    self.source.smem_bytes,
                    &mut args,
                )
                .map_err(runtime)?;
        }
        Ok(RecurrentOutput {
            o,
            final_state,
            final_normalizer,
            shape,
            dims: self.dims,
        })
    }
}

/// The buffers of one forward call (and the forward's part of a backward
/// call).
#[derive(Clone, Copy)]
pub(super) struct ForwardInputs<'a, T: KernelElement> {
    pub(super) q: &'a DeviceBuffer<T>,
    pub(super) k: &'a DeviceBuffer<T>,
    pub(super) v: &'a DeviceBuffer<T>,
    pub(super) customs: &'a [(&'a str, &'a DeviceBuffer<f32>)],
    pub(super) initial_state: Option<&'a DeviceBuffer<f32>>,
    pub(super) initial_normalizer: Option<&'a DeviceBuffer<f32>>,
}

impl<T: KernelElement> ForwardInputs<'_, T> {
    /// q, k, v and the custom inputs by name with their element counts.
    pub(super) fn lens(&self) -> Vec<(&str, usize)> {
        [
            ("q", self.q.len()),
            ("k", self.k.len()),
            ("v", self.v.len()),
        ]
        .into_iter()
        .chain(self.customs.iter().map(|(n, b)| (*n, b.len())))
        .collect()
    }

    /// Every given buffer by name with its device ordinal.
    pub(super) fn ordinals(&self) -> Vec<(&str, usize)> {
        [
            ("q", self.q.ordinal()),
            ("k", self.k.ordinal()),
            ("v", self.v.ordinal()),
        ]
        .into_iter()
        .chain(self.customs.iter().map(|(n, b)| (*n, b.ordinal())))
        .chain(self.initial_state.map(|b| ("initial_state", b.ordinal())))
        .chain(
            self.initial_normalizer
                .map(|b| ("initial_normalizer", b.ordinal())),
        )
        .collect()
    }
}

/// Checks, without a GPU, a packed variable-length call of `variant`'s
/// recurrent forward ([`RecurrentKernels::forward_varlen`]) and returns the
/// inputs' shape `(1, H, T)`: `cu_seqlens` has at least two entries,
/// starts at 0, increases strictly and ends at the steps q holds; the
/// closures do not read `b`, `t`, `B` or `S` as values; q, k, v and the
/// custom inputs fit `[1, H, T, …]` ([`check_recurrent_shapes`]); the
/// initial state is `[N, H, Dk, Dv]` and the normaliser `[N, H, Dk]`.
pub fn check_varlen(
    variant: &frontend::Variant,
    dims: RecurrentDims,
    heads: usize,
    cu_seqlens: &[usize],
    tensors: &[(&str, usize)],
    initial_state: Option<usize>,
    initial_normalizer: Option<usize>,
) -> Result<RecurrentShape, Error> {
    require_recurrent(variant)?;
    let bad = |m: String| Err(Error::Shape(m));
    if let Some(axis) = packed_coordinate_read(variant) {
        return bad(format!(
            "`{}` reads {axis} as a value in a closure; in a packed variable-length batch that \
             would be the packed coordinate, not the sequence's: run its sequences as separate \
             calls of `forward`",
            variant.name
        ));
    }
    check_boundaries("cu_seqlens", cu_seqlens, "step")?;
    let sequences = cu_seqlens.len() - 1;
    if sequences > MAX_GRID_YZ {
        return bad(format!(
            "`cu_seqlens` holds {sequences} sequences; CUDA's grid takes at most {MAX_GRID_YZ} \
             per call: split the batch"
        ));
    }
    let total = cu_seqlens[sequences];
    let dk = dims.dk as usize;
    let q_len = tensors
        .iter()
        .find(|(n, _)| *n == "q")
        .map_or(0, |&(_, n)| n);
    if heads > 0 && q_len.is_multiple_of(heads * dk) && q_len / (heads * dk) != total {
        return bad(format!(
            "`cu_seqlens` ends at {total}, but q holds {} steps ([1, H, T, Dk] with H = {heads}, \
             Dk = {dk}): the last entry must be the total number of steps",
            q_len / (heads * dk)
        ));
    }
    let shape = RecurrentShape::new(1, heads, total);
    check_recurrent_shapes(variant, dims, shape, tensors, None, None)?;
    let (dv, n, h) = (dims.dv as usize, sequences, heads);
    let Some(state) = [n, h, dk, dv]
        .iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
    else {
        return bad(format!(
            "the states would have [N, H, Dk, Dv] = [{n}, {h}, {dk}, {dv}] elements, more than \
             this machine can address: split the batch"
        ));
    };
    if let Some(len) = initial_state
        && len != state
    {
        return bad(format!(
            "tensor `initial_state` has {len} elements, expected [N, H, Dk, Dv] = [{n}, {h}, \
             {dk}, {dv}] = {state} (f32, one state per sequence)"
        ));
    }
    if let Some(len) = initial_normalizer {
        if !normalized(variant) {
            return bad(format!(
                "`{}` has no normaliser (no `normalize`), so it takes no `initial_normalizer`: \
                 pass None",
                variant.name
            ));
        }
        if len != n * h * dk {
            return bad(format!(
                "tensor `initial_normalizer` has {len} elements, expected [N, H, Dk] = [{n}, \
                 {h}, {dk}] = {} (f32, one per sequence)",
                n * h * dk
            ));
        }
    }
    Ok(shape)
}

/// The first of `b`, `t`, `B`, `S` a recurrent closure reads as a value.
fn packed_coordinate_read(variant: &frontend::Variant) -> Option<&'static str> {
    use crate::frontend::ir::Op;
    let rec = variant.recurrent()?;
    let regions = [&rec.modify_q, &rec.modify_k, &rec.modify_v, &rec.normalize]
        .into_iter()
        .flatten()
        .chain(rec.decay.as_ref().map(|d| &d.region));
    let reads = [
        (Op::Index(Axis::B), "the batch index `b`"),
        (Op::Index(Axis::S), "the step `t`"),
        (Op::Shape(Axis::B), "the batch size `B`"),
        (Op::Shape(Axis::S), "the sequence length `S`"),
    ];
    for r in regions {
        for out in &r.outputs {
            if let Some((_, what)) = reads
                .iter()
                .find(|(op, _)| r.graph.depends_on(out.node, |n| n.op == *op))
            {
                return Some(what);
            }
        }
    }
    None
}

/// What [`RecurrentKernels::forward`] returns. The buffers are filled once
/// the stream reaches the launch; [`Stream::download`] waits for that.
#[derive(Debug)]
pub struct RecurrentOutput<T: KernelElement = bf16> {
    /// The output, `[B, H, S, Dv]`, in the kernel's element type.
    pub o: DeviceBuffer<T>,
    /// The state after the last step, f32 `[B, H, Dk, Dv]`: the next call's
    /// `initial_state` to continue the sequence.
    pub final_state: DeviceBuffer<f32>,
    /// For variants with `normalize`, the key sum after the last step, f32
    /// `[B, H, Dk]` (the next call's `initial_normalizer`); `None` otherwise.
    pub final_normalizer: Option<DeviceBuffer<f32>>,
    pub shape: RecurrentShape,
    pub dims: RecurrentDims,
}
