//! Running a variant's forward kernel on an NVIDIA GPU.
//!
//! [`ParallelKernels::compile`] (or [`Variant::compile`](crate::Variant::compile)
//! for a variant declared with [`attention!`](crate::attention)) generates the
//! parallel forward kernel of a variant for given head dims, compiles it with
//! NVRTC for the device (through a process-wide [`KernelCache`] in
//! [`KernelCache::from_env`]'s directory) and loads it.
//! [`ParallelKernels::forward`] checks every input against the variant and the
//! kernel — element counts, custom inputs, head counts, the variant's fixed
//! sizes, 32-bit and grid limits — and only then allocates the outputs and
//! launches.
//!
//! ```no_run
//! use aec::prelude::*;
//!
//! attention! {
//!     /// Softmax attention with grouped-query key/value heads.
//!     pub struct Gqa: parallel {
//!         q: [B, H, Sq, Dqk], k: [B, Hkv, Skv, Dqk], v: [B, Hkv, Skv, Dv];
//!         modify_q = |q| q * rsqrt(Dqk);
//!         online {
//!             state { m = -inf, l = 0.0 }
//!             fwd = |s, st| {
//!                 let m = max(st.m, rowmax(s));
//!                 let p = exp(s - m);
//!                 (p, State { m, l: st.l * exp(st.m - m) + rowsum(p) }, exp(st.m - m))
//!             }
//!             epilogue = |o, st| (o / st.l, Scales { lse: st.m + log(st.l) })
//!         }
//!     }
//! }
//!
//! fn main() -> Result<(), aec::Error> {
//!     let device = Device::open(0)?;
//!     let stream = device.stream();
//!     let kernels = Gqa::compile(&device, HeadDims::new(128, 128), &KernelOptions::default())?;
//!
//!     let shape = Shape::new(2, 8, 2, 1000, 1000); // B, H, Hkv, Sq, Skv
//!     let q = stream.upload(&vec![bf16::from_f32(0.1); 2 * 8 * 1000 * 128])?;
//!     let k = stream.upload(&vec![bf16::from_f32(0.2); 2 * 2 * 1000 * 128])?;
//!     let v = stream.upload(&vec![bf16::from_f32(0.3); 2 * 2 * 1000 * 128])?;
//!     let out = kernels.forward(&stream, &q, &k, &v, &[], shape)?;
//!
//!     let o: Vec<bf16> = stream.download(&out.o)?; // [B, H, Sq, Dv]
//!     let lse: Vec<f32> = out.download_row(&stream, "lse")?; // [B, H, Sq]
//!     println!("{} outputs, lse[0] = {}", o.len(), lse[0]);
//!     Ok(())
//! }
//! ```
//!
//! [`ParallelKernels::backward`] takes the forward's inputs and output and
//! `dO` and returns the gradients of q, k, v and every custom input (its
//! kernels are compiled on first use). Tensors are bf16, or f16 with
//! `KernelOptions { elem: Elem::F16, .. }`.
//!
//! **Recurrent** variants (chunked linear attention) have their own type,
//! [`RecurrentKernels`] (module [`recurrent`]): the forward
//! with an optional initial state and the final state returned. No recurrent
//! backward kernel exists yet (the f64 reference interpreter,
//! [`reference::backward`](crate::reference::backward), computes its gradients
//! on the CPU). Giving a variant of one pattern to the other type returns
//! [`Error::Pattern`].

mod backward;
mod block_sparse;
mod paged;
pub mod recurrent;
mod recurrent_backward;
pub mod recurrent_decode;
mod varlen;

pub use backward::Gradients;
pub use block_sparse::{BlockMask, BlockMaskLists, block_sparse_forward_source, check_block_mask};
pub use paged::{PagedKv, check_paged_shapes, paged_forward_source};
pub use recurrent::{
    RecurrentDims, RecurrentKernels, RecurrentOutput, RecurrentShape, check_recurrent_shapes,
    check_varlen, recurrent_source,
};
pub use recurrent_backward::RecurrentGradients;
pub use recurrent_decode::{RecurrentDecoder, recurrent_step_source};
pub use varlen::{VarlenBatch, check_varlen_shapes, varlen_forward_source};

use std::sync::OnceLock;

use crate::compiler::schedule::{DeviceConfig, model_choice, rank_forward};
use crate::compiler::{
    ArgKind, BackwardConfig, BackwardSource, CompileError, Elem, ForwardConfig, Isa, KernelSource,
    RecurrentConfig, Residency, parallel_backward, parallel_backward_varlen, parallel_forward,
};
use crate::frontend::ir::Axis;
use crate::frontend::variant::TensorDecl;
use crate::frontend::{self, Pattern};
use crate::runtime::{
    Arg, CompileOptions, DType, Device, DeviceBuffer, Element, Kernel, KernelCache, Module, Param,
    RuntimeError, Stream, TensorMap, bf16, f16,
};

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::bf16 {}
    impl Sealed for super::f16 {}
}

/// The element types of q, k, v, o and their gradients: [`bf16`] and
/// [`f16`](struct@f16) (the kernels accumulate in f32). Sealed.
pub trait KernelElement: Element + sealed::Sealed {
    /// The kernels' element type for this Rust type.
    const ELEM: Elem;
    #[doc(hidden)]
    fn arg(b: &DeviceBuffer<Self>) -> Arg<'_>;
    #[doc(hidden)]
    fn arg_mut(b: &mut DeviceBuffer<Self>) -> Arg<'_>;
    #[doc(hidden)]
    fn from_f32(x: f32) -> Self;
    #[doc(hidden)]
    fn to_f32(self) -> f32;
}

impl KernelElement for bf16 {
    const ELEM: Elem = Elem::Bf16;
    fn arg(b: &DeviceBuffer<Self>) -> Arg<'_> {
        Arg::from(b)
    }
    fn arg_mut(b: &mut DeviceBuffer<Self>) -> Arg<'_> {
        Arg::from(b)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl KernelElement for f16 {
    const ELEM: Elem = Elem::F16;
    fn arg(b: &DeviceBuffer<Self>) -> Arg<'_> {
        Arg::from(b)
    }
    fn arg_mut(b: &mut DeviceBuffer<Self>) -> Arg<'_> {
        Arg::from(b)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// The runtime's dtype of an element type.
fn dtype_of(elem: Elem) -> DType {
    match elem {
        Elem::Bf16 => DType::BF16,
        Elem::F16 => DType::F16,
    }
}

/// Everything compiling or running a variant's kernels can fail with. Each
/// message says what is wrong and, where there is something to do, what.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The sizes, head dims or tensors given do not fit the variant or the
    /// kernel (found before anything is allocated or launched).
    #[error("{0}")]
    Shape(String),
    /// A buffer or stream belongs to another device than the kernel.
    #[error("{0}")]
    Device(String),
    /// The kernel generator rejected the variant or the tile configuration.
    #[error("cannot generate the {kernel} kernel of `{variant}`: {source}")]
    Compile {
        variant: String,
        /// `forward` or `backward`.
        kernel: &'static str,
        #[source]
        source: CompileError,
    },
    /// The variant's pattern does not fit the kernels asked for: a recurrent
    /// variant given to [`ParallelKernels`] or a parallel one to
    /// [`RecurrentKernels`]. The message names the type to use.
    #[error("{0}")]
    Pattern(String),
    /// What was asked for does not exist yet (the backward of recurrent
    /// variants).
    #[error("{0}")]
    NotImplemented(String),
    /// A kernel library ([`Library`](crate::library::Library)) is missing a
    /// file, is malformed, or has no kernels for what was asked: `path`
    /// names the library directory or the file, `message` what is wrong.
    #[error("{}: {message}", path.display())]
    Library {
        path: std::path::PathBuf,
        message: String,
    },
    /// The CUDA driver or NVRTC failed; `during` says at which step.
    #[error("{during}: {source}")]
    Runtime {
        during: String,
        #[source]
        source: RuntimeError,
    },
}

impl From<RuntimeError> for Error {
    /// Wraps an error of a direct [`runtime`](crate::runtime) call (an upload,
    /// a download) so that `?` works in functions returning [`Error`].
    fn from(source: RuntimeError) -> Self {
        Error::Runtime {
            during: "CUDA runtime".into(),
            source,
        }
    }
}

/// The head dimensions a kernel is generated for: `Dqk` (q and k) and `Dv`
/// (v and the output). The CUDA templates take multiples of 16, Dv up to 512
/// and Dqk up to 576 in the forward (the sm_80 template, where shared memory
/// allows: MLA decoding) and 256 in the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeadDims {
    pub dqk: u32,
    pub dv: u32,
}

impl HeadDims {
    pub const fn new(dqk: u32, dv: u32) -> HeadDims {
        HeadDims { dqk, dv }
    }

    /// `Dqk = Dv = d`.
    pub const fn square(d: u32) -> HeadDims {
        HeadDims { dqk: d, dv: d }
    }
}

