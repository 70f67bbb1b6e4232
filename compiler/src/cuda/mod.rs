//! CUDA code generation.

pub mod dialect;
pub mod expr;
pub mod forward;
