//! Helpers shared by the integration tests: loading example variants, random
//! inputs, and the finite-difference gradient check.
#![allow(dead_code)]

use aec::frontend::ir::Axis;
use aec::frontend::reference::{self, Gradients, Inputs, Options, Tensor};
use aec::frontend::{Variant, parse_file};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

pub mod emulation;
pub mod gpu;

/// Whether `tool --version` runs.
pub fn tool_runs(tool: &str) -> bool {
    std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `tool` runs; otherwise a skip line saying what goes untested
/// (`untested`), or a failure where `AEC_REQUIRE_TOOLCHAINS=1` says the
/// tool must be there.
pub fn tool_ready(tool: &str, untested: &str) -> bool {
    let ok = tool_runs(tool);
    if !ok {
        let msg = format!("`{tool}` not found: {untested}");
        assert!(!aec::runtime::toolchains_required(), "{msg}");
        eprintln!("skipped: {msg}");
    }
    ok
}

/// `aec compile` of softmax, ALiBi, decode and Mamba2 (parallel, a custom
/// input, a fixed size with GQA and split-KV, recurrent) for h100 and a100
/// at 128x64, without tuning, into `dir`: the library the C and Rust loader
/// tests share.
pub fn compile_example_library(dir: &std::path::Path) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aec"))
        .arg("compile")
        .args(
            ["softmax", "alibi", "decode", "mamba2"]
                .map(|n| examples_dir().join(format!("{n}.rs"))),
        )
        .args([
            "--target",
            "h100,a100",
            "--head-dims",
            "128x64",
            "--no-tuning",
            "-o",
        ])
        .arg(dir)
        .output()
        .expect("run aec compile");
    assert!(out.status.success(), "aec compile failed: {}", show(&out));
}

/// Whether NVRTC, ptxas and cuobjdump are there for the CUDA compile checks;
/// without them the test is skipped with a message, or fails where
/// `AEC_REQUIRE_TOOLCHAINS=1` (CI) says they must be.
pub fn cuda_toolchain_ready() -> bool {
    use aec::runtime::{find_tool, nvrtc_present, toolchains_required};
    let missing: Vec<&str> = [
        (!nvrtc_present()).then_some("NVRTC (libnvrtc.so.13 on LD_LIBRARY_PATH)"),
        find_tool("ptxas").is_err().then_some("ptxas"),
        find_tool("cuobjdump").is_err().then_some("cuobjdump"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "CUDA toolchain missing: {}; run `cargo xtask toolchains` (or `cargo xtask test`)",
        missing.join(", ")
    );
    assert!(!toolchains_required(), "{msg}");
    eprintln!("skipped: {msg}");
    false
}

/// `examples/` where the test was built, else under the current directory
/// (a GPU machine running a copied test binary from a copy of the repository).
pub fn examples_dir() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    if built.is_dir() {
        built
    } else {
        std::env::current_dir()
            .expect("current directory")
            .join("examples")
    }
}