/// The sizes of one forward call (the head dims are the kernel's).
///
/// For a variant without grouped-query heads (k and v declared with `H`),
/// `hkv` must equal `h`: use [`Shape::mha`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Batch.
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads; `h` must be a multiple of it.
    pub hkv: usize,
    /// Query positions.
    pub sq: usize,
    /// Key/value positions.
    pub skv: usize,
}

impl Shape {
    /// `B, H, Hkv, Sq, Skv`.
    pub const fn new(b: usize, h: usize, hkv: usize, sq: usize, skv: usize) -> Shape {
        Shape { b, h, hkv, sq, skv }
    }

    /// Multi-head: `Hkv = H`.
    pub const fn mha(b: usize, h: usize, sq: usize, skv: usize) -> Shape {
        Shape::new(b, h, h, sq, skv)
    }

    /// The size of `axis` (B, H, Hkv, Sq or Skv); `None` for head dims and
    /// recurrent axes.
    pub fn size(&self, axis: Axis) -> Option<usize> {
        match axis {
            Axis::B => Some(self.b),
            Axis::H => Some(self.h),
            Axis::Hkv => Some(self.hkv),
            Axis::Sq => Some(self.sq),
            Axis::Skv => Some(self.skv),
            _ => None,
        }
    }

    /// Query rows, `B · H · Sq`: the length of each row output.
    pub fn rows(&self) -> usize {
        self.b * self.h * self.sq
    }

    fn axes(&self) -> [(Axis, usize); 5] {
        [
            (Axis::B, self.b),
            (Axis::H, self.h),
            (Axis::Hkv, self.hkv),
            (Axis::Sq, self.sq),
            (Axis::Skv, self.skv),
        ]
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[B = {}, H = {}, Hkv = {}, Sq = {}, Skv = {}]",
            self.b, self.h, self.hkv, self.sq, self.skv
        )
    }
}

/// How to generate and compile the kernels. `KernelOptions::default()` is
/// right unless you tune tiles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelOptions {
    /// The element type of q, k, v, o and the gradients: [`Elem::Bf16`]
    /// (the default) or [`Elem::F16`]; `forward` and `backward` then take
    /// buffers of [`bf16`] or [`f16`](struct@f16).
    pub elem: Elem,
    /// The tile configuration; `None` uses [`ForwardConfig::default_for`].
    /// Its `elem` must equal `elem`.
    pub config: Option<ForwardConfig>,
    /// The backward's tile configuration; `None` uses
    /// [`BackwardConfig::for_variant`]. Its `elem` must equal `elem`.
    pub backward_config: Option<BackwardConfig>,
    /// The recurrent forward's tile configuration ([`RecurrentKernels`]);
    /// `None` uses [`RecurrentConfig::for_variant`]. Its `elem` must equal
    /// `elem`.
    pub recurrent_config: Option<RecurrentConfig>,
    /// The recurrent backward's tile configuration
    /// ([`RecurrentKernels::backward`]; its chunk must be
    /// [`BACKWARD_CHUNK`](crate::compiler::cuda::recurrent::BACKWARD_CHUNK));
    /// `None` uses the forward's ([`RecurrentConfig::backward_for`]). Its
    /// `elem` must equal `elem`.
    pub recurrent_backward_config: Option<RecurrentConfig>,
    /// Walk every chain of the sm_90a recurrent forward whole. By default
    /// (`false`) the chains of a last, partly filled wave are cut into
    /// sequence segments that run side by side ([`SegmentSplit`]).
    ///
    /// [`SegmentSplit`]: crate::compiler::SegmentSplit
    pub whole_recurrent_chains: bool,
    /// Extra NVRTC options appended to `-std=c++17` and the include
    /// directories (e.g. `-lineinfo`).
    pub nvrtc_flags: Vec<String>,
    /// K and V share storage: V is the first `Dv` columns of every K row
    /// (multi-head latent attention's compressed KV cache, Dqk 576 = 512
    /// latent + 64 RoPE columns, Dv 512). The forwards then load each K tile
    /// once and take P·V's operand from it; pass the cache as both `k` and
    /// `v` (`[B, Hkv, Skv, Dqk]`, or the paged `[pages, Hkv, page_size,
    /// Dqk]`). Needs Dv ≤ Dqk; the default tiles are then the sm_80
    /// template's (the wgmma ones read V from its own tiles). The backward
    /// of such kernels is refused (dK and dV would alias).
    pub v_in_k: bool,
}

/// The process-wide kernel cache: memory, and disk in [`KernelCache::from_env`]'s
/// directory.
fn cache() -> &'static KernelCache {
    static CACHE: OnceLock<KernelCache> = OnceLock::new();
    CACHE.get_or_init(KernelCache::from_env)
}

/// Compiles `code` with NVRTC for `device` through the kernel cache (with
/// the options' extra flags) and loads it. `what` names the kernels in
/// errors ("the backward kernels of `softmax`").
fn compile_and_load(
    device: &Device,
    code: &str,
    options: &KernelOptions,
    what: &str,
) -> Result<Module, Error> {
    let compiled = cache()
        .compile(code, &nvrtc_options(device, options))
        .map_err(|e| Error::Runtime {
            during: format!("compiling {what} with NVRTC for {}", device.arch()),
            source: e,
        })?;
    Module::load(device, &compiled.cubin).map_err(loading_error(device, what))
}

/// Compiles `code` for `device` into the kernel cache without loading it:
/// NVRTC is thread-safe, so the tuner compiles its plans in parallel this
/// way and loads them afterwards from the cache. Returns ptxas's report of
/// the entry functions (every runtime build asks NVRTC for it).
pub(crate) fn warm_kernel_cache(
    device: &Device,
    code: &str,
    options: &KernelOptions,
) -> Result<Vec<crate::runtime::ResourceUsage>, RuntimeError> {
    cache()
        .compile(code, &nvrtc_options(device, options))
        .map(|c| c.resources())
}

/// The NVRTC options of every runtime build, so that the tuner's warmed
/// kernel-cache entries are the ones `compile_and_load` finds: `device`'s
/// architecture, ptxas's resource report in the log (for the tuner) and
/// the options' extra flags.
fn nvrtc_options(device: &Device, options: &KernelOptions) -> CompileOptions {
    let mut opts = CompileOptions::new(device.arch()).with_resource_usage();
    opts.flags.extend(options.nvrtc_flags.iter().cloned());
    opts
}

/// The error of loading `what` (a module, or a kernel looked up in it) onto
/// `device`.
fn loading_error(device: &Device, what: &str) -> impl Fn(RuntimeError) -> Error {
    let during = format!(
        "loading {what} onto device {} ({})",
        device.ordinal(),
        device.name()
    );
    move |e| Error::Runtime {
        during: during.clone(),
        source: e,
    }
}

/// Generates the parallel forward kernel of `variant` for `dims` and the
/// instruction set `isa` without compiling it: the CUDA source and its launch
/// facts. Needs no GPU; this is the first step of
/// [`ParallelKernels::compile`] (which passes the device's instruction set),
/// with the same errors.
pub fn forward_source(
    variant: &frontend::Variant,
    dims: HeadDims,
    options: &KernelOptions,
    isa: Isa,
) -> Result<KernelSource, Error> {
    generate_forward(
        variant,
        dims,
        options,
        isa,
        ForwardConfig::default_for,
        parallel_forward,
    )
}

/// A forward generator of the compiler (dense, variable-length or paged rows).
type ForwardGenerator =
    fn(&frontend::Variant, u32, u32, &ForwardConfig) -> Result<KernelSource, CompileError>;

/// Generates a forward with `generate` and the options' tile configuration
/// (checked against the instruction set and the element type), else the
/// `default` one.
fn generate_forward(
    variant: &frontend::Variant,
    dims: HeadDims,
    options: &KernelOptions,
    isa: Isa,
    default: fn(&frontend::Variant, u32, u32, Elem, Isa) -> ForwardConfig,
    generate: ForwardGenerator,
) -> Result<KernelSource, Error> {
    require_parallel(variant)?;
    check_head_dims(variant, dims)?;
    let mut cfg = options.config.unwrap_or_else(|| {
        crate::compiler::untuned_forward_config(
            default,
            variant,
            dims.dqk,
            dims.dv,
            options.elem,
            isa,
            options.v_in_k,
        )
    });
    cfg.v_in_k |= options.v_in_k;
    if cfg.wgmma && isa != Isa::Sm90a {
        return Err(Error::Shape(
            "the tile configuration asks for wgmma, which only sm_90a (Hopper) has: \
             set `wgmma: false` or leave `KernelOptions::config` to the default"
                .into(),
        ));
    }
    if cfg.elem != options.elem {
        return Err(Error::Shape(format!(
            "the tile configuration asks for {} elements but the kernel options for {}: \
             set `KernelOptions::elem` and the configuration's `elem` alike",
            cfg.elem.name(),
            options.elem.name()
        )));
    }
    let compile_error = |source| Error::Compile {
        variant: variant.name.clone(),
        kernel: "forward",
        source,
    };
    let source = generate(variant, dims.dqk, dims.dv, &cfg).map_err(compile_error)?;
    if source.smem_bytes > isa.max_dynamic_smem() {
        return Err(compile_error(CompileError(format!(
            "the tile configuration needs {} bytes of shared memory per block, more than the {} \
             an {isa:?} block may use: use fewer `stages` or smaller blocks, or leave \
             `KernelOptions::config` to the default",
            source.smem_bytes,
            isa.max_dynamic_smem()
        ))));
    }
    Ok(source)
}

