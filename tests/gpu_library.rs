//! The Rust loader of kernel libraries on a GPU: `aec::Library::open` on a
//! library compiled by `aec compile`, its entries run on random inputs at
//! sizes that are not tile multiples and compared with the f64 reference
//! interpreter — forward (o and the row outputs) and backward (dq, dk, dv
//! and custom-input gradients) of Softmax, Alibi and Decode (with and
//! without KV splits), Mamba2's recurrent forward with and without an
//! initial state and its final state, and its backward (two modules: the
//! states pass and the backward kernels) with a final-state gradient and
//! the initial state's gradient — and the errors of a bad call,
//! returned before anything is launched. A library built with shared K/V
//! storage (`--v-in-k`, multi-head latent attention) is read from
//! `AEC_TEST_LATENT_LIBRARY` (`gpu_library_latent_cache`).
//!
//! The library is read from `AEC_TEST_LIBRARY`, built (on a machine with
//! Rust and NVRTC) with
//!
//! ```text
//! aec compile examples/softmax.rs examples/alibi.rs examples/decode.rs \
//!     examples/mamba2.rs --target h100 --head-dims 128x64 -o DIR
//! ```
//!
//! (`--target a100` for an 8.x GPU). Without a CUDA driver, or without
//! `AEC_TEST_LIBRARY`, the tests print a skip line, unless
//! `AEC_REQUIRE_GPU=1` (then they fail). The GPU machines have no Rust:
//! build with `cargo test --release --test gpu_library --no-run` and run the
//! binary there from the repository root.

mod common;

