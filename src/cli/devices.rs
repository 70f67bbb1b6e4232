//! `aec devices`: the GPUs this machine can run kernels on — NVIDIA through
//! the CUDA driver, AMD through the HIP runtime (when built with the `hip`
//! feature). Having none is a normal answer, not an error.

use aec::runtime::Device;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct DevicesArgs {}

pub fn run(_: &DevicesArgs) -> ExitCode {
    match Device::count() {
        Ok(0) => println!("NVIDIA: no CUDA device found"),
        Ok(n) => {
            for ordinal in 0..n {
                match Device::open(ordinal) {
                    Ok(d) => println!(
                        "NVIDIA {ordinal}: {} ({}, {} SMs)",
                        d.name(),
                        d.arch(),
                        d.sm_count()
                    ),
                    Err(e) => println!("NVIDIA {ordinal}: cannot open: {e}"),
                }
            }
        }
        Err(e) => println!("NVIDIA: {e}"),
    }
    amd();
    ExitCode::SUCCESS
}

#[cfg(feature = "hip")]
fn amd() {
    match aec::runtime::HipDevice::all() {
        Ok(devices) => {
            for d in devices {
                println!(
                    "AMD {}: {} ({}, {} CUs)",
                    d.ordinal, d.name, d.arch, d.compute_units
                );
            }
        }
        Err(e) => println!("AMD: {e}"),
    }
}

#[cfg(not(feature = "hip"))]
fn amd() {
    println!(
        "AMD: this aec was built without the `hip` feature (cargo build --features hip, with libamdhip64 installed)"
    );
}
