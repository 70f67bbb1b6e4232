//! Helpers of the GPU tests: skipping without a GPU (unless
//! `AEC_REQUIRE_GPU=1`), random bf16 calls with their f64 reference inputs,
//! and relative errors.
#![allow(dead_code)]

use aec::Error;
use aec::frontend::Variant as Definition;
use aec::frontend::ir::Axis;
use aec::frontend::reference::{Inputs, Tensor};
use aec::prelude::*;
use aec::runtime::RuntimeError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn gpu_required() -> bool {
    std::env::var_os("AEC_REQUIRE_GPU").is_some_and(|v| v == "1")
}

pub fn skip(test: &str, what: impl std::fmt::Display) {
    if gpu_required() {
        panic!("{test}: {what}\nAEC_REQUIRE_GPU=1 requires a CUDA GPU, its driver and NVRTC");
    }
    eprintln!("skipped {test}: {what}");
}

/// Device 0, or `None` after a skip line.
pub fn device(test: &str) -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e @ (RuntimeError::NoDriver { .. } | RuntimeError::NoDevice { .. })) => {
            skip(test, e);
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// Device 0 where it runs the sm_90a kernels, else `None` after a skip line
/// saying `why` the test is Hopper's (not an error under
/// `AEC_REQUIRE_GPU=1`: other GPUs run the rest).
pub fn sm90a_device(test: &str, why: &str) -> Option<Device> {
    let device = device(test)?;
    if Isa::for_arch(device.arch()) != Isa::Sm90a {
        eprintln!("{test}: skipped, {why}");
        return None;
    }
    Some(device)
}

/// `compile`'s result, or `None` after a skip line when NVRTC is missing.
pub fn compiled<K>(test: &str, r: Result<K, Error>) -> Option<K> {
    match r {
        Ok(k) => Some(k),
        Err(
            e @ Error::Runtime {
                source: RuntimeError::NoNvrtc,
                ..
            },
        ) => {
            skip(test, e);
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// A device buffer's elements as f64, for comparison with the reference.
pub fn download_f64<T: aec::runtime::Element + Into<f64>>(
    stream: &Stream,
    b: &DeviceBuffer<T>,
) -> Vec<f64> {
    stream
        .download(b)
        .expect("download")
        .into_iter()
        .map(Into::into)
        .collect()
}

/// A random generator for a test's own draws (gradients of the output).
pub fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(1e-12..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm.max(1e-60)).sqrt()
}

/// One random call: bf16 q, k, v and f32 custom inputs for the device, and
/// the same values as the reference interpreter's inputs.
pub struct RandomCall {
    pub q_host: Vec<bf16>,
    pub k_host: Vec<bf16>,
    pub v_host: Vec<bf16>,
    pub customs_host: Vec<(String, Vec<f32>)>,
    pub inputs: Inputs,
}

/// q, k, v standard normal (rounded to bf16), custom inputs uniform in
/// `custom_range` — except `doc_*` inputs, which put three documents in
/// each sequence and the last query in a document no key has (a fully
/// masked row). Seeded by `seed`.
pub fn random_call(
    def: &Definition,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    seed: &str,
) -> RandomCall {
    let mut rng = StdRng::seed_from_u64(seed.bytes().map(u64::from).sum::<u64>() * 7919 + 1);
    let size = |a: Axis| match a {
        Axis::Dqk => dims.dqk as usize,
        Axis::Dv => dims.dv as usize,
        other => shape.size(other).expect("parallel axis"),
    };
    let dims_of = |axes: &[Axis]| axes.iter().map(|a| size(*a)).collect::<Vec<_>>();
    // q, k, v: bf16 on the device, the same values as f64 for the reference.
    let mut tensor = |axes: &[Axis]| {
        let shape = dims_of(axes);
        let host: Vec<bf16> = (0..shape.iter().product::<usize>())
            .map(|_| bf16::from_f64(normal(&mut rng)))
            .collect();
        let t = Tensor {
            shape,
            data: host.iter().map(|x| x.to_f64()).collect(),
        };
        (host, t)
    };
    let (q_host, q_ref) = tensor(&def.q.axes);
    let (k_host, k_ref) = tensor(&def.k.axes);
    let (v_host, v_ref) = tensor(&def.v.axes);
    let mut customs_host: Vec<(String, Vec<f32>, Tensor)> = Vec::new();
    for c in &def.customs {
        // Named axes sized like the call, then the user axes (fixed sizes).
        let mut cshape = dims_of(&c.axes);
        cshape.extend(c.user_axes.iter().map(|(u, n)| {
            n.unwrap_or_else(|| panic!("`{}`: user axis `{u}` has no fixed size", c.name))
        }));
        let host: Vec<f32> = if c.name.starts_with("doc_") {
            // Three documents per sequence; the last query sits in a document
            // no key has, so its row is fully masked (output 0).
            let n = cshape[1];
            (0..cshape.iter().product::<usize>())
                .map(|x| {
                    let pos = x % n;
                    if c.name == "doc_q" && pos == n - 1 {
                        9.0
                    } else {
                        (pos * 3 / n) as f32
                    }
                })
                .collect()
        } else {
            (0..cshape.iter().product::<usize>())
                .map(|_| rng.random_range(custom_range.0..custom_range.1) as f32)
                .collect()
        };
        let t = Tensor {
            shape: cshape,
            data: host.iter().map(|&x| f64::from(x)).collect(),
        };
        customs_host.push((c.name.clone(), host, t));
    }

    RandomCall {
        q_host,
        k_host,
        v_host,
        customs_host: customs_host
            .iter()
            .map(|(n, h, _)| (n.clone(), h.clone()))
            .collect(),
        inputs: Inputs {
            q: q_ref,
            k: k_ref,
            v: v_ref,
            customs: customs_host.into_iter().map(|(n, _, t)| (n, t)).collect(),
            initial_state: None,
            initial_normalizer: None,
        },
    }
}

/// A random call of an example, uploaded to device 0, with its kernels.
pub struct GpuCall {
    pub device: Device,
    pub stream: Stream,
    pub def: Definition,
    pub kernels: ParallelKernels,
    pub call: RandomCall,
    pub q: DeviceBuffer<bf16>,
    pub k: DeviceBuffer<bf16>,
    pub v: DeviceBuffer<bf16>,
    pub custom_bufs: Vec<(String, DeviceBuffer<f32>)>,
}

impl GpuCall {
    /// The custom inputs as the API takes them.
    pub fn customs(&self) -> Vec<(&str, &DeviceBuffer<f32>)> {
        self.custom_bufs
            .iter()
            .map(|(n, b)| (n.as_str(), b))
            .collect()
    }
}

/// Compiles `examples/<name>.rs` for `dims` on device 0 and uploads a random
/// call (see [`random_call`]); `None` after a skip line without a GPU.
pub fn prepare(
    test: &str,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
) -> Option<GpuCall> {
    prepare_with(
        test,
        name,
        shape,
        dims,
        custom_range,
        &KernelOptions::default(),
    )
}

/// [`prepare`] with kernel options (tile configurations).
pub fn prepare_with(
    test: &str,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    options: &KernelOptions,
) -> Option<GpuCall> {
    let def = crate::common::example(name);
    prepare_def(test, def, name, shape, dims, custom_range, options)
}

/// [`prepare_with`] for the variant `def` (`name` seeds its inputs).
pub fn prepare_def(
    test: &str,
    def: Definition,
    name: &str,
    shape: Shape,
    dims: HeadDims,
    custom_range: (f64, f64),
    options: &KernelOptions,
) -> Option<GpuCall> {
    let device = device(test)?;
    let kernels = compiled(test, ParallelKernels::compile(&def, &device, dims, options))?;
    let stream = device.stream();
    let call = random_call(&def, shape, dims, custom_range, name);
    let q = stream.upload(&call.q_host).unwrap();
    let k = stream.upload(&call.k_host).unwrap();
    let v = stream.upload(&call.v_host).unwrap();
    let custom_bufs = call
        .customs_host
        .iter()
        .map(|(n, h)| (n.clone(), stream.upload(h).unwrap()))
        .collect();
    Some(GpuCall {
        device,
        stream,
        def,
        kernels,
        call,
        q,
        k,
        v,
        custom_bufs,
    })
}