/// Generates the parallel backward kernels of `variant` for `dims` and the
/// instruction set `isa` without compiling them. Needs no GPU; the first step
/// of [`ParallelKernels::backward`]'s compilation, with the same errors.
pub fn backward_source(
    variant: &frontend::Variant,
    dims: HeadDims,
    options: &KernelOptions,
    isa: Isa,
) -> Result<BackwardSource, Error> {
    generate_backward(variant, dims, options, isa, false)
}

/// The backward of a packed variable-length batch (what
/// [`ParallelKernels::backward`] runs on the output of
/// [`ParallelKernels::forward_varlen`]), generated as [`backward_source`]
/// generates the dense one. Needs no GPU.
pub fn varlen_backward_source(
    variant: &frontend::Variant,
    dims: HeadDims,
    options: &KernelOptions,
    isa: Isa,
) -> Result<BackwardSource, Error> {
    generate_backward(variant, dims, options, isa, true)
}

/// [`backward_source`], or with `varlen` [`varlen_backward_source`].
fn generate_backward(
    variant: &frontend::Variant,
    dims: HeadDims,
    options: &KernelOptions,
    isa: Isa,
    varlen: bool,
) -> Result<BackwardSource, Error> {
    require_parallel_backward(variant)?;
    check_head_dims(variant, dims)?;
    let cfg = options.backward_config.unwrap_or_else(|| {
        BackwardConfig::for_variant(variant, dims.dqk, dims.dv, options.elem, isa)
    });
    if cfg.wgmma && isa != Isa::Sm90a {
        return Err(Error::Shape(
            "the backward tile configuration asks for wgmma, which only sm_90a (Hopper) has: \
             set `wgmma: false` or leave `KernelOptions::backward_config` to the default"
                .into(),
        ));
    }
    if cfg.elem != options.elem {
        return Err(Error::Shape(format!(
            "the backward tile configuration asks for {} elements but the kernel options for \
             {}: set `KernelOptions::elem` and the configuration's `elem` alike",
            cfg.elem.name(),
            options.elem.name()
        )));
    }
    let generate = if varlen {
        parallel_backward_varlen
    } else {
        parallel_backward
    };
    generate(variant, dims.dqk, dims.dv, &cfg).map_err(|source| Error::Compile {
        variant: variant.name.clone(),
        kernel: "backward",
        source,
    })
}

/// The forward configuration a call of `shape` runs untuned on `device` (a
/// GPU of instruction set `isa`; what `compile_for_shape` takes when the
/// tuning cache has nothing, and what the tuner measures as the default):
/// the variant's default tile ([`crate::compiler::untuned_forward_config`])
/// adapted to the shape's packed rows and grid
/// ([`ForwardConfig::for_decoding_call`]: decoding tiles, few-block rules, the producer),
/// and on sm_90a, for other shapes, the cost model's first plan where it
/// ranks the default [`MODEL_CHOICE_MARGIN`](crate::compiler::schedule::MODEL_CHOICE_MARGIN)
/// times slower — small grids,
/// which the persistent default's pairs of 128-row blocks leave short of a
/// wave ([`model_choice`]).
pub fn untuned_config_for_shape(
    variant: &frontend::Variant,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    isa: Isa,
    device: &DeviceConfig,
    v_in_k: bool,
) -> ForwardConfig {
    untuned_choice(variant, dims, shape, elem, isa, device, v_in_k).config
}

/// What [`untuned_choice`] based a shape's untuned forward on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UntunedReason {
    /// The variant's default tile: nothing about the shape changes it.
    Default,
    /// The decoding rules' tile for the shape's packed rows and grid
    /// ([`ForwardConfig::for_decoding_call`]).
    DecodeRule,
    /// The cost model's first plan, which it ranks `ratio` times faster
    /// than the default ([`model_choice`]).
    Model { ratio: f64 },
}

impl UntunedReason {
    /// How a kernel library's manifest names it (`chosen_by`).
    pub fn name(self) -> &'static str {
        match self {
            UntunedReason::Default => "default",
            UntunedReason::DecodeRule => "decoding rule",
            UntunedReason::Model { .. } => "cost model",
        }
    }
}

/// A shape's untuned forward configuration ([`untuned_config_for_shape`])
/// with the variant's default tile without a shape (what the generator takes
/// when the options name none) and what the choice was based on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UntunedChoice {
    pub plain: ForwardConfig,
    pub config: ForwardConfig,
    pub reason: UntunedReason,
}

/// [`untuned_config_for_shape`] with the default it adapts and the reason.
pub fn untuned_choice(
    variant: &frontend::Variant,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    isa: Isa,
    device: &DeviceConfig,
    v_in_k: bool,
) -> UntunedChoice {
    untuned_by_rule(variant, dims, shape, elem, isa, device, v_in_k).unwrap_or_else(|plain| {
        let (ranked, _) =
            rank_forward(variant, &crate::tune::problem_of(dims, shape, elem), device);
        untuned_by_model(plain, &ranked)
    })
}

/// [`untuned_choice`] where a rule decides (the decoding rule, the default
/// off sm_90a, with V in K or packed heads); else `Err` with the default
/// tile, for [`untuned_by_model`] to weigh against the model's ranking of
/// the shape's problem.
pub(crate) fn untuned_by_rule(
    variant: &frontend::Variant,
    dims: HeadDims,
    shape: Shape,
    elem: Elem,
    isa: Isa,
    device: &DeviceConfig,
    v_in_k: bool,
) -> Result<UntunedChoice, ForwardConfig> {
    let plain = crate::compiler::untuned_forward_config(
        ForwardConfig::default_for,
        variant,
        dims.dqk,
        dims.dv,
        elem,
        isa,
        v_in_k,
    );
    let rows = [shape.b, shape.h, shape.hkv, shape.sq];
    let shaped = plain.for_decoding_call(variant, rows, device.sms, dims.dqk, dims.dv, isa);
    let chosen = |config, reason| UntunedChoice {
        plain,
        config,
        reason,
    };
    // The model's choice only where it was measured (the sm_90a prefill
    // tiles) and where the space describes the call (K and V apart).
    if shaped != plain {
        return Ok(chosen(shaped, UntunedReason::DecodeRule));
    }
    if isa != Isa::Sm90a || v_in_k || plain.pack_gqa {
        return Ok(chosen(plain, UntunedReason::Default));
    }
    Err(plain)
}

/// The model's first plan of `ranked` where it ranks the default `plain`
/// [`MODEL_CHOICE_MARGIN`](crate::compiler::schedule::MODEL_CHOICE_MARGIN)
/// times slower, else `plain` ([`model_choice`]).
pub(crate) fn untuned_by_model(
    plain: ForwardConfig,
    ranked: &[crate::compiler::schedule::Ranked],
) -> UntunedChoice {
    let (config, reason) = match model_choice(ranked, &plain) {
        Some((config, ratio)) => (config, UntunedReason::Model { ratio }),
        None => (plain, UntunedReason::Default),
    };
    UntunedChoice {
        plain,
        config,
        reason,
    }
}

/// The three loaded backward kernels (see [`BackwardSource`]).
#[derive(Debug)]
struct BackwardKernels {
    source: BackwardSource,
    pre: Kernel,
    main: Kernel,
    post: Kernel,
    _module: Module,
}

/// The compiled kernels of one parallel variant for one pair of head dims on
/// one device. Today that is the forward kernel only; see [`forward`](Self::forward).
#[derive(Debug)]
pub struct ParallelKernels {
    variant: frontend::Variant,
    dims: HeadDims,
    source: KernelSource,
    device: Device,
    forward: Kernel,
    /// The split-KV combine kernel, for sources that have one.
    combine: Option<Kernel>,
    _module: Module,
    options: KernelOptions,
    /// Compiled on the first [`backward`](Self::backward) call.
    backward: OnceLock<BackwardKernels>,
    /// Compiled on the first [`backward`](Self::backward) of a
    /// [`forward_varlen`](Self::forward_varlen) output.
    backward_varlen: OnceLock<BackwardKernels>,
    /// Compiled on the first [`forward_varlen`](Self::forward_varlen) call.
    varlen: OnceLock<LayoutKernel>,
    /// Compiled on the first [`forward_paged`](Self::forward_paged) call.
    paged: OnceLock<LayoutKernel>,
    /// Compiled on the first [`forward_block_sparse`](Self::forward_block_sparse) call.
    sparse: OnceLock<LayoutKernel>,
    /// Compiled on the first [`block_mask`](Self::block_mask) call.
    mask_builder: OnceLock<block_sparse::MaskBuilder>,
}

