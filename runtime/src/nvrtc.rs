//! CUDA C++ → CUBIN + PTX through NVRTC, without a GPU or a driver.
//!
//! cudarc's safe wrapper only returns PTX, so this calls `nvrtcGetCUBIN`
//! itself. NVRTC 13 ships no `cuda_fp16.h`/`cuda_bf16.h`; the headers come
//! from [`cuda_include_dirs`] (`AEC_CUDA_INCLUDE`, else `/usr/local/cuda/include`).

#![allow(unsafe_code)]

use std::ffi::{CString, c_char};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::result as nv;
use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};

use crate::error::{Result, RuntimeError};

/// Whether NVRTC (libnvrtc) can be loaded. Checked once.
pub fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen NVRTC's library names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(RuntimeError::NoNvrtc)
    }
}

/// NVRTC's (major, minor) version; part of the kernel cache key.
pub fn nvrtc_version() -> Result<(u32, u32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loadable (checked above); both pointers are valid.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| nvrtc_error("nvrtcVersion", e.0))?;
    Ok((
        u32::try_from(major).unwrap_or(0),
        u32::try_from(minor).unwrap_or(0),
    ))
}

/// The directories holding the CUDA headers (`cuda_bf16.h`, …):
/// `AEC_CUDA_INCLUDE` (`:`-separated) when set, else `/usr/local/cuda/include`
/// when it has the headers, else none.
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    if let Some(v) = std::env::var_os("AEC_CUDA_INCLUDE").filter(|v| !v.is_empty()) {
        return std::env::split_paths(&v).collect();
    }
    let system = PathBuf::from("/usr/local/cuda/include");
    if system.join("cuda_fp16.h").is_file() {
        vec![system]
    } else {
        Vec::new()
    }
}

/// How to compile one source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// `sm_80`, `sm_90a`, … (a real architecture, to get a CUBIN); a virtual
    /// `compute_XY` gives PTX only.
    pub arch: String,
    /// Passed as `-I`; [`CompileOptions::new`] fills in [`cuda_include_dirs`].
    pub include_dirs: Vec<PathBuf>,
    /// Any other NVRTC options, defines included (`-DTILE=64`).
    pub flags: Vec<String>,
}

impl CompileOptions {
    /// C++17, the CUDA headers found by [`cuda_include_dirs`], no other flags.
    pub fn new(arch: impl Into<String>) -> CompileOptions {
        CompileOptions {
            arch: arch.into(),
            include_dirs: cuda_include_dirs(),
            flags: vec!["-std=c++17".into()],
        }
    }

    /// Also asks ptxas (inside NVRTC) for each entry function's registers,
    /// spills and shared memory: they come back in the log, read by
    /// [`Compiled::resources`]. Changes no code, only the log (and so the
    /// kernel cache's key).
    pub fn with_resource_usage(mut self) -> CompileOptions {
        if !self.flags.iter().any(|f| f == RESOURCE_USAGE_FLAG) {
            self.flags.push(RESOURCE_USAGE_FLAG.into());
        }
        self
    }

    /// The full NVRTC option list.
    pub fn nvrtc_options(&self) -> Vec<String> {
        let mut opts = vec![format!("--gpu-architecture={}", self.arch)];
        opts.extend(
            self.include_dirs
                .iter()
                .map(|d| format!("-I{}", d.display())),
        );
        opts.extend(self.flags.iter().cloned());
        opts
    }
}

/// The output of one compilation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The CUBIN for `arch`; empty when `arch` is virtual (`compute_XY`).
    pub cubin: Vec<u8>,
    /// The PTX, without NVRTC's trailing NUL (ptxas rejects it).
    pub ptx: String,
    /// NVRTC's log: warnings, usually empty, and with
    /// [`CompileOptions::with_resource_usage`] ptxas's report.
    pub log: String,
}

/// The NVRTC option that passes `-v` to its ptxas: each entry function's
/// resources in the log ([`Compiled::resources`]).
const RESOURCE_USAGE_FLAG: &str = "--ptxas-options=-v";

impl Compiled {
    /// Registers, spills and shared memory per entry function, from ptxas's
    /// report in the log: empty unless compiled with
    /// [`CompileOptions::with_resource_usage`] for a real architecture.
    pub fn resources(&self) -> Vec<crate::ResourceUsage> {
        crate::parse_ptxas_verbose(&self.log)
    }
}

