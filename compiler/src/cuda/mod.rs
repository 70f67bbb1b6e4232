//! CUDA code generation.

pub mod backward;
pub mod closures;
pub mod dialect;
pub mod expr;
pub mod forward;
pub mod intervals;
pub mod wgmma;
