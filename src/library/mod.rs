//! Kernel libraries: what `aec compile` writes next to the kernels so that
//! they can be called from C, Python and Rust without aec. Every consumer
//! reads the same launch plans ([`aec_compiler::launch_plan`]) from the
//! library's `manifest.json`:
//!
//! - [`c_header`]: the generated C header with one entry point per variant
//!   and pass, over the header-only loader `aec_loader.h`;
//! - [`python`]: the Python module (ctypes + `torch.autograd.Function`);
//! - [`loader`]: [`Library::open`] for Rust programs;
//! - [`tuning_table`]: the tuned forward and backward kernels `aec compile` adds from
//!   the tuning cache, and the bucket rule the loaders pick them by.

pub mod c_header;
pub mod loader;
pub mod python;
pub mod tuning_table;

pub use loader::*;
