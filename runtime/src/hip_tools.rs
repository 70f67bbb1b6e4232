//! The offline AMD tools behind `aec compile --target mi250|mi300x` and the
//! HIP compile checks: HIP source → code object (ELF) for a gfx target, its
//! resource usage from the AMDGPU metadata note, and its ISA. No AMD GPU and
//! no HIP runtime are needed: kernels carry their own prelude of clang
//! builtins, so they compile with `-nogpuinc -nogpulib`.
//!
//! Compilers, in order: `AEC_HIPCC` (a hipcc or clang++ path), Debian's
//! `hipcc` (ROCm 5.2.3, LLVM 15: gfx90a and gfx940, not gfx942), Debian's
//! `clang++-19` (every target here). Readers: `llvm-readelf-19`/`-15` and
//! `llvm-objdump-19`/`-15`.

use std::path::PathBuf;
use std::process::Command;

use crate::error::{Result, RuntimeError};
use crate::tools::{TempDir, run};

/// What to install when a HIP tool is missing (Debian 12 packages).
pub const HIP_TOOLCHAIN_HINT: &str = "install Debian's `hipcc libamdhip64-dev rocm-device-libs clang-19 lld-19 llvm-19` (`cargo xtask toolchains` does, as root)";

/// A compiler able to build HIP device code for a gfx target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipCompiler {
    pub path: PathBuf,
    /// `hipcc` (takes `--genco`) or a plain clang driver.
    pub hipcc: bool,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The compiler for `gfx` (`gfx90a`, `gfx942`, …): `AEC_HIPCC` if set, else
/// hipcc where ROCm 5.2's LLVM knows the target, else clang++-19.
pub fn find_hip_compiler(gfx: &str) -> Result<HipCompiler> {
    if let Some(p) = std::env::var_os("AEC_HIPCC") {
        let path = PathBuf::from(p);
        let hipcc = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("hipcc"));
        return Ok(HipCompiler { path, hipcc });
    }
    let hipcc_knows = matches!(gfx, "gfx90a" | "gfx940");
    if hipcc_knows && let Some(path) = on_path("hipcc") {
        return Ok(HipCompiler { path, hipcc: true });
    }
    if let Some(path) = on_path("clang++-19") {
        return Ok(HipCompiler { path, hipcc: false });
    }
    Err(RuntimeError::HipToolMissing {
        tool: if hipcc_knows {
            "hipcc or clang++-19".into()
        } else {
            "clang++-19".into()
        },
        target: gfx.into(),
    })
}

fn find_llvm_tool(name: &str) -> Result<PathBuf> {
    ["19", "15"]
        .iter()
        .find_map(|v| on_path(&format!("{name}-{v}")))
        .ok_or_else(|| RuntimeError::HipToolMissing {
            tool: format!("{name}-19 or {name}-15"),
            target: "reading AMD code objects".into(),
        })
}

/// A compiled AMD code object.
#[derive(Debug, Clone)]
pub struct HipCodeObject {
    /// The ELF (`hipModuleLoadData` takes it as is).
    pub elf: Vec<u8>,
    /// The compiler that built it and its version line.
    pub compiler: String,
}