use aec::Error;
use aec::frontend::reference::{self, Inputs, Tensor as RefTensor};
use aec::library::{Entry, Library, Outputs, Tensor};
use aec::prelude::{DeviceBuffer, HeadDims, Options, Shape, Stream, bf16};
use common::example;
use common::gpu::{device, download_f64, normal, random_call, rel_err, skip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The head dims the library is compiled for.
const DIMS: HeadDims = HeadDims::new(128, 64);

/// The library of `AEC_TEST_LIBRARY` opened on device 0, or `None` after a
/// skip line.
fn library(test: &str) -> Option<Library> {
    let device = device(test)?;
    let Some(dir) = std::env::var_os("AEC_TEST_LIBRARY") else {
        skip(
            test,
            "AEC_TEST_LIBRARY is not set: compile a library with `aec compile \
             examples/softmax.rs examples/alibi.rs examples/decode.rs examples/mamba2.rs \
             --target h100 --head-dims 128x64 -o DIR` and set AEC_TEST_LIBRARY=DIR",
        );
        return None;
    };
    let lib = Library::open(&dir, &device).unwrap_or_else(|e| panic!("{test}: {e}"));
    eprintln!(
        "{test}: library {} on {} ({}): {}",
        lib.dir().display(),
        device.name(),
        lib.arch(),
        lib.variants().join(", ")
    );
    Some(lib)
}

fn shape_sizes(shape: Shape) -> [(&'static str, usize); 5] {
    [
        ("B", shape.b),
        ("H", shape.h),
        ("Hkv", shape.hkv),
        ("Sq", shape.sq),
        ("Skv", shape.skv),
    ]
}

/// ‖got − want‖ / ‖want‖ over the finite entries of `want`, and whether the
/// infinite ones (fully masked rows) are equal.
fn rel_err_finite(got: &[f64], want: &[f64]) -> (f64, bool) {
    let (mut g, mut w) = (Vec::new(), Vec::new());
    let mut same_inf = true;
    for (x, y) in got.iter().zip(want) {
        if y.is_finite() {
            g.push(*x);
            w.push(*y);
        } else {
            same_inf &= x == y;
        }
    }
    (if w.is_empty() { 0.0 } else { rel_err(&g, &w) }, same_inf)
}

/// Collects (name, relative error, tolerance) and asserts them at the end.
struct Report {
    test: String,
    lines: Vec<(String, f64, f64, bool)>,
}

impl Report {
    fn new(test: &str) -> Report {
        Report {
            test: test.to_string(),
            lines: Vec::new(),
        }
    }

    fn add(&mut self, what: &str, got: &[f64], want: &RefTensor, tol: f64) {
        assert_eq!(got.len(), want.data.len(), "{}: {what} length", self.test);
        let nan = got.iter().any(|x| x.is_nan());
        let norm: f64 = want.data.iter().map(|x| x * x).sum();
        let (e, ok_inf) = if norm == 0.0 {
            // Inputs no gradient reaches are zero on both sides.
            (got.iter().map(|x| x.abs()).fold(0.0, f64::max), true)
        } else {
            rel_err_finite(got, &want.data)
        };
        self.lines.push((what.to_string(), e, tol, !nan && ok_inf));
    }

    fn finish(self, header: &str) {
        let pass = self.lines.iter().all(|(_, e, tol, ok)| *ok && e < tol);
        let text: Vec<String> = self
            .lines
            .iter()
            .map(|(n, e, _, ok)| format!("{n}={e:.2e}{}", if *ok { "" } else { " (NaN/inf)" }))
            .collect();
        eprintln!(
            "{}: {} {header}: {}",
            self.test,
            if pass { "PASS" } else { "FAIL" },
            text.join(", ")
        );
        assert!(pass, "{}: {}", self.test, text.join(", "));
    }
}

/// Runs the forward (and, with `backward`, the backward) of the library's
/// `variant` (declared in `examples/<file>.rs`) on a random call of `shape`
/// and compares with the reference interpreter. Returns the forward's KV
/// splits.
fn check_parallel(
    test: &str,
    lib: &Library,
    file: &str,
    variant: &str,
    shape: Shape,
    custom_range: (f64, f64),
    backward: bool,
) -> u64 {
    let def = example(file);
    assert_eq!(def.name, variant);
    let stream = lib.device().stream();
    let call = random_call(&def, shape, DIMS, custom_range, &format!("{test}{file}"));
    let q = stream.upload(&call.q_host).unwrap();
    let k = stream.upload(&call.k_host).unwrap();
    let v = stream.upload(&call.v_host).unwrap();
    let customs: Vec<(String, DeviceBuffer<f32>)> = call
        .customs_host
        .iter()
        .map(|(n, h)| (n.clone(), stream.upload(h).unwrap()))
        .collect();
    let mut tensors: Vec<(&str, Tensor<'_>)> =
        vec![("q", (&q).into()), ("k", (&k).into()), ("v", (&v).into())];
    tensors.extend(customs.iter().map(|(n, b)| (n.as_str(), Tensor::from(b))));
    let sizes = shape_sizes(shape);

    let fwd = lib.entry(variant, "forward").unwrap();
    let expected_splits = fwd.kv_splits(&sizes).unwrap();
    let out = fwd
        .run(&stream, &tensors, &sizes, &[])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(
        out.kv_splits(),
        expected_splits,
        "{test}: the splits launched"
    );
    assert_eq!(out.names(), ["o", "row_outputs"]);

    let reference = reference::forward(&def, &call.inputs, Options::default()).expect("reference");
    let mut report = Report::new(test);
    report.add(
        "o",
        &download_f64(&stream, out.bf16("o").unwrap()),
        &reference.o,
        1e-2,
    );
    let rows_all = download_f64(&stream, out.f32("row_outputs").unwrap());
    let rows = shape.rows();
    assert_eq!(rows_all.len(), fwd.row_output_names().len().max(1) * rows);
    for (r, name) in fwd.row_output_names().iter().enumerate() {
        let want = match name.split_once('.') {
            Some(("scale", s)) => &reference.scales[s],
            Some(("state", f)) => &reference.row_state[f],
            _ => panic!("{test}: unexpected row output `{name}`"),
        };
        report.add(name, &rows_all[r * rows..(r + 1) * rows], want, 1e-2);
    }

    if backward {
        let mut rng = StdRng::seed_from_u64(0x5eed ^ shape.sq as u64);
        let do_host: Vec<bf16> = (0..rows * DIMS.dv as usize)
            .map(|_| bf16::from_f64(normal(&mut rng)))
            .collect();
        let d_o = stream.upload(&do_host).unwrap();
        let mut btensors = tensors.clone();
        btensors.extend([
            ("o", out.tensor("o").unwrap()),
            ("row_outputs", out.tensor("row_outputs").unwrap()),
            ("dout", Tensor::from(&d_o)),
        ]);
        let grads = lib
            .entry(variant, "backward")
            .unwrap()
            .run(&stream, &btensors, &sizes, &[])
            .unwrap_or_else(|e| panic!("{test}: backward: {e}"));
        let d_o_ref = RefTensor {
            shape: vec![shape.b, shape.h, shape.sq, DIMS.dv as usize],
            data: do_host.iter().map(|x| x.to_f64()).collect(),
        };
        let want = reference::backward(&def, &call.inputs, &d_o_ref).expect("reference backward");
        for (name, r) in [("dq", &want.dq), ("dk", &want.dk), ("dv", &want.dv)] {
            report.add(
                name,
                &download_f64(&stream, grads.bf16(name).unwrap()),
                r,
                2e-2,
            );
        }
        for (cname, r) in &want.customs {
            let name = format!("d{cname}");
            report.add(
                &name,
                &download_f64(&stream, grads.f32(&name).unwrap()),
                r,
                2e-2,
            );
        }
        let mut names = vec!["dq".to_string(), "dk".into(), "dv".into()];
        names.extend(def.customs.iter().map(|c| format!("d{}", c.name)));
        assert_eq!(grads.names(), names, "{test}: the backward's outputs");
    }
    report.finish(&format!(
        "`{variant}`{} on {} {shape} kv_splits={expected_splits}",
        if backward {
            " forward+backward"
        } else {
            " forward"
        },
        lib.device().name()
    ));
    expected_splits
}

#[test]
fn gpu_library_softmax() {
    let test = "gpu_library_softmax";
    let Some(lib) = library(test) else { return };
    check_parallel(
        test,
        &lib,
        "softmax",
        "Softmax",
        Shape::mha(2, 3, 97, 133),
        (0.0, 1.0),
        true,
    );
}

#[test]
fn gpu_library_alibi() {
    let test = "gpu_library_alibi";
    let Some(lib) = library(test) else { return };
    check_parallel(
        test,
        &lib,
        "alibi",
        "Alibi",
        Shape::mha(2, 4, 133, 133),
        (0.01, 0.3),
        true,
    );
}

/// Decode (Sq fixed to 1, grouped kv heads): a short cache and a wide batch
/// (one split: the split workspaces are null pointers and the combine does
/// not run), and one long sequence, whose grid is too small for the GPU so
/// the keys are split and merged by the combine kernel.
#[test]
fn gpu_library_decode_with_and_without_kv_splits() {
    let test = "gpu_library_decode";
    let Some(lib) = library(test) else { return };
    let wide = Shape::new(40, 16, 8, 1, 77);
    let splits = check_parallel(test, &lib, "decode", "Decode", wide, (0.0, 1.0), false);
    assert_eq!(splits, 1, "{test}: {wide} fills the GPU without splits");
    check_parallel(
        test,
        &lib,
        "decode",
        "Decode",
        Shape::new(3, 4, 2, 1, 301),
        (0.0, 1.0),
        true,
    );
    let long = Shape::new(1, 4, 2, 1, 3001);
    let splits = check_parallel(test, &lib, "decode", "Decode", long, (0.0, 1.0), false);
    assert!(
        splits > 1,
        "{test}: expected KV splits for {long}, got {splits}"
    );
}

/// Mamba2's recurrent forward: with an initial state and the final state
/// asked for, and without either.
#[test]
fn gpu_library_mamba2() {
    let test = "gpu_library_mamba2";
    let Some(lib) = library(test) else { return };
    let def = example("mamba2");
    let stream = lib.device().stream();
    let (b, h, s, dk, dv) = (2, 4, 150, 128, 64);
    let mut rng = StdRng::seed_from_u64(0x3a3ba2);
    let mut bf16_tensor = |shape: Vec<usize>| {
        let host: Vec<bf16> = (0..shape.iter().product::<usize>())
            .map(|_| bf16::from_f64(normal(&mut rng)))
            .collect();
        let t = RefTensor {
            shape,
            data: host.iter().map(|x| x.to_f64()).collect(),
        };
        (host, t)
    };
    let (q_h, q_r) = bf16_tensor(vec![b, h, s, dk]);
    let (k_h, k_r) = bf16_tensor(vec![b, h, s, dk]);
    let (v_h, v_r) = bf16_tensor(vec![b, h, s, dv]);
    let mut f32_tensor = |shape: Vec<usize>, lo: f64, hi: f64, normal_dist: bool| {
        let host: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| {
                if normal_dist {
                    normal(&mut rng) as f32
                } else {
                    rng.random_range(lo..hi) as f32
                }
            })
            .collect();
        let t = RefTensor {
            shape,
            data: host.iter().map(|&x| f64::from(x)).collect(),
        };
        (host, t)
    };
    let (a_h, a_r) = f32_tensor(vec![h], -4.0, -0.5, false);
    let (dt_h, dt_r) = f32_tensor(vec![b, h, s], 0.01, 0.2, false);
    let (st_h, st_r) = f32_tensor(vec![b, h, dk, dv], 0.0, 0.0, true);
    let up_b = |x: &[bf16]| stream.upload(x).unwrap();
    let up_f = |x: &[f32]| stream.upload(x).unwrap();
    let (q, k, v) = (up_b(&q_h), up_b(&k_h), up_b(&v_h));
    let (a, dt, state) = (up_f(&a_h), up_f(&dt_h), up_f(&st_h));
    let mut tensors: Vec<(&str, Tensor<'_>)> = vec![
        ("q", (&q).into()),
        ("k", (&k).into()),
        ("v", (&v).into()),
        ("a", (&a).into()),
        ("dt", (&dt).into()),
    ];
    let sizes = [("B", b), ("H", h), ("S", s)];
    let mut inputs = Inputs {
        q: q_r,
        k: k_r,
        v: v_r,
        customs: [("a".to_string(), a_r), ("dt".to_string(), dt_r)]
            .into_iter()
            .collect(),
        initial_state: None,
        initial_normalizer: None,
    };
    let fwd = lib.entry("Mamba2", "forward").unwrap();

    // Without an initial state and without the final state.
    let out = fwd.run(&stream, &tensors, &sizes, &[]).unwrap();
    assert_eq!(out.names(), ["o"]);
    let m = out.f32("state_out").unwrap_err().to_string();
    assert_eq!(
        m,
        "`Mamba2` forward: no output `state_out`; the call returned o"
    );
    let want = reference::forward(&def, &inputs, Options::default()).expect("reference");
    let mut report = Report::new(test);
    report.add(
        "o",
        &download_f64(&stream, out.bf16("o").unwrap()),
        &want.o,
        1e-2,
    );
    report.finish(&format!("`Mamba2` B={b} H={h} S={s} from a zero state"));

    // From an initial state, with the final state out.
    tensors.push(("state_in", (&state).into()));
    inputs.initial_state = Some(st_r);
    let out = fwd.run(&stream, &tensors, &sizes, &["state_out"]).unwrap();
    assert_eq!(out.names(), ["o", "state_out"]);
    let want = reference::forward(&def, &inputs, Options::default()).expect("reference");
    let mut report = Report::new(test);
    report.add(
        "o",
        &download_f64(&stream, out.bf16("o").unwrap()),
        &want.o,
        1e-2,
    );
    report.add(
        "state_out",
        &download_f64(&stream, out.f32("state_out").unwrap()),
        want.final_state.as_ref().expect("reference final state"),
        1e-2,
    );
    report.finish(&format!(
        "`Mamba2` B={b} H={h} S={s} from an initial state, final state out"
    ));

    // The backward from the same initial state, with a gradient of the
    // final state, asking for the initial state's gradient: the states pass
    // (its own module) and the backward kernels.
    let mut rng = StdRng::seed_from_u64(0x3a3ba3);
    let do_h: Vec<bf16> = (0..b * h * s * dv)
        .map(|_| bf16::from_f64(normal(&mut rng)))
        .collect();
    let ds_h: Vec<f32> = (0..b * h * dk * dv)
        .map(|_| normal(&mut rng) as f32)
        .collect();
    let do_r = RefTensor {
        shape: vec![b, h, s, dv],
        data: do_h.iter().map(|x| x.to_f64()).collect(),
    };
    let ds_r = RefTensor {
        shape: vec![b, h, dk, dv],
        data: ds_h.iter().map(|&x| f64::from(x)).collect(),
    };
    let (d_o, d_state) = (up_b(&do_h), up_f(&ds_h));
    let bwd = lib.entry("Mamba2", "backward").unwrap();
    assert!(
        bwd.plan().launches[0].module.is_some(),
        "the states pass lives in its own module"
    );
    let mut bt = tensors.clone();
    bt.push(("do", (&d_o).into()));
    bt.push(("d_state_out", (&d_state).into()));
    let g = bwd.run(&stream, &bt, &sizes, &["d_state_in"]).unwrap();
    assert_eq!(g.names(), ["dq", "dk", "dv", "da", "ddt", "d_state_in"]);
    let want = reference::recurrent_backward(&def, &inputs, &do_r, Some(&ds_r), None)
        .expect("reference backward");
    let mut report = Report::new(test);
    for (name, w) in [("dq", &want.dq), ("dk", &want.dk), ("dv", &want.dv)] {
        report.add(name, &download_f64(&stream, g.bf16(name).unwrap()), w, 2e-2);
    }
    for (name, w) in &want.customs {
        // Sums over steps through the decay's running sums (as in
        // tests/gpu_recurrent.rs): a looser bound.
        let got = download_f64(&stream, g.f32(&format!("d{name}")).unwrap());
        report.add(&format!("d{name}"), &got, w, 8e-2);
    }
    report.add(
        "d_state_in",
        &download_f64(&stream, g.f32("d_state_in").unwrap()),
        want.initial_state
            .as_ref()
            .expect("reference initial state gradient"),
        2e-2,
    );
    report.finish(&format!(
        "`Mamba2` backward B={b} H={h} S={s} from an initial state, final-state gradient in"
    ));
}

fn run_error(
    entry: &Entry,
    stream: &Stream,
    tensors: &[(&str, Tensor<'_>)],
    sizes: &[(&str, usize)],
    want: &[&str],
) -> String {
    match entry.run(stream, tensors, sizes, want) {
        Err(Error::Shape(m)) => m,
        other => panic!(
            "expected Error::Shape, got {:?}",
            other.map(|o: Outputs| o.names().join(","))
        ),
    }
}

/// A bad call is refused before anything is allocated or launched: the
/// inputs stay as they were, and the same entry then runs a correct call.
#[test]
fn gpu_library_errors_before_launch() {
    let test = "gpu_library_errors_before_launch";
    let Some(lib) = library(test) else { return };
    let stream = lib.device().stream();
    let fwd = lib.entry("Softmax", "forward").unwrap();
    let shape = Shape::mha(2, 4, 37, 37);
    let n = 2 * 4 * 37;
    let host = |len: usize, c: f32| -> Vec<bf16> {
        (0..len)
            .map(|i| bf16::from_f32(c * ((i % 13) as f32 - 6.0) / 8.0))
            .collect()
    };
    let (q_host, k_bad_host, v_host) = (host(n * 128, 1.0), host(4096, 0.5), host(n * 64, 0.25));
    let q = stream.upload(&q_host).unwrap();
    let k_bad = stream.upload(&k_bad_host).unwrap();
    let v = stream.upload(&v_host).unwrap();
    let sizes = shape_sizes(shape);
    assert_eq!(
        run_error(
            fwd,
            &stream,
            &[
                ("q", (&q).into()),
                ("k", (&k_bad).into()),
                ("v", (&v).into())
            ],
            &sizes,
            &[]
        ),
        "`Softmax` forward: tensor `k`: expected [B, H, Skv, 128] = [2, 4, 37, 128] = 37888 \
         elements, got 4096"
    );
    let v32 = stream.upload(&vec![0.5f32; n * 64]).unwrap();
    assert_eq!(
        run_error(
            fwd,
            &stream,
            &[("q", (&q).into()), ("k", (&q).into()), ("v", (&v32).into())],
            &sizes,
            &[]
        ),
        "`Softmax` forward: tensor `v`: expected bf16 elements, got f32"
    );
    assert_eq!(
        run_error(
            fwd,
            &stream,
            &[("q", (&q).into()), ("k", (&q).into()), ("v", (&v).into())],
            &sizes[..4],
            &[]
        ),
        "`Softmax` forward: size `Skv` is missing: the call binds B, H, Hkv, Sq, Skv (fixed \
         sizes may be left out)"
    );
    match lib.entry("softmax", "forward") {
        Err(e @ Error::Library { .. }) => {
            assert!(e.to_string().ends_with("did you mean `Softmax`?"), "{e}")
        }
        other => panic!("{test}: expected Error::Library, got {other:?}"),
    }
    // Nothing ran: the inputs are untouched.
    stream.synchronize().unwrap();
    assert_eq!(stream.download(&q).unwrap(), q_host);
    assert_eq!(stream.download(&k_bad).unwrap(), k_bad_host);
    assert_eq!(stream.download(&v).unwrap(), v_host);
    // The same entry then runs a correct call.
    let k = stream.upload(&host(n * 128, 0.5)).unwrap();
    let out = fwd
        .run(
            &stream,
            &[("q", (&q).into()), ("k", (&k).into()), ("v", (&v).into())],
            &sizes,
            &[],
        )
        .unwrap();
    let o = stream.download(out.bf16("o").unwrap()).unwrap();
    assert_eq!(o.len(), n * 64);
    assert!(o.iter().all(|x| x.to_f32().is_finite()));
    assert_eq!(
        out.f32("o").unwrap_err().to_string(),
        "`Softmax` forward: output `o` holds bf16 elements, not f32: use outputs.bf16(\"o\")"
    );
    eprintln!("{test}: PASS (errors before launch, then a correct launch)");
}

/// The tuning table: each tuning-table kernel of the Softmax forward and
/// backward for this GPU (a library compiled with a tuning cache, e.g. the
/// fixture of `bench/src/bin/tuning_fixture.rs`) runs for a call in its
/// bucket and matches the reference there, forward and backward; a call
/// outside runs the pass's default. A library without any for this GPU is
/// a skip line (a failure where `AEC_REQUIRE_TUNED=1`).
#[test]
fn gpu_library_tuning_table() {
    let test = "gpu_library_tuning_table";
    let Some(lib) = library(test) else { return };
    let defaults = ["forward", "backward"].map(|pass| lib.entry("Softmax", pass).unwrap());
    if defaults.iter().all(|e| e.tuned().is_empty()) {
        let msg = format!(
            "the library has no tuning-table kernels for {}: compile it with --tuning-cache",
            lib.device().name()
        );
        assert!(
            std::env::var("AEC_REQUIRE_TUNED").as_deref() != Ok("1"),
            "{test}: {msg}"
        );
        skip(test, &msg);
        return;
    }
    // A length of a power-of-two bucket that is not a power of two.
    let inside = |b: usize| if b <= 2 { b } else { b - b / 4 + 1 };
    for default in defaults {
        for tuned in default.tuned() {
            assert_ne!(tuned.kernel_name(), default.kernel_name());
            for bucket in tuned.tuned_for() {
                let size = |n: &str| {
                    bucket
                        .sizes
                        .iter()
                        .find(|(m, _)| m == n)
                        .map(|&(_, v)| v as usize)
                        .unwrap_or_else(|| panic!("{test}: the bucket has no {n}"))
                };
                let (b, h, hkv) = (size("B"), size("H"), size("Hkv"));
                let shape = Shape::new(b, h, hkv, inside(size("Sq")), inside(size("Skv")));
                assert_eq!(
                    default.for_sizes(&shape_sizes(shape)).kernel_name(),
                    tuned.kernel_name(),
                    "{test}: {shape} is in the bucket"
                );
                check_parallel(test, &lib, "softmax", "Softmax", shape, (0.0, 1.0), true);
                let outside = Shape::new(b, h, hkv, 2 * size("Sq") + 1, size("Skv"));
                assert_eq!(
                    default.for_sizes(&shape_sizes(outside)).kernel_name(),
                    default.kernel_name(),
                    "{test}: {outside} is outside every bucket"
                );
                check_parallel(test, &lib, "softmax", "Softmax", outside, (0.0, 1.0), true);
                eprintln!(
                    "{test}: {} ran for {shape}, the default {} for {outside}",
                    tuned.kernel_name(),
                    default.kernel_name()
                );
            }
        }
    }
}

/// A library built with shared K/V storage (`aec compile
/// examples/mla_decode.rs --target h100 --v-in-k -o DIR`, read from
/// `AEC_TEST_LATENT_LIBRARY`): the latent cache passed as `k` and `v` gives
/// softmax(q · cacheᵀ / √192) times the cache's first 512 columns (f64 on
/// the host), with and without KV splits; a `v` that is another buffer is
/// refused before launch.
#[test]
fn gpu_library_latent_cache() {
    let test = "gpu_library_latent_cache";
    let Some(device) = device(test) else { return };
    let Some(dir) = std::env::var_os("AEC_TEST_LATENT_LIBRARY") else {
        skip(
            test,
            "AEC_TEST_LATENT_LIBRARY is not set: compile `aec compile examples/mla_decode.rs \
             --target h100 --v-in-k -o DIR` and set AEC_TEST_LATENT_LIBRARY=DIR",
        );
        return;
    };
    let lib = Library::open(&dir, &device).unwrap_or_else(|e| panic!("{test}: {e}"));
    let fwd = lib.entry("MlaDecode", "forward").unwrap();
    let stream = lib.device().stream();
    let (dqk, dv) = (576usize, 512usize);
    let mut rng = StdRng::seed_from_u64(7);
    let mut splits_seen = Vec::new();
    for (b, h, skv) in [(3usize, 16usize, 1001usize), (1, 64, 3333), (140, 16, 40)] {
        let q_host: Vec<bf16> = (0..b * h * dqk)
            .map(|_| bf16::from_f64(normal(&mut rng)))
            .collect();
        let c_host: Vec<bf16> = (0..b * skv * dqk)
            .map(|_| bf16::from_f64(normal(&mut rng)))
            .collect();
        let (q, cache) = (
            stream.upload(&q_host).unwrap(),
            stream.upload(&c_host).unwrap(),
        );
        let sizes = [("B", b), ("H", h), ("Hkv", 1), ("Sq", 1), ("Skv", skv)];
        let out = fwd
            .run(
                &stream,
                &[
                    ("q", (&q).into()),
                    ("k", (&cache).into()),
                    ("v", (&cache).into()),
                ],
                &sizes,
                &[],
            )
            .unwrap_or_else(|e| panic!("{test}: {e}"));
        let got = download_f64(&stream, out.bf16("o").unwrap());
        let mut want = vec![0.0f64; b * h * dv];
        for bi in 0..b {
            let key = |j: usize, d: usize| c_host[(bi * skv + j) * dqk + d].to_f64();
            for hi in 0..h {
                let row = |d: usize| q_host[(bi * h + hi) * dqk + d].to_f64();
                let s: Vec<f64> = (0..skv)
                    .map(|j| (0..dqk).map(|d| row(d) * key(j, d)).sum::<f64>() / 192f64.sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = p.iter().sum();
                for d in 0..dv {
                    want[(bi * h + hi) * dv + d] =
                        (0..skv).map(|j| p[j] * key(j, d)).sum::<f64>() / l;
                }
            }
        }
        let err = rel_err(&got, &want);
        eprintln!(
            "{test}: B={b} H={h} Skv={skv} KV splits {}: rel_err(o)={err:.2e}",
            out.kv_splits()
        );
        assert!(err < 1e-2, "{test}: relative error {err:.3e}");
        splits_seen.push(out.kv_splits());
    }
    assert!(
        splits_seen.contains(&1) && splits_seen.iter().any(|&n| n > 1),
        "{test}: expected runs with and without KV splits, got {splits_seen:?}"
    );
    // Another buffer as `v`, even an equal copy, is refused.
    let q = stream.upload(&vec![bf16::from_f32(0.5); 16 * dqk]).unwrap();
    let cache = stream
        .upload(&vec![bf16::from_f32(0.25); 40 * dqk])
        .unwrap();
    let copy = stream
        .upload(&vec![bf16::from_f32(0.25); 40 * dqk])
        .unwrap();
    let sizes = [("B", 1), ("H", 16), ("Hkv", 1), ("Sq", 1), ("Skv", 40)];
    let message = run_error(
        fwd,
        &stream,
        &[
            ("q", (&q).into()),
            ("k", (&cache).into()),
            ("v", (&copy).into()),
        ],
        &sizes,
        &[],
    );
    assert!(
        message.contains("`v` must be the tensor given as `k`"),
        "{message}"
    );
}
