//! The Rust API of recurrent variants (`aec::run::recurrent`):
//! `RecurrentKernels::compile` and `RecurrentKernels::forward`.
//!
//! - `cpu_*` tests run everywhere: the input checks (exact messages) and
//!   kernel generation need no GPU.
//! - `gpu_*` tests compile the recurrent forward of an example with NVRTC,
//!   run it on device 0 with random bf16 inputs (sequence lengths that are
//!   not multiples of the 64-step chunk, an initial state in one of each
//!   example's two shapes) and compare the output, the final state and the
//!   final normaliser with the f64 reference interpreter on the same inputs.
//!   Without a CUDA driver they print a skip line, unless
//!   `AEC_REQUIRE_GPU=1` (then they fail). The GPU machines have no Rust:
//!   build with `cargo test --release --test gpu_recurrent --no-run` and run
//!   the binary there from the repository root.

mod common;

use aec::compiler::{Elem, Isa, RecurrentConfig};
use aec::frontend::Variant as Definition;
use aec::frontend::ir::Axis;
use aec::prelude::*;
use aec::reference::{self, Forward};
use aec::{Error, check_recurrent_shapes, recurrent_source};
use common::example;
use common::gpu::{compiled, device, download_f64, normal, rel_err};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------- helpers

fn shape_error(r: Result<(), Error>) -> String {
    match r {
        Err(Error::Shape(m)) => m,
        other => panic!("expected Error::Shape, got {other:?}"),
    }
}

/// The element counts of q, k, v and the custom inputs of `def` for a call,
/// in the order `check_recurrent_shapes` takes them.
fn lens(def: &Definition, dims: RecurrentDims, shape: RecurrentShape) -> Vec<(String, usize)> {
    [&def.q, &def.k, &def.v]
        .into_iter()
        .chain(def.customs.iter())
        .map(|d| {
            let n = d.axes.iter().map(|a| size_of(*a, dims, shape)).product();
            (d.name.clone(), n)
        })
        .collect()
}

fn size_of(a: Axis, dims: RecurrentDims, shape: RecurrentShape) -> usize {
    match a {
        Axis::Dk => dims.dk as usize,
        Axis::Dv => dims.dv as usize,
        other => shape.size(other).expect("recurrent axis"),
    }
}

fn borrowed(l: &[(String, usize)]) -> Vec<(&str, usize)> {
    l.iter().map(|(n, c)| (n.as_str(), *c)).collect()
}

/// `l` with the element count of `name` replaced (or the entry removed).
fn with(l: &[(String, usize)], name: &str, count: Option<usize>) -> Vec<(String, usize)> {
    l.iter()
        .filter_map(|(n, c)| {
            if n == name {
                count.map(|c| (n.clone(), c))
            } else {
                Some((n.clone(), *c))
            }
        })
        .collect()
}

// -------------------------------------------------------------- CPU tests

#[test]
fn cpu_wrong_element_counts_name_the_tensor_and_its_shape() {
    let v = example("retnet_recurrent");
    let dims = RecurrentDims::new(64, 96);
    let shape = RecurrentShape::new(2, 3, 150);
    let ok = lens(&v, dims, shape);
    let state = 2 * 3 * 64 * 96;
    check_recurrent_shapes(&v, dims, shape, &borrowed(&ok), None, None).expect("right sizes");
    check_recurrent_shapes(&v, dims, shape, &borrowed(&ok), Some(state), None)
        .expect("right sizes with an initial state");
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&with(&ok, "k", Some(4096))),
            None,
            None
        )),
        "tensor `k` has 4096 elements, expected [B, H, S, Dk] = [2, 3, 150, 64] = 57600"
    );
    // v and the output use Dv.
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&with(&ok, "v", Some(57600))),
            None,
            None
        )),
        "tensor `v` has 57600 elements, expected [B, H, S, Dv] = [2, 3, 150, 96] = 86400"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&with(&ok, "q", None)),
            None,
            None
        )),
        "tensor `q` is missing"
    );
    let mut twice = ok.clone();
    twice.push(("v".into(), 86400));
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&twice),
            None,
            None
        )),
        "tensor `v` is given twice"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&ok),
            Some(state - 1),
            None
        )),
        "tensor `initial_state` has 36863 elements, expected [B, H, Dk, Dv] = [2, 3, 64, 96] \
         = 36864 (f32)"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&ok),
            None,
            Some(2 * 3 * 64)
        )),
        "`RetNetRecurrent` has no normaliser (no `normalize`), so it takes no \
         `initial_normalizer`: pass None"
    );
}

#[test]
fn cpu_custom_inputs_and_the_normaliser_are_checked() {
    let v = example("mamba2");
    let dims = RecurrentDims::new(128, 64);
    let shape = RecurrentShape::new(2, 4, 333);
    let ok = lens(&v, dims, shape);
    check_recurrent_shapes(&v, dims, shape, &borrowed(&ok), None, None).expect("right sizes");
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&with(&ok, "dt", None)),
            None,
            None
        )),
        "missing custom input `dt`: `Mamba2` declares it as [B, H, S] = [2, 4, 333]; pass \
         (\"dt\", buffer) with 2664 f32 elements in `customs`"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&with(&ok, "a", Some(8))),
            None,
            None
        )),
        "custom input `a` has 8 elements, expected [H] = [4] = 4"
    );
    let mut unknown = ok.clone();
    unknown.push(("gate".into(), 2664));
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            shape,
            &borrowed(&unknown),
            None,
            None
        )),
        "unknown custom input `gate`: `Mamba2` declares the custom inputs `a`, `dt`"
    );

    let rfa = example("rfa");
    let dims = RecurrentDims::new(64, 96);
    let ok = lens(&rfa, dims, shape);
    let (state, z) = (2 * 4 * 64 * 96, 2 * 4 * 64);
    check_recurrent_shapes(&rfa, dims, shape, &borrowed(&ok), Some(state), Some(z))
        .expect("right sizes with a state and a normaliser");
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &rfa,
            dims,
            shape,
            &borrowed(&ok),
            Some(state),
            Some(z * 96)
        )),
        "tensor `initial_normalizer` has 49152 elements, expected [B, H, Dk] = [2, 4, 64] = \
         512 (f32)"
    );
}

#[test]
fn cpu_sizes_limits_and_patterns() {
    let v = example("gated_retention");
    let dims = RecurrentDims::new(64, 64);
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            RecurrentShape::new(2, 3, 0),
            &[],
            None,
            None
        )),
        "S = 0 in the shape [B = 2, H = 3, S = 0]: every size must be at least 1"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            RecurrentShape::new(1, 1, i32::MAX as usize),
            &[],
            None,
            None
        )),
        "S = 2147483647 in the shape [B = 1, H = 1, S = 2147483647] does not fit the kernel's \
         32-bit sizes (at most 2147483584): split the call, passing each call's final state \
         as the next one's initial state"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            dims,
            RecurrentShape::new(1, 70_000, 10),
            &[],
            None,
            None
        )),
        "H = 70000 in the shape [B = 1, H = 70000, S = 10] exceeds CUDA's grid limit of 65535 \
         (the grid is (Dv / dv_tile, H, B)): split the call"
    );
    assert_eq!(
        shape_error(check_recurrent_shapes(
            &v,
            RecurrentDims::new(64, 0),
            RecurrentShape::new(1, 1, 10),
            &[],
            None,
            None
        )),
        "Dv = 0 in the head dims: every size must be at least 1"
    );
    // A parallel variant is pointed to ParallelKernels.
    let softmax = example("softmax");
    let expected = "`Softmax` is a parallel variant: RecurrentKernels runs recurrent variants \
                    only; compile it with ParallelKernels::compile (or `Variant::compile` for \
                    a variant declared with attention!)";
    match check_recurrent_shapes(
        &softmax,
        dims,
        RecurrentShape::new(1, 1, 10),
        &[],
        None,
        None,
    ) {
        Err(Error::Pattern(m)) => assert_eq!(m, expected),
        other => panic!("expected Error::Pattern, got {other:?}"),
    }
    match recurrent_source(&softmax, dims, &KernelOptions::default(), Isa::Sm90a) {
        Err(Error::Pattern(m)) => assert_eq!(m, expected),
        other => panic!("expected Error::Pattern, got {other:?}"),
    }
}

