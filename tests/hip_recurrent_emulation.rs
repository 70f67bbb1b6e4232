//! The HIP recurrent forward run on the CPU (issue: AMD backend; see
//! ARCHITECTURE.md, "How the HIP kernels are checked"). There is no AMD GPU
//! here, so `templates/hip/recurrent_fwd.hip` is rendered with the emulation
//! prelude and built by the system C++ compiler: the same kernel text (LDS
//! tiles, the transposed GEMMs' operand indexing, the wave's decay scan, the
//! per-key factor tables, the normaliser's shares, the chunk loop with its
//! register prefetch and `cu_seqlens`) with every work-item a thread and
//! `mfma16` a reference routine over the documented operand layout. The
//! output, the final state and the final normaliser are compared with the
//! f64 reference interpreter on random inputs, at lengths that are not chunk
//! multiples, with and without initial states.

mod common;

use aec::compiler::hip::dialect::{Gfx, HipPrelude};
use aec::compiler::hip::recurrent::{HipRecurrentConfig, hip_recurrent_forward};
use aec::compiler::hip::recurrent_bwd::hip_recurrent_backward;
use aec::compiler::{ArgKind, Elem, ForwardKind, RecurrentBackwardSource, RecurrentSource};
use aec::frontend::Variant;
use aec::frontend::ir::Axis;
use aec::prelude::*;
use aec::reference::{self, Options};
use aec::runtime::bf16;
use common::emulation::{build_and_run, cxx};
use common::gpu::{normal, rel_err};
use rand::Rng;
use std::fmt::Write as _;

/// One call: `seqs` sequences of `lengths` steps, each batch item its own
/// sequence (`packed` false) or all packed along S of batch item 0 with
/// `cu_seqlens` (then `lengths` may differ).
struct Call {
    heads: usize,
    lengths: Vec<usize>,
    packed: bool,
    dk: usize,
    dv: usize,
    initial: bool,
    /// Where each custom input's values are drawn from, by name.
    custom_range: fn(&str) -> (f64, f64),
}

impl Call {
    fn seqs(&self) -> usize {
        self.lengths.len()
    }

    /// Batch items and steps per item of q, k, v and the custom inputs.
    fn batch_and_steps(&self) -> (usize, usize) {
        if self.packed {
            (1, self.lengths.iter().sum())
        } else {
            (self.seqs(), self.lengths[0])
        }
    }

    fn size(&self, a: Axis) -> usize {
        let (b, s) = self.batch_and_steps();
        match a {
            Axis::B => b,
            Axis::H => self.heads,
            Axis::S => s,
            Axis::Dk => self.dk,
            Axis::Dv => self.dv,
            other => panic!("recurrent calls have no {other:?}"),
        }
    }

    /// Sequence n's steps within its batch item.
    fn steps_of(&self, n: usize) -> (usize, std::ops::Range<usize>) {
        if self.packed {
            let t0: usize = self.lengths[..n].iter().sum();
            (0, t0..t0 + self.lengths[n])
        } else {
            (n, 0..self.lengths[n])
        }
    }
}

/// Item `item`, steps `range` of a tensor with `axes` as a one-item tensor
/// (an axis B becomes 1, an axis S the range's length): its shape and, for
/// each of its elements, the flat index it comes from.
fn cut_indices(
    t_shape: &[usize],
    axes: &[Axis],
    item: usize,
    range: &std::ops::Range<usize>,
) -> (Vec<usize>, Vec<usize>) {
    let shape: Vec<usize> = axes
        .iter()
        .zip(t_shape)
        .map(|(a, &n)| match a {
            Axis::B => 1,
            Axis::S => range.len(),
            _ => n,
        })
        .collect();
    // Each index of the result, read from the source at the same index
    // shifted to `item` along B and to `range` along S.
    let from = (0..shape.iter().product::<usize>())
        .map(|flat| {
            let (mut rest, mut at, mut stride) = (flat, 0, 1);
            for i in (0..axes.len()).rev() {
                let idx = rest % shape[i];
                rest /= shape[i];
                let src = match axes[i] {
                    Axis::B => item,
                    Axis::S => range.start + idx,
                    _ => idx,
                };
                at += src * stride;
                stride *= t_shape[i];
            }
            at
        })
        .collect();
    (shape, from)
}

fn cut(t: &Tensor, axes: &[Axis], item: usize, range: &std::ops::Range<usize>) -> Tensor {
    let (shape, from) = cut_indices(&t.shape, axes, item, range);
    Tensor {
        shape,
        data: from.iter().map(|&i| t.data[i]).collect(),
    }
}

