//! The f64 reference interpreter: the semantic ground truth.
//!
//! It evaluates any traced variant naively — materialised scores, plain loops,
//! f64 throughout — forward and backward. It is meant to be obviously correct,
//! not fast; every kernel is checked against it.
//!
//! Semantics fixed here (and documented in the README):
//! - A masked key does not exist for its query: `fwd` sees only the row's
//!   unmasked scores, blocks with none are skipped, its weight is 0.
//! - A query row with no unmasked key has output 0 and zero gradients; its row
//!   scales are what the epilogue gives for the initial state.
//! - Gradients flow from the output `o` only; row scales and final states are
//!   auxiliary outputs.

pub mod eval;
pub mod parallel;
pub mod recurrent;
pub mod tensor;

pub use tensor::Tensor;

use crate::ir::{Axis, Op};
use crate::variant::{Pattern, TensorDecl, Variant};
use indexmap::IndexMap;
use std::fmt;

/// The tensors of one call.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// Custom inputs by name, shaped as declared.
    pub customs: IndexMap<String, Tensor>,
    /// Recurrent pattern: the hidden state before the first step, `[B, H, Dk, Dv]`.
    pub initial_state: Option<Tensor>,
    /// Recurrent with `normalize`: the key sum `z` before the first step,
    /// `[B, H, Dk]` (0 when absent).
    pub initial_normalizer: Option<Tensor>,
}

#[derive(Clone, Debug)]
pub struct Forward {
    /// `[B, H, Sq, Dv]` (parallel) or `[B, H, S, Dv]` (recurrent).
    pub o: Tensor,
    /// Parallel: the epilogue's final row scales, each `[B, H, Sq]`.
    pub scales: IndexMap<String, Tensor>,
    /// Parallel: the final online state per row, each field `[B, H, Sq]`.
    pub row_state: IndexMap<String, Tensor>,
    /// Recurrent: the hidden state after the last step, `[B, H, Dk, Dv]`.
    pub final_state: Option<Tensor>,
    /// Recurrent with `normalize`: the key sum `z` after the last step, `[B, H, Dk]`.
    pub final_normalizer: Option<Tensor>,
}

#[derive(Clone, Debug)]
pub struct Gradients {
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
    pub customs: IndexMap<String, Tensor>,
    /// Recurrent: gradient of the initial state when one was given.
    pub initial_state: Option<Tensor>,
    /// Recurrent: gradient of the initial normaliser when one was given.
    pub initial_normalizer: Option<Tensor>,
}

/// Options of the forward evaluation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// KV block size of the online normalisation; `None` runs each row as one
    /// block. A correct online algorithm gives the same result for any size.
    pub block: Option<usize>,
}

/// A shape problem in the given tensors, naming the tensor and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

pub fn forward(variant: &Variant, inputs: &Inputs, opts: Options) -> Result<Forward, ShapeError> {
    let sizes = Sizes::bind(variant, inputs)?;
    match variant.pattern {
        Pattern::Parallel => Ok(parallel::forward(variant, inputs, &sizes, opts)),
        Pattern::Recurrent => Ok(recurrent::forward(variant, inputs, &sizes)),
    }
}

/// What a block-sparse mask makes of one score, before the variant's mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRule {
    /// Not seen (its key block is not listed).
    Hidden,
    /// The variant's mask decides (a partial block).
    Masked,
    /// Seen, the mask not evaluated (a full block).
    Shown,
}

/// The forward of a parallel variant with `rule(b, h, i, j)` applied to
/// every score before the variant's mask (the semantics of a block-sparse
/// mask's lists).
pub fn forward_with_rule(
    variant: &Variant,
    inputs: &Inputs,
    opts: Options,
    rule: &dyn Fn(usize, usize, usize, usize) -> KeyRule,
) -> Result<Forward, ShapeError> {
    let sizes = Sizes::bind(variant, inputs)?;
    match variant.pattern {
        Pattern::Parallel => Ok(parallel::forward_with_rule(
            variant, inputs, &sizes, opts, rule,
        )),
        Pattern::Recurrent => Err(ShapeError(format!(
            "`{}` is a recurrent variant: a key rule applies to parallel variants' scores",
            variant.name
        ))),
    }
}

