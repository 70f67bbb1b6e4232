//! The parallel pattern, naively: per query row, all scores, the user's online
//! normalisation over KV blocks, the epilogue; and the backward through the
//! derived regions.

use super::eval::{eval_region, eval_scalar_with};
use super::{
    Forward, Gradients, Inputs, KeyRule, Options, Point, Sizes, Tensor, accumulate_customs,
    gather_value, leaf_value, modification_backward, zero_custom_grads,
};
use crate::ir::{Axis, Op, ParamRole, Region};
use crate::variant::{Parallel, Variant};
use indexmap::IndexMap;

/// Applies an optional elementwise modification to every element of `t`,
/// whose axes are `axes`.
fn modified(
    region: Option<&Region>,
    t: &Tensor,
    axes: [Axis; 4],
    variant: &Variant,
    inputs: &Inputs,
    sizes: &Sizes,
) -> Tensor {
    let Some(r) = region else { return t.clone() };
    Tensor::from_fn(&t.shape, |idx| {
        let p = point4(axes, idx);
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

fn point4(axes: [Axis; 4], idx: &[usize]) -> Point {
    axes.iter()
        .zip(idx)
        .fold(Point::default(), |p, (a, i)| p.with(*a, *i))
}

/// The modified q, k, v of a call.
struct Prepared {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: usize,
}

fn prepare(par: &Parallel, variant: &Variant, inputs: &Inputs, sizes: &Sizes) -> Prepared {
    let hk = par.kv_heads;
    Prepared {
        q: modified(
            par.modify_q.as_ref(),
            &inputs.q,
            [Axis::B, Axis::H, Axis::Sq, Axis::Dqk],
            variant,
            inputs,
            sizes,
        ),
        k: modified(
            par.modify_k.as_ref(),
            &inputs.k,
            [Axis::B, hk, Axis::Skv, Axis::Dqk],
            variant,
            inputs,
            sizes,
        ),
        v: modified(
            par.modify_v.as_ref(),
            &inputs.v,
            [Axis::B, hk, Axis::Skv, Axis::Dv],
            variant,
            inputs,
            sizes,
        ),
        group: sizes.get(Axis::H) / sizes.get(Axis::Hkv),
    }
}

/// The scores of one row: raw (before `modify_scores`), modified, and whether
/// each key is visible.
struct RowScores {
    raw: Vec<f64>,
    s: Vec<f64>,
    visible: Vec<bool>,
}

fn row_scores(
    par: &Parallel,
    prep: &Prepared,
    p: Point,
    variant: &Variant,
    inputs: &Inputs,
    sizes: &Sizes,
) -> RowScores {
    let (b, h, i) = (p.at(Axis::B), p.at(Axis::H), p.at(Axis::Sq));
    let hk = h / prep.group;
    let (skv, dqk) = (sizes.get(Axis::Skv), sizes.get(Axis::Dqk));
    let mut row = RowScores {
        raw: Vec::with_capacity(skv),
        s: Vec::with_capacity(skv),
        visible: Vec::with_capacity(skv),
    };
    for j in 0..skv {
        let pj = p.with(Axis::Skv, j);
        let raw: f64 = (0..dqk)
            .map(|d| prep.q.get(&[b, h, i, d]) * prep.k.get(&[b, hk, j, d]))
            .sum();
        let s = match &par.modify_scores {
            Some(r) => eval_scalar_with(
                r,
                &mut |op| match op {
                    Op::Param(_) => raw,
                    other => leaf_value(other, &pj, sizes, variant, inputs),
                },
                &mut |c, idx| gather_value(c, idx, &pj, variant, inputs),
            )[0],
            None => raw,
        };
        let visible = match &par.mask {
            Some(r) => {
                eval_scalar_with(
                    r,
                    &mut |op| leaf_value(op, &pj, sizes, variant, inputs),
                    &mut |c, idx| gather_value(c, idx, &pj, variant, inputs),
                )[0] != 0.0
            }
            None => true,
        };
        row.raw.push(raw);
        row.s.push(s);
        row.visible.push(visible);
    }
    row
}

fn state_of(region: &Region, state: &[f64], fields: &[String], p: u32) -> f64 {
    match &region.params[p as usize].role {
        ParamRole::State(f) => state[fields.iter().position(|x| x == f).expect("declared field")],
        other => unreachable!("not a state param: {other:?}"),
    }
}

fn broadcast(v: Vec<f64>, len: usize) -> Vec<f64> {
    if v.len() == len { v } else { vec![v[0]; len] }
}

pub fn forward(variant: &Variant, inputs: &Inputs, sizes: &Sizes, opts: Options) -> Forward {
    forward_with_rule(variant, inputs, sizes, opts, &|_, _, _, _| KeyRule::Masked)
}

/// [`forward`] with `rule(b, h, i, j)` deciding, before the variant's mask,
/// whether score (i, j) is hidden, left to the mask, or shown regardless.
pub fn forward_with_rule(
    variant: &Variant,
    inputs: &Inputs,
    sizes: &Sizes,
    opts: Options,
    rule: &dyn Fn(usize, usize, usize, usize) -> KeyRule,
) -> Forward {
    let par = variant.parallel().expect("parallel variant");
    let prep = prepare(par, variant, inputs, sizes);
    let online = &par.online;
    let fields: Vec<String> = online.state.iter().map(|f| f.name.clone()).collect();
    let (b_n, h_n, sq, skv, dv) = (
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::Sq),
        sizes.get(Axis::Skv),
        sizes.get(Axis::Dv),
    );
    let block = opts.block.unwrap_or(skv).max(1);
    let mut o = Tensor::zeros(&[b_n, h_n, sq, dv]);
    let mut scales: IndexMap<String, Tensor> = online
        .scales
        .iter()
        .map(|s| (s.clone(), Tensor::zeros(&[b_n, h_n, sq])))
        .collect();
    let mut row_state: IndexMap<String, Tensor> = fields
        .iter()
        .map(|f| (f.clone(), Tensor::zeros(&[b_n, h_n, sq])))
        .collect();
    let fwd_state_out: Vec<usize> = fields
        .iter()
        .map(|f| {
            online
                .fwd
                .outputs
                .iter()
                .position(|o| o.name == format!("state.{f}"))
                .expect("state output")
        })
        .collect();
    let alpha_out = online
        .fwd
        .outputs
        .iter()
        .position(|o| o.name == "alpha")
        .expect("alpha output");
    for b in 0..b_n {
        for h in 0..h_n {
            let hk = h / prep.group;
            for i in 0..sq {
                let p = Point::default()
                    .with(Axis::B, b)
                    .with(Axis::H, h)
                    .with(Axis::Sq, i);
                let mut row = row_scores(par, &prep, p, variant, inputs, sizes);
                for (j, seen) in row.visible.iter_mut().enumerate() {
                    match rule(b, h, i, j) {
                        KeyRule::Hidden => *seen = false,
                        KeyRule::Masked => {}
                        KeyRule::Shown => *seen = true,
                    }
                }
                let mut state: Vec<f64> = online.state.iter().map(|f| f.init).collect();
                let mut acc = vec![0.0; dv];
                let mut any = false;
                for j0 in (0..skv).step_by(block) {
                    let js: Vec<usize> = (j0..(j0 + block).min(skv))
                        .filter(|&j| row.visible[j])
                        .collect();
                    if js.is_empty() {
                        continue;
                    }
                    any = true;
                    let svec: Vec<f64> = js.iter().map(|&j| row.s[j]).collect();
                    let outs = eval_region(&online.fwd, &mut |op| match op {
                        Op::Param(k) => match &online.fwd.params[*k as usize].role {
                            ParamRole::Element => svec.clone(),
                            _ => vec![state_of(&online.fwd, &state, &fields, *k)],
                        },
                        other => vec![leaf_value(other, &p, sizes, variant, inputs)],
                    });
                    let weights = broadcast(outs[0].clone(), js.len());
                    let alpha = outs[alpha_out][0];
                    for (e, a) in acc.iter_mut().enumerate() {
                        let add: f64 = js
                            .iter()
                            .zip(&weights)
                            .map(|(&j, w)| w * prep.v.get(&[b, hk, j, e]))
                            .sum();
                        *a = alpha * *a + add;
                    }
                    state = fwd_state_out.iter().map(|&k| outs[k][0]).collect();
                }
                for (f, t) in fields.iter().zip(&state) {
                    row_state[f].set(&[b, h, i], *t);
                }
                for (e, &acc_e) in acc.iter().enumerate() {
                    let pe = p.with(Axis::Dv, e);
                    let outs = eval_scalar_with(
                        &online.epilogue,
                        &mut |op| match op {
                            Op::Param(k) => match &online.epilogue.params[*k as usize].role {
                                ParamRole::Element => acc_e,
                                _ => state_of(&online.epilogue, &state, &fields, *k),
                            },
                            other => leaf_value(other, &pe, sizes, variant, inputs),
                        },
                        &mut |c, idx| gather_value(c, idx, &pe, variant, inputs),
                    );
                    o.set(&[b, h, i, e], if any { outs[0] } else { 0.0 });
                    if e == 0 {
                        for (name, v) in online.scales.iter().zip(&outs[1..]) {
                            scales[name].set(&[b, h, i], *v);
                        }
                    }
                }
            }
        }
    }
    Forward {
        o,
        scales,
        row_state,
        final_state: None,
        final_normalizer: None,
    }
}

pub fn backward(variant: &Variant, inputs: &Inputs, sizes: &Sizes, d_o: &Tensor) -> Gradients {
    let par = variant.parallel().expect("parallel variant");
    let bwd = &par.backward;
    let prep = prepare(par, variant, inputs, sizes);
    let fwd = forward(variant, inputs, sizes, Options::default());
    let fields: Vec<String> = par.online.state.iter().map(|f| f.name.clone()).collect();
    let hkv = par.kv_heads;
    let (b_n, h_n, sq, skv, dqk, dv) = (
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::Sq),
        sizes.get(Axis::Skv),
        sizes.get(Axis::Dqk),
        sizes.get(Axis::Dv),
    );
    let mut dq_m = Tensor::zeros(&prep.q.shape);
    let mut dk_m = Tensor::zeros(&prep.k.shape);
    let mut dv_m = Tensor::zeros(&prep.v.shape);
    let mut customs = zero_custom_grads(inputs);
    for b in 0..b_n {
        for h in 0..h_n {
            let hk = h / prep.group;
            for i in 0..sq {
                let p = Point::default()
                    .with(Axis::B, b)
                    .with(Axis::H, h)
                    .with(Axis::Sq, i);
                let row = row_scores(par, &prep, p, variant, inputs, sizes);
                let js: Vec<usize> = (0..skv).filter(|&j| row.visible[j]).collect();
                if js.is_empty() {
                    continue;
                }
                let state: Vec<f64> = fields
                    .iter()
                    .map(|f| fwd.row_state[f].get(&[b, h, i]))
                    .collect();
                let svec: Vec<f64> = js.iter().map(|&j| row.s[j]).collect();
                let row_leaf = |region: &Region, k: u32, dp: &[f64]| -> Vec<f64> {
                    match &region.params[k as usize].role {
                        ParamRole::Element => svec.clone(),
                        ParamRole::Seed(_) => dp.to_vec(),
                        ParamRole::State(_) => vec![state_of(region, &state, &fields, k)],
                    }
                };
                let weights = broadcast(
                    eval_region(&bwd.recompute, &mut |op| match op {
                        Op::Param(k) => row_leaf(&bwd.recompute, *k, &[]),
                        other => vec![leaf_value(other, &p, sizes, variant, inputs)],
                    })
                    .remove(0),
                    js.len(),
                );
                // dP_ij = dO_i · v'_j, and dv'_j += P_ij dO_i.
                let dp: Vec<f64> = js
                    .iter()
                    .map(|&j| {
                        (0..dv)
                            .map(|e| d_o.get(&[b, h, i, e]) * prep.v.get(&[b, hk, j, e]))
                            .sum()
                    })
                    .collect();
                for (&j, w) in js.iter().zip(&weights) {
                    for e in 0..dv {
                        dv_m.add(&[b, hk, j, e], w * d_o.get(&[b, h, i, e]));
                    }
                }
                let ds = broadcast(
                    eval_region(&bwd.norm, &mut |op| match op {
                        Op::Param(k) => row_leaf(&bwd.norm, *k, &dp),
                        other => vec![leaf_value(other, &p, sizes, variant, inputs)],
                    })
                    .remove(0),
                    js.len(),
                );
                for (&j, &dsj) in js.iter().zip(&ds) {
                    let pj = p.with(Axis::Skv, j);
                    let ds_raw = match &bwd.modify_scores {
                        Some(r) => {
                            let outs = eval_scalar_with(
                                r,
                                &mut |op| match op {
                                    Op::Param(k) => match r.params[*k as usize].role {
                                        ParamRole::Seed(_) => dsj,
                                        _ => row.raw[j],
                                    },
                                    other => leaf_value(other, &pj, sizes, variant, inputs),
                                },
                                &mut |c, idx| gather_value(c, idx, &pj, variant, inputs),
                            );
                            accumulate_customs(r, &outs, &pj, variant, &mut customs);
                            outs[0]
                        }
                        None => dsj,
                    };
                    for d in 0..dqk {
                        dq_m.add(&[b, h, i, d], ds_raw * prep.k.get(&[b, hk, j, d]));
                        dk_m.add(&[b, hk, j, d], ds_raw * prep.q.get(&[b, h, i, d]));
                    }
                }
            }
        }
    }
    let mb = |r: Option<&Region>,
              x: &Tensor,
              dx: &Tensor,
              axes,
              customs: &mut IndexMap<String, Tensor>| {
        modification_backward(r, x, dx, axes, sizes, variant, inputs, customs)
    };
    let dq = mb(
        bwd.modify_q.as_ref(),
        &inputs.q,
        &dq_m,
        [Axis::B, Axis::H, Axis::Sq, Axis::Dqk],
        &mut customs,
    );
    let dk = mb(
        bwd.modify_k.as_ref(),
        &inputs.k,
        &dk_m,
        [Axis::B, hkv, Axis::Skv, Axis::Dqk],
        &mut customs,
    );
    let dv_t = mb(
        bwd.modify_v.as_ref(),
        &inputs.v,
        &dv_m,
        [Axis::B, hkv, Axis::Skv, Axis::Dv],
        &mut customs,
    );
    Gradients {
        dq,
        dk,
        dv: dv_t,
        customs,
        initial_state: None,
        initial_normalizer: None,
    }
}