/// Adds a one-item tensor cut as [`cut`] does back into `full` (a gradient
/// per sequence into the batch's; per-head inputs sum over sequences).
fn add_back(
    full: &mut [f64],
    shape: &[usize],
    axes: &[Axis],
    item: usize,
    range: &std::ops::Range<usize>,
    part: &Tensor,
) {
    let (_, from) = cut_indices(shape, axes, item, range);
    assert_eq!(from.len(), part.data.len());
    for (&i, x) in from.iter().zip(&part.data) {
        full[i] += x;
    }
}

/// A driver's `out.bin`, read in order: bf16 bits and f32 values as f64.
struct OutFile {
    bytes: Vec<u8>,
    at: usize,
}

impl OutFile {
    fn read(path: &std::path::Path) -> OutFile {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        OutFile { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let x = &self.bytes[self.at..self.at + n];
        self.at += n;
        x
    }

    fn bf16(&mut self, len: usize) -> Vec<f64> {
        self.take(2 * len)
            .chunks(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64())
            .collect()
    }

    fn f32(&mut self, len: usize) -> Vec<f64> {
        self.take(4 * len)
            .chunks(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect()
    }

    /// Bytes not read yet.
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
}

/// A host tensor (bf16 bits or f32) and the same values for the reference.
type Host<T> = (Vec<T>, Tensor);

/// Random inputs of one call: bf16 q, k, v; custom inputs in their ranges;
/// with `call.initial` initial states (and normalisers).
struct RandomInputs {
    q: Host<u16>,
    k: Host<u16>,
    v: Host<u16>,
    customs: Vec<(String, Vec<Axis>, Host<f32>)>,
    state: Option<Host<f32>>,
    norm: Option<Host<f32>>,
}

fn bf16_tensor(shape: Vec<usize>, rng: &mut rand::rngs::StdRng) -> Host<u16> {
    let host: Vec<u16> = (0..shape.iter().product::<usize>())
        .map(|_| bf16::from_f64(normal(rng)).to_bits())
        .collect();
    let data = host.iter().map(|&b| bf16::from_bits(b).to_f64()).collect();
    (host, Tensor { shape, data })
}

fn f32_tensor(shape: Vec<usize>, rng: &mut rand::rngs::StdRng, lo: f64, hi: f64) -> Host<f32> {
    let host: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.random_range(lo..hi) as f32)
        .collect();
    let data = host.iter().map(|&x| f64::from(x)).collect();
    (host, Tensor { shape, data })
}

impl RandomInputs {
    fn new(def: &Variant, call: &Call, rng: &mut rand::rngs::StdRng) -> RandomInputs {
        let shape = |axes: &[Axis]| axes.iter().map(|a| call.size(*a)).collect::<Vec<_>>();
        let q = bf16_tensor(shape(&def.q.axes), rng);
        let k = bf16_tensor(shape(&def.k.axes), rng);
        let v = bf16_tensor(shape(&def.v.axes), rng);
        let customs = def
            .customs
            .iter()
            .map(|c| {
                let (lo, hi) = (call.custom_range)(&c.name);
                (
                    c.name.clone(),
                    c.axes.clone(),
                    f32_tensor(shape(&c.axes), rng, lo, hi),
                )
            })
            .collect();
        let (n, h) = (call.seqs(), call.heads);
        let state = call
            .initial
            .then(|| f32_tensor(vec![n, h, call.dk, call.dv], rng, -1.0, 1.0));
        let norm = (call.initial && ForwardKind::of(def).normalize)
            .then(|| f32_tensor(vec![n, h, call.dk], rng, 0.5, 2.0));
        RandomInputs {
            q,
            k,
            v,
            customs,
            state,
            norm,
        }
    }

    /// in.bin: q, k, v (bf16 bits), the custom inputs, the initial state and
    /// normaliser where given (f32).
    fn bytes(&self) -> Vec<u8> {
        let mut input: Vec<u8> = Vec::new();
        for (t, _) in [&self.q, &self.k, &self.v] {
            input.extend(t.iter().flat_map(|x| x.to_le_bytes()));
        }
        for (_, _, (host, _)) in &self.customs {
            input.extend(host.iter().flat_map(|x| x.to_le_bytes()));
        }
        for (host, _) in self.state.iter().chain(&self.norm) {
            input.extend(host.iter().flat_map(|x| x.to_le_bytes()));
        }
        input
    }

    fn custom_lens(&self) -> Vec<usize> {
        self.customs.iter().map(|(_, _, (h, _))| h.len()).collect()
    }