/// A loaded forward kernel (of any row layout) with its split-KV combine
/// where it has one.
#[derive(Debug)]
struct LayoutKernel {
    source: KernelSource,
    main: Kernel,
    combine: Option<Kernel>,
    _module: Module,
}

/// The KV splits `source`, loaded as `main`, launches with for `shape` on
/// `device`: the split rule capped at one wave of the blocks a
/// multiprocessor holds ([`residency_of`]).
fn kv_splits_on(device: &Device, source: &KernelSource, main: &Kernel, shape: Shape) -> u32 {
    let sizes = [shape.b, shape.h, shape.hkv, shape.sq, shape.skv];
    let residency = if source.split_kv {
        residency_of(device, main, source.threads, source.smem_bytes)
    } else {
        Residency::Unknown
    };
    source.kv_splits(sizes, device.sm_count(), residency)
}

/// How many blocks of `kernel` (`threads` threads, `smem` bytes of dynamic
/// shared memory) one multiprocessor of `device` holds: the driver's
/// occupancy count, which counts registers too; where the driver cannot
/// say, the shared-memory bound.
pub(crate) fn residency_of(device: &Device, kernel: &Kernel, threads: u32, smem: u32) -> Residency {
    kernel.resident_blocks(threads, smem).map_or_else(
        |_| Residency::SharedMemory(u64::from(device.shared_memory_per_sm())),
        |n| Residency::Blocks(u64::from(n)),
    )
}

/// Compiles the forward `source` of `variant` for `device` (through the
/// kernel cache) and loads its entry points; `form` names it in errors
/// ("the forward kernel of `softmax`").
fn load_forward(
    variant: &frontend::Variant,
    device: &Device,
    options: &KernelOptions,
    source: KernelSource,
    form: &str,
) -> Result<LayoutKernel, Error> {
    let params = params_of(
        variant,
        "forward",
        &source.args,
        source.elem,
        &["o", "rowout", "opart", "spart"],
    )?;
    let what = format!("`{}` (the {form} of `{}`)", source.name, variant.name);
    let module = compile_and_load(device, &source.source, options, &what)?;
    let loading = loading_error(device, &what);
    let main = module.kernel(&source.name, &params).map_err(&loading)?;
    let combine = match &source.combine {
        Some(name) => Some(module.kernel(name, &params).map_err(&loading)?),
        None => None,
    };
    Ok(LayoutKernel {
        source,
        main,
        combine,
        _module: module,
    })
}

impl ParallelKernels {
    /// Generates the forward kernel of `variant` for `dims` (with
    /// `options.config`, else [`ForwardConfig::default_for`]), compiles it
    /// with NVRTC for `device.arch()` through the kernel cache and loads it
    /// onto `device`.
    ///
    /// Errors: a recurrent variant ([`Error::Pattern`]: use
    /// [`RecurrentKernels`]); head dims
    /// that contradict the variant's fixed `Dqk`/`Dv` ([`Error::Shape`]);
    /// head dims or tiles the template does not support ([`Error::Compile`]);
    /// NVRTC or the driver failing ([`Error::Runtime`]).
    pub fn compile(
        variant: &frontend::Variant,
        device: &Device,
        dims: HeadDims,
        options: &KernelOptions,
    ) -> Result<ParallelKernels, Error> {
        let source = forward_source(variant, dims, options, Isa::for_arch(device.arch()))?;
        let LayoutKernel {
            source,
            main: forward,
            combine,
            _module: module,
        } = load_forward(variant, device, options, source, "forward kernel")?;
        Ok(ParallelKernels {
            variant: variant.clone(),
            dims,
            source,
            device: device.clone(),
            forward,
            combine,
            _module: module,
            options: options.clone(),
            backward: OnceLock::new(),
            backward_varlen: OnceLock::new(),
            varlen: OnceLock::new(),
            mask_builder: OnceLock::new(),
            paged: OnceLock::new(),
            sparse: OnceLock::new(),
        })
    }

    /// [`compile`](Self::compile) for calls of `shape`'s bucket: where
    /// `options` names no configuration of the forward (`config`) or of the
    /// backward (`backward_config`), the one `aec tune` (`--backward` for
    /// the backward's) stored in the tuning cache for this variant, GPU,
    /// toolchain and shape bucket, else
    /// the default for the shape ([`untuned_config_for_shape`]: decoding
    /// with 64 or more query rows per KV head gets 64-row blocks,
    /// [`ForwardConfig::for_packed_rows`]; a long context over few blocks
    /// fatter ones, [`ForwardConfig::for_few_blocks`]; on sm_90a a grid the
    /// default leaves short of a wave the cost model's first plan). It
    /// never tunes; a missing or unreadable cache means the default.
    pub fn compile_for_shape(
        variant: &frontend::Variant,
        device: &Device,
        dims: HeadDims,
        shape: Shape,
        options: &KernelOptions,
    ) -> Result<ParallelKernels, Error> {
        let mut options = options.clone();
        if options.config.is_none() || options.backward_config.is_none() {
            use crate::tune::dispatch::{self, KernelDispatch};
            let parts = dispatch::DeviceKeyParts::of(device);
            let parts = parts.parts();
            let cache = dispatch::process_cache()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if options.config.is_none() {
                let plan = KernelDispatch::forward(variant, dims, options.elem, &parts);
                options.config = plan.lookup(&cache, shape).map(|(_, c)| c);
            }
            if options.backward_config.is_none() {
                let plan = KernelDispatch::backward(variant, dims, options.elem, &parts);
                options.backward_config = plan.lookup(&cache, shape).map(|(_, c)| c);
            }
        }
        if options.config.is_none() {
            // Untuned decoding: the default tile for the shape's packed rows
            // and grid (ForwardConfig::for_decoding_call); elsewhere the
            // generator's own default, as without a shape.
            let isa = Isa::for_arch(device.arch());
            let (elem, v_in_k) = (options.elem, options.v_in_k);
            let model = DeviceConfig::detect(
                device.name(),
                device.compute_capability(),
                device.sm_count(),
            );
            let untuned = untuned_choice(variant, dims, shape, elem, isa, &model, v_in_k);
            if untuned.config != untuned.plain {
                options.config = Some(untuned.config);
            }
        }
        ParallelKernels::compile(variant, device, dims, &options)
    }

    /// The variant the kernels were generated from.
    pub fn variant(&self) -> &frontend::Variant {
        &self.variant
    }

    pub fn dims(&self) -> HeadDims {
        self.dims
    }

    /// The device the kernels are loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The generated forward source and its launch facts (kernel name,
    /// threads, tile rows, shared memory, argument order, row outputs).
    pub fn forward_source(&self) -> &KernelSource {
        &self.source
    }

    /// The names of the forward's row outputs, in the order of
    /// [`ForwardOutput::row_outputs`]: `scale.<name>` for each final row
    /// scale of the epilogue (e.g. `scale.lse`), then `state.<field>` for
    /// each field of the final online state (e.g. `state.m`, `state.l`).
    pub fn row_output_names(&self) -> &[String] {
        &self.source.row_outputs
    }

    /// The launch grid for `shape` (without KV splits): `(ceil(Sq / block_m)
    /// · dv_split, H, B)`, or with the query heads of a group packed into the
    /// rows (decoding kernels) `(ceil(H/Hkv · Sq / block_m) · dv_split, Hkv,
    /// B)`; for a persistent kernel `(min(units, SMs), 1, 1)`
    /// ([`KernelSource::launch_grid`]). `None` when it exceeds what CUDA
    /// launches.
    pub fn grid(&self, shape: Shape) -> Option<(u32, u32, u32)> {
        self.source.launch_grid(
            [shape.b, shape.h, shape.hkv, shape.sq],
            self.device.sm_count(),
            1,
        )
    }

    /// The KV splits the forward launches with for `shape` on this device
    /// (1 unless the kernel has split-KV and the grid is small:
    /// [`KernelSource::kv_splits`], at most one wave of the blocks the driver
    /// says a multiprocessor holds).
    pub fn kv_splits(&self, shape: Shape) -> u32 {
        kv_splits_on(&self.device, &self.source, &self.forward, shape)
    }

    /// Checks, without touching the GPU, that tensors with the given element
    /// counts fit this kernel for `shape`: [`check_shapes`] with the kernel's
    /// variant and head dims.
    pub fn check(&self, shape: Shape, tensors: &[(&str, usize)]) -> Result<(), Error> {
        check_shapes(&self.variant, self.dims, shape, tensors)
    }

    /// The element type the kernels were compiled for.
    pub fn elem(&self) -> Elem {
        self.source.elem
    }

    /// Checks that buffers of `T` fit the kernels' element type.
    fn check_elem<T: KernelElement>(&self, what: &str) -> Result<(), Error> {
        check_elem::<T>(&self.variant.name, self.source.elem, what)
    }

    /// Checks that the stream and every buffer live on the kernels' device.
    fn check_devices<'a>(
        &self,
        stream: &Stream,
        buffers: impl IntoIterator<Item = (&'a str, usize)>,
    ) -> Result<(), Error> {
        check_devices(&self.device, &self.variant.name, stream, buffers)
    }

