//! Without a CUDA driver every device entry point is an error, never a panic
//! (cudarc panics if asked to load a driver that is not there). On a machine
//! with a driver these check that opening works instead.

use aec_runtime::{Device, RuntimeError, driver_present};

#[test]
fn device_open_without_driver_is_an_error_not_a_panic() {
    match Device::open(0) {
        Err(RuntimeError::NoDriver { .. }) => assert!(!driver_present()),
        Err(RuntimeError::NoDevice {
            ordinal: 0,
            count: 0,
        }) => assert!(driver_present()),
        Ok(d) => {
            assert!(driver_present());
            assert!(d.arch().starts_with("sm_"), "{}", d.arch());
            assert!(d.sm_count() > 0);
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn device_count_without_driver_is_an_error() {
    match Device::count() {
        Err(e @ RuntimeError::NoDriver { .. }) => {
            assert!(!driver_present());
            let msg = e.to_string();
            assert!(
                msg.contains("no CUDA driver") && msg.contains("libcuda"),
                "{msg}"
            );
        }
        Ok(_) => assert!(driver_present()),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn out_of_range_ordinal_is_no_device() {
    match Device::open(1 << 20) {
        Err(RuntimeError::NoDriver { .. }) => assert!(!driver_present()),
        Err(RuntimeError::NoDevice { ordinal, .. }) => assert_eq!(ordinal, 1 << 20),
        other => panic!("expected NoDevice, got {other:?}"),
    }
}