/// Gradients of `Σ o · d_o` with respect to every input.
pub fn backward(variant: &Variant, inputs: &Inputs, d_o: &Tensor) -> Result<Gradients, ShapeError> {
    let sizes = Sizes::bind(variant, inputs)?;
    let o_shape = sizes.output_shape(variant);
    if d_o.shape != o_shape {
        return Err(ShapeError(format!(
            "tensor `d_o` has shape {:?}, expected {:?} (the output's shape)",
            d_o.shape, o_shape
        )));
    }
    match variant.pattern {
        Pattern::Parallel => Ok(parallel::backward(variant, inputs, &sizes, d_o)),
        Pattern::Recurrent => Ok(recurrent::backward(
            variant, inputs, &sizes, d_o, None, None,
        )),
    }
}

/// A recurrent variant's gradients of `Σ o · d_o + Σ S_T · d_final_state +
/// Σ z_T · d_final_normalizer`: the backward when the final state (`[B, H,
/// Dk, Dv]`) and final normaliser (`[B, H, Dk]`) also feed later work.
pub fn recurrent_backward(
    variant: &Variant,
    inputs: &Inputs,
    d_o: &Tensor,
    d_final_state: Option<&Tensor>,
    d_final_normalizer: Option<&Tensor>,
) -> Result<Gradients, ShapeError> {
    let rec = variant.recurrent().ok_or_else(|| {
        ShapeError(format!(
            "`{}` is a parallel variant; recurrent_backward takes recurrent ones",
            variant.name
        ))
    })?;
    let sizes = Sizes::bind(variant, inputs)?;
    let o_shape = sizes.output_shape(variant);
    let (b, h, dk, dv) = (
        sizes.get(Axis::B),
        sizes.get(Axis::H),
        sizes.get(Axis::Dk),
        sizes.get(Axis::Dv),
    );
    let expect = |name: &str, t: &Tensor, want: Vec<usize>| {
        if t.shape == want {
            Ok(())
        } else {
            Err(ShapeError(format!(
                "tensor `{name}` has shape {:?}, expected {want:?}",
                t.shape
            )))
        }
    };
    expect("d_o", d_o, o_shape)?;
    if let Some(t) = d_final_state {
        expect("d_final_state", t, vec![b, h, dk, dv])?;
    }
    if let Some(t) = d_final_normalizer {
        if rec.normalize.is_none() {
            return Err(ShapeError(format!(
                "`{}` has no normaliser, so it takes no `d_final_normalizer`",
                variant.name
            )));
        }
        expect("d_final_normalizer", t, vec![b, h, dk])?;
    }
    Ok(recurrent::backward(
        variant,
        inputs,
        &sizes,
        d_o,
        d_final_state,
        d_final_normalizer,
    ))
}

/// Axis sizes bound from the given tensors.
#[derive(Clone, Debug)]
pub struct Sizes {
    size: [Option<usize>; 9],
}

impl Sizes {
    pub fn get(&self, a: Axis) -> usize {
        self.size[a as usize].expect("axis bound by the inputs")
    }

