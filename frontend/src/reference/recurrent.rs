//! The recurrent pattern, naively, in two independent forms:
//!
//! - step by step: `S_t = diag(g_t) S_{t-1} + k_t ⊗ v_t`, `o_t = q_t · S_t`
//!   (and, with `normalize`, `z_t = g_t ⊙ z_{t-1} + k_t`, `n_t = q_t · z_t`);
//! - parallel: `o_t = Σ_{s≤t} Σ_d q_td k_sd Π_{r=s+1..t} g_rd v_s` (the masked
//!   decay matrix), plus the decayed initial state.
//!
//! `q, k, v` are the modified ones and `g` the decay (1 without one). The
//! backward runs the recurrence in reverse (back-propagation through time).

use super::eval::eval_scalar_with;
use super::tensor::for_each_index;
use super::{
    Forward, Gradients, Inputs, Point, Sizes, Tensor, accumulate_customs, gather_value, leaf_value,
    modification_backward, zero_custom_grads,
};
use crate::ir::{Axis, Op, ParamRole, Region};
use crate::variant::{Recurrent, Variant};
use indexmap::IndexMap;

struct Prepared {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// `[B, H, S, Dk]`: the decay per key dimension (a scalar decay repeated).
    g: Tensor,
}

fn point(b: usize, h: usize, t: usize) -> Point {
    Point::default()
        .with(Axis::B, b)
        .with(Axis::H, h)
        .with(Axis::S, t)
}

fn modified(
    region: Option<&Region>,
    t: &Tensor,
    last: Axis,
    variant: &Variant,
    inputs: &Inputs,
    sizes: &Sizes,
) -> Tensor {
    let Some(r) = region else { return t.clone() };
    Tensor::from_fn(&t.shape, |idx| {
        let p = point(idx[0], idx[1], idx[2]).with(last, idx[3]);
        eval_scalar_with(
            r,
            &mut |op| match op {
                Op::Param(_) => t.get(idx),
                other => leaf_value(other, &p, sizes, variant, inputs),
            },
            &mut |c, idx| gather_value(c, idx, &p, variant, inputs),
        )[0]
    })
}

fn prepare(rec: &Recurrent, variant: &Variant, inputs: &Inputs, sizes: &Sizes) -> Prepared {
    let shape = [
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::S),
        sizes.get(Axis::Dk),
    ];
    let g = match &rec.decay {
        None => Tensor::from_fn(&shape, |_| 1.0),
        Some(d) => Tensor::from_fn(&shape, |idx| {
            let p = point(idx[0], idx[1], idx[2]).with(Axis::Dk, idx[3]);
            eval_scalar_with(
                &d.region,
                &mut |op| leaf_value(op, &p, sizes, variant, inputs),
                &mut |c, idx| gather_value(c, idx, &p, variant, inputs),
            )[0]
        }),
    };
    Prepared {
        q: modified(
            rec.modify_q.as_ref(),
            &inputs.q,
            Axis::Dk,
            variant,
            inputs,
            sizes,
        ),
        k: modified(
            rec.modify_k.as_ref(),
            &inputs.k,
            Axis::Dk,
            variant,
            inputs,
            sizes,
        ),
        v: modified(
            rec.modify_v.as_ref(),
            &inputs.v,
            Axis::Dv,
            variant,
            inputs,
            sizes,
        ),
        g,
    }
}

fn normalized(
    rec: &Recurrent,
    o: f64,
    n: f64,
    p: &Point,
    variant: &Variant,
    inputs: &Inputs,
    sizes: &Sizes,
) -> f64 {
    match &rec.normalize {
        None => o,
        Some(r) => eval_scalar_with(
            r,
            &mut |op| match op {
                Op::Param(k) => match r.params[*k as usize].role {
                    ParamRole::Element => o,
                    _ => n,
                },
                other => leaf_value(other, p, sizes, variant, inputs),
            },
            &mut |c, idx| gather_value(c, idx, p, variant, inputs),
        )[0],
    }
}

/// All hidden states `S_0 … S_T` and key sums `z_0 … z_T` of one head.
struct Trajectory {
    s: Vec<Vec<f64>>,
    z: Vec<Vec<f64>>,
}