/// Compiles a self-contained HIP source (its own prelude, no HIP headers)
/// for `gfx`, device code only, at -O3.
pub fn hip_compile(source: &str, gfx: &str) -> Result<HipCodeObject> {
    let cc = find_hip_compiler(gfx)?;
    let dir = TempDir::new()?;
    let input = dir.write("kernel.hip", source.as_bytes())?;
    let output = dir.0.join("kernel.co");
    let mut cmd = Command::new(&cc.path);
    if cc.hipcc {
        cmd.arg("--genco");
    } else {
        cmd.args(["-x", "hip", "--cuda-device-only"]);
    }
    cmd.arg(format!("--offload-arch={gfx}"))
        .args(["-O3", "-nogpuinc", "-nogpulib", "--no-gpu-bundle-output"])
        // Hardware f32 atomics (dQ accumulation) instead of CAS loops: valid
        // for the coarse-grained memory hipMalloc returns.
        .arg("-munsafe-fp-atomics")
        .arg(&input)
        .arg("-o")
        .arg(&output);
    let tool = cc.path.display().to_string();
    run(&mut cmd, &tool)?;
    let elf = std::fs::read(&output).map_err(RuntimeError::io("cannot read", &output))?;
    let version = run(Command::new(&cc.path).arg("--version"), &tool)
        .ok()
        .and_then(|v| {
            v.lines()
                .find(|l| l.contains("clang version") || l.contains("HIP version"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    Ok(HipCodeObject {
        elf,
        compiler: format!("{} ({})", cc.path.display(), version.trim()),
    })
}

/// One kernel's resources, from the code object's AMDGPU metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HipResourceUsage {
    pub name: String,
    /// Vector registers per lane from the unified file (CDNA2/3): the
    /// architectural VGPRs and the AGPRs (`.vgpr_count`, which counts both).
    pub vgprs: u32,
    /// Of those, the accumulation registers (MFMA accumulators).
    pub agprs: u32,
    pub sgprs: u32,
    /// Static LDS per workgroup (bytes).
    pub lds_bytes: u32,
    /// Scratch (private segment) per work-item (bytes): spills and stack.
    pub scratch_bytes: u32,
    pub vgpr_spills: u32,
    pub sgpr_spills: u32,
    pub wavefront_size: u32,
    pub max_workgroup_size: u32,
}

impl HipResourceUsage {
    /// Waves per SIMD the registers and LDS allow for `waves_per_group`-wave
    /// workgroups (CDNA2/3: 512 registers per lane in granules of 8; 64 KiB
    /// of LDS and 4 SIMDs per CU; at most 8 waves per SIMD).
    pub fn waves_per_simd(&self, waves_per_group: u32) -> u32 {
        let regs = self.vgprs.max(1).div_ceil(8) * 8;
        let by_regs = (512 / regs).min(8);
        let by_lds = (64 * 1024u32)
            .checked_div(self.lds_bytes)
            .map_or(8, |groups| {
                (groups * waves_per_group.max(1)).div_ceil(4).min(8)
            });
        by_regs.min(by_lds)
    }
}

/// The kernels' resources in a code object, from `llvm-readelf --notes`.
pub fn hip_resources(elf: &[u8]) -> Result<Vec<HipResourceUsage>> {
    let readelf = find_llvm_tool("llvm-readelf")?;
    let dir = TempDir::new()?;
    let input = dir.write("kernel.co", elf)?;
    let notes = run(
        Command::new(&readelf).arg("--notes").arg(&input),
        "llvm-readelf",
    )?;
    Ok(parse_amdgpu_metadata(&notes))
}

/// The kernels of an AMDGPU metadata note as `llvm-readelf --notes` prints it
/// (YAML: one `- .key: value` map per kernel under `amdhsa.kernels`).
pub fn parse_amdgpu_metadata(notes: &str) -> Vec<HipResourceUsage> {
    let mut kernels = Vec::new();
    let mut current: Option<HipResourceUsage> = None;
    let mut in_kernels = false;
    for line in notes.lines() {
        if line.starts_with("amdhsa.kernels:") {
            in_kernels = true;
            continue;
        }
        if in_kernels && !line.starts_with(' ') {
            in_kernels = false;
        }
        if !in_kernels {
            continue;
        }
        // Kernel-level keys are indented four columns ("  - " starts a kernel).
        let (starts, rest) = if let Some(r) = line.strip_prefix("  - ") {
            (true, r)
        } else if let Some(r) = line.strip_prefix("    ") {
            if r.starts_with(' ') || r.starts_with('-') {
                continue;
            }
            (false, r)
        } else {
            continue;
        };
        if starts {
            kernels.extend(current.take());
            current = Some(HipResourceUsage::default());
        }
        let Some(k) = current.as_mut() else { continue };
        let Some((key, value)) = rest.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let n = || value.parse::<u32>().unwrap_or(0);
        match key {
            ".name" => k.name = value.to_string(),
            ".vgpr_count" => k.vgprs = n(),
            ".agpr_count" => k.agprs = n(),
            ".sgpr_count" => k.sgprs = n(),
            ".group_segment_fixed_size" => k.lds_bytes = n(),
            ".private_segment_fixed_size" => k.scratch_bytes = n(),
            ".vgpr_spill_count" => k.vgpr_spills = n(),
            ".sgpr_spill_count" => k.sgpr_spills = n(),
            ".wavefront_size" => k.wavefront_size = n(),
            ".max_flat_workgroup_size" => k.max_workgroup_size = n(),
            _ => {}
        }
    }
    kernels.extend(current);
    kernels
}

/// The ISA of a code object (`llvm-objdump -d --mcpu=<gfx>`).
pub fn hip_isa(elf: &[u8], gfx: &str) -> Result<String> {
    let objdump = find_llvm_tool("llvm-objdump")?;
    let dir = TempDir::new()?;
    let input = dir.write("kernel.co", elf)?;
    run(
        Command::new(&objdump)
            .arg("-d")
            .arg(format!("--mcpu={gfx}"))
            .arg(&input),
        "llvm-objdump",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTES: &str = "Displaying notes found in: .note
    AMDGPU Metadata:
        ---
amdhsa.kernels:
  - .agpr_count:     4
    .args:
      - .address_space:  global
        .offset:         0
      - .offset:         16
        .value_kind:     by_value
    .group_segment_fixed_size: 35840
    .max_flat_workgroup_size: 256
    .name:           first
    .private_segment_fixed_size: 0
    .sgpr_count:     14
    .sgpr_spill_count: 0
    .vgpr_count:     120
    .vgpr_spill_count: 0
    .wavefront_size: 64
  - .agpr_count:     0
    .name:           second
    .private_segment_fixed_size: 16
    .vgpr_count:     256
    .vgpr_spill_count: 3
amdhsa.target:   amdgcn-amd-amdhsa--gfx942
";

    #[test]
    fn metadata_gives_each_kernels_resources() {
        let k = parse_amdgpu_metadata(NOTES);
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "first");
        assert_eq!(
            (k[0].vgprs, k[0].agprs, k[0].sgprs, k[0].lds_bytes),
            (120, 4, 14, 35840)
        );
        assert_eq!((k[0].wavefront_size, k[0].max_workgroup_size), (64, 256));
        assert_eq!(k[1].name, "second");
        assert_eq!((k[1].scratch_bytes, k[1].vgpr_spills), (16, 3));
    }

    #[test]
    fn occupancy_is_bounded_by_registers_and_lds() {
        let k = &parse_amdgpu_metadata(NOTES)[0];
        // 120 registers: 4 waves per SIMD; 35840 B of LDS: one 4-wave group
        // per CU, so 1 wave per SIMD.
        assert_eq!(k.waves_per_simd(4), 1);
        let small = HipResourceUsage {
            lds_bytes: 8192,
            ..k.clone()
        };
        assert_eq!(small.waves_per_simd(4), 4);
        let big = HipResourceUsage {
            vgprs: 292,
            ..small
        };
        assert_eq!(big.waves_per_simd(4), 1);
    }
}