    fn bind(variant: &Variant, inputs: &Inputs) -> Result<Sizes, ShapeError> {
        let mut s = Sizes { size: [None; 9] };
        let mut from: [&str; 9] = [""; 9];
        for (k, size) in &variant.fixed_sizes {
            s.size[*k as usize] = Some(*size);
            from[*k as usize] = "the variant";
        }
        let mut tensors: Vec<(&TensorDecl, &Tensor)> = vec![
            (&variant.q, &inputs.q),
            (&variant.k, &inputs.k),
            (&variant.v, &inputs.v),
        ];
        for c in &variant.customs {
            let t = inputs.customs.get(&c.name).ok_or_else(|| {
                ShapeError(format!(
                    "missing custom input `{}` (declared as {})",
                    c.name,
                    decl_str(c)
                ))
            })?;
            tensors.push((c, t));
        }
        for name in inputs.customs.keys() {
            if !variant.customs.iter().any(|c| &c.name == name) {
                return Err(ShapeError(format!(
                    "unknown custom input `{name}`; the variant declares {}",
                    if variant.customs.is_empty() {
                        "none".into()
                    } else {
                        variant.custom_names().join(", ")
                    }
                )));
            }
        }
        for (decl, t) in tensors {
            let rank = decl.axes.len() + decl.user_axes.len();
            if t.shape.len() != rank {
                return Err(ShapeError(format!(
                    "tensor `{}` has shape {:?} ({} axes) but is declared {} ({rank} axes)",
                    decl.name,
                    t.shape,
                    t.shape.len(),
                    decl_str(decl),
                )));
            }
            if t.data.len() != t.shape.iter().product::<usize>() {
                return Err(ShapeError(format!(
                    "tensor `{}` has {} elements for shape {:?}",
                    decl.name,
                    t.data.len(),
                    t.shape
                )));
            }
            for ((u, fixed), &n) in decl.user_axes.iter().zip(&t.shape[decl.axes.len()..]) {
                if fixed.is_some_and(|f| f != n) || n == 0 {
                    return Err(ShapeError(format!(
                        "tensor `{}` has shape {:?}: user axis {u} is {n}, declared {}",
                        decl.name,
                        t.shape,
                        decl_str(decl)
                    )));
                }
            }
            for (a, &n) in decl.axes.iter().zip(&t.shape) {
                match s.size[*a as usize] {
                    Some(m) if m != n => {
                        return Err(ShapeError(format!(
                            "tensor `{}` has shape {:?}: axis {a} is {n}, but {} gives {a} = {m}",
                            decl.name, t.shape, from[*a as usize]
                        )));
                    }
                    Some(_) => {}
                    None => {
                        s.size[*a as usize] = Some(n);
                        from[*a as usize] = match decl.name.as_str() {
                            "q" => "`q`",
                            "k" => "`k`",
                            "v" => "`v`",
                            _ => "a custom input",
                        };
                    }
                }
                if n == 0 {
                    return Err(ShapeError(format!(
                        "tensor `{}` has shape {:?}: axis {a} is empty",
                        decl.name, t.shape
                    )));
                }
            }
        }
        if variant.pattern == Pattern::Parallel {
            if s.size[Axis::Hkv as usize].is_none() {
                s.size[Axis::Hkv as usize] = s.size[Axis::H as usize];
            }
            let (h, hkv) = (s.get(Axis::H), s.get(Axis::Hkv));
            if h % hkv != 0 {
                return Err(ShapeError(format!(
                    "`q` has {h} heads and `k` has {hkv}: the query heads must be a multiple of the key/value heads"
                )));
            }
        }
        if let Some(z) = &inputs.initial_normalizer {
            if variant.recurrent().is_none_or(|r| r.normalize.is_none()) {
                return Err(ShapeError(format!(
                    "an initial normaliser is only taken by recurrent variants with `normalize`; `{}` has none",
                    variant.name
                )));
            }
            let want = [s.get(Axis::B), s.get(Axis::H), s.get(Axis::Dk)];
            if z.shape != want {
                return Err(ShapeError(format!(
                    "tensor `initial_normalizer` has shape {:?}, expected [B, H, Dk] = {:?}",
                    z.shape, want
                )));
            }
        }
        if let Some(st) = &inputs.initial_state {
            if variant.pattern != Pattern::Recurrent {
                return Err(ShapeError(
                    "an initial state is only taken by recurrent variants".into(),
                ));
            }
            let want = [
                s.get(Axis::B),
                s.get(Axis::H),
                s.get(Axis::Dk),
                s.get(Axis::Dv),
            ];
            if st.shape != want {
                return Err(ShapeError(format!(
                    "tensor `initial_state` has shape {:?}, expected [B, H, Dk, Dv] = {:?}",
                    st.shape, want
                )));
            }
        }
        Ok(s)
    }

    pub fn output_shape(&self, variant: &Variant) -> Vec<usize> {
        match variant.pattern {
            Pattern::Parallel => vec![
                self.get(Axis::B),
                self.get(Axis::H),
                self.get(Axis::Sq),
                self.get(Axis::Dv),
            ],
            Pattern::Recurrent => vec![
                self.get(Axis::B),
                self.get(Axis::H),
                self.get(Axis::S),
                self.get(Axis::Dv),
            ],
        }
    }
}

fn decl_str(d: &TensorDecl) -> String {
    let mut parts: Vec<String> = d.axes.iter().map(|a| a.name().to_string()).collect();
    parts.extend(d.user_axes.iter().map(|(u, n)| match n {
        Some(n) => format!("{u} = {n}"),
        None => u.clone(),
    }));
    format!("[{}]", parts.join(", "))
}

/// Coordinates of one evaluation point, by axis.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Point {
    pub idx: [usize; 9],
}

impl Point {
    pub fn with(mut self, a: Axis, i: usize) -> Point {
        self.idx[a as usize] = i;
        self
    }

    pub fn at(&self, a: Axis) -> usize {
        self.idx[a as usize]
    }
}

/// Resolves the leaves that do not depend on the region's params.
pub(crate) fn leaf_value(
    op: &Op,
    p: &Point,
    sizes: &Sizes,
    variant: &Variant,
    inputs: &Inputs,
) -> f64 {
    match op {
        Op::Index(a) => p.at(*a) as f64,
        Op::Shape(a) => sizes.get(*a) as f64,
        Op::Custom(c) => {
            let decl = &variant.customs[*c as usize];
            let t = &inputs.customs[&decl.name];
            let idx: Vec<usize> = decl.axes.iter().map(|a| p.at(*a)).collect();
            t.get(&idx)
        }
        Op::Const(c) => c.get(),
        other => unreachable!("leaf_value called on {other:?}"),
    }
}