    /// Runs the forward on `stream`: `o = attention(q, k, v)` and the row
    /// outputs, queued on `stream` (download them on the same stream, or
    /// synchronise, before reading).
    ///
    /// - `q`: `[B, H, Sq, Dqk]`, `k`: `[B, Hkv, Skv, Dqk]`, `v`:
    ///   `[B, Hkv, Skv, Dv]`, in the kernels' element type (bf16 unless
    ///   [`KernelOptions::elem`] says f16), contiguous (row-major). Query head `h`
    ///   reads key/value head `h / (H / Hkv)`.
    /// - `customs`: every custom input the variant declares, by name, f32,
    ///   contiguous in its declared axis order (`slopes: [H]` has `H`
    ///   elements).
    ///
    /// Every check happens before anything is allocated or launched; a
    /// failing one returns [`Error::Shape`] (or [`Error::Device`] for a
    /// buffer of another device) naming the tensor, its expected shape and
    /// what was given. Masked-out rows (no visible key) output 0.
    ///
    /// [`backward`](Self::backward) takes the returned [`ForwardOutput`]
    /// (its row outputs hold the saved state).
    pub fn forward<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: Shape,
    ) -> Result<ForwardOutput<T>, Error> {
        self.check_inputs(stream, q, k, v, customs, shape)?;

        let mut out = self.alloc_output::<T>(stream, shape)?;
        self.launch_into(stream, q, k, v, customs, &mut out)?;
        Ok(out)
    }

    /// Allocates (zeroed) what [`forward`](Self::forward) returns for `shape`,
    /// for [`forward_into`](Self::forward_into).
    pub fn alloc_output<T: KernelElement>(
        &self,
        stream: &Stream,
        shape: Shape,
    ) -> Result<ForwardOutput<T>, Error> {
        let runtime = |e| Error::Runtime {
            during: format!("allocating the outputs of `{}`", self.source.name),
            source: e,
        };
        let rows = shape.rows();
        let n_rows = self.source.row_outputs.len();
        let o = stream
            .alloc_zeros::<T>(rows * self.dims.dv as usize)
            .map_err(runtime)?;
        let row_outputs = stream
            .alloc_zeros::<f32>(n_rows.max(1) * rows)
            .map_err(runtime)?;
        Ok(ForwardOutput {
            o,
            row_outputs,
            row_names: self.source.row_outputs.clone(),
            shape,
            dv: self.dims.dv,
            cu_seqlens: None,
        })
    }

    /// [`forward`](Self::forward) into outputs allocated before (by
    /// [`alloc_output`](Self::alloc_output) for `out.shape`): no allocation
    /// of o or the row outputs, so repeated calls (benchmarks, tuning) time
    /// the kernels alone. The same checks as `forward`, and `out`'s buffers
    /// must have its shape's lengths.
    pub fn forward_into<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        out: &mut ForwardOutput<T>,
    ) -> Result<(), Error> {
        let shape = out.shape;
        if out.cu_seqlens.is_some() {
            return Err(Error::Shape(
                "`out` holds the output of `forward_varlen` (a packed variable-length batch): \
                 allocate dense outputs with alloc_output, or call forward_varlen again"
                    .into(),
            ));
        }
        self.check_inputs(stream, q, k, v, customs, shape)?;

        let rows = shape.rows();
        let n_rows = self.source.row_outputs.len().max(1);
        for (name, len, want) in [
            ("o", out.o.len(), rows * self.dims.dv as usize),
            ("rowout", out.row_outputs.len(), n_rows * rows),
        ] {
            if len != want {
                return Err(Error::Shape(format!(
                    "output `{name}` has {len} elements, but the shape {shape} needs {want}: \
                     allocate it with alloc_output"
                )));
            }
        }
        self.check_devices(
            stream,
            [
                ("o", out.o.ordinal()),
                ("rowout", out.row_outputs.ordinal()),
            ],
        )?;
        self.launch_into(stream, q, k, v, customs, out)
    }

    /// The forward's input checks: element type, devices, shapes.
    fn check_inputs<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: Shape,
    ) -> Result<(), Error> {
        let lens = self.input_lens(stream, q, k, v, customs)?;
        self.check(shape, &lens)?;
        Ok(())
    }

    /// The checks every forward makes of its inputs before their shapes:
    /// element type and devices; returns each input's element count.
    fn input_lens<'a, T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&'a str, &DeviceBuffer<f32>)],
    ) -> Result<Vec<(&'a str, usize)>, Error> {
        self.check_elem::<T>("q, k and v")?;
        let buffers = [("q", q.ordinal()), ("k", k.ordinal()), ("v", v.ordinal())]
            .into_iter()
            .chain(customs.iter().map(|(n, b)| (*n, b.ordinal())));
        self.check_devices(stream, buffers)?;
        // With V stored in K the one cache is passed twice; V's extent is
        // its first Dv columns.
        let v_len = if self.source.v_in_k {
            if !std::ptr::eq(k, v) {
                return Err(Error::Shape(format!(
                    "the kernels of `{}` were compiled with `v_in_k` (V is the first Dv = {} \
                     columns of each K row): pass the one K/V cache as both `k` and `v`",
                    self.variant.name, self.dims.dv
                )));
            }
            let dqk = self.dims.dqk as usize;
            if k.len().is_multiple_of(dqk) {
                k.len() / dqk * self.dims.dv as usize
            } else {
                k.len() // `k`'s own check reports it
            }
        } else {
            v.len()
        };
        Ok([("q", q.len()), ("k", k.len()), ("v", v_len)]
            .into_iter()
            .chain(customs.iter().map(|(n, b)| (*n, b.len())))
            .collect())
    }

    /// A forward of another row layout (variable-length or paged) held in
    /// `slot`: generated by `source` and compiled on first use.
    fn layout_kernel<'a>(
        &self,
        slot: &'a OnceLock<LayoutKernel>,
        source: fn(
            &frontend::Variant,
            HeadDims,
            &KernelOptions,
            Isa,
        ) -> Result<KernelSource, Error>,
        form: &str,
    ) -> Result<&'a LayoutKernel, Error> {
        if let Some(k) = slot.get() {
            return Ok(k);
        }
        let source = source(
            &self.variant,
            self.dims,
            &self.options,
            Isa::for_arch(self.device.arch()),
        )?;
        let kernel = load_forward(
            &self.variant,
            &self.device,
            &self.options,
            source,
            &format!("{form} forward"),
        )?;
        let _ = slot.set(kernel);
        Ok(slot.get().expect("set above"))
    }

    /// Launches the forward (and the combine) into `out` after the checks.
    fn launch_into<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        out: &mut ForwardOutput<T>,
    ) -> Result<(), Error> {
        // Split-KV where the grid leaves the GPU idle (decoding): partial rows
        // into two workspaces, merged by the combine kernel.
        let launch = ForwardLaunch {
            source: &self.source,
            main: &self.forward,
            combine: self.combine.as_ref(),
            sizes: out.shape,
            n_splits: self.kv_splits(out.shape),
            rows: LaunchRows::Dense,
        };
        self.launch_forward(stream, &launch, q, k, v, customs, out)
    }

    /// Launches `launch`'s kernel (and its combine) into `out` after the
    /// checks: `out.shape` gives the outputs' rows, `launch.sizes` the
    /// kernel's size arguments and grid.
    #[allow(clippy::too_many_arguments)]
    fn launch_forward<T: KernelElement>(
        &self,
        stream: &Stream,
        launch: &ForwardLaunch<'_>,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        out: &mut ForwardOutput<T>,
    ) -> Result<(), Error> {
        let (shape, sizes, n_splits, source) =
            (out.shape, launch.sizes, launch.n_splits, launch.source);
        let grid = source
            .launch_grid(
                [sizes.b, sizes.h, sizes.hkv, sizes.sq],
                self.device.sm_count(),
                n_splits,
            )
            .ok_or_else(|| {
                Error::Shape(format!(
                    "the shape {shape} needs a grid for `{}` larger than CUDA launches: split \
                     the call",
                    source.name
                ))
            })?;
        let launching = || format!("launching `{}`", source.name);
        let runtime = |e| Error::Runtime {
            during: launching(),
            source: e,
        };
        let rows = shape.rows();
        let (o, row_outputs) = (&mut out.o, &mut out.row_outputs);
        // The partial rows are not zero-filled: every block of every split
        // writes its rows' outputs and states (a split past the last key
        // block writes "saw no key"), and the combine reads only those
        // (compute-sanitizer initcheck clean on the split-KV tests). MLA's
        // four splits would otherwise memset 8.4 MB per call.
        let workspace = |name: &str| {
            let n = if n_splits > 1 {
                source.workspace_len(name, rows, n_splits)
            } else {
                1 // not read with one split; a valid pointer all the same
            };
            stream.alloc_scratch::<f32>(n)
        };
        // A fresh zeroed ticket counter per launch: concurrent launches on
        // other streams must not share one.
        let mut tile_counter = if source.tile_schedule {
            Some(stream.alloc_zeros::<i32>(1).map_err(runtime)?)
        } else {
            None
        };
        // The row blocks' counters of a kernel that merges its own splits:
        // zeroed per launch, as the ticket counter; with one split they are
        // not read (a valid pointer, not filled).
        let split_count_len = source.split_count_len([shape.b, shape.h, shape.hkv, shape.sq]);
        let mut split_count = match (split_count_len, n_splits) {
            (0, _) => None,
            (_, 1) => Some(stream.alloc_scratch::<i32>(1).map_err(runtime)?),
            (n, _) => Some(stream.alloc_zeros::<i32>(n).map_err(runtime)?),
        };
        let (mut opart, mut spart) = if source.split_kv {
            (
                Some(workspace("opart").map_err(runtime)?),
                Some(workspace("spart").map_err(runtime)?),
            )
        } else {
            (None, None)
        };
        // TMA loads: tensor maps of q, k and v for this call (they hold the
        // buffers' addresses).
        let maps = encode_tensor_maps(stream, &source.tensor_maps, sizes, |t| match t {
            "q" => q,
            "k" => k,
            _ => v,
        })
        .map_err(runtime)?;
        {
            let mut o_slot = Some(o);
            let mut rows_slot = Some(row_outputs);
            let (mut opart_slot, mut spart_slot) = (opart.as_mut(), spart.as_mut());
            let mut counter_slot = tile_counter.as_mut();
            let mut split_count_slot = split_count.as_mut();
            let twice = |what: &str| Error::Compile {
                variant: self.variant.name.clone(),
                kernel: "forward",
                source: CompileError(format!(
                    "the generated kernel takes `{what}` twice; this is a bug in aec"
                )),
            };
            let mut args: Vec<Arg<'_>> = Vec::with_capacity(source.args.len());
            for a in &source.args {
                args.push(match a {
                    ArgKind::Tensor("q") => T::arg(q),
                    ArgKind::Tensor("k") => T::arg(k),
                    ArgKind::Tensor("v") => T::arg(v),
                    ArgKind::Tensor("o") => T::arg_mut(o_slot.take().ok_or_else(|| twice("o"))?),
                    ArgKind::RowOut => Arg::from(rows_slot.take().ok_or_else(|| twice("rowout"))?),
                    ArgKind::Custom(name) => {
                        let buf = customs
                            .iter()
                            .find(|(n, _)| n == name)
                            .map(|(_, b)| *b)
                            .expect("check_shapes found every custom input");
                        Arg::from(buf)
                    }
                    ArgKind::Size(axis) => {
                        let n = match axis {
                            Axis::Dqk => self.dims.dqk as usize,
                            Axis::Dv => self.dims.dv as usize,
                            a => sizes.size(*a).expect("params_of accepted the axis"),
                        };
                        Arg::from(i32::try_from(n).expect("check_shapes bounded every size"))
                    }
                    ArgKind::Workspace("opart") => {
                        Arg::from(opart_slot.take().ok_or_else(|| twice("opart"))?)
                    }
                    ArgKind::Workspace("spart") => {
                        Arg::from(spart_slot.take().ok_or_else(|| twice("spart"))?)
                    }
                    ArgKind::Workspace("tile_counter") => {
                        Arg::from(counter_slot.take().ok_or_else(|| twice("tile_counter"))?)
                    }
                    ArgKind::Workspace("split_count") => Arg::from(
                        split_count_slot
                            .take()
                            .ok_or_else(|| twice("split_count"))?,
                    ),
                    ArgKind::KvSplits => Arg::from(n_splits as i32),
                    ArgKind::TensorMap(name) => tensor_map_arg(&maps, name),
                    ArgKind::CuSeqlens
                    | ArgKind::CuSeqlensKv
                    | ArgKind::PagedKv(_)
                    | ArgKind::BlockMask(_) => {
                        let value = match (a, &launch.rows) {
                            (ArgKind::CuSeqlens, LaunchRows::Varlen { cu_q, .. }) => {
                                Some(Arg::from(*cu_q))
                            }
                            (ArgKind::CuSeqlensKv, LaunchRows::Varlen { cu_k, .. }) => {
                                Some(Arg::from(*cu_k))
                            }
                            (ArgKind::PagedKv(name), LaunchRows::Paged(p)) => p.arg(name),
                            (ArgKind::BlockMask(name), LaunchRows::BlockSparse(m)) => m.arg(name),
                            _ => None,
                        };
                        value.ok_or_else(|| Error::Compile {
                            variant: self.variant.name.clone(),
                            kernel: "forward",
                            source: CompileError(format!(
                                "the kernel takes {a:?}, which this launch has no value for; \
                                 this is a bug in aec"
                            )),
                        })?
                    }
                    other @ (ArgKind::Tensor(_)
                    | ArgKind::CustomGrad(_)
                    | ArgKind::Workspace(_)
                    | ArgKind::State(_)
                    | ArgKind::Segments(_)) => {
                        unreachable!("params_of rejected argument {other:?}")
                    }
                });
            }
            launch
                .main
                .launch(
                    stream,
                    grid,
                    (source.threads, 1, 1),
                    source.smem_bytes,
                    &mut args,
                )
                .map_err(runtime)?;
            if let (Some(combine), true) = (launch.combine, n_splits > 1) {
                let grid = source.combine_grid(rows).ok_or_else(|| {
                    Error::Shape(format!(
                        "the shape {shape} has more rows than one launch of the combine kernel takes: split the call"
                    ))
                })?;
                combine
                    .launch(stream, grid, (source.combine_threads(), 1, 1), 0, &mut args)
                    .map_err(runtime)?;
            }
        }
        Ok(())
    }
}