    /// The reference's inputs of sequence `s` alone.
    fn sequence(&self, def: &Variant, call: &Call, s: usize) -> Inputs {
        let (item, range) = call.steps_of(s);
        let mut inputs = Inputs {
            q: cut(&self.q.1, &def.q.axes, item, &range),
            k: cut(&self.k.1, &def.k.axes, item, &range),
            v: cut(&self.v.1, &def.v.axes, item, &range),
            customs: Default::default(),
            initial_state: None,
            initial_normalizer: None,
        };
        for (cname, axes, (_, t)) in &self.customs {
            inputs
                .customs
                .insert(cname.clone(), cut(t, axes, item, &range));
        }
        inputs.initial_state = self.state.as_ref().map(|(_, t)| leading(t, s));
        inputs.initial_normalizer = self.norm.as_ref().map(|(_, t)| leading(t, s));
        inputs
    }
}

/// Sequence s of a per-sequence tensor ([N, H, Dk(, Dv)]).
fn leading(t: &Tensor, s: usize) -> Tensor {
    cut(
        t,
        &[Axis::B, Axis::H, Axis::Dk, Axis::Dv][..t.shape.len()],
        s,
        &(0..0),
    )
}

/// Runs the HIP recurrent forward of `examples/<name>.rs` on the emulator
/// and compares it with the reference, sequence by sequence.
fn check(name: &str, call: &Call, tune: impl Fn(&mut HipRecurrentConfig)) {
    let Some(cxx) = cxx() else { return };
    let def: Variant = common::example(name);
    let kind = ForwardKind::of(&def);
    let (dk, dv) = (call.dk as u32, call.dv as u32);
    let mut cfg = HipRecurrentConfig::default_for(dk, dv, kind, Elem::Bf16);
    tune(&mut cfg);
    let k = hip_recurrent_forward(&def, dk, dv, &cfg, Gfx::Gfx90a, HipPrelude::CpuEmulation)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let normalized = kind.normalize;

    let mut rng = common::rng(name.bytes().map(u64::from).sum::<u64>() + call.dk as u64);
    let inputs = RandomInputs::new(&def, call, &mut rng);
    let (n, h) = (call.seqs(), call.heads);
    let mut cu: Vec<i32> = vec![0];
    for l in &call.lengths {
        cu.push(cu.last().unwrap() + *l as i32);
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let p = |f: &str| dir.path().join(f);
    std::fs::write(p("kernel.hip"), &k.source).unwrap();
    let mut input = inputs.bytes();
    input.extend(cu.iter().flat_map(|x| x.to_le_bytes()));
    std::fs::write(p("in.bin"), input).unwrap();
    let o_len = inputs.v.0.len();
    let state_len = n * h * call.dk * call.dv;
    std::fs::write(
        p("driver.cpp"),
        driver(&k, call, &inputs.custom_lens(), normalized),
    )
    .unwrap();
    build_and_run(&cxx, dir.path(), name);
    let mut out = OutFile::read(&p("out.bin"));
    let o = out.bf16(o_len);
    let st = out.f32(state_len);
    let z = normalized.then(|| out.f32(out.left() / 4));
    assert!(
        o.iter().chain(&st).all(|x| x.is_finite()),
        "{name}: non-finite output"
    );

    // The reference, one sequence at a time.
    let (mut got_o, mut want_o) = (Vec::new(), Vec::new());
    let (mut want_st, mut want_z) = (Vec::new(), Vec::new());
    let o_tensor = Tensor {
        shape: def.v.axes.iter().map(|a| call.size(*a)).collect(),
        data: o,
    };
    for s in 0..n {
        let (item, range) = call.steps_of(s);
        let seq = inputs.sequence(&def, call, s);
        let fwd = reference::forward(&def, &seq, Options::default()).expect("reference");
        want_o.extend(&fwd.o.data);
        got_o.extend(cut(&o_tensor, &def.v.axes, item, &range).data);
        want_st.extend(&fwd.final_state.expect("final state").data);
        if let Some(zf) = fwd.final_normalizer {
            want_z.extend(zf.data);
        }
    }
    for (what, w) in [("o", &want_o), ("final state", &want_st)] {
        assert!(
            w.iter().map(|x| x * x).sum::<f64>() > 0.0,
            "{name}: the reference {what} is all zeros, the comparison would prove nothing"
        );
    }
    let mut report = format!(
        "{name} {} ({} sequences of {:?}{}{}): o {:.2e}, state {:.2e}",
        k.name,
        n,
        call.lengths,
        if call.packed { ", packed" } else { "" },
        if call.initial { ", initial state" } else { "" },
        rel_err(&got_o, &want_o),
        rel_err(&st, &want_st)
    );
    if let Some(z) = &z {
        let _ = write!(report, ", normaliser {:.2e}", rel_err(z, &want_z));
    }
    eprintln!("{report}");
    assert!(rel_err(&got_o, &want_o) < 1e-2, "{report}");
    assert!(rel_err(&st, &want_st) < 1e-2, "{report}");
    if let Some(z) = &z {
        assert!(rel_err(z, &want_z) < 1e-2, "{report}");
    }
}

/// The C++ driver: reads q, k, v (bf16 bits), the custom inputs (f32), the
/// initial state and normaliser (f32, when given) and cu_seqlens from
/// `in.bin`, launches the kernel on the emulator, writes o (bf16 bits), the
/// final state and normaliser (f32) to `out.bin`.
fn driver(k: &RecurrentSource, call: &Call, custom_lens: &[usize], normalized: bool) -> String {
    let (b, s_total) = call.batch_and_steps();
    let (n, h) = (call.seqs(), call.heads);
    let q_len = b * h * s_total * call.dk;
    let v_len = b * h * s_total * call.dv;
    let state_len = n * h * call.dk * call.dv;
    let norm_len = n * h * call.dk;
    let mut s = String::from("#include \"kernel.hip\"\n#include <cstdio>\n#include <vector>\n\n");
    s += "template <class T> static void rd(FILE* f, std::vector<T>& v) { if (fread(v.data(), sizeof(T), v.size(), f) != v.size()) abort(); }\n";
    s += "int main() {\n    FILE* f = fopen(\"in.bin\", \"rb\");\n";
    let _ = writeln!(
        s,
        "    std::vector<unsigned short> q({q_len}), k({q_len}), v({v_len}), o({v_len}, 0xffff);\n    rd(f, q); rd(f, k); rd(f, v);"
    );
    for (i, len) in custom_lens.iter().enumerate() {
        let _ = writeln!(s, "    std::vector<float> c{i}({len}); rd(f, c{i});");
    }
    let _ = writeln!(
        s,
        "    std::vector<float> state_in({state_len}), state_out({state_len}, -12345.0f), norm_in({norm_len}), norm_out({norm_len}, -12345.0f);"
    );
    if call.initial {
        s += "    rd(f, state_in);\n";
        if normalized {
            s += "    rd(f, norm_in);\n";
        }
    }
    let _ = writeln!(
        s,
        "    std::vector<int> cu({}); rd(f, cu);\n    fclose(f);",
        n + 1
    );
    let customs: Vec<&str> = k
        .args
        .iter()
        .filter_map(|a| match a {
            ArgKind::Custom(name) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let args: Vec<String> = k
        .args
        .iter()
        .map(|a| match a {
            ArgKind::Tensor(t) => format!("{t}.data()"),
            ArgKind::Custom(c) => {
                format!("c{}.data()", customs.iter().position(|x| x == c).unwrap())
            }
            ArgKind::State(st @ ("state_in" | "norm_in")) => {
                if call.initial {
                    format!("{st}.data()")
                } else {
                    "nullptr".into()
                }
            }
            ArgKind::State(st) => format!("{st}.data()"),
            ArgKind::CuSeqlens => {
                if call.packed {
                    "cu.data()".into()
                } else {
                    "nullptr".into()
                }
            }
            ArgKind::Size(Axis::B) => n.to_string(),
            ArgKind::Size(Axis::H) => h.to_string(),
            ArgKind::Size(Axis::S) => s_total.to_string(),
            other => panic!("the recurrent forward takes no {other:?}"),
        })
        .collect();
    let (gx, gy, gz) = k.grid_for(n, h).expect("grid");
    let _ = writeln!(
        s,
        "    aec_emu::launch({gx}, {gy}, {gz}, {}, [&] {{ {}({}); }});",
        k.threads,
        k.name,
        args.join(", ")
    );
    s += "    FILE* g = fopen(\"out.bin\", \"wb\");\n    fwrite(o.data(), 2, o.size(), g);\n    fwrite(state_out.data(), 4, state_out.size(), g);\n";
    if normalized {
        s += "    fwrite(norm_out.data(), 4, norm_out.size(), g);\n";
    }
    s += "    fclose(g);\n    return 0;\n}\n";
    s
}

fn batch(heads: usize, seqs: usize, len: usize, dk: usize, dv: usize, initial: bool) -> Call {
    Call {
        heads,
        lengths: vec![len; seqs],
        packed: false,
        dk,
        dv,
        initial,
        custom_range: common::recurrent_custom_range,
    }
}

#[test]
fn emulated_retnet_recurrent() {
    // Dv 96: 32-column slices (two waves); 150 steps: a partial third chunk.
    check("retnet_recurrent", &batch(2, 2, 150, 64, 96, true), |_| {});
}

#[test]
fn emulated_gated_retention() {
    check("gated_retention", &batch(2, 1, 100, 128, 64, false), |_| {});
}

#[test]
fn emulated_mamba2() {
    check("mamba2", &batch(2, 2, 77, 32, 64, true), |_| {});
}

/// Mamba2's step sizes up to 60, so that about a quarter of the steps'
/// decays exp(dt·A) lie below f32's smallest number (their log2 is −inf,
/// and a chunk's prefix sums of log2 decays would then give −inf − −inf):
/// the kernels floor a step's log2 decay at −160 (2^−160 is 0 in f32 all the
/// same), and match the f64 reference, forward and backward.
fn steps_past_underflow(name: &str) -> (f64, f64) {
    match name {
        "dt" => (0.01, 60.0),
        other => common::recurrent_custom_range(other),
    }
}

#[test]
fn emulated_mamba2_decays_below_f32() {
    let call = Call {
        custom_range: steps_past_underflow,
        ..batch(2, 2, 77, 32, 64, true)
    };
    check("mamba2", &call, |_| {});
    check_backward("mamba2", &call);
}

#[test]
fn emulated_rfa_normaliser() {
    check("rfa", &batch(2, 1, 130, 32, 64, true), |_| {});
}

#[test]
fn emulated_gla_per_key_decay() {
    check("gla", &batch(1, 2, 90, 64, 64, true), |_| {});
}

#[test]
fn emulated_dk_256_takes_32_step_chunks() {
    let call = batch(1, 1, 70, 256, 64, true);
    check("retnet_recurrent", &call, |c| {
        assert_eq!(c.chunk, 32, "Dk 256 default")
    });
    check("gla", &call, |_| {});
}

#[test]
fn emulated_packed_sequences() {
    // Three sequences along one batch item: one shorter than a chunk, one a
    // single step, one longer than a chunk; each from its own initial state.
    for name in ["mamba2", "rfa"] {
        let call = Call {
            heads: 2,
            lengths: vec![37, 1, 100],
            packed: true,
            dk: 32,
            dv: 32,
            initial: true,
            custom_range: common::recurrent_custom_range,
        };
        check(name, &call, |_| {});
    }
}

/// The two programs of a backward run: the states pass, then the backward's
/// kernels (each a kernel source of its own, so each gets its own driver).
#[derive(Clone, Copy, PartialEq)]
enum Stage {
    States,
    Backward,
}

/// The C++ driver of one backward stage. Reads `in.bin` (the forward's
/// inputs as [`RandomInputs::bytes`], `cu_seqlens` with the chunk offsets,
/// `do` in bf16 bits and, with an initial state, the final state's
/// gradient). The states pass writes `states.bin`; the backward reads it and
/// writes `out.bin`: dq, dk, dv (bf16 bits), the initial state's gradient and
/// every custom input's gradient (f32).
fn backward_driver(
    stage: Stage,
    b: &RecurrentBackwardSource,
    call: &Call,
    custom_lens: &[usize],
    units: usize,
    max_len: usize,
) -> String {
    let (bsz, s_total) = call.batch_and_steps();
    let (n, h) = (call.seqs(), call.heads);
    let q_len = bsz * h * s_total * call.dk;
    let v_len = bsz * h * s_total * call.dv;
    let state_len = n * h * call.dk * call.dv;
    let norm_len = n * h * call.dk;
    let states_len = units * call.dk * call.dv;
    let rows = bsz * h * s_total;
    let mut s = String::from("#include \"kernel.hip\"\n#include <cstdio>\n#include <vector>\n\n");
    s += "template <class T> static void rd(FILE* f, std::vector<T>& v) { if (fread(v.data(), sizeof(T), v.size(), f) != v.size()) abort(); }\n";
    s += "template <class T> static void wr(FILE* f, const std::vector<T>& v) { fwrite(v.data(), sizeof(T), v.size(), f); }\n";
    s += "int main() {\n    FILE* f = fopen(\"in.bin\", \"rb\");\n";
    let _ = writeln!(
        s,
        "    std::vector<unsigned short> q({q_len}), k({q_len}), v({v_len}), dout_({v_len});\n    rd(f, q); rd(f, k); rd(f, v);"
    );
    for (i, len) in custom_lens.iter().enumerate() {
        let _ = writeln!(
            s,
            "    std::vector<float> c{i}({len}), g{i}({len}, 0.0f); rd(f, c{i});"
        );
    }
    let _ = writeln!(
        s,
        "    std::vector<float> state_in({state_len}), d_fin({state_len}), d_state_in({state_len}, -12345.0f);"
    );
    let _ = writeln!(
        s,
        "    std::vector<float> norm_in({norm_len}), d_norm_fin({norm_len}), d_norm_in({norm_len}, -12345.0f);"
    );
    if call.initial {
        s += "    rd(f, state_in);\n";
        if b.normalized {
            s += "    rd(f, norm_in);\n";
        }
    }
    let _ = writeln!(
        s,
        "    std::vector<int> cu({}); rd(f, cu);\n    rd(f, dout_);",
        2 * (n + 1)
    );
    if call.initial {
        s += "    rd(f, d_fin);\n";
        if b.normalized {
            s += "    rd(f, d_norm_fin);\n";
        }
    }
    s += "    fclose(f);\n";
    // dlog: a log decay gradient per step, or per step and key.
    let dlog_len = if b.per_key { rows * call.dk } else { rows };
    let _ = writeln!(
        s,
        "    std::vector<unsigned short> states({states_len}, 0xffff), dstates({states_len}, 0xffff), dq_({q_len}, 0xffff), dk_({q_len}, 0xffff), dv_({v_len}, 0xffff);\n    std::vector<float> dlog({dlog_len}, 0.0f);"
    );
    // The normaliser's workspaces (unused without one).
    let _ = writeln!(
        s,
        "    std::vector<float> norm_states({}, -12345.0f), dnorm_states({}, -12345.0f), row_n({rows}, -12345.0f), dn({rows}, -12345.0f);\n    std::vector<unsigned short> o_raw({v_len}, 0xffff), dob({v_len}, 0xffff);",
        units * call.dk,
        units * call.dk
    );
    let custom_index = |c: &str| {
        b.args
            .iter()
            .filter_map(|a| match a {
                ArgKind::Custom(name) => Some(name.as_str()),
                _ => None,
            })
            .position(|x| x == c)
            .expect("custom input")
    };
    let bind = |args: &[ArgKind]| -> String {
        args.iter()
            .map(|a| match a {
                ArgKind::Tensor("do") => "dout_.data()".to_string(),
                ArgKind::Tensor("o") => "o_raw.data()".to_string(),
                ArgKind::Tensor(t @ ("dq" | "dk" | "dv")) => format!("{t}_.data()"),
                ArgKind::Tensor(t) => format!("{t}.data()"),
                ArgKind::Custom(c) => format!("c{}.data()", custom_index(c)),
                ArgKind::CustomGrad(c) => format!("g{}.data()", custom_index(c)),
                ArgKind::State("state_in") if call.initial => "state_in.data()".into(),
                ArgKind::State("d_state_out") if call.initial => "d_fin.data()".into(),
                ArgKind::State("norm_in") if call.initial => "norm_in.data()".into(),
                ArgKind::State("d_norm_out") if call.initial => "d_norm_fin.data()".into(),
                ArgKind::State(st @ ("d_state_in" | "d_norm_in")) => format!("{st}.data()"),
                ArgKind::State(_) => "nullptr".into(),
                ArgKind::Workspace(w) => format!("{w}.data()"),
                ArgKind::CuSeqlens if call.packed => "cu.data()".into(),
                ArgKind::CuSeqlens => "nullptr".into(),
                ArgKind::Size(Axis::B) => n.to_string(),
                ArgKind::Size(Axis::H) => h.to_string(),
                ArgKind::Size(Axis::S) => s_total.to_string(),
                other => panic!("the recurrent backward takes no {other:?}"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    match stage {
        Stage::States => {
            let st = &b.states;
            let (gx, gy, gz) = st.grid_for(n, h).expect("grid");
            let _ = writeln!(
                s,
                "    aec_emu::launch({gx}, {gy}, {gz}, {}, [&] {{ {}({}); }});",
                st.threads,
                st.name,
                bind(&st.args)
            );
            s += "    FILE* g = fopen(\"states.bin\", \"wb\");\n    wr(g, states); wr(g, norm_states); wr(g, o_raw); wr(g, row_n);\n    fclose(g);\n";
        }
        Stage::Backward => {
            s += "    FILE* st = fopen(\"../states/states.bin\", \"rb\");\n    rd(st, states); rd(st, norm_states); rd(st, o_raw); rd(st, row_n);\n    fclose(st);\n";
            for k in &b.kernels {
                let gx = k.grid_x.extent(call.dv as u32, max_len, b.config.chunk);
                let _ = writeln!(
                    s,
                    "    aec_emu::launch({gx}, {h}, {n}, {}, [&] {{ {}({}); }});",
                    k.threads,
                    k.name,
                    bind(&b.args)
                );
            }
            s += "    FILE* g = fopen(\"out.bin\", \"wb\");\n    wr(g, dq_); wr(g, dk_); wr(g, dv_); wr(g, d_state_in);\n";
            if b.normalized {
                s += "    wr(g, d_norm_in);\n";
            }
            for i in 0..custom_lens.len() {
                let _ = writeln!(s, "    wr(g, g{i});");
            }
            s += "    fclose(g);\n";
        }
    }
    s += "    return 0;\n}\n";
    s
}

/// Runs the HIP recurrent backward of `examples/<name>.rs` (its states pass,
/// then `_dstate`, `_dqk`, `_dv` and `_decay`) on the emulator and compares
/// every gradient with the reference's, sequence by sequence: dq, dk, dv,
/// the custom inputs' (summed over the sequences where an input is per
/// head) and, with an initial state, the initial state's, for the output
/// gradient `do` and (then) a final state gradient.
fn check_backward(name: &str, call: &Call) {
    let Some(cxx) = cxx() else { return };
    let def: Variant = common::example(name);
    let kind = ForwardKind::of(&def);
    let (dk, dv) = (call.dk as u32, call.dv as u32);
    let cfg = HipRecurrentConfig::default_for(dk, dv, kind, Elem::Bf16);
    let b = hip_recurrent_backward(&def, dk, dv, &cfg, Gfx::Gfx90a, HipPrelude::CpuEmulation)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut rng = common::rng(name.bytes().map(u64::from).sum::<u64>() + 7 * call.dk as u64);
    let inputs = RandomInputs::new(&def, call, &mut rng);
    let (n, h) = (call.seqs(), call.heads);
    let o_shape: Vec<usize> = def.v.axes.iter().map(|a| call.size(*a)).collect();
    let d_o = bf16_tensor(o_shape, &mut rng);
    let d_fin = call
        .initial
        .then(|| f32_tensor(vec![n, h, call.dk, call.dv], &mut rng, -1.0, 1.0));
    let d_norm_fin = (call.initial && b.normalized)
        .then(|| f32_tensor(vec![n, h, call.dk], &mut rng, -1.0, 1.0));

    // cu_seqlens: the boundaries, then each sequence's first chunk.
    let chunk = cfg.chunk as usize;
    let (mut cu, mut first) = (vec![0i32], vec![0i32]);
    for &l in &call.lengths {
        cu.push(cu.last().unwrap() + l as i32);
        first.push(first.last().unwrap() + l.div_ceil(chunk) as i32);
    }
    let max_len = *call.lengths.iter().max().unwrap();
    let units = if call.packed {
        *first.last().unwrap() as usize * h
    } else {
        n * h * max_len.div_ceil(chunk)
    };
    let mut input = inputs.bytes();
    for x in cu.iter().chain(&first) {
        input.extend(x.to_le_bytes());
    }
    input.extend(d_o.0.iter().flat_map(|x| x.to_le_bytes()));
    for (host, _) in d_fin.iter().chain(&d_norm_fin) {
        input.extend(host.iter().flat_map(|x| x.to_le_bytes()));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    for (stage, sub, source) in [
        (Stage::States, "states", &b.states.source),
        (Stage::Backward, "bwd", &b.source),
    ] {
        let d = dir.path().join(sub);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("kernel.hip"), source).unwrap();
        std::fs::write(d.join("in.bin"), &input).unwrap();
        let drv = backward_driver(stage, &b, call, &inputs.custom_lens(), units, max_len);
        std::fs::write(d.join("driver.cpp"), drv).unwrap();
        build_and_run(&cxx, &d, &format!("{name} ({sub})"));
    }
    let mut out = OutFile::read(&dir.path().join("bwd/out.bin"));
    let (q_len, v_len) = (inputs.q.0.len(), inputs.v.0.len());
    let state_len = n * h * call.dk * call.dv;
    let got_dq = out.bf16(q_len);
    let got_dk = out.bf16(q_len);
    let got_dv = out.bf16(v_len);
    let got_ds = out.f32(state_len);
    let norm_len = n * h * call.dk;
    let got_dz = b.normalized.then(|| out.f32(norm_len));
    let got_customs: Vec<Vec<f64>> = inputs
        .custom_lens()
        .iter()
        .map(|&len| out.f32(len))
        .collect();
    assert_eq!(out.left(), 0, "{name}: out.bin has bytes left unread");

    // The reference, one sequence at a time, added back into the batch's gradients.
    let mut want_dq = vec![0.0; q_len];
    let mut want_dk = vec![0.0; q_len];
    let mut want_dv = vec![0.0; v_len];
    let mut want_ds = vec![0.0; state_len];
    let mut want_dz = vec![0.0; norm_len];
    let mut want_customs: Vec<Vec<f64>> =
        inputs.custom_lens().iter().map(|&l| vec![0.0; l]).collect();
    let state_axes = [Axis::B, Axis::H, Axis::Dk, Axis::Dv];
    for s in 0..n {
        let (item, range) = call.steps_of(s);
        let seq = inputs.sequence(&def, call, s);
        let d_o_seq = cut(&d_o.1, &def.v.axes, item, &range);
        let d_fin_seq = d_fin.as_ref().map(|(_, t)| leading(t, s));
        let d_norm_fin_seq = d_norm_fin.as_ref().map(|(_, t)| leading(t, s));
        let g = reference::recurrent_backward(
            &def,
            &seq,
            &d_o_seq,
            d_fin_seq.as_ref(),
            d_norm_fin_seq.as_ref(),
        )
        .expect("reference backward");
        add_back(
            &mut want_dq,
            &inputs.q.1.shape,
            &def.q.axes,
            item,
            &range,
            &g.dq,
        );
        add_back(
            &mut want_dk,
            &inputs.k.1.shape,
            &def.k.axes,
            item,
            &range,
            &g.dk,
        );
        add_back(
            &mut want_dv,
            &inputs.v.1.shape,
            &def.v.axes,
            item,
            &range,
            &g.dv,
        );
        for (i, (cname, axes, (_, t))) in inputs.customs.iter().enumerate() {
            let part = g
                .customs
                .get(cname)
                .unwrap_or_else(|| panic!("{name}: no reference gradient for `{cname}`"));
            add_back(&mut want_customs[i], &t.shape, axes, item, &range, part);
        }
        if let Some(ds) = &g.initial_state {
            add_back(
                &mut want_ds,
                &[n, h, call.dk, call.dv],
                &state_axes,
                s,
                &(0..0),
                ds,
            );
        }
        if let Some(dz) = &g.initial_normalizer {
            add_back(
                &mut want_dz,
                &[n, h, call.dk],
                &state_axes[..3],
                s,
                &(0..0),
                dz,
            );
        }
    }
    let mut rows: Vec<(String, f64, f64)> = vec![
        ("dq".into(), rel_err(&got_dq, &want_dq), 2e-2),
        ("dk".into(), rel_err(&got_dk, &want_dk), 2e-2),
        ("dv".into(), rel_err(&got_dv, &want_dv), 2e-2),
    ];
    if call.initial {
        rows.push(("d_initial_state".into(), rel_err(&got_ds, &want_ds), 2e-2));
        if let Some(dz) = &got_dz {
            rows.push(("d_initial_normaliser".into(), rel_err(dz, &want_dz), 2e-2));
        }
    }
    for (i, (cname, _, _)) in inputs.customs.iter().enumerate() {
        // A custom input's gradient sums over steps through the decay's
        // reverse running sum, whose terms cancel (as on the GPU).
        rows.push((
            format!("d{cname}"),
            rel_err(&got_customs[i], &want_customs[i]),
            8e-2,
        ));
    }
    for (what, w) in [("dq", &want_dq), ("dk", &want_dk), ("dv", &want_dv)] {
        assert!(
            w.iter().map(|x| x * x).sum::<f64>() > 0.0,
            "{name}: the reference {what} is all zeros, the comparison would prove nothing"
        );
    }
    let report = format!(
        "{name} {} ({} sequences of {:?}{}{}, Dk {} Dv {}): {}",
        b.name,
        n,
        call.lengths,
        if call.packed { ", packed" } else { "" },
        if call.initial { ", initial state" } else { "" },
        call.dk,
        call.dv,
        rows.iter()
            .map(|(w, e, _)| format!("{w} {e:.2e}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!("{report}");
    for (what, e, tol) in &rows {
        assert!(e.is_finite() && e < tol, "{what} over {tol}: {report}");
    }
}

#[test]
fn emulated_backward_retnet_recurrent() {
    // Dv 96: two-wave _dstate slices; 150 steps: a partial third chunk.
    check_backward("retnet_recurrent", &batch(2, 2, 150, 64, 96, true));
}

#[test]
fn emulated_backward_gated_retention() {
    check_backward("gated_retention", &batch(2, 1, 100, 128, 64, false));
}

#[test]
fn emulated_backward_mamba2() {
    check_backward("mamba2", &batch(2, 2, 77, 32, 64, true));
}

#[test]
fn emulated_backward_rfa_normaliser() {
    // The normaliser: _pre, the key sum's gradient through _dstate and _dqk.
    check_backward("rfa", &batch(2, 2, 130, 32, 64, true));
}

#[test]
fn emulated_backward_gla_per_key_decay() {
    // Dk 128 in four 32-key _dqk slices; 90 steps: a partial second chunk.
    check_backward("gla", &batch(1, 2, 90, 128, 64, true));
}

#[test]
fn emulated_backward_dk_256_and_packed_sequences() {
    check_backward("retnet_recurrent", &batch(1, 1, 70, 256, 64, true));
    let call = Call {
        heads: 2,
        lengths: vec![37, 1, 100],
        packed: true,
        dk: 32,
        dv: 32,
        initial: true,
        custom_range: common::recurrent_custom_range,
    };
    check_backward("mamba2", &call);
    // GLA at Dk 256 takes 32-step chunks; RFA packed, each sequence from its own state.
    check_backward("gla", &batch(1, 1, 45, 256, 64, true));
    check_backward("rfa", &call);
}
