//! End to end on a GPU: compile with NVRTC for the device, load, launch,
//! copy back, time. Skipped without a CUDA driver (this CI has none) unless
//! AEC_REQUIRE_GPU=1; run on the GPU machines.

mod common;

use aec_runtime::{
    CompileOptions, DType, Device, KernelCache, Module, Param, RuntimeError, Stream, args, bf16,
    f16, time_ms,
};

const MMA: &str = include_str!("kernels/mma.cu");
const SMEM: &str = include_str!("kernels/smem.cu");

/// Device 0 and a module of `source` compiled for it, or `None` (skipped).
fn setup(test: &str, source: &str) -> Option<(Device, Stream, Module)> {
    let device = match Device::open(0) {
        Ok(d) => d,
        Err(e @ (RuntimeError::NoDriver { .. } | RuntimeError::NoDevice { .. })) => {
            common::skip_gpu(test, e);
            return None;
        }
        Err(e) => panic!("{test}: {e}"),
    };
    let cache = KernelCache::new(None);
    let compiled = match cache.compile(source, &CompileOptions::new(device.arch())) {
        Ok(c) => c,
        Err(e @ RuntimeError::NoNvrtc) => {
            common::skip_toolchain(test, e);
            return None;
        }
        Err(e) => panic!("{test}: {e}"),
    };
    let module = Module::load(&device, &compiled.cubin).unwrap();
    let stream = device.stream();
    Some((device, stream, module))
}

#[test]
fn gpu_device_properties() {
    let Some((device, _, _)) = setup("gpu_device_properties", SMEM) else {
        return;
    };
    let info = device.info();
    eprintln!("{info:?}");
    assert_eq!(
        device.arch(),
        aec_runtime::arch_for(info.compute_capability.0, info.compute_capability.1)
    );
    assert!(info.sm_count > 0);
    assert!(info.max_shared_per_block_optin >= info.max_shared_per_block);
    assert!(Device::count().unwrap() >= 1);
}

#[test]
fn gpu_mma_matches_cpu() {
    let Some((_, stream, module)) = setup("gpu_mma_matches_cpu", MMA) else {
        return;
    };
    // A: 16x16 row-major, B: 16x8 stored column-major (b[n * 16 + k]).
    let a: Vec<bf16> = (0..256)
        .map(|i| bf16::from_f32(((i * 7 % 23) as f32 - 11.0) / 8.0))
        .collect();
    let b: Vec<bf16> = (0..128)
        .map(|i| bf16::from_f32(((i * 5 % 17) as f32 - 8.0) / 4.0))
        .collect();
    let da = stream.upload(&a).unwrap();
    let db = stream.upload(&b).unwrap();
    let mut dc = stream.alloc_zeros::<f32>(128).unwrap();
    let kernel = module
        .kernel(
            "mma_bf16_m16n8k16",
            &[
                Param::In(DType::BF16),
                Param::In(DType::BF16),
                Param::Out(DType::F32),
            ],
        )
        .unwrap();
    kernel
        .launch(
            &stream,
            (1, 1, 1),
            (32, 1, 1),
            0,
            &mut args![&da, &db, &mut dc],
        )
        .unwrap();
    let c = stream.download(&dc).unwrap();
    for m in 0..16 {
        for n in 0..8 {
            let want: f32 = (0..16)
                .map(|k| a[m * 16 + k].to_f32() * b[n * 16 + k].to_f32())
                .sum();
            let got = c[m * 8 + n];
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "C[{m}][{n}] = {got}, want {want}"
            );
        }
    }
}

#[test]
fn gpu_bf16_conversion_and_copies() {
    let Some((_, stream, module)) = setup("gpu_bf16_conversion_and_copies", MMA) else {
        return;
    };
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| (i as f32 - 500.0) * 0.3717).collect();
    let dx = stream.upload(&x).unwrap();
    let mut dy = stream.alloc_zeros::<bf16>(n).unwrap();
    let kernel = module
        .kernel(
            "to_bf16",
            &[Param::In(DType::F32), Param::Out(DType::BF16), Param::I32],
        )
        .unwrap();
    let grid = (n as u32).div_ceil(256);
    kernel
        .launch(
            &stream,
            (grid, 1, 1),
            (256, 1, 1),
            0,
            &mut args![&dx, &mut dy, n as i32],
        )
        .unwrap();
    let y = stream.download(&dy).unwrap();
    let want: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(y, want);

    // f16 and f32 round trips, and overwriting a buffer.
    let h: Vec<f16> = (0..77).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
    let mut dh = stream.upload(&h).unwrap();
    assert_eq!(stream.download(&dh).unwrap(), h);
    let h2: Vec<f16> = h.iter().map(|v| -*v).collect();
    stream.copy_to_device(&h2, &mut dh).unwrap();
    assert_eq!(stream.download(&dh).unwrap(), h2);
    assert!(matches!(
        stream.copy_to_device(&h2[..10], &mut dh),
        Err(RuntimeError::Length {
            expected: 77,
            got: 10
        })
    ));
    let empty = stream.upload::<f32>(&[]).unwrap();
    assert!(stream.download(&empty).unwrap().is_empty());
}

