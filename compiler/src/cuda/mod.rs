//! CUDA code generation.

pub mod backward;
pub mod block_mask;
pub mod dialect;
pub mod forward;
pub mod recurrent;
pub mod recurrent_step;
pub mod recurrent_wgmma;
pub mod wgmma;
