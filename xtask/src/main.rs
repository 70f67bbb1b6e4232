//! Project tasks: `cargo xtask test` is the one command that runs every check
//! CI runs (formatting, lints, the whole test suite).
//!
//! Toolchains the checks need are installed here too (`toolchains`: the pinned
//! CUDA wheels for the NVRTC/ptxas compile checks, Debian's hipcc/clang-19/llvm
//! for the HIP compile checks), so the command stays the same as they are added.

mod hip_toolchain;
mod toolchains;

use std::process::{Command, ExitCode};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("toolchains") => install_toolchains(&args[1..]),
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("error: unknown task `{other}`\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  test [--quick]   installs the toolchains (below), then the formatting check,
                   clippy (-D warnings) and every test of the workspace, with
                   the toolchain checks required (AEC_REQUIRE_TOOLCHAINS=1);
                   --quick skips formatting and clippy, and skips checking the
                   toolchains when they were installed before
  toolchains       installs the pinned CUDA 13.0 wheels (NVRTC, headers, ptxas,
                   cuobjdump, nvdisasm; ~480 MB) with `python3 -m pip` into
                   target/toolchains/cuda, and Debian's HIP packages (hipcc,
                   libamdhip64-dev, rocm-device-libs, clang-19, lld-19,
                   llvm-19; ~700 MB) with apt-get as root or through sudo;
                   instant when already installed";

fn install_toolchains(flags: &[String]) -> ExitCode {
    if let Some(bad) = flags.first() {
        eprintln!("error: unknown flag `{bad}` for `toolchains`\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let dir = toolchains::install_dir();
    if let Err(e) = hip_toolchain::ensure() {
        eprintln!("==> toolchains: FAILED: {e}");
        return ExitCode::FAILURE;
    }
    match toolchains::ensure(&dir) {
        Ok(cuda) => {
            eprintln!("==> toolchains: to use them outside `cargo xtask test`, set");
            for (k, v) in cuda.env() {
                if k == "LD_LIBRARY_PATH" {
                    eprintln!("      {k}={}:$LD_LIBRARY_PATH", cuda.lib.display());
                } else {
                    eprintln!("      {k}={v}");
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("==> toolchains: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn test(flags: &[String]) -> ExitCode {
    let quick = flags.iter().any(|f| f == "--quick");
    if let Some(bad) = flags.iter().find(|f| *f != "--quick") {
        eprintln!("error: unknown flag `{bad}` for `test`\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let dir = toolchains::install_dir();
    let cuda = match toolchains::stamped(&dir).filter(|_| quick) {
        Some(cuda) => {
            eprintln!("==> toolchains: --quick: using {} unchecked", dir.display());
            cuda
        }
        None => match toolchains::ensure(&dir) {
            Ok(cuda) => cuda,
            Err(e) => {
                eprintln!("==> toolchains: FAILED: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    if !quick && let Err(e) = hip_toolchain::ensure() {
        eprintln!("==> toolchains: FAILED: {e}");
        return ExitCode::FAILURE;
    }
    let mut steps: Vec<(&str, Vec<&str>)> = Vec::new();
    if !quick {
        steps.push(("formatting", vec!["fmt", "--all", "--check"]));
        steps.push((
            "clippy",
            vec![
                "clippy",
                "--workspace",
                "--all-targets",
                "--features",
                "hip",
                "--",
                "-D",
                "warnings",
            ],
        ));
    }
    steps.push(("tests", vec!["test", "--workspace"]));
    // The HIP runtime (links libamdhip64): builds, and reports no AMD GPU here.
    steps.push((
        "hip runtime",
        vec!["test", "--features", "hip", "--test", "hip_runtime"],
    ));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (name, args) in steps {
        let start = Instant::now();
        eprintln!("==> {name}: cargo {}", args.join(" "));
        let mut command = Command::new(&cargo);
        command.args(&args);
        if name == "tests" || name == "hip runtime" {
            // The runtime's compile checks fail (instead of skipping) without
            // these; see runtime/README.md.
            command.envs(cuda.env());
        }
        let status = command.status();
        match status {
            Ok(s) if s.success() => {
                eprintln!("==> {name}: ok ({:.0} s)", start.elapsed().as_secs_f64());
            }
            Ok(s) => {
                eprintln!("==> {name}: FAILED ({s})");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("==> {name}: cannot run cargo: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