fn run(prep: &Prepared, inputs: &Inputs, b: usize, h: usize, sizes: &Sizes) -> Trajectory {
    let (sl, dk, dv) = (sizes.get(Axis::S), sizes.get(Axis::Dk), sizes.get(Axis::Dv));
    let s0 = match &inputs.initial_state {
        Some(st) => (0..dk * dv)
            .map(|x| st.get(&[b, h, x / dv, x % dv]))
            .collect(),
        None => vec![0.0; dk * dv],
    };
    let z0 = match &inputs.initial_normalizer {
        Some(z) => (0..dk).map(|d| z.get(&[b, h, d])).collect(),
        None => vec![0.0; dk],
    };
    let mut traj = Trajectory {
        s: vec![s0],
        z: vec![z0],
    };
    for t in 0..sl {
        let (prev_s, prev_z) = (traj.s.last().expect("s0"), traj.z.last().expect("z0"));
        let mut s = vec![0.0; dk * dv];
        let mut z = vec![0.0; dk];
        for d in 0..dk {
            let g = prep.g.get(&[b, h, t, d]);
            let kd = prep.k.get(&[b, h, t, d]);
            for e in 0..dv {
                s[d * dv + e] = g * prev_s[d * dv + e] + kd * prep.v.get(&[b, h, t, e]);
            }
            z[d] = g * prev_z[d] + kd;
        }
        traj.s.push(s);
        traj.z.push(z);
    }
    traj
}

pub fn forward(variant: &Variant, inputs: &Inputs, sizes: &Sizes) -> Forward {
    let rec = variant.recurrent().expect("recurrent variant");
    let prep = prepare(rec, variant, inputs, sizes);
    let (b_n, h_n, sl, dk, dv) = (
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::S),
        sizes.get(Axis::Dk),
        sizes.get(Axis::Dv),
    );
    let mut o = Tensor::zeros(&[b_n, h_n, sl, dv]);
    let mut fin = Tensor::zeros(&[b_n, h_n, dk, dv]);
    let mut fin_z = Tensor::zeros(&[b_n, h_n, dk]);
    for b in 0..b_n {
        for h in 0..h_n {
            let traj = run(&prep, inputs, b, h, sizes);
            for t in 0..sl {
                let (s, z) = (&traj.s[t + 1], &traj.z[t + 1]);
                let n: f64 = (0..dk).map(|d| prep.q.get(&[b, h, t, d]) * z[d]).sum();
                for e in 0..dv {
                    let ot: f64 = (0..dk)
                        .map(|d| prep.q.get(&[b, h, t, d]) * s[d * dv + e])
                        .sum();
                    let p = point(b, h, t).with(Axis::Dv, e);
                    o.set(
                        &[b, h, t, e],
                        normalized(rec, ot, n, &p, variant, inputs, sizes),
                    );
                }
            }
            let last = traj.s.last().expect("states");
            for (x, &value) in last.iter().enumerate() {
                fin.set(&[b, h, x / dv, x % dv], value);
            }
            for (d, &value) in traj.z.last().expect("key sums").iter().enumerate() {
                fin_z.set(&[b, h, d], value);
            }
        }
    }
    Forward {
        o,
        scales: IndexMap::new(),
        row_state: IndexMap::new(),
        final_state: Some(fin),
        final_normalizer: rec.normalize.as_ref().map(|_| fin_z),
    }
}