#[test]
fn cpu_recurrent_source_generates_without_a_gpu() {
    use aec::compiler::ArgKind;
    let v = example("mamba2");
    let src = recurrent_source(
        &v,
        RecurrentDims::new(128, 64),
        &KernelOptions::default(),
        Isa::Sm90a,
    )
    .expect("Mamba2 forward");
    assert!(src.source.contains(&format!("{}(", src.name)));
    assert_eq!(
        src.args,
        [
            ArgKind::Tensor("q"),
            ArgKind::Tensor("k"),
            ArgKind::Tensor("v"),
            ArgKind::Tensor("o"),
            ArgKind::Custom("a".into()),
            ArgKind::Custom("dt".into()),
            ArgKind::State("state_in"),
            ArgKind::State("state_out"),
            ArgKind::CuSeqlens,
            ArgKind::Workspace("sched"),
            ArgKind::Workspace("carry"),
            ArgKind::Size(Axis::B),
            ArgKind::Size(Axis::H),
            ArgKind::Size(Axis::S),
            ArgKind::Segments("n_whole"),
            ArgKind::Segments("n_tail"),
            ArgKind::Segments("n_seg"),
        ]
    );
    assert!(
        src.wgmma && src.segments,
        "the sm_90a kernel at Dk 128 runs segments"
    );
    assert!(!src.normalized);
    assert_eq!((src.dk, src.dv), (128, 64));
    assert!(
        recurrent_source(
            &example("rfa"),
            RecurrentDims::new(64, 64),
            &KernelOptions::default(),
            Isa::Sm80
        )
        .expect("RFA forward")
        .normalized
    );

    match recurrent_source(
        &v,
        RecurrentDims::new(48, 64),
        &KernelOptions::default(),
        Isa::Sm90a,
    ) {
        Err(e @ Error::Compile { .. }) => assert_eq!(
            e.to_string(),
            "cannot generate the recurrent forward kernel of `Mamba2`: head dimension Dk = 48 \
             is not supported by the recurrent template: it takes 16, 32, 64, 128 or 256"
        ),
        other => panic!("expected Error::Compile, got {other:?}"),
    }
    // GLA decays per key dimension: the `mma.sync` forward and backward
    // scale their operands per key (sm_90a too).
    let gla = example("gla");
    let src = recurrent_source(
        &gla,
        RecurrentDims::new(64, 64),
        &KernelOptions::default(),
        Isa::Sm90a,
    )
    .expect("GLA forward");
    assert!(!src.wgmma && !src.config.wgmma, "{:?}", src.config);
    assert!(src.source.contains("decay_operands("));
    let bwd = aec::compiler::recurrent_backward(&gla, 64, 64, &src.config, Isa::Sm90a)
        .expect("GLA backward");
    assert!(bwd.per_key && bwd.decay);
    // A configuration whose element type contradicts the options'.
    let mixed = KernelOptions {
        recurrent_config: Some(RecurrentConfig {
            elem: Elem::F16,
            ..RecurrentConfig::default_for(128, 64, Elem::Bf16, Isa::Sm90a)
        }),
        ..KernelOptions::default()
    };
    match recurrent_source(&v, RecurrentDims::new(128, 64), &mixed, Isa::Sm90a) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "the recurrent tile configuration asks for f16 elements but the kernel options for \
             bf16: set `KernelOptions::elem` and the configuration's `elem` alike"
        ),
        other => panic!("expected Error::Shape, got {other:?}"),
    }
    // A tuned configuration is used as given.
    let tuned = KernelOptions {
        recurrent_config: Some(RecurrentConfig {
            dv_tile: 32,
            wgmma: false,
            ..RecurrentConfig::default_for(128, 64, Elem::Bf16, Isa::Sm90a)
        }),
        ..KernelOptions::default()
    };
    let src = recurrent_source(&v, RecurrentDims::new(128, 64), &tuned, Isa::Sm90a).unwrap();
    assert_eq!(src.config.dv_tile, 32);
    assert_eq!(src.grid_for(2, 4), Some((2, 4, 2)));
    // f16 operands.
    let f16 = KernelOptions {
        elem: Elem::F16,
        ..KernelOptions::default()
    };
    let src = recurrent_source(&v, RecurrentDims::new(128, 64), &f16, Isa::Sm90a).unwrap();
    assert!(src.source.contains("typedef __half elem_t;"));
}

// -------------------------------------------------------------- GPU tests

/// One random call's host inputs: bf16 q, k, v, f32 custom inputs, initial
/// state and normaliser, and the same values as the reference's inputs.
struct Call {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    customs: Vec<(String, Vec<f32>)>,
    state: Option<Vec<f32>>,
    normalizer: Option<Vec<f32>>,
    inputs: Inputs,
}

fn random_call(
    def: &Definition,
    dims: RecurrentDims,
    shape: RecurrentShape,
    initial: bool,
    seed: u64,
) -> Call {
    let mut rng = StdRng::seed_from_u64(seed);
    let dims_of =
        |axes: &[Axis]| -> Vec<usize> { axes.iter().map(|a| size_of(*a, dims, shape)).collect() };
    let mut bf16_tensor = |axes: &[Axis]| {
        let s = dims_of(axes);
        let host: Vec<bf16> = (0..s.iter().product::<usize>())
            .map(|_| bf16::from_f64(normal(&mut rng)))
            .collect();
        let t = Tensor {
            shape: s,
            data: host.iter().map(|x| x.to_f64()).collect(),
        };
        (host, t)
    };
    let (q, q_ref) = bf16_tensor(&def.q.axes);
    let (k, k_ref) = bf16_tensor(&def.k.axes);
    let (v, v_ref) = bf16_tensor(&def.v.axes);
    let f32_tensor = |s: Vec<usize>, rng: &mut StdRng, f: &dyn Fn(&mut StdRng) -> f64| {
        let host: Vec<f32> = (0..s.iter().product::<usize>())
            .map(|_| f(rng) as f32)
            .collect();
        let t = Tensor {
            shape: s,
            data: host.iter().map(|&x| f64::from(x)).collect(),
        };
        (host, t)
    };
    let mut customs = Vec::new();
    let mut inputs = Inputs {
        q: q_ref,
        k: k_ref,
        v: v_ref,
        customs: Default::default(),
        initial_state: None,
        initial_normalizer: None,
    };
    for c in &def.customs {
        let (lo, hi) = common::recurrent_custom_range(&c.name);
        let (host, t) = f32_tensor(dims_of(&c.axes), &mut rng, &|r| r.random_range(lo..hi));
        customs.push((c.name.clone(), host));
        inputs.customs.insert(c.name.clone(), t);
    }
    let (b, h) = (shape.b, shape.h);
    let (dk, dv) = (dims.dk as usize, dims.dv as usize);
    let normalized = def.recurrent().is_some_and(|r| r.normalize.is_some());
    let mut state = None;
    let mut normalizer = None;
    if initial {
        let (host, t) = f32_tensor(vec![b, h, dk, dv], &mut rng, &|r| normal(r));
        state = Some(host);
        inputs.initial_state = Some(t);
        if normalized {
            let (host, t) = f32_tensor(vec![b, h, dk], &mut rng, &|r| r.random_range(0.5..2.0));
            normalizer = Some(host);
            inputs.initial_normalizer = Some(t);
        }
    }
    Call {
        q,
        k,
        v,
        customs,
        state,
        normalizer,
        inputs,
    }
}

/// What one comparison found: relative errors of o, the final state and
/// (normalised variants) the final normaliser, and whether any is NaN.
struct Errors {
    o: f64,
    state: f64,
    normalizer: Option<f64>,
    nan: bool,
}

impl Errors {
    fn pass(&self) -> bool {
        !self.nan && self.o < 1e-2 && self.state < 1e-2 && self.normalizer.is_none_or(|e| e < 1e-2)
    }

    fn report(&self) -> String {
        format!(
            "rel_err(o)={:.2e} rel_err(state)={:.2e}{} nan={}",
            self.o,
            self.state,
            self.normalizer
                .map(|e| format!(" rel_err(normalizer)={e:.2e}"))
                .unwrap_or_default(),
            self.nan
        )
    }
}

/// Compares downloaded outputs with the reference's.
fn compare(
    test: &str,
    fwd: &Forward,
    o: &[f64],
    state: &[f64],
    normalizer: Option<&[f64]>,
) -> Errors {
    let state_ref = fwd.final_state.as_ref().expect("reference final state");
    assert_eq!(o.len(), fwd.o.data.len(), "{test}: o length");
    assert_eq!(state.len(), state_ref.data.len(), "{test}: state length");
    for (what, r) in [("o", &fwd.o), ("final state", state_ref)] {
        assert!(
            r.norm() > 0.0,
            "{test}: the reference {what} is all zeros, the comparison would prove nothing"
        );
    }
    let normalizer = match (normalizer, &fwd.final_normalizer) {
        (Some(got), Some(want)) => {
            assert_eq!(got.len(), want.data.len(), "{test}: normaliser length");
            Some((got, want))
        }
        (None, None) => None,
        (got, want) => panic!(
            "{test}: normaliser returned: {}, in the reference: {}",
            got.is_some(),
            want.is_some()
        ),
    };
    let nan = o.iter().chain(state).any(|x| x.is_nan())
        || normalizer.is_some_and(|(g, _)| g.iter().any(|x| x.is_nan()));
    Errors {
        o: rel_err(o, &fwd.o.data),
        state: rel_err(state, &state_ref.data),
        normalizer: normalizer.map(|(g, w)| rel_err(g, &w.data)),
        nan,
    }
}

/// The device and the recurrent kernels of `examples/<name>.rs` for `sizes`
/// (B, H, S, Dk, Dv); `None` (after a skip line) without a GPU or NVRTC.
fn example_kernels(
    test: &str,
    name: &str,
    sizes: [usize; 5],
    options: &KernelOptions,
) -> Option<(
    Device,
    Definition,
    RecurrentKernels,
    RecurrentDims,
    RecurrentShape,
)> {
    let [b, h, s, dk, dv] = sizes;
    let (dims, shape) = (
        RecurrentDims::new(dk as u32, dv as u32),
        RecurrentShape::new(b, h, s),
    );
    let device = device(test)?;
    let def = example(name);
    let kernels = compiled(
        test,
        RecurrentKernels::compile(&def, &device, dims, options),
    )?;
    Some((device, def, kernels, dims, shape))
}

/// A call's inputs on the device.
struct Uploaded {
    q: DeviceBuffer<bf16>,
    k: DeviceBuffer<bf16>,
    v: DeviceBuffer<bf16>,
    customs: Vec<(String, DeviceBuffer<f32>)>,
    state: Option<DeviceBuffer<f32>>,
    normalizer: Option<DeviceBuffer<f32>>,
}