/// Compiles `source` with NVRTC. Works without a GPU; needs libnvrtc and,
/// for the `cuda_*.h` headers, [`cuda_include_dirs`].
pub fn compile(source: &str, opts: &CompileOptions) -> Result<Compiled> {
    require_nvrtc()?;
    let src = CString::new(source)
        .map_err(|_| RuntimeError::Invalid("the kernel source contains a NUL byte".into()))?;
    let options = opts.nvrtc_options();
    if options.iter().any(|o| o.contains('\0')) {
        return Err(RuntimeError::Invalid(
            "an NVRTC option contains a NUL byte".into(),
        ));
    }
    let prog = Program(
        nv::create_program(&src, Some(c"aec_kernel.cu"))
            .map_err(|e| nvrtc_error("nvrtcCreateProgram", e.0))?,
    );
    // SAFETY: `prog` is a live program (dropped only at the end of this scope);
    // the options contain no NUL (checked above, so cudarc's CString::new
    // cannot panic).
    let compiled = unsafe { nv::compile_program(prog.0, &options) };
    let log = prog.log();
    if let Err(e) = compiled {
        let mut log = log;
        if log.trim().is_empty() {
            log = format!("(no log; NVRTC returned {:?})", e.0);
        }
        if e.0 == nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE {
            log.push_str(BUILTINS_HINT);
        }
        return Err(RuntimeError::Compile {
            arch: opts.arch.clone(),
            log,
        });
    }
    let ptx = prog.ptx()?;
    let cubin = if opts.arch.starts_with("sm_") {
        prog.cubin()?
    } else {
        Vec::new()
    };
    Ok(Compiled { cubin, ptx, log })
}

const BUILTINS_HINT: &str = "\nhint: NVRTC could not load libnvrtc-builtins.so.13.0; put the \
     directory holding it (the nvidia-cuda-nvrtc wheel's nvidia/cu13/lib, which \
     `cargo xtask toolchains` installs under target/toolchains/cuda) on LD_LIBRARY_PATH";

fn nvrtc_error(call: &'static str, code: nvrtcResult) -> RuntimeError {
    let hint = match code {
        nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE => {
            "; libnvrtc-builtins.so.13.0 must be on LD_LIBRARY_PATH (see runtime/README.md)"
        }
        _ => "",
    };
    RuntimeError::Nvrtc {
        call,
        code: format!("{code:?}"),
        hint,
    }
}

/// Owns an `nvrtcProgram` and destroys it on drop.
struct Program(nvrtcProgram);

impl Program {
    fn log(&self) -> String {
        // SAFETY: self.0 is a live program.
        match unsafe { nv::get_program_log(self.0) } {
            Ok(bytes) => c_chars_to_string(&bytes),
            Err(e) => format!("(could not read the NVRTC log: {:?})", e.0),
        }
    }

    fn ptx(&self) -> Result<String> {
        // SAFETY: self.0 is a live, compiled program.
        let bytes = unsafe { nv::get_ptx(self.0) }.map_err(|e| nvrtc_error("nvrtcGetPTX", e.0))?;
        Ok(c_chars_to_string(&bytes))
    }

    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: self.0 is a live, compiled program; `size` is a valid pointer.
        unsafe { sys::nvrtcGetCUBINSize(self.0, &mut size) }
            .result()
            .map_err(|e| nvrtc_error("nvrtcGetCUBINSize", e.0))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has exactly the size NVRTC reported.
        unsafe { sys::nvrtcGetCUBIN(self.0, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()
            .map_err(|e| nvrtc_error("nvrtcGetCUBIN", e.0))?;
        Ok(cubin)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here.
        let _ = unsafe { nv::destroy_program(self.0) };
    }
}

/// NVRTC strings end in a NUL (and PTX must not, for ptxas).
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_list() {
        let opts = CompileOptions {
            arch: "sm_90a".into(),
            include_dirs: vec!["/a".into(), "/b c".into()],
            flags: vec!["-DX=1".into()],
        };
        assert_eq!(
            opts.nvrtc_options(),
            ["--gpu-architecture=sm_90a", "-I/a", "-I/b c", "-DX=1"]
        );
    }

    #[test]
    fn trailing_nul_is_stripped() {
        let chars: Vec<c_char> = b"ptx\0".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_chars_to_string(&chars), "ptx");
    }
}
