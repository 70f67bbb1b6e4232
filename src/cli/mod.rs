//! Command-line interface. Only this layer reads files and sets exit codes.

mod cache;
mod check;
mod compile;
mod devices;
mod tune;
mod workload_tiles;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// aec: an attention compiler. Describe an attention variant once; get its
/// forward and backward graphs and GPU kernels for NVIDIA and AMD.
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
    /// CUDA sources and cubins (through NVRTC) for NVIDIA targets, HIP sources
    /// and code objects (hipcc / clang-19) for AMD targets, and manifest.json.
    /// No GPU needed.
    Compile(compile::CompileArgs),
    /// List the GPUs kernels can run on here: NVIDIA (CUDA driver) and, when
    /// built with the `hip` feature, AMD (HIP runtime).
    Devices(devices::DevicesArgs),
    /// Tune a variant's kernels on the GPU present: the parallel forward
    /// (the cost model ranks the tile configurations, the best compile in
    /// parallel and are profiled with the default), with `--backward` the
    /// parallel backward's tile, or a recurrent variant's forward (with
    /// `--backward` its backward; these over their tile spaces in order);
    /// the fastest per shape bucket
    /// goes into the tuning cache (read by `compile_for_shape`). `--target`
    /// ranks the parallel forward with the model only, without a GPU.
    Tune(tune::TuneArgs),
    /// Inspect and manage the autotuner's tuning cache: list, show, clear,
    /// export, import.
    Cache(cache::CacheArgs),
}

/// Exit code for problems in the user's input (bad file, DSL errors).
pub const EXIT_INPUT: u8 = 2;

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Compile(args) => compile::run(&args),
        Command::Devices(args) => devices::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Cache(args) => cache::run(&args),
    }
}