fn upload(stream: &Stream, call: &Call) -> Uploaded {
    let f32s = |x: &Vec<f32>| stream.upload(x).unwrap();
    Uploaded {
        q: stream.upload(&call.q).unwrap(),
        k: stream.upload(&call.k).unwrap(),
        v: stream.upload(&call.v).unwrap(),
        customs: call
            .customs
            .iter()
            .map(|(n, x)| (n.clone(), f32s(x)))
            .collect(),
        state: call.state.as_ref().map(f32s),
        normalizer: call.normalizer.as_ref().map(f32s),
    }
}

fn borrowed_customs(c: &[(String, DeviceBuffer<f32>)]) -> Vec<(&str, &DeviceBuffer<f32>)> {
    c.iter().map(|(n, b)| (n.as_str(), b)).collect()
}

/// Runs the recurrent forward of `examples/<name>.rs` on the GPU and
/// compares o, the final state and the final normaliser with the reference
/// interpreter on the same inputs.
fn check_example(test: &str, name: &str, sizes: [usize; 5], initial: bool) {
    check_example_with(test, name, sizes, initial, &KernelOptions::default(), 1.0);
}

/// [`check_example`] with the `mma.sync` forward where the default on sm_90a
/// is the wgmma one, so that both stay checked at the same dims.
fn check_example_mma_sync(test: &str, name: &str, sizes: [usize; 5], initial: bool) {
    let [_, _, _, dk, dv] = sizes;
    let options = KernelOptions {
        recurrent_config: Some(RecurrentConfig {
            wgmma: false,
            ..RecurrentConfig::default_for(dk as u32, dv as u32, Elem::Bf16, Isa::Sm80)
        }),
        ..KernelOptions::default()
    };
    check_example_with(test, name, sizes, initial, &options, 1.0);
}

/// Every custom input of `call` multiplied by `scale`, the reference's too.
fn scale_customs(call: &mut Call, scale: f64) {
    for (name, host) in &mut call.customs {
        host.iter_mut().for_each(|x| *x *= scale as f32);
        let t = call.inputs.customs.get_mut(name.as_str()).expect("custom");
        t.data = host.iter().map(|&x| f64::from(x)).collect();
    }
}

/// [`check_example`] with `options` and every custom input multiplied by
/// `custom_scale` (beyond its usual range: stronger gates).
fn check_example_with(
    test: &str,
    name: &str,
    sizes: [usize; 5],
    initial: bool,
    options: &KernelOptions,
    custom_scale: f64,
) {
    let [b, h, s, dk, dv] = sizes;
    let Some((device, def, kernels, dims, shape)) = example_kernels(test, name, sizes, options)
    else {
        return;
    };
    let stream = device.stream();
    let seed = name.bytes().map(u64::from).sum::<u64>() * 7919 + (s * dk + dv) as u64;
    let mut call = random_call(&def, dims, shape, initial, seed);
    scale_customs(&mut call, custom_scale);
    let Uploaded {
        q,
        k,
        v,
        customs: custom_bufs,
        state,
        normalizer,
    } = upload(&stream, &call);
    let customs = borrowed_customs(&custom_bufs);
    assert_eq!(initial, state.is_some());
    assert_eq!(
        initial && kernels.normalized(),
        normalizer.is_some(),
        "{test}: an initial normaliser exactly for normalised variants"
    );
    let out = kernels
        .forward(
            &stream,
            &q,
            &k,
            &v,
            &customs,
            shape,
            state.as_ref(),
            normalizer.as_ref(),
        )
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let o = download_f64(&stream, &out.o);
    let st: Vec<f64> = download_f64(&stream, &out.final_state);
    let z: Option<Vec<f64>> = out
        .final_normalizer
        .as_ref()
        .map(|b| download_f64(&stream, b));

    let fwd = reference::forward(&def, &call.inputs, Options::default()).expect("reference");
    assert_eq!(fwd.o.shape, [b, h, s, dv]);
    let errors = compare(test, &fwd, &o, &st, z.as_deref());
    eprintln!(
        "{test}: {} `{}` on {} {shape} Dk={dk} Dv={dv} initial_state={initial}{}: {}",
        if errors.pass() { "PASS" } else { "FAIL" },
        kernels.forward_source().name,
        device.name(),
        if custom_scale == 1.0 {
            String::new()
        } else {
            format!(" custom inputs ×{custom_scale}")
        },
        errors.report()
    );
    assert!(errors.pass(), "{test}: {}", errors.report());
}

#[test]
fn gpu_recurrent_retnet() {
    let test = "gpu_recurrent_retnet";
    check_example(test, "retnet_recurrent", [2, 3, 150, 64, 96], true);
    check_example(test, "retnet_recurrent", [1, 2, 333, 256, 256], false);
    check_example_mma_sync(test, "retnet_recurrent", [1, 2, 200, 128, 128], true);
}

#[test]
fn gpu_recurrent_gated_retention() {
    let test = "gpu_recurrent_gated_retention";
    check_example(test, "gated_retention", [2, 2, 333, 128, 64], true);
    check_example(test, "gated_retention", [1, 3, 150, 256, 256], false);
    check_example_mma_sync(test, "gated_retention", [2, 1, 100, 64, 128], true);
}

#[test]
fn gpu_recurrent_mamba2() {
    let test = "gpu_recurrent_mamba2";
    check_example(test, "mamba2", [2, 4, 150, 128, 64], true);
    check_example(test, "mamba2", [1, 2, 333, 64, 96], false);
    check_example_mma_sync(test, "mamba2", [1, 3, 200, 128, 64], false);
}

/// Mamba2 with A and dt 16 times their usual range: dt·A down to about
/// −200, so that many steps' decays exp(dt·A) are 0 in f32 (log2 −inf,
/// floored at −160 by `log2_decay`; their gradient through the decay is 0,
/// `decay_grad_from_log`). Forward and backward match the f64 reference,
/// no NaN or inf from −inf − −inf or dlog / 0.
#[test]
fn gpu_recurrent_mamba2_decays_below_f32() {
    let test = "gpu_recurrent_mamba2_decays_below_f32";
    let defaults = KernelOptions::default();
    check_example_with(test, "mamba2", [1, 2, 150, 64, 64], true, &defaults, 16.0);
    check_backward_with(
        test,
        "mamba2",
        [1, 2, 150, 64, 64],
        true,
        true,
        &defaults,
        16.0,
    );
}

/// The `mma.sync` forward with 32-step chunks, a point of the tile space
/// the benchmark sweeps (`RecurrentConfig::mma_sync_space`): every
/// recurrent example against the reference at lengths that are not
/// multiples of 32, with and without initial states; then a backward of
/// kernels compiled with that forward configuration (it runs 64-step
/// chunks: `RecurrentConfig::backward_for`).
#[test]
fn gpu_recurrent_chunks_of_32() {
    let test = "gpu_recurrent_chunks_of_32";
    let chunk32 = |name: &str, dk: usize, dv: usize| KernelOptions {
        recurrent_config: Some(RecurrentConfig {
            chunk: 32,
            ..RecurrentConfig::for_variant(
                &example(name),
                dk as u32,
                dv as u32,
                Elem::Bf16,
                Isa::Sm80,
            )
        }),
        ..KernelOptions::default()
    };
    for (name, sizes, initial) in [
        ("retnet_recurrent", [2, 2, 150, 128, 128], true),
        ("gated_retention", [1, 2, 77, 256, 256], false),
        ("mamba2", [2, 3, 100, 128, 64], true),
        ("rfa", [1, 2, 190, 64, 64], true),
        ("gla", [2, 2, 90, 64, 64], true),
    ] {
        let [_, _, _, dk, dv] = sizes;
        let options = chunk32(name, dk, dv);
        let dims = RecurrentDims::new(dk as u32, dv as u32);
        let src = recurrent_source(&example(name), dims, &options, Isa::Sm90a).expect("source");
        assert!(
            src.config.chunk == 32 && !src.wgmma,
            "{test}: {name} runs {}",
            src.name
        );
        check_example_with(test, name, sizes, initial, &options, 1.0);
    }
    check_backward_with(
        test,
        "gated_retention",
        [1, 2, 100, 64, 128],
        true,
        true,
        &chunk32("gated_retention", 64, 128),
        1.0,
    );
}

/// Few chains over long sequences: on a GPU with many multiprocessors the
/// sm_90a forward cuts each chain into sequence segments
/// (`SegmentSplit`): entering states from the initial state (segment 1)
/// and published by the previous segment (later ones), uneven segments,
/// lengths that are not chunk multiples.
#[test]
fn gpu_recurrent_segments() {
    let test = "gpu_recurrent_segments";
    for (name, sizes, initial) in [
        ("retnet_recurrent", [1, 2, 1500, 128, 128], true),
        ("gated_retention", [2, 1, 1000, 128, 64], false),
        ("gated_retention", [1, 1, 1100, 256, 256], true),
        ("mamba2", [1, 3, 777, 64, 64], true),
    ] {
        let Some((_, _, kernels, _, _)) =
            example_kernels(test, name, sizes, &KernelOptions::default())
        else {
            return;
        };
        let [b, h, s, ..] = sizes;
        let split = kernels.segment_split(b, h, s);
        eprintln!(
            "{test}: {name} {sizes:?}: {} whole chains, {} cut into {} segments",
            split.whole, split.tail, split.segments
        );
        if kernels.forward_source().segments && kernels.device().sm_count() >= 32 {
            assert!(split.segments >= 3, "{test}: {name}: {split:?}");
        }
        check_example(test, name, sizes, initial);
    }
}

