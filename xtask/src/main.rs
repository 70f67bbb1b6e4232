//! Project tasks: `cargo xtask test` is the one command that runs every check
//! CI runs (formatting, lints, the whole test suite).
//!
//! Later stages add their toolchain steps here (pinned NVRTC/ptxas wheels for
//! the CUDA compile checks, Debian's hipcc for the HIP ones), so the command
//! stays the same.

use std::process::{Command, ExitCode};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
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
  test [--quick]   formatting check, clippy (-D warnings) and every test of the
                   workspace; --quick skips formatting and clippy";

fn test(flags: &[String]) -> ExitCode {
    let quick = flags.iter().any(|f| f == "--quick");
    if let Some(bad) = flags.iter().find(|f| *f != "--quick") {
        eprintln!("error: unknown flag `{bad}` for `test`\n\n{USAGE}");
        return ExitCode::from(2);
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
                "--",
                "-D",
                "warnings",
            ],
        ));
    }
    steps.push(("tests", vec!["test", "--workspace"]));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (name, args) in steps {
        let start = Instant::now();
        eprintln!("==> {name}: cargo {}", args.join(" "));
        let status = Command::new(&cargo).args(&args).status();
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
