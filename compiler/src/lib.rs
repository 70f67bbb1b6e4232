//! aec compiler: lowers traced attention variants to GPU kernel sources
//! (CUDA for NVIDIA, HIP for AMD).
//!
//! Like the frontend it does no I/O and needs no GPU: it turns a
//! [`aec_frontend::Variant`] and a kernel configuration into source text plus
//! the launch facts a runtime needs.

pub mod backward_plan;
mod check_rng;
pub mod combine;
pub mod cuda;
pub mod cxx;
pub mod held_max;
pub mod hip;
pub mod intervals;
pub mod launch_plan;
pub mod neg_inf_mask;
pub mod q_scale;
pub mod schedule;
pub mod simplify;
pub mod tile_order;

pub use cuda::backward::{
    BackwardConfig, BackwardSource, Grid, Launch, parallel_backward, parallel_backward_varlen,
};
pub use cuda::block_mask::{BlockMaskBuilder, block_mask_builder};
pub use cuda::dialect::{Elem, Isa};
pub use cuda::forward::{
    ArgKind, BLOCK_MASK_ARGS, ForwardConfig, KernelSource, Residency, TILE_SCHEDULE_ARGS,
    TensorMapSpec, forward_default_isa, parallel_forward, parallel_forward_block_sparse,
    parallel_forward_paged, parallel_forward_varlen, untuned_forward_config,
};
pub use cuda::recurrent::{
    ForwardKind, RecurrentBackwardKernel, RecurrentBackwardSource, RecurrentConfig, RecurrentGridX,
    RecurrentSource, recurrent_backward, recurrent_forward, recurrent_states,
};
pub use cuda::recurrent_step::{RecurrentStepSource, recurrent_step};
pub use cuda::recurrent_wgmma::SegmentSplit;
pub use cxx::closures::{MAX_DQK, MAX_DV, MAX_FORWARD_DQK};

/// Why a variant cannot be compiled with a given configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError(pub String);

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompileError {}
