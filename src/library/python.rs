//! The Python module of a kernel library: `python/aec_library.py`, the same
//! file for every library (it reads the library's manifest and interprets
//! its launch plans). It needs only PyTorch and the CUDA driver at run time.

/// The module's text, written by `aec compile` to `DIR/python/aec_library.py`.
pub const MODULE: &str = include_str!("../../templates/library/aec_library.py");

/// Where `aec compile` writes [`MODULE`], relative to the library directory.
pub const MODULE_PATH: &str = "python/aec_library.py";