/// One launch of a forward kernel: which kernel, its size arguments and
/// grid (`sizes`: `B, H, Hkv, Sq, Skv`), its KV splits and, for a
/// variable-length forward, the query and key boundaries.
struct ForwardLaunch<'a> {
    source: &'a KernelSource,
    main: &'a Kernel,
    combine: Option<&'a Kernel>,
    sizes: Shape,
    n_splits: u32,
    rows: LaunchRows<'a>,
}

/// Where a launch's rows are, beyond its sizes.
enum LaunchRows<'a> {
    Dense,
    /// A packed variable-length batch's boundaries.
    Varlen {
        cu_q: &'a DeviceBuffer<i32>,
        cu_k: &'a DeviceBuffer<i32>,
    },
    /// K and V in a paged cache.
    Paged(paged::PagedArgs<'a>),
    /// Dense rows under a block-sparse mask.
    BlockSparse(&'a block_sparse::BlockMaskArgs),
}

/// What [`ParallelKernels::forward`] returns. The buffers are filled once the
/// stream reaches the launch; [`Stream::download`] waits for that.
#[derive(Debug)]
pub struct ForwardOutput<T: KernelElement = bf16> {
    /// The output, `[B, H, Sq, Dv]`, in the kernels' element type.
    pub o: DeviceBuffer<T>,
    /// The row outputs, f32 `[max(1, row_names.len()), B · H · Sq]`: row `r`
    /// holds `row_names[r]` for every query row, in `[B, H, Sq]` order. (A
    /// variant without row outputs still gets one unused row.)
    pub row_outputs: DeviceBuffer<f32>,
    /// See [`ParallelKernels::row_output_names`].
    pub row_names: Vec<String>,
    /// The outputs' shape: the call's, or for a variable-length forward
    /// `(1, H, Hkv, Tq, Tk)` (the packed totals).
    pub shape: Shape,
    pub dv: u32,
    /// The query and key boundaries of a variable-length forward
    /// ([`ParallelKernels::forward_varlen`]); `None` for a dense one.
    cu_seqlens: Option<(Vec<usize>, Vec<usize>)>,
}

impl<T: KernelElement> ForwardOutput<T> {
    /// The query and key boundaries (`cu_seqlens_q`, `cu_seqlens_k`) of the
    /// packed batch this output is of; `None` for a dense forward.
    pub fn cu_seqlens(&self) -> Option<(&[usize], &[usize])> {
        self.cu_seqlens
            .as_ref()
            .map(|(q, k)| (q.as_slice(), k.as_slice()))
    }

    /// The index in [`row_outputs`](Self::row_outputs) of the row output
    /// `name`: an exact name (`scale.lse`, `state.m`), else a row scale
    /// (`lse` → `scale.lse`), else a state field (`m` → `state.m`).
    pub fn row_index(&self, name: &str) -> Option<usize> {
        let find = |n: &str| self.row_names.iter().position(|x| x == n);
        find(name)
            .or_else(|| find(&format!("scale.{name}")))
            .or_else(|| find(&format!("state.{name}")))
    }

    /// Downloads one row output (see [`row_index`](Self::row_index)), `B · H · Sq`
    /// values in `[B, H, Sq]` order.
    pub fn download_row(&self, stream: &Stream, name: &str) -> Result<Vec<f32>, Error> {
        let r = self.row_index(name).ok_or_else(|| {
            Error::Shape(format!(
                "no row output `{name}`; this kernel has {}",
                if self.row_names.is_empty() {
                    "none".to_string()
                } else {
                    self.row_names.join(", ")
                }
            ))
        })?;
        let rows = self.shape.rows();
        let all = stream.download(&self.row_outputs)?;
        Ok(all[r * rows..(r + 1) * rows].to_vec())
    }
}

/// Checks that buffers of `T` fit kernels of `variant` compiled for `elem`.
/// One call's tensor maps (TMA loads): each spec's extents at the call's
/// `sizes`, over the buffer `buffer_of` gives for its tensor's name.
fn encode_tensor_maps<'b, T: KernelElement>(
    stream: &Stream,
    specs: &[crate::compiler::TensorMapSpec],
    sizes: Shape,
    buffer_of: impl Fn(&str) -> &'b DeviceBuffer<T>,
) -> crate::runtime::Result<Vec<(&'static str, TensorMap)>> {
    let size_of = |name: &str| {
        Axis::from_name(name)
            .and_then(|a| sizes.size(a))
            .map(|n| n as u64)
    };
    specs
        .iter()
        .map(|spec| {
            let dims = std::array::from_fn(|d| spec.dims[d].eval(&size_of).unwrap_or(0));
            let map = TensorMap::tiled_3d(
                stream,
                buffer_of(spec.tensor),
                spec.tensor,
                dims,
                spec.box_dims,
            )?;
            Ok((spec.tensor, map))
        })
        .collect()
}

