//! One error type for the whole runtime, so callers match on what went wrong
//! and every message says what to do next.

use std::path::PathBuf;

/// Everything the runtime can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "no CUDA driver: {detail}. Kernels can only be loaded and launched on a \
         machine with an NVIDIA GPU and its driver (libcuda.so.1); compiling \
         (NVRTC) and the ptxas/SASS checks work without one"
    )]
    NoDriver { detail: String },

    #[error(
        "no CUDA device {ordinal}: the driver sees {count} device(s); pick an \
         ordinal below {count} (and check CUDA_VISIBLE_DEVICES)"
    )]
    NoDevice { ordinal: usize, count: usize },

    #[error(
        "NVRTC (libnvrtc.so.13) could not be loaded: run `cargo xtask toolchains` \
         and put target/toolchains/cuda/nvidia/cu13/lib on LD_LIBRARY_PATH, or \
         install CUDA 13.0 (its lib64 on the loader path)"
    )]
    NoNvrtc,

    #[error("NVRTC {call} failed ({code}){hint}")]
    Nvrtc {
        call: &'static str,
        code: String,
        hint: &'static str,
    },

    #[error(
        "NVRTC could not compile the kernel for {arch}:\n{log}\n(headers come from \
         AEC_CUDA_INCLUDE or /usr/local/cuda/include; see runtime/README.md)"
    )]
    Compile { arch: String, log: String },

    #[error("CUDA driver call {call} failed: {source}")]
    Driver {
        call: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },

    #[error(
        "no kernel `{name}` in the module: kernels must be declared \
         `extern \"C\" __global__` so their names are not mangled"
    )]
    KernelNotFound { name: String },

    #[error("bad arguments for kernel `{kernel}`: {detail}")]
    Arguments { kernel: String, detail: String },

    #[error("bad launch configuration for kernel `{kernel}`: {detail}")]
    LaunchConfig { kernel: String, detail: String },

    #[error(
        "kernel `{kernel}` asks for {requested} bytes of dynamic shared memory but \
         this device allows at most {limit} per block (opt-in limit minus the \
         kernel's {static_bytes} static bytes); use smaller tiles"
    )]
    SharedMemory {
        kernel: String,
        requested: u32,
        limit: u32,
        static_bytes: u32,
    },

    #[error("host slice has {got} elements but the device buffer has {expected}")]
    Length { expected: usize, got: usize },

    #[error("invalid argument: {0}")]
    Invalid(String),

    #[error(
        "`{tool}` not found (looked in {looked}): run `cargo xtask toolchains` and \
         set AEC_CUDA_BIN=target/toolchains/cuda/nvidia/cu13/bin, or put the CUDA \
         13.0 bin directory on PATH"
    )]
    ToolMissing { tool: String, looked: String },

    #[error(
        "no AMD GPU found: the HIP runtime sees none. HIP kernels can be compiled \
         and checked without one (`aec compile --target mi250|mi300x`); launching \
         them needs an AMD GPU with ROCm"
    )]
    NoAmdGpu,

    #[error("HIP runtime call {call} failed: {detail}")]
    Hip { call: &'static str, detail: String },

    #[error("`{tool}` not found (needed for {target}): {hint}", hint = crate::hip_tools::HIP_TOOLCHAIN_HINT)]
    HipToolMissing { tool: String, target: String },

    #[error("`{tool}` failed ({status}):\n{output}")]
    ToolFailed {
        tool: String,
        status: String,
        output: String,
    },

    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The runtime's result type.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl RuntimeError {
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| RuntimeError::Driver { call, source }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| RuntimeError::Io {
            action,
            path,
            source,
        }
    }
}
