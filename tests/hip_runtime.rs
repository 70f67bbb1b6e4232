//! The HIP runtime behind the `hip` feature (`cargo test --features hip --test
//! hip_runtime`; `cargo xtask test` runs it). No AMD GPU exists on the
//! machines this runs on: device discovery must say so as an error value,
//! never a panic, and a code object must be refused cleanly before any GPU
//! is needed. With an AMD GPU present, the devices are listed instead.
#![cfg(feature = "hip")]

use aec::runtime::{HipDevice, HipModule, RuntimeError};

#[test]
fn device_discovery_reports_no_amd_gpu_cleanly() {
    match HipDevice::all() {
        Err(RuntimeError::NoAmdGpu) => {
            let msg = RuntimeError::NoAmdGpu.to_string();
            assert!(msg.starts_with("no AMD GPU found"), "{msg}");
        }
        Ok(devices) => {
            assert!(!devices.is_empty());
            for d in devices {
                assert!(d.arch.starts_with("gfx"), "{d:?}");
            }
        }
        Err(other) => panic!("expected NoAmdGpu or devices, got {other}"),
    }
}

#[test]
fn a_code_object_that_is_not_an_elf_is_refused() {
    let err = HipModule::load(b"not a code object").expect_err("refused");
    assert!(err.to_string().contains("expected an ELF"), "{err}");
}

#[test]
fn aec_devices_exits_cleanly() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aec"))
        .arg("devices")
        .output()
        .expect("run aec devices");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("AMD"), "{text}");
    assert!(!text.contains("without the `hip` feature"), "{text}");
}
