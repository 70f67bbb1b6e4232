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
use aec::compiler::{ArgKind, Elem, ForwardKind, RecurrentSource};
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
/// (an axis B becomes 1, an axis S the range's length).
fn cut(t: &Tensor, axes: &[Axis], item: usize, range: &std::ops::Range<usize>) -> Tensor {
    let shape: Vec<usize> = axes
        .iter()
        .zip(&t.shape)
        .map(|(a, &n)| match a {
            Axis::B => 1,
            Axis::S => range.len(),
            _ => n,
        })
        .collect();
    // Each index of the result, read from the source at the same index
    // shifted to `item` along B and to `range` along S.
    let data = (0..shape.iter().product::<usize>())
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
                stride *= t.shape[i];
            }
            t.data[at]
        })
        .collect();
    Tensor { shape, data }
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

    // Random inputs: bf16 q, k, v; customs in their ranges; initial states.
    let mut rng = common::rng(name.bytes().map(u64::from).sum::<u64>() + call.dk as u64);
    let bf16_tensor = |axes: &[Axis], rng: &mut rand::rngs::StdRng| {
        let shape: Vec<usize> = axes.iter().map(|a| call.size(*a)).collect();
        let host: Vec<u16> = (0..shape.iter().product::<usize>())
            .map(|_| bf16::from_f64(normal(rng)).to_bits())
            .collect();
        let data = host.iter().map(|&b| bf16::from_bits(b).to_f64()).collect();
        (host, Tensor { shape, data })
    };
    let (q, q_ref) = bf16_tensor(&def.q.axes, &mut rng);
    let (kk, k_ref) = bf16_tensor(&def.k.axes, &mut rng);
    let (v, v_ref) = bf16_tensor(&def.v.axes, &mut rng);
    let f32_tensor = |shape: Vec<usize>, rng: &mut rand::rngs::StdRng, lo: f64, hi: f64| {
        let host: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| rng.random_range(lo..hi) as f32)
            .collect();
        let data = host.iter().map(|&x| f64::from(x)).collect();
        (host, Tensor { shape, data })
    };
    let mut customs = Vec::new();
    for c in &def.customs {
        let (lo, hi) = common::recurrent_custom_range(&c.name);
        let shape = c.axes.iter().map(|a| call.size(*a)).collect();
        customs.push((
            c.name.clone(),
            c.axes.clone(),
            f32_tensor(shape, &mut rng, lo, hi),
        ));
    }
    let (n, h) = (call.seqs(), call.heads);
    let state = call
        .initial
        .then(|| f32_tensor(vec![n, h, call.dk, call.dv], &mut rng, -1.0, 1.0));
    let norm =
        (call.initial && normalized).then(|| f32_tensor(vec![n, h, call.dk], &mut rng, 0.5, 2.0));
    let mut cu: Vec<i32> = vec![0];
    for l in &call.lengths {
        cu.push(cu.last().unwrap() + *l as i32);
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let p = |f: &str| dir.path().join(f);
    std::fs::write(p("kernel.hip"), &k.source).unwrap();
    let mut input: Vec<u8> = Vec::new();
    for t in [&q, &kk, &v] {
        input.extend(t.iter().flat_map(|x| x.to_le_bytes()));
    }
    for (_, _, (host, _)) in &customs {
        input.extend(host.iter().flat_map(|x| x.to_le_bytes()));
    }
    for (host, _) in state.iter().chain(&norm) {
        input.extend(host.iter().flat_map(|x| x.to_le_bytes()));
    }
    input.extend(cu.iter().flat_map(|x| x.to_le_bytes()));
    std::fs::write(p("in.bin"), input).unwrap();
    let o_len = v.len();
    let state_len = n * h * call.dk * call.dv;
    std::fs::write(
        p("driver.cpp"),
        driver(
            &k,
            call,
            &customs
                .iter()
                .map(|(_, _, (h, _))| h.len())
                .collect::<Vec<_>>(),
            normalized,
        ),
    )
    .unwrap();
    build_and_run(&cxx, dir.path(), name);
    let out = std::fs::read(p("out.bin")).unwrap();
    let o: Vec<f64> = out[..2 * o_len]
        .chunks(2)
        .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64())
        .collect();
    let f32s = |bytes: &[u8]| -> Vec<f64> {
        bytes
            .chunks(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect()
    };
    let st = f32s(&out[2 * o_len..2 * o_len + 4 * state_len]);
    let z = normalized.then(|| f32s(&out[2 * o_len + 4 * state_len..]));
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
        let mut inputs = Inputs {
            q: cut(&q_ref, &def.q.axes, item, &range),
            k: cut(&k_ref, &def.k.axes, item, &range),
            v: cut(&v_ref, &def.v.axes, item, &range),
            customs: Default::default(),
            initial_state: None,
            initial_normalizer: None,
        };
        for (cname, axes, (_, t)) in &customs {
            inputs
                .customs
                .insert(cname.clone(), cut(t, axes, item, &range));
        }
        let leading = |t: &Tensor| {
            cut(
                t,
                &[Axis::B, Axis::H, Axis::Dk, Axis::Dv][..t.shape.len()],
                s,
                &(0..0),
            )
        };
        inputs.initial_state = state.as_ref().map(|(_, t)| leading(t));
        inputs.initial_normalizer = norm.as_ref().map(|(_, t)| leading(t));
        let fwd = reference::forward(&def, &inputs, Options::default()).expect("reference");
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
        };
        check(name, &call, |_| {});
    }
}