/// GLA's decay per key dimension (the `mma.sync` forward scales the
/// operands per key in 16-step blocks), also with gates 8× stronger than
/// the usual range: up to 92 in log2 over one 16-step block, near what the
/// factorisation holds (ARCHITECTURE.md).
#[test]
fn gpu_recurrent_gla() {
    let test = "gpu_recurrent_gla";
    check_example(test, "gla", [2, 3, 150, 64, 64], true);
    check_example(test, "gla", [1, 2, 333, 128, 128], false);
    check_example(test, "gla", [1, 2, 77, 256, 256], true);
    let defaults = KernelOptions::default();
    check_example_with(test, "gla", [2, 2, 200, 128, 64], true, &defaults, 8.0);
    // Dv slices of 32 (the A100's configuration at Dk 256) on this GPU too.
    let narrow = KernelOptions {
        recurrent_config: Some(RecurrentConfig {
            dv_tile: 32,
            ..RecurrentConfig::for_variant(&example("gla"), 256, 96, Elem::Bf16, Isa::Sm80)
        }),
        ..KernelOptions::default()
    };
    check_example_with(test, "gla", [1, 3, 130, 256, 96], true, &narrow, 1.0);
}

#[test]
fn gpu_recurrent_rfa() {
    let test = "gpu_recurrent_rfa";
    check_example(test, "rfa", [2, 2, 333, 64, 96], true);
    check_example(test, "rfa", [1, 2, 150, 128, 64], false);
    check_example(test, "rfa", [1, 1, 77, 256, 128], true);
}

/// Runs the recurrent backward of `examples/<name>.rs` on the GPU and
/// compares dq, dk, dv, every custom input's gradient and (with `initial`)
/// the initial state's and normaliser's with the reference interpreter's;
/// with `seeds` the final state (and normaliser) also get random gradients.
fn check_backward(test: &str, name: &str, sizes: [usize; 5], initial: bool, seeds: bool) {
    check_backward_with(
        test,
        name,
        sizes,
        initial,
        seeds,
        &KernelOptions::default(),
        1.0,
    );
}

/// [`check_backward`] of kernels compiled with `options`, every custom input
/// multiplied by `custom_scale`.
fn check_backward_with(
    test: &str,
    name: &str,
    sizes: [usize; 5],
    initial: bool,
    seeds: bool,
    options: &KernelOptions,
    custom_scale: f64,
) {
    let [b, h, s, dk, dv] = sizes;
    let Some((device, def, kernels, dims, shape)) = example_kernels(test, name, sizes, options)
    else {
        return;
    };
    let stream = device.stream();
    let seed = name.bytes().map(u64::from).sum::<u64>() * 104_729 + (s * dk + dv) as u64;
    let mut call = random_call(&def, dims, shape, initial, seed);
    scale_customs(&mut call, custom_scale);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let d_o: Vec<bf16> = (0..b * h * s * dv)
        .map(|_| bf16::from_f64(normal(&mut rng)))
        .collect();
    let d_o_ref = Tensor {
        shape: vec![b, h, s, dv],
        data: d_o.iter().map(|x| x.to_f64()).collect(),
    };
    let f32s =
        |n: usize, rng: &mut StdRng| -> Vec<f32> { (0..n).map(|_| normal(rng) as f32).collect() };
    let d_fin = seeds.then(|| f32s(b * h * dk * dv, &mut rng));
    let d_fin_z = (seeds && kernels.normalized()).then(|| f32s(b * h * dk, &mut rng));
    let as_tensor = |x: &Vec<f32>, shape: Vec<usize>| Tensor {
        shape,
        data: x.iter().map(|&v| f64::from(v)).collect(),
    };
    let up = |x: &Vec<f32>| stream.upload(x).unwrap();
    let Uploaded {
        q,
        k,
        v,
        customs: custom_bufs,
        state,
        normalizer,
    } = upload(&stream, &call);
    let customs = borrowed_customs(&custom_bufs);
    let dob = stream.upload(&d_o).unwrap();
    let d_fin_buf = d_fin.as_ref().map(up);
    let d_fin_z_buf = d_fin_z.as_ref().map(up);
    let grads = kernels
        .backward(
            &stream,
            &q,
            &k,
            &v,
            &customs,
            shape,
            state.as_ref(),
            normalizer.as_ref(),
            &dob,
            d_fin_buf.as_ref(),
            d_fin_z_buf.as_ref(),
        )
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let want = reference::recurrent_backward(
        &def,
        &call.inputs,
        &d_o_ref,
        d_fin
            .as_ref()
            .map(|x| as_tensor(x, vec![b, h, dk, dv]))
            .as_ref(),
        d_fin_z
            .as_ref()
            .map(|x| as_tensor(x, vec![b, h, dk]))
            .as_ref(),
    )
    .expect("reference backward");
    let mut rows: Vec<(String, f64, f64)> = vec![
        (
            "dq".into(),
            rel_err(&download_f64(&stream, &grads.dq), &want.dq.data),
            2e-2,
        ),
        (
            "dk".into(),
            rel_err(&download_f64(&stream, &grads.dk), &want.dk.data),
            2e-2,
        ),
        (
            "dv".into(),
            rel_err(&download_f64(&stream, &grads.dv), &want.dv.data),
            2e-2,
        ),
    ];
    for (n, t) in &want.customs {
        let got = grads
            .custom(n)
            .unwrap_or_else(|| panic!("{test}: no gradient for `{n}`"));
        // A custom input's gradient sums over steps (Mamba2's `a` over every
        // step of every batch) through the decay's reverse running sum, whose
        // terms cancel: its error grows with S like the parallel dγ's.
        rows.push((
            format!("d{n}"),
            rel_err(&download_f64(&stream, got), &t.data),
            8e-2,
        ));
    }
    for (what, got, want) in [
        (
            "d_initial_state",
            &grads.d_initial_state,
            &want.initial_state,
        ),
        (
            "d_initial_normalizer",
            &grads.d_initial_normalizer,
            &want.initial_normalizer,
        ),
    ] {
        match (got, want) {
            (Some(g), Some(w)) => rows.push((
                what.into(),
                rel_err(&download_f64(&stream, g), &w.data),
                2e-2,
            )),
            (None, None) => {}
            (g, w) => panic!(
                "{test}: {what} returned: {}, in the reference: {}",
                g.is_some(),
                w.is_some()
            ),
        }
    }
    let what = format!(
        "backward `{}` on {} {shape} Dk={dk} Dv={dv} initial_state={initial} seeds={seeds}",
        kernels.forward_source().name,
        device.name(),
    );
    report_gradients(test, &what, &rows);
}

/// Prints each gradient's relative error (name, error, tolerance) on one
/// PASS/FAIL line and fails the test where one exceeds its tolerance.
fn report_gradients(test: &str, what: &str, rows: &[(String, f64, f64)]) {
    let report: Vec<String> = rows
        .iter()
        .map(|(n, e, _)| format!("{n}={e:.2e}"))
        .collect();
    let pass = rows.iter().all(|(_, e, tol)| e < tol);
    eprintln!(
        "{test}: {} {what}: {}",
        if pass { "PASS" } else { "FAIL" },
        report.join(" ")
    );
    assert!(pass, "{test}: {}", report.join(" "));
}

#[test]
fn gpu_recurrent_backward_retnet() {
    let test = "gpu_recurrent_backward_retnet";
    check_backward(test, "retnet_recurrent", [2, 3, 150, 64, 96], true, true);
    check_backward(
        test,
        "retnet_recurrent",
        [1, 2, 333, 256, 256],
        false,
        false,
    );
    check_backward(test, "retnet_recurrent", [1, 2, 64, 128, 64], false, true);
}

/// GLA's decay per key dimension: `dalpha` is a gradient per step and key.
#[test]
fn gpu_recurrent_backward_gla() {
    let test = "gpu_recurrent_backward_gla";
    check_backward(test, "gla", [2, 2, 150, 64, 64], true, true);
    check_backward(test, "gla", [1, 2, 333, 128, 128], false, false);
    check_backward(test, "gla", [1, 2, 77, 256, 256], true, true);
    check_backward(test, "gla", [2, 1, 100, 32, 64], false, true);
}

#[test]
fn gpu_recurrent_backward_gated_retention() {
    let test = "gpu_recurrent_backward_gated_retention";
    check_backward(test, "gated_retention", [2, 2, 333, 128, 64], true, true);
    check_backward(test, "gated_retention", [1, 3, 150, 256, 256], false, false);
    check_backward(test, "gated_retention", [1, 2, 100, 64, 128], true, false);
}

#[test]
fn gpu_recurrent_backward_mamba2() {
    let test = "gpu_recurrent_backward_mamba2";
    check_backward(test, "mamba2", [2, 4, 150, 128, 64], true, true);
    check_backward(test, "mamba2", [1, 2, 333, 64, 96], false, false);
    check_backward(test, "mamba2", [1, 3, 200, 128, 64], false, true);
}

#[test]
fn gpu_recurrent_backward_rfa() {
    let test = "gpu_recurrent_backward_rfa";
    check_backward(test, "rfa", [2, 2, 333, 64, 96], true, true);
    check_backward(test, "rfa", [1, 2, 150, 128, 64], false, false);
    check_backward(test, "rfa", [1, 2, 90, 32, 128], true, false);
}

/// Steps `range` of a host tensor whose axes include `S` (others whole).
fn steps<T: Copy>(
    host: &[T],
    axes: &[Axis],
    dims: RecurrentDims,
    shape: RecurrentShape,
    range: std::ops::Range<usize>,
) -> Vec<T> {
    let Some(at) = axes.iter().position(|a| *a == Axis::S) else {
        return host.to_vec();
    };
    let sizes: Vec<usize> = axes.iter().map(|a| size_of(*a, dims, shape)).collect();
    let outer: usize = sizes[..at].iter().product();
    let inner: usize = sizes[at + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * range.len() * inner);
    for o in 0..outer {
        let base = o * shape.s * inner;
        out.extend_from_slice(&host[base + range.start * inner..base + range.end * inner]);
    }
    out
}

