//! `cargo xtask toolchains`: the pinned CUDA 13.0 compile toolchain (NVRTC,
//! headers, ptxas, cuobjdump, nvdisasm) from NVIDIA's pip wheels, so the CUDA
//! compile checks run on machines without a GPU or a CUDA install.
//!
//! Everything is pinned: unpinned, pip mixes in newer CUDA parts whose PTX the
//! GPU machines' 580 driver may reject. cuobjdump and nvdisasm have no 13.0
//! wheel; the oldest published (13.2.51) is pinned, which is harmless because
//! they only read code, they never produce it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The wheels, exactly. Changing this list changes the stamp, so the next run
/// reinstalls.
pub const PINS: &[&str] = &[
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    // CCCL: `nv/target`, which cuda_fp16.h and cuda_bf16.h include under nvcc.
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-cuobjdump==13.2.51",
    "nvidia-cuda-nvdisasm==13.2.51",
];

/// Where the wheels put their files, relative to the install directory.
const CU13: &str = "nvidia/cu13";
const STAMP: &str = ".aec-toolchain-stamp";

/// The installed toolchain's directories.
#[derive(Debug)]
pub struct Cuda {
    pub include: PathBuf,
    pub bin: PathBuf,
    pub lib: PathBuf,
}

impl Cuda {
    fn at(dir: &Path) -> Cuda {
        let root = dir.join(CU13);
        Cuda {
            include: root.join("include"),
            bin: root.join("bin"),
            lib: root.join("lib"),
        }
    }

    /// Files whose absence means the install is broken even if the stamp exists.
    fn essentials(&self) -> [PathBuf; 5] {
        [
            self.lib.join("libnvrtc.so.13"),
            self.lib.join("libnvrtc-builtins.so.13.0"),
            self.include.join("cuda_bf16.h"),
            self.bin.join("ptxas"),
            self.bin.join("cuobjdump"),
        ]
    }

    /// The environment `cargo test` needs to use this toolchain (see
    /// `runtime/README.md`).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut lib_path = vec![self.lib.clone()];
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            lib_path.extend(std::env::split_paths(&old));
        }
        let lib_path = std::env::join_paths(lib_path)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| self.lib.display().to_string());
        vec![
            ("AEC_REQUIRE_TOOLCHAINS".into(), "1".into()),
            (
                "AEC_CUDA_INCLUDE".into(),
                self.include.display().to_string(),
            ),
            ("AEC_CUDA_BIN".into(), self.bin.display().to_string()),
            ("LD_LIBRARY_PATH".into(), lib_path),
        ]
    }
}

/// `<workspace>/target/toolchains/cuda`.
pub fn install_dir() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = xtask.parent().unwrap_or(xtask);
    root.join("target").join("toolchains").join("cuda")
}

fn stamp_text() -> String {
    let mut s = String::from("# installed by `cargo xtask toolchains`; do not edit\n");
    for pin in PINS {
        s.push_str(pin);
        s.push('\n');
    }
    s
}

/// The toolchain if its stamp exists, without checking the pins (`--quick`).
pub fn stamped(dir: &Path) -> Option<Cuda> {
    dir.join(STAMP).is_file().then(|| Cuda::at(dir))
}

/// Installs the pinned wheels into `dir` unless the stamp there records the
/// same pins and the essential files are present.
pub fn ensure(dir: &Path) -> Result<Cuda, String> {
    let cuda = Cuda::at(dir);
    let current = std::fs::read_to_string(dir.join(STAMP)).ok();
    if current.as_deref() == Some(stamp_text().as_str())
        && cuda.essentials().iter().all(|f| f.exists())
    {
        eprintln!(
            "==> toolchains: CUDA 13.0 wheels up to date in {}",
            dir.display()
        );
        return Ok(cuda);
    }
    let start = Instant::now();
    check_pip()?;
    // Install next to the final place, then swap: an interrupted install never
    // leaves a directory that looks complete.
    let partial = dir.with_extension("partial");
    remove(&partial)?;
    eprintln!(
        "==> toolchains: installing {} pinned CUDA wheels (~480 MB) into {}",
        PINS.len(),
        dir.display()
    );
    for pin in PINS {
        eprintln!("      {pin}");
    }
    let status = Command::new("python3")
        .args(["-m", "pip", "install"])
        .args(["--no-deps", "--only-binary=:all:", "--no-input"])
        .args(["--disable-pip-version-check", "--progress-bar", "off"])
        .arg("--target")
        .arg(&partial)
        .args(PINS)
        .status()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !status.success() {
        return Err(format!(
            "pip could not install the CUDA wheels ({status}); check the network \
             access to PyPI and rerun `cargo xtask toolchains`"
        ));
    }
    let fresh = Cuda::at(&partial);
    if let Some(missing) = fresh.essentials().iter().find(|f| !f.exists()) {
        return Err(format!(
            "the wheels installed but {} is missing: their layout changed; \
             update xtask/src/toolchains.rs",
            missing.display()
        ));
    }
    std::fs::write(partial.join(STAMP), stamp_text())
        .map_err(|e| format!("cannot write the stamp in {}: {e}", partial.display()))?;
    remove(dir)?;
    std::fs::rename(&partial, dir).map_err(|e| {
        format!(
            "cannot move {} to {}: {e}",
            partial.display(),
            dir.display()
        )
    })?;
    eprintln!(
        "==> toolchains: ok ({:.0} s)",
        start.elapsed().as_secs_f64()
    );
    Ok(cuda)
}

fn check_pip() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(_) => Err("python3 has no pip; install it (Debian: `apt-get install \
                      python3-pip`) and rerun `cargo xtask toolchains`"
            .into()),
        Err(e) => Err(format!(
            "python3 not found ({e}); the CUDA compile checks install NVIDIA's \
             pip wheels with it: install python3 and pip (Debian: `apt-get \
             install python3-pip`) and rerun `cargo xtask toolchains`"
        )),
    }
}

fn remove(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
}