/// The output through the parallel (masked decay matrix) form.
pub fn forward_parallel_form(
    variant: &Variant,
    inputs: &Inputs,
) -> Result<Tensor, super::ShapeError> {
    let sizes = &Sizes::bind(variant, inputs)?;
    let rec = variant.recurrent().expect("recurrent variant");
    let prep = prepare(rec, variant, inputs, sizes);
    let (b_n, h_n, sl, dk, dv) = (
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::S),
        sizes.get(Axis::Dk),
        sizes.get(Axis::Dv),
    );
    let mut o = Tensor::zeros(&[b_n, h_n, sl, dv]);
    // Π_{r=from..=to} g_rd (1 when from > to).
    let decay = |b: usize, h: usize, from: usize, to: usize, d: usize| -> f64 {
        (from..=to)
            .map(|r| prep.g.get(&[b, h, r, d]))
            .product::<f64>()
    };
    for b in 0..b_n {
        for h in 0..h_n {
            for t in 0..sl {
                let mut row = vec![0.0; dv];
                let mut n = 0.0;
                for s in 0..=t {
                    let mut w = 0.0;
                    for d in 0..dk {
                        w += prep.q.get(&[b, h, t, d])
                            * prep.k.get(&[b, h, s, d])
                            * decay(b, h, s + 1, t, d);
                    }
                    n += w;
                    for (e, r) in row.iter_mut().enumerate() {
                        *r += w * prep.v.get(&[b, h, s, e]);
                    }
                }
                if let Some(z0) = &inputs.initial_normalizer {
                    n += (0..dk)
                        .map(|d| {
                            prep.q.get(&[b, h, t, d]) * decay(b, h, 0, t, d) * z0.get(&[b, h, d])
                        })
                        .sum::<f64>();
                }
                if let Some(st) = &inputs.initial_state {
                    for d in 0..dk {
                        let qd = prep.q.get(&[b, h, t, d]) * decay(b, h, 0, t, d);
                        for (e, r) in row.iter_mut().enumerate() {
                            *r += qd * st.get(&[b, h, d, e]);
                        }
                    }
                }
                for (e, r) in row.iter().enumerate() {
                    let p = point(b, h, t).with(Axis::Dv, e);
                    o.set(
                        &[b, h, t, e],
                        normalized(rec, *r, n, &p, variant, inputs, sizes),
                    );
                }
            }
        }
    }
    Ok(o)
}