/// A sequence split into two calls, the second starting from the first's
/// final state and normaliser, gives the reference's output and final
/// state of the whole sequence (RFA: both the state and the normaliser
/// carry over). The split is not at a chunk boundary.
#[test]
fn gpu_recurrent_continues_from_a_final_state() {
    let test = "gpu_recurrent_continues_from_a_final_state";
    let Some(device) = device(test) else {
        return;
    };
    let def = example("rfa");
    let dims = RecurrentDims::new(64, 64);
    let whole = RecurrentShape::new(2, 2, 333);
    let Some(kernels) = compiled(
        test,
        RecurrentKernels::compile(&def, &device, dims, &KernelOptions::default()),
    ) else {
        return;
    };
    let stream = device.stream();
    let call = random_call(&def, dims, whole, true, 42);
    let split = 200;
    let init_state = stream
        .upload(call.state.as_ref().expect("initial state"))
        .unwrap();
    let init_norm = stream
        .upload(call.normalizer.as_ref().expect("initial normaliser"))
        .unwrap();
    let mut o_all: Vec<Vec<f64>> = Vec::new();
    let mut carried: Option<(DeviceBuffer<f32>, Option<DeviceBuffer<f32>>)> = None;
    for range in [0..split, split..whole.s] {
        let shape = RecurrentShape::new(whole.b, whole.h, range.len());
        let part = |host: &[bf16], axes: &[Axis]| {
            stream
                .upload(&steps(host, axes, dims, whole, range.clone()))
                .unwrap()
        };
        let q = part(&call.q, &def.q.axes);
        let k = part(&call.k, &def.k.axes);
        let v = part(&call.v, &def.v.axes);
        let custom_bufs: Vec<(String, DeviceBuffer<f32>)> = def
            .customs
            .iter()
            .zip(&call.customs)
            .map(|(decl, (n, x))| {
                let sliced = steps(x, &decl.axes, dims, whole, range.clone());
                (n.clone(), stream.upload(&sliced).unwrap())
            })
            .collect();
        let customs: Vec<(&str, &DeviceBuffer<f32>)> =
            custom_bufs.iter().map(|(n, b)| (n.as_str(), b)).collect();
        // The first call starts from the case's initial state and
        // normaliser, the second from the first's final ones.
        let (state, normalizer) = match &carried {
            Some((s, z)) => (s, z.as_ref()),
            None => (&init_state, Some(&init_norm)),
        };
        let out = kernels
            .forward(
                &stream,
                &q,
                &k,
                &v,
                &customs,
                shape,
                Some(state),
                normalizer,
            )
            .unwrap_or_else(|e| panic!("{test}: {e}"));
        o_all.push(download_f64(&stream, &out.o));
        carried = Some((out.final_state, out.final_normalizer));
    }
    let (state, normalizer) = carried.expect("two calls");
    let st = download_f64(&stream, &state);
    let z = download_f64(
        &stream,
        normalizer.as_ref().expect("RFA returns its normaliser"),
    );
    // Reassemble o, [B, H, S, Dv], from the two calls' steps.
    let dv = dims.dv as usize;
    let mut o = Vec::with_capacity(whole.b * whole.h * whole.s * dv);
    for bh in 0..whole.b * whole.h {
        for (part, len) in o_all.iter().zip([split, whole.s - split]) {
            o.extend_from_slice(&part[bh * len * dv..(bh + 1) * len * dv]);
        }
    }
    let fwd = reference::forward(&def, &call.inputs, Options::default()).expect("reference");
    let errors = compare(test, &fwd, &o, &st, Some(&z));
    eprintln!(
        "{test}: {} `{}` on {} {whole} in calls of {split} and {} steps: {}",
        if errors.pass() { "PASS" } else { "FAIL" },
        kernels.forward_source().name,
        device.name(),
        whole.s - split,
        errors.report()
    );
    assert!(errors.pass(), "{test}: {}", errors.report());
}