/// The launch argument of the tensor map `name` among a call's `maps`.
fn tensor_map_arg<'m>(maps: &'m [(&'static str, TensorMap)], name: &str) -> Arg<'m> {
    let (_, map) = maps
        .iter()
        .find(|(n, _)| *n == name)
        .expect("every tensor-map argument has its spec");
    Arg::from(map)
}

fn check_elem<T: KernelElement>(variant: &str, elem: Elem, what: &str) -> Result<(), Error> {
    if T::ELEM != elem {
        return Err(Error::Shape(format!(
            "{what} are {} but the kernels of `{variant}` were compiled for {}: pass {} buffers or \
             compile with `KernelOptions {{ elem: Elem::{:?}, .. }}`",
            T::ELEM.name(),
            elem.name(),
            elem.name(),
            T::ELEM
        )));
    }
    Ok(())
}

/// Checks that the stream and every buffer (name, device ordinal) live on
/// `device`, where the kernels of `variant` are loaded.
fn check_devices<'a>(
    device: &Device,
    variant: &str,
    stream: &Stream,
    buffers: impl IntoIterator<Item = (&'a str, usize)>,
) -> Result<(), Error> {
    let ordinal = device.ordinal();
    if stream.ordinal() != ordinal {
        return Err(Error::Device(format!(
            "the stream belongs to device {}, but the kernels of `{variant}` are loaded on device \
             {ordinal}: use a stream of that device (kernels.device().stream())",
            stream.ordinal()
        )));
    }
    for (name, o) in buffers {
        if o != ordinal {
            return Err(Error::Device(format!(
                "tensor `{name}` lives on device {o}, but the kernels of `{variant}` are loaded on \
                 device {ordinal}: upload it with a stream of that device"
            )));
        }
    }
    Ok(())
}

/// Refuses a recurrent variant where parallel kernels are asked for, naming
/// the type that runs it.
fn require_parallel(variant: &frontend::Variant) -> Result<(), Error> {
    if variant.pattern == Pattern::Recurrent {
        return Err(Error::Pattern(format!(
            "`{}` is a recurrent variant: ParallelKernels runs parallel variants only; compile \
             it with RecurrentKernels::compile (or `Variant::compile_recurrent` for a variant \
             declared with attention!) and check its inputs with check_recurrent_shapes",
            variant.name
        )));
    }
    Ok(())
}

/// Refuses a recurrent variant where its backward is asked for: no
/// recurrent backward kernel exists yet.
fn require_parallel_backward(variant: &frontend::Variant) -> Result<(), Error> {
    if variant.pattern == Pattern::Recurrent {
        return Err(Error::NotImplemented(format!(
            "`{}` is a recurrent variant: its backward kernel is not implemented yet \
             (RecurrentKernels runs its forward; aec::reference::backward computes its \
             gradients on the CPU)",
            variant.name
        )));
    }
    Ok(())
}

fn check_head_dims(variant: &frontend::Variant, dims: HeadDims) -> Result<(), Error> {
    let fixed = |axis: Axis| {
        variant
            .fixed_sizes
            .iter()
            .find(|(a, _)| *a == axis)
            .map(|&(_, n)| n)
    };
    let want = (
        fixed(Axis::Dqk).unwrap_or(dims.dqk as usize),
        fixed(Axis::Dv).unwrap_or(dims.dv as usize),
    );
    for (axis, d) in [(Axis::Dqk, dims.dqk), (Axis::Dv, dims.dv)] {
        if let Some(n) = fixed(axis)
            && n != d as usize
        {
            return Err(Error::Shape(format!(
                "`{}` fixes {axis} = {n}, but the head dims ask for {axis} = {d}: compile with \
                 HeadDims {{ dqk: {}, dv: {} }}",
                variant.name, want.0, want.1
            )));
        }
    }
    Ok(())
}

/// A generated kernel's parameter list, from its argument kinds: `written`
/// names the tensors, workspaces and `rowout` it writes; it reads the rest.
fn params_of(
    variant: &frontend::Variant,
    kernel: &'static str,
    args: &[ArgKind],
    elem: Elem,
    written: &[&str],
) -> Result<Vec<Param>, Error> {
    let dir = |name: &str, d: DType| {
        if written.contains(&name) {
            Param::Out(d)
        } else {
            Param::In(d)
        }
    };
    let declared = |name: &String| variant.customs.iter().any(|c| &c.name == name);
    args.iter()
        .map(|a| match a {
            ArgKind::Tensor(n @ ("q" | "k" | "v" | "o" | "dout" | "dq" | "dk" | "dv"))
            | ArgKind::Workspace(n @ "qmod") => Ok(dir(n, dtype_of(elem))),
            ArgKind::Workspace(n @ ("dot" | "dq_acc" | "opart" | "spart")) => {
                Ok(dir(n, DType::F32))
            }
            ArgKind::Workspace("tile_counter" | "split_count") => Ok(Param::Out(DType::I32)),
            ArgKind::KvSplits => Ok(Param::I32),
            ArgKind::CuSeqlens | ArgKind::CuSeqlensKv => Ok(Param::In(DType::I32)),
            ArgKind::PagedKv("block_table" | "seqlens_k") => Ok(Param::In(DType::I32)),
            ArgKind::PagedKv("pages_per_seq" | "page_shift") => Ok(Param::I32),
            ArgKind::BlockMask(
                "kv_num_blocks" | "kv_indices" | "full_kv_num_blocks" | "full_kv_indices"
                | "tile_order",
            ) => Ok(Param::In(DType::I32)),
            ArgKind::BlockMask(_) => Ok(Param::I32),
            ArgKind::RowOut => Ok(dir("rowout", DType::F32)),
            ArgKind::Custom(name) if declared(name) => Ok(Param::In(DType::F32)),
            ArgKind::CustomGrad(name) if declared(name) => Ok(Param::Out(DType::F32)),
            ArgKind::Size(Axis::B | Axis::H | Axis::Hkv | Axis::Sq | Axis::Skv)
            | ArgKind::Size(Axis::Dqk | Axis::Dv) => Ok(Param::I32),
            ArgKind::TensorMap("q" | "k" | "v" | "dout") => Ok(Param::TensorMap),
            other => Err(Error::Compile {
                variant: variant.name.clone(),
                kernel,
                source: CompileError(format!(
                    "the generated kernel takes an argument this API does not know ({other:?}); \
                     aec's run module and kernel generator disagree, which is a bug in aec"
                )),
            }),
        })
        .collect()
}

/// Checks element counts of buffers whose expected length is known:
/// (name, layout, given, expected, shape).
fn check_lengths(items: &[(&str, &str, usize, usize, Shape)]) -> Result<(), Error> {
    for &(name, layout, len, expected, shape) in items {
        if len != expected {
            return Err(Error::Shape(format!(
                "tensor `{name}` has {len} elements, expected {layout} = {expected} for the shape {shape}"
            )));
        }
    }
    Ok(())
}

/// The largest grid y (heads) and z (batch) dimension CUDA allows.
const MAX_GRID_YZ: usize = 65_535;

/// Uploads host indices (boundaries, key counts, page numbers) as the
/// kernels' i32 tensor `name`. The callers' checks bound every value by a
/// 32-bit size first; a value past `i32::MAX` would saturate.
fn upload_i32<I: TryInto<i32>>(
    stream: &Stream,
    name: &str,
    values: impl IntoIterator<Item = I>,
) -> Result<DeviceBuffer<i32>, Error> {
    let host: Vec<i32> = values
        .into_iter()
        .map(|x| x.try_into().unwrap_or(i32::MAX))
        .collect();
    stream.upload(&host).map_err(|e| Error::Runtime {
        during: format!("uploading `{name}`"),
        source: e,
    })
}

/// Checks the boundaries `bounds` (named `name`) of a packed batch whose
/// sequences are made of `unit`s (rows, steps): at least two entries, 0
/// first, strictly increasing (every sequence has one).
fn check_boundaries(name: &str, bounds: &[usize], unit: &str) -> Result<(), Error> {
    let bad = |m: String| Err(Error::Shape(m));
    if bounds.len() < 2 {
        return bad(format!(
            "`{name}` has {} entries; a packed batch of N sequences needs N + 1 (0, the end of \
             each sequence)",
            bounds.len()
        ));
    }
    if bounds[0] != 0 {
        return bad(format!(
            "`{name}` starts at {}; the first sequence starts at {unit} 0",
            bounds[0]
        ));
    }
    if let Some(i) = bounds.windows(2).position(|w| w[1] <= w[0]) {
        return bad(format!(
            "`{name}` is not increasing: entry {} is {} after {} (sequence {i} would have no \
             {unit}s)",
            i + 1,
            bounds[i + 1],
            bounds[i]
        ));
    }
    Ok(())
}

/// Checks, without a GPU, that tensors with the given element counts fit the
/// forward of `variant` with head dims `dims` for `shape`.
///
/// `tensors` lists `q`, `k`, `v` and every custom input by name with its
/// element count. In order, it checks: the variant is parallel; no size is
/// 0; sizes fit the kernel's 32-bit sizes and CUDA's grid (`H`, `B` ≤
/// 65535); the variant's fixed sizes; `Hkv = H` for variants without
/// grouped-query heads and `H` a multiple of `Hkv`; no tensor given twice,
/// none unknown, none missing; every element count equal to the product of
/// its expected shape.
pub fn check_shapes(
    variant: &frontend::Variant,
    dims: HeadDims,
    shape: Shape,
    tensors: &[(&str, usize)],
) -> Result<(), Error> {
    check_shapes_with(variant, dims, shape, tensors, true)
}

/// [`check_shapes`]; `fixed_lengths`: whether to hold `Sq` and `Skv` to the
/// variant's fixed sizes (a variable-length call checks them per sequence).
fn check_shapes_with(
    variant: &frontend::Variant,
    dims: HeadDims,
    shape: Shape,
    tensors: &[(&str, usize)],
    fixed_lengths: bool,
) -> Result<(), Error> {
    require_parallel(variant)?;
    let bad = |m: String| Err(Error::Shape(m));
    for (axis, n) in shape.axes() {
        if n == 0 {
            return bad(format!(
                "{axis} = 0 in the shape {shape}: every size must be at least 1"
            ));
        }
        if i32::try_from(n).is_err() {
            return bad(format!(
                "{axis} = {n} in the shape {shape} does not fit the kernel's 32-bit sizes \
                 (at most {}): split the call",
                i32::MAX
            ));
        }
    }
    for (axis, n) in [(Axis::H, shape.h), (Axis::B, shape.b)] {
        if n > MAX_GRID_YZ {
            return bad(format!(
                "{axis} = {n} in the shape {shape} exceeds CUDA's grid limit of {MAX_GRID_YZ} \
                 (the grid is (ceil(Sq / block_m), H, B)): split the call"
            ));
        }
    }
    if i32::try_from(shape.b * shape.h).is_err() {
        return bad(format!(
            "B · H = {} in the shape {shape} does not fit the kernel's 32-bit row index \
             (at most {}): split the batch",
            shape.b * shape.h,
            i32::MAX
        ));
    }
    for (axis, d) in [(Axis::Dqk, dims.dqk), (Axis::Dv, dims.dv)] {
        if d == 0 {
            return bad(format!(
                "{axis} = 0 in the head dims: every size must be at least 1"
            ));
        }
    }
    check_head_dims(variant, dims)?;
    for &(axis, fixed) in &variant.fixed_sizes {
        if !fixed_lengths && matches!(axis, Axis::Sq | Axis::Skv) {
            continue;
        }
        if let Some(n) = shape.size(axis)
            && n != fixed
        {
            return bad(format!(
                "`{}` fixes {axis} = {fixed}, but the shape {shape} has {axis} = {n}",
                variant.name
            ));
        }
    }
    let par = variant.parallel().expect("checked parallel above");
    if par.kv_heads == Axis::H && shape.hkv != shape.h {
        return bad(format!(
            "`{}` has no grouped-query heads (k and v are declared with H heads), so Hkv must \
             equal H, but the shape {shape} has H = {} and Hkv = {}: use Shape::mha",
            variant.name, shape.h, shape.hkv
        ));
    }
    if !shape.h.is_multiple_of(shape.hkv) {
        return bad(format!(
            "H = {} query heads is not a multiple of Hkv = {} key/value heads (shape {shape})",
            shape.h, shape.hkv
        ));
    }

    let size = |a: Axis| -> Option<usize> {
        match a {
            Axis::Dqk => Some(dims.dqk as usize),
            Axis::Dv => Some(dims.dv as usize),
            other => shape.size(other),
        }
    };
    check_declared_tensors(variant, tensors, &size, "forward")?;
    // The outputs: `o` is [B, H, Sq, Dv]; the row outputs are smaller.
    if [shape.b, shape.h, shape.sq, dims.dv as usize]
        .into_iter()
        .try_fold(1usize, |acc, n| acc.checked_mul(n))
        .is_none()
    {
        return bad(format!(
            "the output `o` would have [B, H, Sq, Dv] = {:?} elements, more than this \
             machine can address: split the call",
            [shape.b, shape.h, shape.sq, dims.dv as usize]
        ));
    }
    Ok(())
}

/// The checks every pattern makes of the given tensors (name, element
/// count): none given twice, no unknown custom input, and each of q, k, v
/// and the declared custom inputs present with the element count of its
/// declared axes (`size` gives each axis's extent; `None` for an axis the
/// call has no size for, a frontend bug reported against `kernel`).
pub(crate) fn check_declared_tensors(
    variant: &frontend::Variant,
    tensors: &[(&str, usize)],
    size: &dyn Fn(Axis) -> Option<usize>,
    kernel: &'static str,
) -> Result<(), Error> {
    let bad = |m: String| Err(Error::Shape(m));
    for (i, (name, _)) in tensors.iter().enumerate() {
        if tensors[..i].iter().any(|(n, _)| n == name) {
            return bad(format!("tensor `{name}` is given twice"));
        }
    }
    let declared = || {
        if variant.customs.is_empty() {
            "no custom inputs".to_string()
        } else {
            let names: Vec<String> = variant
                .customs
                .iter()
                .map(|c| format!("`{}`", c.name))
                .collect();
            format!("the custom inputs {}", names.join(", "))
        }
    };
    for (name, _) in tensors {
        if !matches!(*name, "q" | "k" | "v") && !variant.customs.iter().any(|c| c.name == *name) {
            return bad(format!(
                "unknown custom input `{name}`: `{}` declares {}",
                variant.name,
                declared()
            ));
        }
    }
    let decls = [&variant.q, &variant.k, &variant.v]
        .into_iter()
        .chain(variant.customs.iter());
    for decl in decls {
        let Some(expected) = decl
            .axes
            .iter()
            .map(|a| size(*a))
            .chain(decl.user_axes.iter().map(|(_, n)| *n))
            .collect::<Option<Vec<usize>>>()
        else {
            return Err(Error::Compile {
                variant: variant.name.clone(),
                kernel,
                source: CompileError(format!(
                    "`{}` is declared with an axis the call has no size for ({}); \
                     this is a bug in aec's frontend",
                    decl.name,
                    axes_str(decl)
                )),
            });
        };
        let what = if matches!(decl.name.as_str(), "q" | "k" | "v") {
            "tensor"
        } else {
            "custom input"
        };
        let Some(count) = expected
            .iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        else {
            return bad(format!(
                "{what} `{}` would have {} = {expected:?} elements, more than this machine \
                 can address: split the call",
                decl.name,
                axes_str(decl)
            ));
        };
        let Some(&(_, len)) = tensors.iter().find(|(n, _)| *n == decl.name) else {
            return bad(if what == "tensor" {
                format!("tensor `{}` is missing", decl.name)
            } else {
                format!(
                    "missing custom input `{}`: `{}` declares it as {} = {expected:?}; pass \
                     (\"{}\", buffer) with {count} f32 elements in `customs`",
                    decl.name,
                    variant.name,
                    axes_str(decl),
                    decl.name
                )
            });
        };
        if len != count {
            return bad(format!(
                "{what} `{}` has {len} elements, expected {} = {expected:?} = {count}",
                decl.name,
                axes_str(decl)
            ));
        }
    }
    Ok(())
}

pub(crate) fn axes_str(decl: &TensorDecl) -> String {
    let names: Vec<String> = decl
        .axes
        .iter()
        .map(|a| a.name().to_string())
        .chain(decl.user_axes.iter().map(|(u, n)| match n {
            Some(n) => format!("{u} = {n}"),
            None => u.clone(),
        }))
        .collect();
    format!("[{}]", names.join(", "))
}