/// Gradients of `Σ o · d_o` (plus `Σ S_T · d_final_state` and `Σ z_T ·
/// d_final_normalizer` where given: the final state's and normaliser's
/// gradients from later use).
pub fn backward(
    variant: &Variant,
    inputs: &Inputs,
    sizes: &Sizes,
    d_o: &Tensor,
    d_final_state: Option<&Tensor>,
    d_final_normalizer: Option<&Tensor>,
) -> Gradients {
    let rec = variant.recurrent().expect("recurrent variant");
    let bwd = &rec.backward;
    let prep = prepare(rec, variant, inputs, sizes);
    let (b_n, h_n, sl, dk, dv) = (
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::S),
        sizes.get(Axis::Dk),
        sizes.get(Axis::Dv),
    );
    let mut dq_m = Tensor::zeros(&prep.q.shape);
    let mut dk_m = Tensor::zeros(&prep.k.shape);
    let mut dv_m = Tensor::zeros(&prep.v.shape);
    let mut dg = Tensor::zeros(&prep.g.shape);
    let mut customs = zero_custom_grads(inputs);
    let mut d_init = inputs
        .initial_state
        .as_ref()
        .map(|s| Tensor::zeros(&s.shape));
    let mut d_init_z = inputs
        .initial_normalizer
        .as_ref()
        .map(|z| Tensor::zeros(&z.shape));
    for b in 0..b_n {
        for h in 0..h_n {
            let traj = run(&prep, inputs, b, h, sizes);
            let mut ds: Vec<f64> = match d_final_state {
                Some(t) => (0..dk * dv)
                    .map(|x| t.get(&[b, h, x / dv, x % dv]))
                    .collect(),
                None => vec![0.0; dk * dv],
            };
            let mut dz: Vec<f64> = match d_final_normalizer {
                Some(t) => (0..dk).map(|d| t.get(&[b, h, d])).collect(),
                None => vec![0.0; dk],
            };
            for t in (0..sl).rev() {
                let (s, z) = (&traj.s[t + 1], &traj.z[t + 1]);
                let q = |d: usize| prep.q.get(&[b, h, t, d]);
                let n: f64 = (0..dk).map(|d| q(d) * z[d]).sum();
                // Through `normalize`: d_o → (do, dn).
                let mut dout = vec![0.0; dv];
                let mut dn = 0.0;
                for (e, de) in dout.iter_mut().enumerate() {
                    let seed = d_o.get(&[b, h, t, e]);
                    match &bwd.normalize {
                        None => *de = seed,
                        Some(r) => {
                            let ot: f64 = (0..dk).map(|d| q(d) * s[d * dv + e]).sum();
                            let p = point(b, h, t).with(Axis::Dv, e);
                            let outs = eval_scalar_with(
                                r,
                                &mut |op| match op {
                                    Op::Param(k) => match &r.params[*k as usize].role {
                                        ParamRole::Element => ot,
                                        ParamRole::Seed(_) => seed,
                                        ParamRole::State(_) => n,
                                    },
                                    other => leaf_value(other, &p, sizes, variant, inputs),
                                },
                                &mut |c, idx| gather_value(c, idx, &p, variant, inputs),
                            );
                            *de = outs[r.outputs.iter().position(|o| o.name == "do").expect("do")];
                            dn += outs[r.outputs.iter().position(|o| o.name == "dn").expect("dn")];
                            accumulate_customs(r, &outs, &p, variant, &mut customs);
                        }
                    }
                }
                for d in 0..dk {
                    for e in 0..dv {
                        ds[d * dv + e] += q(d) * dout[e];
                    }
                    dz[d] += q(d) * dn;
                }
                for d in 0..dk {
                    let dqd: f64 =
                        (0..dv).map(|e| s[d * dv + e] * dout[e]).sum::<f64>() + z[d] * dn;
                    dq_m.add(&[b, h, t, d], dqd);
                    let dkd: f64 = (0..dv)
                        .map(|e| ds[d * dv + e] * prep.v.get(&[b, h, t, e]))
                        .sum::<f64>()
                        + dz[d];
                    dk_m.add(&[b, h, t, d], dkd);
                }
                for e in 0..dv {
                    let dve: f64 = (0..dk)
                        .map(|d| ds[d * dv + e] * prep.k.get(&[b, h, t, d]))
                        .sum();
                    dv_m.add(&[b, h, t, e], dve);
                }
                let (ps, pz) = (&traj.s[t], &traj.z[t]);
                for d in 0..dk {
                    let g = prep.g.get(&[b, h, t, d]);
                    let dgd: f64 = (0..dv)
                        .map(|e| ps[d * dv + e] * ds[d * dv + e])
                        .sum::<f64>()
                        + pz[d] * dz[d];
                    dg.add(&[b, h, t, d], dgd);
                    for e in 0..dv {
                        ds[d * dv + e] *= g;
                    }
                    dz[d] *= g;
                }
            }
            if let Some(di) = d_init.as_mut() {
                for (x, &value) in ds.iter().enumerate() {
                    di.set(&[b, h, x / dv, x % dv], value);
                }
            }
            if let Some(dz0) = d_init_z.as_mut() {
                for (d, &value) in dz.iter().enumerate() {
                    dz0.set(&[b, h, d], value);
                }
            }
        }
    }
    if let (Some(r), Some(decay)) = (&bwd.decay, &rec.decay) {
        let shape = if decay.per_key_dim {
            dg.shape.clone()
        } else {
            dg.shape[..3].to_vec()
        };
        for_each_index(&shape, |idx| {
            let mut p = point(idx[0], idx[1], idx[2]);
            let seed = if decay.per_key_dim {
                p = p.with(Axis::Dk, idx[3]);
                dg.get(idx)
            } else {
                (0..dk).map(|d| dg.get(&[idx[0], idx[1], idx[2], d])).sum()
            };
            let outs = eval_scalar_with(
                r,
                &mut |op| match op {
                    Op::Param(_) => seed,
                    other => leaf_value(other, &p, sizes, variant, inputs),
                },
                &mut |c, idx| gather_value(c, idx, &p, variant, inputs),
            );
            accumulate_customs(r, &outs, &p, variant, &mut customs);
        });
    }
    let mb = |r: Option<&Region>,
              x: &Tensor,
              dx: &Tensor,
              last,
              customs: &mut IndexMap<String, Tensor>| {
        modification_backward(
            r,
            x,
            dx,
            [Axis::B, Axis::H, Axis::S, last],
            sizes,
            variant,
            inputs,
            customs,
        )
    };
    let dq = mb(
        bwd.modify_q.as_ref(),
        &inputs.q,
        &dq_m,
        Axis::Dk,
        &mut customs,
    );
    let dk_t = mb(
        bwd.modify_k.as_ref(),
        &inputs.k,
        &dk_m,
        Axis::Dk,
        &mut customs,
    );
    let dv_t = mb(
        bwd.modify_v.as_ref(),
        &inputs.v,
        &dv_m,
        Axis::Dv,
        &mut customs,
    );
    Gradients {
        dq,
        dk: dk_t,
        dv: dv_t,
        customs,
        initial_state: d_init,
        initial_normalizer: d_init_z,
    }
}