/// Bad inputs are refused before anything runs, by the compiled kernels'
/// `forward` itself; the same kernels then run a correct call.
#[test]
fn gpu_recurrent_input_errors_before_launch() {
    let test = "gpu_recurrent_input_errors_before_launch";
    let Some(device) = device(test) else {
        return;
    };
    let def = example("retnet_recurrent");
    let dims = RecurrentDims::new(64, 64);
    let Some(kernels) = compiled(
        test,
        RecurrentKernels::compile(&def, &device, dims, &KernelOptions::default()),
    ) else {
        return;
    };
    let stream = device.stream();
    let shape = RecurrentShape::new(1, 2, 70);
    let n = 2 * 70 * 64;
    let x = stream.upload(&vec![bf16::from_f32(0.25); n]).unwrap();
    let short = stream.upload(&vec![bf16::from_f32(0.25); n - 64]).unwrap();
    let state = stream.upload(&vec![0.5f32; 2 * 64 * 64]).unwrap();
    let z = stream.upload(&vec![1.0f32; 2 * 64]).unwrap();
    match kernels.forward(&stream, &x, &x, &short, &[], shape, None, None) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "tensor `v` has 8896 elements, expected [B, H, S, Dv] = [1, 2, 70, 64] = 8960"
        ),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    match kernels.forward(&stream, &x, &x, &x, &[], shape, Some(&z), None) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "tensor `initial_state` has 128 elements, expected [B, H, Dk, Dv] = [1, 2, 64, 64] \
             = 8192 (f32)"
        ),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    match kernels.forward(&stream, &x, &x, &x, &[], shape, Some(&state), Some(&z)) {
        Err(Error::Shape(m)) => assert!(m.contains("takes no `initial_normalizer`"), "{m}"),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    match kernels.forward(&stream, &x, &x, &x, &[("gate", &z)], shape, None, None) {
        Err(Error::Shape(m)) => assert_eq!(
            m,
            "unknown custom input `gate`: `RetNetRecurrent` declares no custom inputs"
        ),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    let halves = stream.upload(&vec![f16::from_f32(0.25); n]).unwrap();
    match kernels.forward(&stream, &halves, &halves, &halves, &[], shape, None, None) {
        Err(Error::Shape(m)) => assert!(m.starts_with("q, k and v are f16"), "{m}"),
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    }
    // The same kernels then run a correct call: constant inputs, so the
    // state after S steps is a geometric sum per head.
    let out = kernels
        .forward(&stream, &x, &x, &x, &[], shape, Some(&state), None)
        .unwrap();
    let st = stream.download(&out.final_state).unwrap();
    assert!(out.final_normalizer.is_none());
    for head in 0..2 {
        let g = 1.0 - 2f64.powf(-5.0 - head as f64);
        let decayed = 0.5 * g.powi(70);
        let sum: f64 = (0..70).map(|t| g.powi(t)).sum::<f64>() * 0.25 * 0.25;
        let want = decayed + sum;
        let got = f64::from(st[head * 64 * 64]);
        assert!(
            (got - want).abs() < 1e-2 * want,
            "{test}: head {head}: state {got}, expected {want}"
        );
    }
    eprintln!("{test}: PASS (shape errors before launch, then a correct launch)");
}

// ------------------------------------------------------- the step kernel

/// The step (decode) kernel of `examples/<name>.rs` for `sizes` from a
/// random state (and normaliser): the output and the state and normaliser
/// updated in place against the reference from the same initial ones.
fn check_decode(test: &str, name: &str, sizes: [usize; 5]) {
    let [b, h, s, dk, dv] = sizes;
    let (dims, shape) = (
        RecurrentDims::new(dk as u32, dv as u32),
        RecurrentShape::new(b, h, s),
    );
    let Some(device) = device(test) else {
        return;
    };
    let def = example(name);
    let Some(decoder) = compiled(
        test,
        RecurrentDecoder::compile(&def, &device, dims, &KernelOptions::default()),
    ) else {
        return;
    };
    let stream = device.stream();
    let seed = name.bytes().map(u64::from).sum::<u64>() * 31 + (s * dk + dv) as u64;
    let call = random_call(&def, dims, shape, true, seed);
    let up = upload(&stream, &call);
    let customs = borrowed_customs(&up.customs);
    let mut state = up.state.expect("initial state");
    let mut normalizer = up.normalizer;
    assert_eq!(decoder.normalized(), normalizer.is_some());
    let o = decoder
        .step(
            &stream,
            &up.q,
            &up.k,
            &up.v,
            &customs,
            shape,
            &mut state,
            normalizer.as_mut(),
        )
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let o = download_f64(&stream, &o);
    let st = download_f64(&stream, &state);
    let z = normalizer.as_ref().map(|b| download_f64(&stream, b));
    let fwd = reference::forward(&def, &call.inputs, Options::default()).expect("reference");
    let errors = compare(test, &fwd, &o, &st, z.as_deref());
    eprintln!(
        "{test}: {} `{}` on {} {shape} Dk={dk} Dv={dv}: {}",
        if errors.pass() { "PASS" } else { "FAIL" },
        decoder.source().name,
        device.name(),
        errors.report()
    );
    assert!(errors.pass(), "{test}: {}", errors.report());
}

/// Every recurrent example's step kernel (GLA's per-key-dimension decay
/// included), one step and a few, head dims that are not powers of two.
#[test]
fn gpu_recurrent_decode_every_example() {
    let test = "gpu_recurrent_decode_every_example";
    check_decode(test, "retnet_recurrent", [2, 3, 1, 64, 96]);
    check_decode(test, "retnet_recurrent", [1, 2, 3, 256, 512]);
    check_decode(test, "gated_retention", [3, 2, 1, 128, 128]);
    check_decode(test, "mamba2", [2, 5, 1, 128, 64]);
    check_decode(test, "mamba2", [1, 3, 4, 64, 32]);
    check_decode(test, "rfa", [2, 2, 1, 64, 96]);
    check_decode(test, "rfa", [1, 2, 3, 32, 128]);
    check_decode(test, "gla", [2, 3, 1, 100, 64]);
    check_decode(test, "gla", [1, 2, 2, 128, 128]);
}

/// Serving's sequence of calls: a prompt through the chunked forward, then
/// one decode step at a time from its final state (state updated in place),
/// equals the reference over the whole sequence (Mamba2: per-step custom
/// inputs sliced per call).
#[test]
fn gpu_recurrent_decode_continues_a_prompt() {
    let test = "gpu_recurrent_decode_continues_a_prompt";
    let Some(device) = device(test) else {
        return;
    };
    let def = example("mamba2");
    let dims = RecurrentDims::new(64, 64);
    let options = KernelOptions::default();
    let Some(kernels) = compiled(
        test,
        RecurrentKernels::compile(&def, &device, dims, &options),
    ) else {
        return;
    };
    let Some(decoder) = compiled(
        test,
        RecurrentDecoder::compile(&def, &device, dims, &options),
    ) else {
        return;
    };
    let stream = device.stream();
    let whole = RecurrentShape::new(2, 3, 70);
    let prompt = 67;
    let call = random_call(&def, dims, whole, false, 7);
    let mut o_all: Vec<(usize, Vec<f64>)> = Vec::new();
    let mut state: Option<DeviceBuffer<f32>> = None;
    let ranges = std::iter::once(0..prompt).chain((prompt..whole.s).map(|t| t..t + 1));
    for range in ranges {
        let shape = RecurrentShape::new(whole.b, whole.h, range.len());
        let part = |host: &[bf16], axes: &[Axis]| {
            stream
                .upload(&steps(host, axes, dims, whole, range.clone()))
                .unwrap()
        };
        let (q, k, v) = (
            part(&call.q, &def.q.axes),
            part(&call.k, &def.k.axes),
            part(&call.v, &def.v.axes),
        );
        let custom_bufs: Vec<(String, DeviceBuffer<f32>)> = def
            .customs
            .iter()
            .zip(&call.customs)
            .map(|(decl, (n, x))| {
                let sliced = steps(x, &decl.axes, dims, whole, range.clone());
                (n.clone(), stream.upload(&sliced).unwrap())
            })
            .collect();
        let customs = borrowed_customs(&custom_bufs);
        let o = match state.as_mut() {
            None => {
                let out = kernels
                    .forward(&stream, &q, &k, &v, &customs, shape, None, None)
                    .unwrap_or_else(|e| panic!("{test}: {e}"));
                state = Some(out.final_state);
                out.o
            }
            Some(st) => decoder
                .step(&stream, &q, &k, &v, &customs, shape, st, None)
                .unwrap_or_else(|e| panic!("{test}: {e}")),
        };
        o_all.push((range.len(), download_f64(&stream, &o)));
    }
    let st = download_f64(&stream, state.as_ref().expect("state"));
    let dv = dims.dv as usize;
    let mut o = Vec::with_capacity(whole.b * whole.h * whole.s * dv);
    for bh in 0..whole.b * whole.h {
        for (len, part) in &o_all {
            o.extend_from_slice(&part[bh * len * dv..(bh + 1) * len * dv]);
        }
    }
    let fwd = reference::forward(&def, &call.inputs, Options::default()).expect("reference");
    let errors = compare(test, &fwd, &o, &st, None);
    eprintln!(
        "{test}: {} a {prompt}-step prompt through `{}`, then {} steps through `{}`: {}",
        if errors.pass() { "PASS" } else { "FAIL" },
        kernels.forward_source().name,
        whole.s - prompt,
        decoder.source().name,
        errors.report()
    );
    assert!(errors.pass(), "{test}: {}", errors.report());
}

/// The step kernel's input errors, before anything runs.
#[test]
fn gpu_recurrent_decode_input_errors_before_launch() {
    let test = "gpu_recurrent_decode_input_errors_before_launch";
    let Some(device) = device(test) else {
        return;
    };
    let dims = RecurrentDims::new(64, 64);
    let options = KernelOptions::default();
    let Some(retnet) = compiled(
        test,
        RecurrentDecoder::compile(&example("retnet_recurrent"), &device, dims, &options),
    ) else {
        return;
    };
    let Some(rfa) = compiled(
        test,
        RecurrentDecoder::compile(&example("rfa"), &device, dims, &options),
    ) else {
        return;
    };
    let stream = device.stream();
    let shape = RecurrentShape::new(1, 2, 1);
    let x = stream.upload(&vec![bf16::from_f32(0.25); 2 * 64]).unwrap();
    let mut short_state = stream.upload(&vec![0.5f32; 2 * 64 * 64 - 1]).unwrap();
    let mut state = stream.upload(&vec![0.5f32; 2 * 64 * 64]).unwrap();
    let mut z = stream.upload(&vec![1.0f32; 2 * 64]).unwrap();
    let shape_err = |r: Result<DeviceBuffer<bf16>, Error>| match r {
        Err(Error::Shape(m)) => m,
        other => panic!("{test}: expected Error::Shape, got {other:?}"),
    };
    assert_eq!(
        shape_err(retnet.step(&stream, &x, &x, &x, &[], shape, &mut short_state, None)),
        "tensor `state` has 8191 elements, expected [B, H, Dk, Dv] = [1, 2, 64, 64] = 8192 (f32)"
    );
    assert!(
        shape_err(retnet.step(&stream, &x, &x, &x, &[], shape, &mut state, Some(&mut z)))
            .contains("takes no `normalizer`")
    );
    let g = stream.upload(&[0.9f32; 2]).unwrap();
    assert!(
        shape_err(rfa.step(&stream, &x, &x, &x, &[("g", &g)], shape, &mut state, None))
            .contains("has a normaliser")
    );
    let e = RecurrentDecoder::compile(&example("softmax"), &device, dims, &options)
        .expect_err("a parallel variant");
    assert!(matches!(e, Error::Pattern(_)), "{e:?}");
    // Nothing ran: the state is as uploaded.
    assert!(stream.download(&state).unwrap().iter().all(|&x| x == 0.5));
    eprintln!("{test}: PASS");
}

// ------------------------------------------------- variable-length batches

/// Steps `range` of a reference tensor whose axes include `S`, as a tensor
/// of `range.len()` steps.
fn tensor_steps(
    t: &Tensor,
    axes: &[Axis],
    dims: RecurrentDims,
    shape: RecurrentShape,
    range: std::ops::Range<usize>,
) -> Tensor {
    let mut sizes = t.shape.clone();
    if let Some(at) = axes.iter().position(|a| *a == Axis::S) {
        sizes[at] = range.len();
    }
    Tensor {
        shape: sizes,
        data: steps(&t.data, axes, dims, shape, range),
    }
}

/// The reference inputs of sequence `s` (steps `range`) of a packed call,
/// from its packed inputs and the batch of initial states.
fn sequence_inputs(
    def: &Definition,
    dims: RecurrentDims,
    packed: RecurrentShape,
    call: &Call,
    initial: &Call,
    s: usize,
    range: std::ops::Range<usize>,
) -> Inputs {
    let cut = |t: &Tensor, axes: &[Axis]| tensor_steps(t, axes, dims, packed, range.clone());
    let mut inputs = Inputs {
        q: cut(&call.inputs.q, &def.q.axes),
        k: cut(&call.inputs.k, &def.k.axes),
        v: cut(&call.inputs.v, &def.v.axes),
        customs: Default::default(),
        initial_state: initial.inputs.initial_state.as_ref().map(|t| leading(t, s)),
        initial_normalizer: initial
            .inputs
            .initial_normalizer
            .as_ref()
            .map(|t| leading(t, s)),
    };
    for c in &def.customs {
        inputs
            .customs
            .insert(c.name.clone(), cut(&call.inputs.customs[&c.name], &c.axes));
    }
    inputs
}

/// Item `n` of the leading axis of a reference tensor.
fn leading(t: &Tensor, n: usize) -> Tensor {
    let inner: usize = t.shape[1..].iter().product();
    let mut shape = t.shape.clone();
    shape[0] = 1;
    Tensor {
        shape,
        data: t.data[n * inner..(n + 1) * inner].to_vec(),
    }
}

/// A packed batch of sequences of `lengths` steps (none a chunk multiple,
/// one of a single step) through `forward_varlen`, each from its own initial
/// state, against the reference run on each sequence alone.
fn check_varlen_example(
    test: &str,
    name: &str,
    heads: usize,
    lengths: &[usize],
    options: &KernelOptions,
) {
    let Some(device) = device(test) else {
        return;
    };
    let def = example(name);
    let dims = RecurrentDims::new(64, 128);
    let Some(kernels) = compiled(
        test,
        RecurrentKernels::compile(&def, &device, dims, options),
    ) else {
        return;
    };
    let stream = device.stream();
    let mut cu = vec![0usize];
    for l in lengths {
        cu.push(cu.last().copied().unwrap_or(0) + l);
    }
    let total = *cu.last().expect("bounds");
    let n = lengths.len();
    let packed = RecurrentShape::new(1, heads, total);
    // The packed inputs, and N initial states (normalisers) as a batch of N.
    let call = random_call(&def, dims, packed, false, 11 + total as u64);
    let initial = random_call(&def, dims, RecurrentShape::new(n, heads, 1), true, 5);
    let up = upload(&stream, &call);
    let customs = borrowed_customs(&up.customs);
    let state = stream
        .upload(initial.state.as_ref().expect("states"))
        .unwrap();
    let normalizer = initial
        .normalizer
        .as_ref()
        .map(|z| stream.upload(z).unwrap());
    let out = kernels
        .forward_varlen(
            &stream,
            &up.q,
            &up.k,
            &up.v,
            &customs,
            heads,
            &cu,
            Some(&state),
            normalizer.as_ref(),
        )
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let o = download_f64(&stream, &out.o);
    let st = download_f64(&stream, &out.final_state);
    let z = out
        .final_normalizer
        .as_ref()
        .map(|b| download_f64(&stream, b));

    // The reference, sequence by sequence, reassembled like the kernel's outputs.
    let dv = dims.dv as usize;
    let mut o_want = vec![0.0; heads * total * dv];
    let (mut st_want, mut z_want) = (Vec::new(), Vec::new());
    for (s, w) in cu.windows(2).enumerate() {
        let range = w[0]..w[1];
        let inputs = sequence_inputs(&def, dims, packed, &call, &initial, s, range.clone());
        let fwd = reference::forward(&def, &inputs, Options::default()).expect("reference");
        for h in 0..heads {
            for (i, t) in range.clone().enumerate() {
                let from = (h * range.len() + i) * dv;
                o_want[(h * total + t) * dv..][..dv].copy_from_slice(&fwd.o.data[from..from + dv]);
            }
        }
        st_want.extend_from_slice(&fwd.final_state.expect("final state").data);
        if let Some(zf) = fwd.final_normalizer {
            z_want.extend_from_slice(&zf.data);
        }
    }
    let (e_o, e_st) = (rel_err(&o, &o_want), rel_err(&st, &st_want));
    let e_z = z.as_ref().map(|z| rel_err(z, &z_want));
    let nan = o.iter().chain(&st).any(|x| x.is_nan());
    let pass = !nan && e_o < 1e-2 && e_st < 1e-2 && e_z.is_none_or(|e| e < 1e-2);
    eprintln!(
        "{test}: {} `{}` on {} H={heads} lengths {lengths:?}: rel_err(o)={e_o:.2e} \
         rel_err(states)={e_st:.2e}{} nan={nan}",
        if pass { "PASS" } else { "FAIL" },
        kernels.forward_source().name,
        device.name(),
        e_z.map(|e| format!(" rel_err(normalizers)={e:.2e}"))
            .unwrap_or_default()
    );
    assert!(
        pass,
        "{test}: o {e_o:.2e}, states {e_st:.2e}, normalizers {e_z:?}"
    );
}

/// Every example through `forward_varlen`, on the device's default
/// forward (wgmma on sm_90a where the dims allow) and the `mma.sync` one.
#[test]
fn gpu_recurrent_varlen() {
    let test = "gpu_recurrent_varlen";
    let defaults = KernelOptions::default();
    let mma_sync = KernelOptions {
        recurrent_config: Some(RecurrentConfig {
            wgmma: false,
            ..RecurrentConfig::default_for(64, 128, Elem::Bf16, Isa::Sm80)
        }),
        ..KernelOptions::default()
    };
    let lengths = [70, 1, 130, 64];
    for options in [&defaults, &mma_sync] {
        check_varlen_example(test, "retnet_recurrent", 2, &lengths, options);
        check_varlen_example(test, "gated_retention", 3, &lengths, options);
        check_varlen_example(test, "mamba2", 2, &lengths, options);
    }
    check_varlen_example(test, "rfa", 2, &lengths, &defaults);
    check_varlen_example(test, "gla", 2, &lengths, &defaults);
    // Long and short sequences cut into segments (sm_90a), some of them
    // empty for the short ones.
    let long = [900, 1, 300, 64];
    check_varlen_example(test, "retnet_recurrent", 2, &long, &defaults);
    check_varlen_example(test, "mamba2", 2, &long, &defaults);
}

/// `cu_seqlens` and the per-sequence states are checked before anything
/// runs; variants whose closures read the step as a value are refused.
#[test]
fn cpu_varlen_errors_name_the_problem() {
    let v = example("mamba2");
    let dims = RecurrentDims::new(64, 32);
    let (h, total) = (2, 10);
    let packed = RecurrentShape::new(1, h, total);
    let ok = lens(&v, dims, packed);
    let check = |cu: &[usize], state: Option<usize>| {
        aec::check_varlen(&v, dims, h, cu, &borrowed(&ok), state, None)
    };
    assert_eq!(check(&[0, 4, 10], None).expect("valid"), packed);
    let err = |r: Result<RecurrentShape, Error>| shape_error(r.map(|_| ()));
    assert!(err(check(&[0], None)).contains("has 1 entries"));
    assert!(err(check(&[1, 4, 10], None)).contains("starts at 1"));
    assert_eq!(
        err(check(&[0, 4, 4, 10], None)),
        "`cu_seqlens` is not increasing: entry 2 is 4 after 4 (sequence 1 would have no steps)"
    );
    assert_eq!(
        err(check(&[0, 4, 9], None)),
        "`cu_seqlens` ends at 9, but q holds 10 steps ([1, H, T, Dk] with H = 2, Dk = 64): the \
         last entry must be the total number of steps"
    );
    assert_eq!(
        err(check(&[0, 4, 10], Some(2 * 64 * 32))),
        "tensor `initial_state` has 4096 elements, expected [N, H, Dk, Dv] = [2, 2, 64, 32] = \
         8192 (f32, one state per sequence)"
    );
    // dt is [B, H, S]: packed, B = 1.
    let wrong_dt = with(&ok, "dt", Some(2 * h * total));
    let e = err(aec::check_varlen(
        &v,
        dims,
        h,
        &[0, 4, 10],
        &borrowed(&wrong_dt),
        None,
        None,
    ));
    assert_eq!(
        e,
        "custom input `dt` has 40 elements, expected [B, H, S] = [1, 2, 10] = 20"
    );
    let positional = aec::frontend::parse_str(
        "pub struct Positional: recurrent { q: [B, H, S, Dk]; k: [B, H, S, Dk]; \
         v: [B, H, S, Dv]; decay = |b, h, t| 1.0 - 1.0 / (t + 2.0); }",
    )
    .expect("a valid variant");
    let p_lens = lens(&positional, dims, packed);
    let e = err(aec::check_varlen(
        &positional,
        dims,
        h,
        &[0, 4, 10],
        &borrowed(&p_lens),
        None,
        None,
    ));
    assert!(e.contains("reads the step `t` as a value"), "{e}");
}

/// Writes (or, for tensors without an `S` axis, adds) the steps `range` of a
/// packed tensor from `part`, the tensor of those steps alone: the inverse of
/// [`steps`].
fn put_steps(
    dst: &mut [f64],
    part: &[f64],
    axes: &[Axis],
    dims: RecurrentDims,
    packed: RecurrentShape,
    range: std::ops::Range<usize>,
) {
    let Some(at) = axes.iter().position(|a| *a == Axis::S) else {
        for (d, p) in dst.iter_mut().zip(part) {
            *d += p;
        }
        return;
    };
    let sizes: Vec<usize> = axes.iter().map(|a| size_of(*a, dims, packed)).collect();
    let outer: usize = sizes[..at].iter().product();
    let inner: usize = sizes[at + 1..].iter().product();
    let len = range.len();
    for o in 0..outer {
        let to = (o * packed.s + range.start) * inner;
        dst[to..to + len * inner].copy_from_slice(&part[o * len * inner..(o + 1) * len * inner]);
    }
}

/// `backward_varlen` on a packed batch (lengths not chunk multiples, one of
/// a single step), with per-sequence initial states and final-state
/// gradients, against the reference backward of each sequence alone: dq,
/// dk, dv and the custom inputs' gradients packed (summed over sequences
/// where the input has no `S` axis, as Mamba2's `a`), the initial states'.
fn check_varlen_backward(test: &str, name: &str, heads: usize, lengths: &[usize]) {
    let Some(device) = device(test) else {
        return;
    };
    let def = example(name);
    let dims = RecurrentDims::new(64, 128);
    let (dk, dv) = (64usize, 128usize);
    let Some(kernels) = compiled(
        test,
        RecurrentKernels::compile(&def, &device, dims, &KernelOptions::default()),
    ) else {
        return;
    };
    let stream = device.stream();
    let mut cu = vec![0usize];
    for l in lengths {
        cu.push(cu.last().copied().unwrap_or(0) + l);
    }
    let (n, total) = (lengths.len(), *cu.last().expect("bounds"));
    let packed = RecurrentShape::new(1, heads, total);
    let call = random_call(&def, dims, packed, false, 23 + total as u64);
    let initial = random_call(&def, dims, RecurrentShape::new(n, heads, 1), true, 29);
    let mut rng = StdRng::seed_from_u64(31);
    let d_o: Vec<bf16> = (0..heads * total * dv)
        .map(|_| bf16::from_f64(normal(&mut rng)))
        .collect();
    let d_fin: Vec<f32> = (0..n * heads * dk * dv)
        .map(|_| normal(&mut rng) as f32)
        .collect();
    let d_fin_z: Option<Vec<f32>> = kernels.normalized().then(|| {
        (0..n * heads * dk)
            .map(|_| normal(&mut rng) as f32)
            .collect()
    });
    let up = upload(&stream, &call);
    let customs = borrowed_customs(&up.customs);
    let state = stream
        .upload(initial.state.as_ref().expect("states"))
        .unwrap();
    let normalizer = initial
        .normalizer
        .as_ref()
        .map(|z| stream.upload(z).unwrap());
    let d_o_buf = stream.upload(&d_o).unwrap();
    let d_fin_buf = stream.upload(&d_fin).unwrap();
    let d_fin_z_buf = d_fin_z.as_ref().map(|z| stream.upload(z).unwrap());
    let grads = kernels
        .backward_varlen(
            &stream,
            &up.q,
            &up.k,
            &up.v,
            &customs,
            heads,
            &cu,
            Some(&state),
            normalizer.as_ref(),
            &d_o_buf,
            Some(&d_fin_buf),
            d_fin_z_buf.as_ref(),
        )
        .unwrap_or_else(|e| panic!("{test}: {e}"));

    let d_o_ref = Tensor {
        shape: vec![1, heads, total, dv],
        data: d_o.iter().map(|x| x.to_f64()).collect(),
    };
    let f64s = |x: &[f32], shape: Vec<usize>| Tensor {
        shape,
        data: x.iter().map(|&v| f64::from(v)).collect(),
    };
    let d_fin_ref = f64s(&d_fin, vec![n, heads, dk, dv]);
    let d_fin_z_ref = d_fin_z.as_ref().map(|z| f64s(z, vec![n, heads, dk]));
    let mut want_q = vec![0.0; heads * total * dk];
    let mut want_k = vec![0.0; heads * total * dk];
    let mut want_v = vec![0.0; heads * total * dv];
    let mut want_c: Vec<Vec<f64>> = def
        .customs
        .iter()
        .map(|c| vec![0.0; call.inputs.customs[&c.name].data.len()])
        .collect();
    let (mut want_s, mut want_z) = (Vec::new(), Vec::new());
    for (s, w) in cu.windows(2).enumerate() {
        let range = w[0]..w[1];
        let inputs = sequence_inputs(&def, dims, packed, &call, &initial, s, range.clone());
        let d_o_s = tensor_steps(&d_o_ref, &def.v.axes, dims, packed, range.clone());
        let g = reference::recurrent_backward(
            &def,
            &inputs,
            &d_o_s,
            Some(&leading(&d_fin_ref, s)),
            d_fin_z_ref.as_ref().map(|z| leading(z, s)).as_ref(),
        )
        .expect("reference backward");
        put_steps(
            &mut want_q,
            &g.dq.data,
            &def.q.axes,
            dims,
            packed,
            range.clone(),
        );
        put_steps(
            &mut want_k,
            &g.dk.data,
            &def.k.axes,
            dims,
            packed,
            range.clone(),
        );
        put_steps(
            &mut want_v,
            &g.dv.data,
            &def.v.axes,
            dims,
            packed,
            range.clone(),
        );
        for (c, acc) in def.customs.iter().zip(want_c.iter_mut()) {
            put_steps(
                acc,
                &g.customs[&c.name].data,
                &c.axes,
                dims,
                packed,
                range.clone(),
            );
        }
        want_s.extend_from_slice(&g.initial_state.expect("initial state's gradient").data);
        if let Some(z) = g.initial_normalizer {
            want_z.extend_from_slice(&z.data);
        }
    }
    let mut rows: Vec<(String, f64, f64)> = vec![
        (
            "dq".into(),
            rel_err(&download_f64(&stream, &grads.dq), &want_q),
            2e-2,
        ),
        (
            "dk".into(),
            rel_err(&download_f64(&stream, &grads.dk), &want_k),
            2e-2,
        ),
        (
            "dv".into(),
            rel_err(&download_f64(&stream, &grads.dv), &want_v),
            2e-2,
        ),
    ];
    for (c, want) in def.customs.iter().zip(&want_c) {
        let got = grads.custom(&c.name).expect("custom gradient");
        rows.push((
            format!("d{}", c.name),
            rel_err(&download_f64(&stream, got), want),
            8e-2,
        ));
    }
    let d_init = grads
        .d_initial_state
        .as_ref()
        .expect("initial state's gradient");
    rows.push((
        "d_initial_state".into(),
        rel_err(&download_f64(&stream, d_init), &want_s),
        2e-2,
    ));
    if let Some(z) = &grads.d_initial_normalizer {
        rows.push((
            "d_initial_normalizer".into(),
            rel_err(&download_f64(&stream, z), &want_z),
            2e-2,
        ));
    }
    let what = format!(
        "backward_varlen `{}` on {} H={heads} lengths {lengths:?}",
        kernels.forward_source().name,
        device.name(),
    );
    report_gradients(test, &what, &rows);
}

/// Every example's backward on a packed batch.
#[test]
fn gpu_recurrent_varlen_backward() {
    let test = "gpu_recurrent_varlen_backward";
    let lengths = [70, 1, 130, 64];
    check_varlen_backward(test, "retnet_recurrent", 2, &lengths);
    check_varlen_backward(test, "gated_retention", 2, &lengths);
    check_varlen_backward(test, "mamba2", 3, &lengths);
    check_varlen_backward(test, "rfa", 2, &lengths);
    check_varlen_backward(test, "gla", 2, &lengths);
}

/// `aec tune` (`pass`) of `name` at `[B, H, S, Dk, Dv]` on the GPU: the
/// default and the first `top` other tiles of the pass's space, each run
/// three times, with the test's custom-input ranges; every profiled plan
/// printed.
fn tune_on_gpu(
    test: &str,
    dev: &Device,
    name: &str,
    [b, h, s, dk, dv]: [usize; 5],
    pass: aec::tune::RecurrentPass,
    top: usize,
) -> aec::tune::TuneReport<RecurrentConfig> {
    use aec::compiler::schedule::DeviceConfig;
    use aec::tune::dispatch::DeviceKeyParts;
    use aec::tune::gpu::RecurrentGpuProfiler;
    use aec::tune::{TuneOptions, tune_recurrent, variant_hash};
    let v = example(name);
    let (dims, shape) = (
        RecurrentDims::new(dk as u32, dv as u32),
        RecurrentShape::new(b, h, s),
    );
    let model = DeviceConfig::detect(dev.name(), dev.compute_capability(), dev.sm_count());
    let parts = DeviceKeyParts::of(dev);
    let key = pass.key(
        &v,
        &variant_hash(&v),
        dims,
        shape,
        Elem::Bf16,
        &parts.parts(),
    );
    let ranges = v
        .customs
        .iter()
        .map(|c| {
            let (lo, hi) = common::recurrent_custom_range(&c.name);
            (c.name.clone(), lo as f32, hi as f32)
        })
        .collect();
    let options = TuneOptions {
        top,
        warmup: 1,
        warmup_ms: 0.0,
        reps: 3,
        custom_ranges: ranges,
    };
    let mut profiler =
        RecurrentGpuProfiler::<bf16>::new(&v, dev, dims, shape, pass, options.clone(), Vec::new())
            .unwrap_or_else(|e| panic!("{test}: {name}: {e}"));
    let r = tune_recurrent(
        &v,
        &model,
        dims,
        shape,
        Elem::Bf16,
        pass,
        key,
        &options,
        &mut profiler,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{test}: {name}: {e}"));
    for p in &r.profiled {
        println!("{test}: {name} {} {:?}", p.label, p.measured);
    }
    r
}

/// `aec tune` on a recurrent variant: the tuner profiles the default and
/// the first tiles of the recurrent space on the GPU (each checked against
/// the default's output and final state), keeps the fastest, and the tile
/// it keeps matches the reference interpreter.
#[test]
fn gpu_recurrent_tuning_keeps_a_tile_that_matches_the_reference() {
    use aec::tune::{RecurrentPass, entry_config};
    let test = "gpu_recurrent_tuning_keeps_a_tile_that_matches_the_reference";
    let Some(dev) = device(test) else {
        return;
    };
    let sizes = [2, 3, 333, 128, 64];
    let r = tune_on_gpu(test, &dev, "mamba2", sizes, RecurrentPass::Forward, 4);
    assert_eq!(r.profiled.len(), 5, "the default and four more");
    assert!(
        r.profiled.iter().all(|p| p.measured.is_ok()),
        "every tile of the space runs"
    );
    assert!(r.entry.best_us <= r.entry.default_us);
    let best: RecurrentConfig = entry_config(&r.entry).expect("a recurrent configuration");
    let options = KernelOptions {
        recurrent_config: Some(best),
        ..KernelOptions::default()
    };
    check_example_with(test, "mamba2", sizes, false, &options, 1.0);
}

/// `aec tune --backward` on a recurrent variant: the tuner profiles the
/// backward of the default forward and the first tiles of the backward's
/// space on the GPU (each checked against the default's gradients, custom
/// inputs' included), keeps the fastest, and the backward on the tile it
/// keeps matches the reference interpreter's gradients.
#[test]
fn gpu_recurrent_backward_tuning_keeps_a_tile_that_matches_the_reference() {
    use aec::tune::{RecurrentPass, entry_config};
    let test = "gpu_recurrent_backward_tuning_keeps_a_tile_that_matches_the_reference";
    let Some(dev) = device(test) else {
        return;
    };
    for (name, sizes) in [
        ("mamba2", [2, 3, 333, 128, 64]),
        ("gated_retention", [1, 2, 200, 64, 128]),
    ] {
        let r = tune_on_gpu(test, &dev, name, sizes, RecurrentPass::Backward, 5);
        assert_eq!(r.profiled.len(), 6, "{name}: the default and five more");
        assert!(
            r.profiled.iter().all(|p| p.measured.is_ok()),
            "{name}: every tile that generates runs and matches the default's gradients"
        );
        assert!(r.entry.best_us <= r.entry.default_us);
        let best: RecurrentConfig = entry_config(&r.entry).expect("a recurrent configuration");
        let options = KernelOptions {
            recurrent_backward_config: Some(best),
            ..KernelOptions::default()
        };
        check_backward_with(test, name, sizes, true, true, &options, 1.0);
    }
}