/// The single variant declared in `examples/<name>.rs`, parsed from the file
/// exactly as the CLI reads it.
pub fn example(name: &str) -> Variant {
    let path = examples_dir().join(format!("{name}.rs"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut found = parse_file(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        found.len(),
        1,
        "{} should declare exactly one variant",
        path.display()
    );
    found.remove(0).variant.unwrap_or_else(|e| {
        let (l, c) = e.line_col();
        panic!("{}:{l}:{c}: {e}", path.display())
    })
}

/// `examples/<name>.rs` made a decoding variant: one query position (`Sq =
/// 1` on q) over k and v on their own `Hkv` heads, so the query heads of a
/// KV head pack into one tile's rows.
pub fn decoding_form(name: &str) -> Variant {
    let path = examples_dir().join(format!("{name}.rs"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let q_line = src
        .lines()
        .find(|l| l.trim_start().starts_with("q: [B, H, Sq,"))
        .unwrap_or_else(|| panic!("{}: no `q: [B, H, Sq, ..]`", path.display()));
    let decoding = src
        .replace(q_line, &q_line.replacen("Sq", "Sq = 1", 1))
        .replace("k: [B, H, Skv", "k: [B, Hkv, Skv")
        .replace("v: [B, H, Skv", "v: [B, Hkv, Skv");
    let mut found = parse_file(&decoding).unwrap_or_else(|e| panic!("{name}: {e}"));
    found
        .remove(0)
        .variant
        .unwrap_or_else(|e| panic!("{name} as a decoding variant: {e}"))
}

/// Every parallel example, by file stem, sorted.
pub fn parallel_examples() -> Vec<(String, Variant)> {
    examples_where(|v| v.parallel().is_some())
}

/// Every recurrent example, by file stem, sorted.
pub fn recurrent_examples() -> Vec<(String, Variant)> {
    examples_where(|v| v.recurrent().is_some())
}

/// The examples that `keep` accepts, by file stem, sorted.
fn examples_where(keep: impl Fn(&Variant) -> bool) -> Vec<(String, Variant)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(examples_dir()).expect("examples dir") {
        let path = entry.expect("entry").path();
        let src = std::fs::read_to_string(&path).expect("read example");
        for inv in parse_file(&src).expect("rust file") {
            let v = inv.variant.expect("valid example");
            if keep(&v) {
                out.push((path.file_stem().unwrap().to_string_lossy().into_owned(), v));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The range of each recurrent example's custom inputs: gated retention's
/// gate logits, Mamba2's A (negative) and step sizes, RFA's gate after its
/// sigmoid, GLA's log decays.
pub fn recurrent_custom_range(name: &str) -> (f64, f64) {
    match name {
        "gate" => (-1.0, 3.0),
        "a" => (-4.0, -0.5),
        "dt" => (0.01, 0.2),
        "g" => (0.5, 0.99),
        "alpha" => (-0.5, -0.01),
        other => panic!("no range for custom input `{other}`"),
    }
}

/// The example's fixed head dims, 128 where it leaves them free.
pub fn head_dims(v: &Variant) -> (u32, u32) {
    let fixed = |a: Axis| {
        v.fixed_sizes
            .iter()
            .find(|(x, _)| *x == a)
            .map(|(_, n)| *n as u32)
            .unwrap_or(128)
    };
    (fixed(Axis::Dqk), fixed(Axis::Dv))
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn random(shape: &[usize], rng: &mut StdRng, lo: f64, hi: f64) -> Tensor {
    Tensor::from_fn(shape, |_| rng.random_range(lo..hi))
}

/// Random inputs for `v` with the given axis sizes (fixed sizes of the variant
/// win); q, k, v in (-1, 1), custom inputs in `custom_range`.
pub fn inputs(
    v: &Variant,
    sizes: &[(Axis, usize)],
    rng: &mut StdRng,
    custom_range: (f64, f64),
) -> Inputs {
    let size = |a: Axis| -> usize {
        if let Some((_, n)) = v.fixed_sizes.iter().find(|(x, _)| *x == a) {
            return *n;
        }
        if a == Axis::Hkv && !sizes.iter().any(|(x, _)| *x == Axis::Hkv) {
            return sizes
                .iter()
                .find(|(x, _)| *x == Axis::H)
                .map(|s| s.1)
                .expect("H given");
        }
        sizes
            .iter()
            .find(|(x, _)| *x == a)
            .unwrap_or_else(|| panic!("no size for axis {a}"))
            .1
    };
    let shape = |axes: &[Axis]| axes.iter().map(|a| size(*a)).collect::<Vec<_>>();
    let q = random(&shape(&v.q.axes), rng, -1.0, 1.0);
    let k = random(&shape(&v.k.axes), rng, -1.0, 1.0);
    let vv = random(&shape(&v.v.axes), rng, -1.0, 1.0);
    let customs = v
        .customs
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                random(
                    &shape(&c.axes)
                        .into_iter()
                        .chain(c.user_axes.iter().map(|(_, n)| n.unwrap_or(9)))
                        .collect::<Vec<_>>(),
                    rng,
                    custom_range.0,
                    custom_range.1,
                ),
            )
        })
        .collect();
    Inputs {
        q,
        k,
        v: vv,
        customs,
        initial_state: None,
        initial_normalizer: None,
    }
}

/// `Σ o · d_o` for the reference forward.
pub fn loss(v: &Variant, inputs: &Inputs, d_o: &Tensor) -> f64 {
    seeded_loss(v, inputs, d_o, None)
}

/// `Σ o · d_o`, plus `Σ S_T · dS + Σ z_T · dz` with final-state seeds.
fn seeded_loss(
    v: &Variant,
    inputs: &Inputs,
    d_o: &Tensor,
    seeds: Option<&(Tensor, Option<Tensor>)>,
) -> f64 {
    let fwd = reference::forward(v, inputs, Options::default()).expect("forward");
    let dot =
        |a: &Tensor, b: &Tensor| -> f64 { a.data.iter().zip(&b.data).map(|(x, y)| x * y).sum() };
    let mut l = dot(&fwd.o, d_o);
    if let Some((ds, dz)) = seeds {
        l += dot(fwd.final_state.as_ref().expect("recurrent"), ds);
        if let (Some(dz), Some(z)) = (dz, fwd.final_normalizer.as_ref()) {
            l += dot(z, dz);
        }
    }
    l
}

/// Checks every gradient of the reference backward (q, k, v, each custom input,
/// the initial state) against central finite differences of the reference
/// forward, on `samples` random coordinates per tensor. Asserts the relative
/// error ‖fd − grad‖ / ‖fd‖ over the sampled coordinates is below `tol`.
pub fn check_gradients(v: &Variant, inputs: &Inputs, samples: usize, tol: f64, rng: &mut StdRng) {
    check_gradients_with(v, inputs, samples, tol, rng, false);
}

/// [`check_gradients`]; with `final_seeds` (recurrent variants) the loss also
/// takes random multiples of the final state and normaliser
/// (`reference::recurrent_backward`'s seeds).
pub fn check_gradients_with(
    v: &Variant,
    inputs: &Inputs,
    samples: usize,
    tol: f64,
    rng: &mut StdRng,
    final_seeds: bool,
) {
    let fwd = reference::forward(v, inputs, Options::default()).expect("forward");
    let d_o = random(&fwd.o.shape, rng, -1.0, 1.0);
    let seeds = final_seeds.then(|| {
        let ds = random(
            &fwd.final_state.as_ref().expect("recurrent").shape,
            rng,
            -1.0,
            1.0,
        );
        let dz = fwd
            .final_normalizer
            .as_ref()
            .map(|z| random(&z.shape, rng, -1.0, 1.0));
        (ds, dz)
    });
    let grads = match &seeds {
        Some((ds, dz)) => reference::recurrent_backward(v, inputs, &d_o, Some(ds), dz.as_ref()),
        None => reference::backward(v, inputs, &d_o),
    }
    .expect("backward");
    let mut names: Vec<String> = vec!["q".into(), "k".into(), "v".into()];
    names.extend(inputs.customs.keys().cloned());
    if inputs.initial_state.is_some() {
        names.push("initial_state".into());
    }
    if inputs.initial_normalizer.is_some() {
        names.push("initial_normalizer".into());
    }
    for name in names {
        let analytic = grad_of(&grads, &name);
        let len = tensor_of(inputs, &name).data.len();
        let coords: Vec<usize> = if len <= samples {
            (0..len).collect()
        } else {
            (0..samples).map(|_| rng.random_range(0..len)).collect()
        };
        let (mut num, mut den) = (0.0f64, 0.0f64);
        let mut worst = String::new();
        for &c in &coords {
            let x = tensor_of(inputs, &name).data[c];
            let eps = 1e-5 * x.abs().max(1.0);
            let mut plus = inputs.clone();
            tensor_mut(&mut plus, &name).data[c] = x + eps;
            let mut minus = inputs.clone();
            tensor_mut(&mut minus, &name).data[c] = x - eps;
            let fd = (seeded_loss(v, &plus, &d_o, seeds.as_ref())
                - seeded_loss(v, &minus, &d_o, seeds.as_ref()))
                / (2.0 * eps);
            let an = analytic.data[c];
            num += (fd - an) * (fd - an);
            den += fd * fd;
            if (fd - an).abs() > 1e-7 * fd.abs().max(1.0) && worst.is_empty() {
                worst =
                    format!(" (e.g. at flat index {c}: finite difference {fd:e}, backward {an:e})");
            }
        }
        let rel = if den > 0.0 {
            (num / den).sqrt()
        } else {
            num.sqrt()
        };
        assert!(
            rel < tol,
            "{}: gradient of `{name}` disagrees with finite differences: relative error {rel:e} ≥ {tol:e}{worst}",
            v.name
        );
        assert!(
            den > 0.0 || coords.is_empty(),
            "{}: all sampled finite differences of `{name}` are zero; the check would not catch a wrong gradient",
            v.name
        );
    }
}

fn tensor_of<'a>(inputs: &'a Inputs, name: &str) -> &'a Tensor {
    match name {
        "q" => &inputs.q,
        "k" => &inputs.k,
        "v" => &inputs.v,
        "initial_state" => inputs.initial_state.as_ref().expect("initial state"),
        "initial_normalizer" => inputs
            .initial_normalizer
            .as_ref()
            .expect("initial normaliser"),
        c => &inputs.customs[c],
    }
}

fn tensor_mut<'a>(inputs: &'a mut Inputs, name: &str) -> &'a mut Tensor {
    match name {
        "q" => &mut inputs.q,
        "k" => &mut inputs.k,
        "v" => &mut inputs.v,
        "initial_state" => inputs.initial_state.as_mut().expect("initial state"),
        "initial_normalizer" => inputs
            .initial_normalizer
            .as_mut()
            .expect("initial normaliser"),
        c => inputs.customs.get_mut(c).expect("custom input"),
    }
}

fn grad_of<'a>(g: &'a Gradients, name: &str) -> &'a Tensor {
    match name {
        "q" => &g.dq,
        "k" => &g.dk,
        "v" => &g.dv,
        "initial_state" => g.initial_state.as_ref().expect("initial state gradient"),
        "initial_normalizer" => g
            .initial_normalizer
            .as_ref()
            .expect("initial normaliser gradient"),
        c => &g.customs[c],
    }
}

/// Asserts `got` matches `want` to a relative error below `tol`.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape, want.shape, "{what}: shapes differ");
    assert!(
        got.data.iter().all(|x| x.is_finite()),
        "{what}: non-finite values"
    );
    assert!(
        want.norm() > 0.0,
        "{what}: the expected tensor is all zeros, the comparison would prove nothing"
    );
    let err = got.rel_err(want);
    assert!(err < tol, "{what}: relative error {err:e} ≥ {tol:e}");
}

/// The repository root (where examples/, tests/ and templates/ are).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A finished command's exit status, stdout and stderr, for assertion messages.
pub fn show(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
