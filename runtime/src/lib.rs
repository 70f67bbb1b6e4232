//! `aec-runtime`: everything that touches the GPU, its driver and the CUDA
//! tools, so the frontend and compiler never do.
//!
//! - [`Device`]: a CUDA device and its limits; without a driver every entry
//!   point returns [`RuntimeError::NoDriver`] (cudarc would panic).
//! - [`compile`]: CUDA C++ → CUBIN + PTX with NVRTC; needs no GPU.
//! - [`KernelCache`]: compiled modules in memory and on disk.
//! - [`Module`], [`Kernel`], [`Arg`]: loading and checked launches;
//!   [`TensorMap`]: the descriptors of TMA copies, encoded per call.
//! - [`Stream`], [`DeviceBuffer`]: copies; [`time_ms`]: event timing.
//! - [`ptxas_resources`], [`sass`]: the compile checks' view of a kernel.
//! - [`tuning`]: the autotuner's persistent results ([`TuningCache`]), one
//!   JSON file shared by every process (`AEC_TUNING_CACHE`).
//! - [`hip_compile`], [`hip_resources`], [`hip_isa`]: AMD code objects built
//!   and read offline (no AMD GPU or HIP runtime needed).
//! - With the cargo feature `hip`: [`HipDevice`], [`HipModule`],
//!   [`HipBuffer`], [`hip_time_ms`] over the HIP runtime (`hip-sys`).
//!
//! Where the CUDA pieces come from (`AEC_CUDA_INCLUDE`, `AEC_CUDA_BIN`,
//! `LD_LIBRARY_PATH`, `AEC_CACHE_DIR`) is described in `runtime/README.md`.

mod cache;
mod device;
mod error;
mod hash;
#[cfg(feature = "hip")]
mod hip_runtime;
mod hip_tools;
mod launch;
mod memory;
mod nvrtc;
mod resources;
mod stream;
mod tensor_map;
mod timer;
mod tools;
pub mod tuning;

pub use cache::{CacheKey, KernelCache, default_dir as default_cache_dir};
pub use device::{Device, DeviceInfo, arch_for, driver_present, driver_version};
pub use error::{Result, RuntimeError};
pub use hash::hex_digest;
#[cfg(feature = "hip")]
pub use hip_runtime::{HipBuffer, HipDevice, HipKernel, HipModule, HipParam, hip_time_ms};
pub use hip_tools::{
    HIP_TOOLCHAIN_HINT, HipCodeObject, HipCompiler, HipResourceUsage, find_hip_compiler,
    hip_compile, hip_isa, hip_resources, parse_amdgpu_metadata,
};
pub use launch::{Arg, Kernel, Module, Param};
pub use memory::{DType, DeviceBuffer, Element};
pub use nvrtc::{
    CompileOptions, Compiled, compile, cuda_include_dirs, nvrtc_present, nvrtc_version,
};
pub use resources::{ResourceUsage, parse_ptxas_verbose};
pub use stream::Stream;
pub use tensor_map::TensorMap;
pub use timer::{Timing, time_ms};
pub use tools::{find_tool, ptxas_resources, sass, toolchains_required};
pub use tuning::{
    Rejection, ShapeBucket, TUNING_CACHE_VERSION, TunedEntry, TuningCache, TuningCacheError,
    TuningKey, bucket_len, performance_portability,
};

/// The element types device buffers hold.
pub use half::{bf16, f16};
