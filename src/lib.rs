//! aec — an attention compiler.
//!
//! Describe an attention variant once with [`attention!`]; aec traces it into a
//! graph, derives its backward pass, checks it against the f64 reference
//! interpreter ([`frontend::reference`]), and generates CUDA kernels: the
//! forward and backward of parallel variants ([`Variant::compile`],
//! [`ParallelKernels::forward`], [`ParallelKernels::backward`]) and the
//! forward and backward of recurrent ones ([`Variant::compile_recurrent`],
//! [`RecurrentKernels::forward`], [`RecurrentKernels::backward`]). The
//! README's status table says what is not there yet (the HIP recurrent backward).
//!
//! ```
//! use aec::prelude::*;
//!
//! attention! {
//!     /// ReLU attention scaled by the key count.
//!     pub struct Relu: parallel {
//!         q: [B, H, Sq, Dqk], k: [B, H, Skv, Dqk], v: [B, H, Skv, Dv];
//!         modify_scores = |s| relu(s) / Skv;
//!     }
//! }
//!
//! assert_eq!(Relu::NAME, "Relu");
//! assert_eq!(Relu::definition().pattern, Pattern::Parallel);
//! ```

pub use aec_compiler as compiler;
pub use aec_frontend as frontend;
pub use aec_frontend::reference;
pub use aec_macros::attention;
pub use aec_runtime as runtime;

pub mod library;
pub use library::Library;
pub mod run;
pub mod tune;
pub use run::{
    BlockMask, BlockMaskLists, Error, ForwardOutput, Gradients, HeadDims, KernelElement,
    KernelOptions, PagedKv, ParallelKernels, RecurrentDecoder, RecurrentDims, RecurrentGradients,
    RecurrentKernels, RecurrentOutput, RecurrentShape, Shape, VarlenBatch, backward_source,
    block_sparse_forward_source, check_block_mask, check_paged_shapes, check_recurrent_shapes,
    check_shapes, check_varlen, check_varlen_shapes, forward_source, paged_forward_source,
    recurrent_source, recurrent_step_source, varlen_backward_source, varlen_forward_source,
};

/// A variant declared with [`attention!`].
pub trait Variant {
    /// The struct's name.
    const NAME: &'static str;
    /// The variant's DSL text, as written in the macro.
    const SOURCE: &'static str;
    /// The traced and validated definition (forward and derived backward graphs).
    fn definition() -> &'static frontend::Variant;

    /// Generates, compiles (NVRTC, for `device.arch()`, through the kernel
    /// cache) and loads this variant's forward kernel for head dims `dims`:
    /// [`ParallelKernels::compile`] with [`definition`](Self::definition).
    /// Run it with [`ParallelKernels::forward`]. A recurrent variant returns
    /// [`Error::Pattern`]: use [`compile_recurrent`](Self::compile_recurrent).
    /// See [`run`] for an example.
    fn compile(
        device: &runtime::Device,
        dims: HeadDims,
        options: &KernelOptions,
    ) -> Result<ParallelKernels, Error> {
        ParallelKernels::compile(Self::definition(), device, dims, options)
    }

    /// The same for a recurrent variant: [`RecurrentKernels::compile`] with
    /// [`definition`](Self::definition), for head dims `Dk`, `Dv`. Run it
    /// with [`RecurrentKernels::forward`]. A parallel variant returns
    /// [`Error::Pattern`]. See [`run::recurrent`] for an example.
    fn compile_recurrent(
        device: &runtime::Device,
        dims: RecurrentDims,
        options: &KernelOptions,
    ) -> Result<RecurrentKernels, Error> {
        RecurrentKernels::compile(Self::definition(), device, dims, options)
    }

    /// The step kernel for decoding with a recurrent variant:
    /// [`RecurrentDecoder::compile`] with [`definition`](Self::definition).
    /// Run it with [`RecurrentDecoder::step`]. See [`run::recurrent_decode`].
    fn compile_recurrent_decoder(
        device: &runtime::Device,
        dims: RecurrentDims,
        options: &KernelOptions,
    ) -> Result<RecurrentDecoder, Error> {
        RecurrentDecoder::compile(Self::definition(), device, dims, options)
    }
}

pub mod prelude {
    pub use crate::Variant;
    pub use crate::attention;
    pub use crate::run::{
        BlockMask, ForwardOutput, Gradients, HeadDims, KernelElement, KernelOptions, PagedKv,
        ParallelKernels, RecurrentDecoder, RecurrentDims, RecurrentGradients, RecurrentKernels,
        RecurrentOutput, RecurrentShape, Shape, VarlenBatch,
    };
    pub use aec_compiler::{Elem, Isa};
    pub use aec_frontend::Pattern;
    pub use aec_frontend::reference::{Inputs, Options, Tensor};
    pub use aec_runtime::{Device, DeviceBuffer, Stream, bf16, f16};
}
