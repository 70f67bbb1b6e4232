//! aec — an attention compiler.
//!
//! Describe an attention variant once with [`attention!`]; aec traces it into a
//! graph, derives its backward pass, and (in later stages) generates GPU
//! kernels. Today the frontend is complete: parsing, tracing, validation,
//! autodiff and the f64 reference interpreter ([`reference`]).
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

/// A variant declared with [`attention!`].
pub trait Variant {
    /// The struct's name.
    const NAME: &'static str;
    /// The variant's DSL text, as written in the macro.
    const SOURCE: &'static str;
    /// The traced and validated definition (forward and derived backward graphs).
    fn definition() -> &'static frontend::Variant;
}

pub mod prelude {
    pub use crate::Variant;
    pub use crate::attention;
    pub use aec_frontend::Pattern;
    pub use aec_frontend::reference::{Inputs, Options, Tensor};
}