#[test]
fn gpu_large_dynamic_shared_memory_is_opted_in() {
    let Some((device, stream, module)) = setup("gpu_large_dynamic_shared_memory_is_opted_in", SMEM)
    else {
        return;
    };
    let kernel = module
        .kernel(
            "smem_sum",
            &[Param::In(DType::F32), Param::Out(DType::F32), Param::U32],
        )
        .unwrap();
    let x: Vec<f32> = (0..1024).map(|i| (i % 7) as f32).collect();
    let dx = stream.upload(&x).unwrap();
    let mut out = stream.alloc_zeros::<f32>(1).unwrap();
    let max = kernel.max_dynamic_shared_bytes();
    assert!(
        max > 48 * 1024,
        "device {} has only {max} bytes",
        device.name()
    );
    for bytes in [16 * 1024, 100 * 1024, max] {
        let floats = bytes / 4;
        kernel
            .launch(
                &stream,
                (1, 1, 1),
                (256, 1, 1),
                bytes,
                &mut args![&dx, &mut out, floats],
            )
            .unwrap_or_else(|e| panic!("{bytes} bytes: {e}"));
        let want: f32 = (0..floats as usize).map(|i| x[i % 1024]).sum();
        assert_eq!(stream.download(&out).unwrap()[0], want, "{bytes} bytes");
    }
    let too_much = max + 1;
    match kernel.launch(
        &stream,
        (1, 1, 1),
        (256, 1, 1),
        too_much,
        &mut args![&dx, &mut out, 1u32],
    ) {
        Err(RuntimeError::SharedMemory {
            requested, limit, ..
        }) => {
            assert_eq!((requested, limit), (too_much, max));
        }
        other => panic!("expected a shared memory error, got {other:?}"),
    }
}

#[test]
fn gpu_launch_checks_arguments_and_configuration() {
    let Some((_, stream, module)) = setup("gpu_launch_checks_arguments_and_configuration", SMEM)
    else {
        return;
    };
    assert!(matches!(
        module.kernel("no_such_kernel", &[]),
        Err(RuntimeError::KernelNotFound { .. })
    ));
    let kernel = module
        .kernel(
            "smem_sum",
            &[Param::In(DType::F32), Param::Out(DType::F32), Param::U32],
        )
        .unwrap();
    let dx = stream.alloc_zeros::<f32>(1024).unwrap();
    let mut out = stream.alloc_zeros::<f32>(1).unwrap();
    let mut wrong = stream.alloc_zeros::<bf16>(1).unwrap();
    let cases: Vec<(&str, aec_runtime::Result<()>)> = vec![
        (
            "count",
            kernel.launch(&stream, (1, 1, 1), (32, 1, 1), 0, &mut args![&dx, &mut out]),
        ),
        (
            "dtype",
            kernel.launch(
                &stream,
                (1, 1, 1),
                (32, 1, 1),
                0,
                &mut args![&dx, &mut wrong, 0u32],
            ),
        ),
        (
            "scalar",
            kernel.launch(
                &stream,
                (1, 1, 1),
                (32, 1, 1),
                0,
                &mut args![&dx, &mut out, 0i32],
            ),
        ),
        (
            "read-only output",
            kernel.launch(
                &stream,
                (1, 1, 1),
                (32, 1, 1),
                0,
                &mut args![&dx, &out, 0u32],
            ),
        ),
    ];
    for (what, result) in cases {
        match result {
            Err(RuntimeError::Arguments { detail, .. }) => eprintln!("{what}: {detail}"),
            other => panic!("{what}: expected an argument error, got {other:?}"),
        }
    }
    assert!(matches!(
        kernel.launch(
            &stream,
            (1, 1, 1),
            (2048, 1, 1),
            0,
            &mut args![&dx, &mut out, 0u32]
        ),
        Err(RuntimeError::LaunchConfig { .. })
    ));
    assert!(matches!(
        kernel.launch(
            &stream,
            (0, 1, 1),
            (32, 1, 1),
            0,
            &mut args![&dx, &mut out, 0u32]
        ),
        Err(RuntimeError::LaunchConfig { .. })
    ));
    // Still usable after the rejected launches.
    kernel
        .launch(
            &stream,
            (1, 1, 1),
            (32, 1, 1),
            4096,
            &mut args![&dx, &mut out, 1024u32],
        )
        .unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn gpu_timing_reports_the_median_of_events() {
    let Some((device, _, module)) = setup("gpu_timing_reports_the_median_of_events", SMEM) else {
        return;
    };
    // A stream of its own (cudarc then tracks buffer uses across streams).
    let stream = device.new_stream().unwrap();
    let kernel = module
        .kernel(
            "smem_sum",
            &[Param::In(DType::F32), Param::Out(DType::F32), Param::U32],
        )
        .unwrap();
    let dx = stream.alloc_zeros::<f32>(1024).unwrap();
    let mut out = stream.alloc_zeros::<f32>(1).unwrap();
    let t = time_ms(&stream, 3, 9, || {
        kernel.launch(
            &stream,
            (132, 1, 1),
            (256, 1, 1),
            32 * 1024,
            &mut args![&dx, &mut out, 8192u32],
        )
    })
    .unwrap();
    eprintln!("{t:?}");
    assert_eq!(t.samples_ms.len(), 9);
    assert!(t.median_ms > 0.0 && t.min_ms <= t.median_ms && t.median_ms <= t.max_ms);
    assert!(time_ms(&stream, 0, 0, || Ok(())).is_err());
}

#[test]
fn gpu_cubin_for_another_arch_is_a_clear_error() {
    let test = "gpu_cubin_for_another_arch_is_a_clear_error";
    let Some((device, _, _)) = setup(test, SMEM) else {
        return;
    };
    let other = if device.compute_capability().0 == 8 {
        "sm_90a"
    } else {
        "sm_80"
    };
    let compiled = aec_runtime::compile(SMEM, &CompileOptions::new(other)).unwrap();
    match Module::load(&device, &compiled.cubin) {
        Err(e @ RuntimeError::Invalid(_)) => {
            let msg = e.to_string();
            assert!(
                msg.contains(device.arch()) && msg.contains("CompileOptions::new"),
                "{msg}"
            );
        }
        other => panic!("expected an architecture error, got {other:?}"),
    }
}
