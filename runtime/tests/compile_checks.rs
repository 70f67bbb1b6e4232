//! NVRTC → ptxas → SASS on a real tensor-core kernel, for both CUDA targets.
//! Needs the CUDA toolchain (`cargo xtask toolchains`), not a GPU; skips
//! without it unless AEC_REQUIRE_TOOLCHAINS=1.

mod common;

use aec_runtime::{
    CompileOptions, Compiled, RuntimeError, compile, cuda_include_dirs, ptxas_resources, sass,
};

const MMA: &str = include_str!("kernels/mma.cu");

/// Compiles `MMA` for `arch`, or `None` (skipped) without NVRTC or headers.
fn compile_mma(test: &str, arch: &str) -> Option<Compiled> {
    if !cuda_include_dirs()
        .iter()
        .any(|d| d.join("cuda_bf16.h").is_file())
    {
        common::skip_toolchain(
            test,
            "no cuda_bf16.h in AEC_CUDA_INCLUDE or /usr/local/cuda/include",
        );
        return None;
    }
    match compile(MMA, &CompileOptions::new(arch)) {
        Ok(c) => Some(c),
        Err(e @ RuntimeError::NoNvrtc) => {
            common::skip_toolchain(test, e);
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

fn check_target(test: &str, arch: &str) {
    let Some(c) = compile_mma(test, arch) else {
        return;
    };
    assert!(!c.cubin.is_empty(), "empty CUBIN for {arch}");
    assert_eq!(&c.cubin[..4], b"\x7fELF", "the CUBIN is not an ELF image");
    assert!(
        c.ptx
            .contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    );
    assert!(
        c.ptx.contains(&format!(".target {arch}")),
        "PTX target is not {arch}"
    );
    assert!(!c.ptx.ends_with('\0'), "trailing NUL left in the PTX");

    // NVRTC's own ptxas report (no ptxas binary needed) …
    let own = compile(MMA, &CompileOptions::new(arch).with_resource_usage())
        .expect("compiles with the resource report")
        .resources();
    let usage = match ptxas_resources(&c.ptx, arch) {
        Ok(u) => u,
        Err(e @ RuntimeError::ToolMissing { .. }) => return common::skip_toolchain(test, e),
        Err(e) => panic!("{test}: {e}"),
    };
    let mma = usage
        .iter()
        .find(|u| u.function == "mma_bf16_m16n8k16")
        .unwrap_or_else(|| panic!("no mma kernel in the ptxas report: {usage:?}"));
    assert_eq!(mma.arch, arch);
    assert!(mma.registers > 0 && mma.registers <= 255, "{mma:?}");
    assert!(!mma.spills(), "the mma kernel spills: {mma:?}");
    assert_eq!(mma.shared_bytes, 0, "{mma:?}");
    assert!(usage.iter().any(|u| u.function == "to_bf16"), "{usage:?}");
    // … says what the ptxas binary says, kernel for kernel.
    let key = |u: &aec_runtime::ResourceUsage| {
        (
            u.function.clone(),
            u.arch.clone(),
            u.registers,
            u.spill_store_bytes,
            u.shared_bytes,
        )
    };
    let (mut a, mut b): (Vec<_>, Vec<_>) = (
        own.iter().map(key).collect(),
        usage.iter().map(key).collect(),
    );
    a.sort();
    b.sort();
    assert_eq!(a, b, "NVRTC's report against ptxas's");
    assert!(
        c.resources().is_empty(),
        "no report without with_resource_usage: {:?}",
        c.resources()
    );

    let sass = match sass(&c.cubin) {
        Ok(s) => s,
        Err(e @ RuntimeError::ToolMissing { .. }) => return common::skip_toolchain(test, e),
        Err(e) => panic!("{test}: {e}"),
    };
    assert!(
        sass.contains("HMMA"),
        "no HMMA in the SASS for {arch}:\n{sass}"
    );
}

#[test]
fn mma_kernel_compiles_assembles_and_uses_tensor_cores_sm80() {
    check_target(
        "mma_kernel_compiles_assembles_and_uses_tensor_cores_sm80",
        "sm_80",
    );
}

#[test]
fn mma_kernel_compiles_assembles_and_uses_tensor_cores_sm90a() {
    check_target(
        "mma_kernel_compiles_assembles_and_uses_tensor_cores_sm90a",
        "sm_90a",
    );
}

#[test]
fn compile_error_carries_the_nvrtc_log() {
    let test = "compile_error_carries_the_nvrtc_log";
    let src = "extern \"C\" __global__ void broken(float* x) { x[0] = undeclared_name; }";
    match compile(src, &CompileOptions::new("sm_80")) {
        Err(RuntimeError::Compile { arch, log }) => {
            assert_eq!(arch, "sm_80");
            assert!(log.contains("undeclared_name"), "log: {log}");
        }
        Err(e @ RuntimeError::NoNvrtc) => common::skip_toolchain(test, e),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn virtual_arch_gives_ptx_only() {
    let test = "virtual_arch_gives_ptx_only";
    let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }";
    let mut opts = CompileOptions::new("compute_80");
    opts.include_dirs.clear();
    match compile(src, &opts) {
        Ok(c) => {
            assert!(c.cubin.is_empty());
            assert!(c.ptx.contains(".entry k"), "{}", c.ptx);
        }
        Err(e @ RuntimeError::NoNvrtc) => common::skip_toolchain(test, e),
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn cache_compiles_once_through_nvrtc() {
    let test = "cache_compiles_once_through_nvrtc";
    let dir = tempfile::tempdir().unwrap();
    let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }";
    let opts = CompileOptions::new("sm_80");
    let cache = aec_runtime::KernelCache::new(Some(dir.path().to_path_buf()));
    let first = match cache.compile(src, &opts) {
        Ok(c) => c,
        Err(e @ RuntimeError::NoNvrtc) => return common::skip_toolchain(test, e),
        Err(e) => panic!("{test}: {e}"),
    };
    assert!(!first.cubin.is_empty());
    // A second process's cache reads the entry back: same bytes.
    let other = aec_runtime::KernelCache::new(Some(dir.path().to_path_buf()));
    let key = aec_runtime::CacheKey::new(src, &opts, aec_runtime::nvrtc_version().unwrap());
    let again = other
        .get_or_insert_with(key, || panic!("must come from disk"))
        .unwrap();
    assert_eq!(*again, *first);
}
