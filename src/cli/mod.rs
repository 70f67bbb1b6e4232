//! Command-line interface. Only this layer reads files and sets exit codes.

mod check;
mod compile;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// aec: an attention compiler. Describe an attention variant once; get its
/// forward and backward graphs (and, in later versions, GPU kernels).
#[derive(Parser, Debug)]
#[command(name = "aec", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Parse, trace, differentiate and validate the variants in a file, and
    /// print their forward and backward graphs.
    Check(check::CheckArgs),
    /// Generate and compile the variants' kernels into a library directory:
    /// CUDA sources, cubins (through NVRTC; no GPU needed) and manifest.json.
    Compile(compile::CompileArgs),
}

/// Exit code for problems in the user's input (bad file, DSL errors).
pub const EXIT_INPUT: u8 = 2;

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Compile(args) => compile::run(&args),
    }
}