/// An indexed input's element: broadcast coordinates from the point, user-axis
/// indices clamped into range (so `rel[i - j + 16]` saturates at the table's ends).
pub(crate) fn gather_value(
    c: u32,
    idx: &[i64],
    p: &Point,
    variant: &Variant,
    inputs: &Inputs,
) -> f64 {
    let decl = &variant.customs[c as usize];
    let t = &inputs.customs[&decl.name];
    t.get(&gather_index(decl, t, idx, p))
}

fn gather_index(decl: &TensorDecl, t: &Tensor, idx: &[i64], p: &Point) -> Vec<usize> {
    let mut full: Vec<usize> = decl.axes.iter().map(|a| p.at(*a)).collect();
    for (k, &i) in idx.iter().enumerate() {
        let n = t.shape[decl.axes.len() + k] as i64;
        full.push(i.clamp(0, n - 1) as usize);
    }
    full
}

/// Adds a closure backward's custom-input gradients at a point.
pub(crate) fn accumulate_customs(
    region: &crate::ir::Region,
    outs: &[f64],
    p: &Point,
    variant: &Variant,
    grads: &mut IndexMap<String, Tensor>,
) {
    for (o, v) in region.outputs.iter().zip(outs) {
        let Some(name) = o.name.strip_prefix("grad.") else {
            continue;
        };
        // `grad.<input>#<k>`: the k-th indexed read; its indices are the
        // outputs `grad.<input>#<k>.<axis>`. (Names with a `.` after `#` are
        // those indices, not gradients.)
        let (input, read) = match name.split_once('#') {
            Some((_, rest)) if rest.contains('.') => continue,
            Some((input, _)) => (input, Some(name)),
            None => (name, None),
        };
        let Some(decl) = variant.customs.iter().find(|c| c.name == input) else {
            continue;
        };
        let grad = grads
            .get_mut(input)
            .expect("gradient tensor per custom input");
        let idx = match read {
            None => decl.axes.iter().map(|a| p.at(*a)).collect(),
            Some(read) => {
                let user: Vec<i64> = (0..decl.user_axes.len())
                    .map(|a| {
                        let want = format!("grad.{read}.{a}");
                        let k = region
                            .outputs
                            .iter()
                            .position(|o| o.name == want)
                            .expect("index output");
                        outs[k] as i64
                    })
                    .collect();
                gather_index(decl, &inputs_shape(grad), &user, p)
            }
        };
        grad.add(&idx, *v);
    }
}

/// `dx` from `dx_m` (the gradient of the modified tensor) through an optional
/// modification closure's backward region; adds the custom-input gradients.
/// `axes` names the axes of `x`'s four dimensions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn modification_backward(
    r: Option<&crate::ir::Region>,
    x: &Tensor,
    dx_m: &Tensor,
    axes: [Axis; 4],
    sizes: &Sizes,
    variant: &Variant,
    inputs: &Inputs,
    customs: &mut IndexMap<String, Tensor>,
) -> Tensor {
    let Some(r) = r else { return dx_m.clone() };
    Tensor::from_fn(&x.shape, |idx| {
        let p = axes
            .iter()
            .zip(idx)
            .fold(Point::default(), |p, (a, i)| p.with(*a, *i));
        let outs = eval::eval_scalar_with(
            r,
            &mut |op| match op {
                Op::Param(k) => match r.params[*k as usize].role {
                    crate::ir::ParamRole::Seed(_) => dx_m.get(idx),
                    _ => x.get(idx),
                },
                other => leaf_value(other, &p, sizes, variant, inputs),
            },
            &mut |c, i| gather_value(c, i, &p, variant, inputs),
        );
        accumulate_customs(r, &outs, &p, variant, customs);
        outs[0]
    })
}

/// A zero-sized stand-in carrying a tensor's shape (for index clamping).
fn inputs_shape(t: &Tensor) -> Tensor {
    Tensor {
        shape: t.shape.clone(),
        data: Vec::new(),
    }
}

pub(crate) fn zero_custom_grads(inputs: &Inputs) -> IndexMap<String, Tensor> {
    inputs
        .customs
        .iter()
        .map(|(n, t)| (n.clone(), Tensor::zeros(&t.shape)))
        .collect()
}
