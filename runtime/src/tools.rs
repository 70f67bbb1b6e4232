//! The offline CUDA tools (ptxas, cuobjdump) behind the compile checks:
//! resource usage of a kernel and its SASS, without a GPU.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, RuntimeError};
use crate::resources::{ResourceUsage, parse_ptxas_verbose};

/// Whether `AEC_REQUIRE_TOOLCHAINS=1`: tests that need NVRTC/ptxas/cuobjdump
/// must fail, not skip, when they are missing (`cargo xtask test` sets it).
pub fn toolchains_required() -> bool {
    std::env::var_os("AEC_REQUIRE_TOOLCHAINS").is_some_and(|v| v == "1")
}

/// Finds a CUDA tool in `AEC_CUDA_BIN` (`:`-separated), then `PATH`, then
/// `/usr/local/cuda/bin`.
pub fn find_tool(name: &str) -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["AEC_CUDA_BIN", "PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| RuntimeError::ToolMissing {
            tool: name.into(),
            looked: "AEC_CUDA_BIN, PATH, /usr/local/cuda/bin".into(),
        })
}

/// Assembles `ptx` with `ptxas -v -arch=<arch>` and returns the resource
/// usage of each kernel in it.
pub fn ptxas_resources(ptx: &str, arch: &str) -> Result<Vec<ResourceUsage>> {
    let ptxas = find_tool("ptxas")?;
    let dir = TempDir::new()?;
    let input = dir.write("kernel.ptx", ptx.as_bytes())?;
    let output = dir.0.join("kernel.cubin");
    let out = run(
        Command::new(&ptxas)
            .arg("-v")
            .arg(format!("-arch={arch}"))
            .arg(&input)
            .arg("-o")
            .arg(&output),
        "ptxas",
    )?;
    Ok(parse_ptxas_verbose(&out))
}

/// The SASS of a CUBIN, from `cuobjdump -sass`.
pub fn sass(cubin: &[u8]) -> Result<String> {
    let cuobjdump = find_tool("cuobjdump")?;
    let dir = TempDir::new()?;
    let input = dir.write("kernel.cubin", cubin)?;
    run(
        Command::new(&cuobjdump).arg("-sass").arg(&input),
        "cuobjdump",
    )
}

/// Runs a tool; its stdout and stderr together, or its failure with both.
pub(crate) fn run(cmd: &mut Command, tool: &str) -> Result<String> {
    let out = cmd.output().map_err(|e| RuntimeError::ToolFailed {
        tool: tool.into(),
        status: "could not start".into(),
        output: e.to_string(),
    })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(RuntimeError::ToolFailed {
            tool: tool.into(),
            status: out.status.to_string(),
            output: text,
        })
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "aec-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(RuntimeError::io("cannot create", &dir))?;
        Ok(TempDir(dir))
    }

    pub(crate) fn write(&self, name: &str, data: &[u8]) -> Result<PathBuf> {
        let path = self.0.join(name);
        std::fs::write(&path, data).map_err(RuntimeError::io("cannot write", &path))?;
        Ok(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
