//! The AMD compile toolchain from Debian's packages: ROCm 5.2.3's `hipcc`
//! (gfx90a), `clang-19` with `lld-19` (gfx942), `llvm-19` (readelf, objdump)
//! and `libamdhip64-dev` (the HIP runtime the `hip` feature links). Installed
//! with apt as root (or through passwordless sudo); a machine where neither
//! works gets the package list to install by hand.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The packages, exactly as apt names them (Debian 12).
pub const PACKAGES: &[&str] = &[
    "hipcc",
    "libamdhip64-dev",
    "rocm-device-libs",
    "clang-19",
    "lld-19",
    "llvm-19",
];

/// Files whose presence means the toolchain is installed.
const ESSENTIALS: &[&str] = &[
    "/usr/bin/hipcc",
    "/usr/bin/clang++-19",
    "/usr/lib/llvm-19/bin/ld.lld",
    "/usr/bin/llvm-readelf-19",
    "/usr/bin/llvm-objdump-19",
    "/usr/include/hip/hip_runtime_api.h",
];

fn missing() -> Vec<&'static str> {
    ESSENTIALS
        .iter()
        .copied()
        .filter(|f| !Path::new(f).exists())
        .collect()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn apt(sudo: bool, args: &[&str]) -> Result<(), String> {
    let mut cmd = if sudo {
        let mut c = Command::new("sudo");
        c.args(["-n", "apt-get"]);
        c
    } else {
        Command::new("apt-get")
    };
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "apt-get {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }
}

/// Installs the packages unless every essential file is there already.
pub fn ensure() -> Result<(), String> {
    let absent = missing();
    if absent.is_empty() {
        eprintln!("==> toolchains: HIP (hipcc, clang-19, llvm-19, libamdhip64) present");
        return Ok(());
    }
    let by_hand = || {
        format!(
            "the HIP compile checks need Debian's {}; install them (as root: `apt-get install {}`) and rerun",
            PACKAGES.join(", "),
            PACKAGES.join(" ")
        )
    };
    let sudo = if is_root() {
        false
    } else if Command::new("sudo")
        .args(["-n", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        true
    } else {
        return Err(format!("not root and no passwordless sudo: {}", by_hand()));
    };
    let start = Instant::now();
    eprintln!(
        "==> toolchains: installing {} Debian packages for the HIP checks (~700 MB): {}",
        PACKAGES.len(),
        PACKAGES.join(" ")
    );
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(PACKAGES);
    if apt(sudo, &install).is_err() {
        // A fresh machine may have no package lists yet.
        apt(sudo, &["update"]).map_err(|e| format!("{e}\n{}", by_hand()))?;
        apt(sudo, &install).map_err(|e| format!("{e}\n{}", by_hand()))?;
    }
    let absent = missing();
    if !absent.is_empty() {
        return Err(format!(
            "the packages installed but {} is missing: their layout changed; update xtask/src/hip_toolchain.rs",
            absent.join(", ")
        ));
    }
    eprintln!(
        "==> toolchains: HIP ok ({:.0} s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
