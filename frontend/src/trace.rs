//! The tracer: turns parsed closures into graph regions and checks them.
//!
//! Every check that can point at a token happens here: unknown names and
//! functions, arity, boolean/number mix-ups, custom inputs whose axes a closure
//! does not iterate, reductions outside the online block, state fields missing
//! from `fwd`'s result, an epilogue that is not linear in `o`.

use crate::derive;
use crate::diag::{Diagnostic, Result, suggest};
use crate::ir::{
    Axis, AxisSet, Binary, DType, Fold, Graph, NodeId, Op, Output, Param, ParamRole, Reduce,
    Region, Unary,
};
use crate::reference::eval::eval_scalar;
use crate::syntax::{ItemSyntax, OnlineSyntax, VariantSyntax, closure_span};
use crate::variant::{
    Body, Decay, Online, Parallel, Pattern, Recurrent, StateField, TensorDecl, Variant,
};
use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, ExprClosure, Pat};

const PARALLEL_AXES: [Axis; 7] = [
    Axis::B,
    Axis::H,
    Axis::Hkv,
    Axis::Sq,
    Axis::Skv,
    Axis::Dqk,
    Axis::Dv,
];
const RECURRENT_AXES: [Axis; 5] = [Axis::B, Axis::H, Axis::S, Axis::Dk, Axis::Dv];

pub const PARALLEL_CLOSURES: [&str; 5] =
    ["modify_q", "modify_k", "modify_v", "modify_scores", "mask"];
pub const RECURRENT_CLOSURES: [&str; 5] =
    ["modify_q", "modify_k", "modify_v", "decay", "normalize"];

/// Names with a fixed meaning that a custom input may not take.
const RESERVED: [&str; 6] = ["inf", "State", "Scales", "online", "state", "st"];

/// Names the DSL calls as functions.
pub const FUNCTIONS: [&str; 19] = [
    "exp",
    "exp2",
    "log",
    "log2",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "relu",
    "abs",
    "sign",
    "neg",
    "max",
    "min",
    "pow",
    "select",
    "rowsum",
    "rowmax",
    "rowabssum",
];

/// Traces and validates a parsed variant and derives its backward regions.
pub fn trace(syntax: &VariantSyntax) -> Result<Variant> {
    let pattern = match syntax.pattern.to_string().as_str() {
        "parallel" => Pattern::Parallel,
        "recurrent" => Pattern::Recurrent,
        other => {
            let mut d = Diagnostic::new(
                syntax.pattern.span(),
                format!("unknown pattern `{other}`; expected `parallel` or `recurrent`"),
            );
            if let Some(s) = suggest(other, ["parallel", "recurrent"]) {
                d = d.help(format!("did you mean `{s}`?"));
            }
            return Err(d);
        }
    };
    let decls = Decls::collect(syntax, pattern)?;
    let closures = collect_closures(syntax, pattern)?;
    let body = match pattern {
        Pattern::Parallel => Body::Parallel(Box::new(trace_parallel(syntax, &decls, &closures)?)),
        Pattern::Recurrent => Body::Recurrent(Box::new(trace_recurrent(&decls, &closures)?)),
    };
    let variant = Variant {
        name: syntax.name.to_string(),
        doc: syntax.doc(),
        pattern,
        q: decls.q.clone(),
        k: decls.k.clone(),
        v: decls.v.clone(),
        customs: decls.customs.clone(),
        fixed_sizes: decls.fixed.clone(),
        body,
    };
    for r in variant
        .forward_regions()
        .into_iter()
        .chain(variant.backward_regions())
    {
        r.validate()
            .map_err(|e| Diagnostic::new(syntax.name.span(), format!("internal error: {e}")))?;
    }
    Ok(variant)
}

/// The declared tensors, resolved against the pattern's layouts.
struct Decls {
    pattern: Pattern,
    q: TensorDecl,
    k: TensorDecl,
    v: TensorDecl,
    customs: Vec<TensorDecl>,
    fixed: Vec<(Axis, usize)>,
    kv_heads: Axis,
}

impl Decls {
    fn collect(syntax: &VariantSyntax, pattern: Pattern) -> Result<Decls> {
        let known: &[Axis] = match pattern {
            Pattern::Parallel => &PARALLEL_AXES,
            Pattern::Recurrent => &RECURRENT_AXES,
        };
        let known_names = || {
            known
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut q = None;
        let mut k = None;
        let mut v = None;
        let mut customs: Vec<TensorDecl> = Vec::new();
        let mut fixed: Vec<(Axis, usize, Span)> = Vec::new();
        let mut spans: Vec<(String, Vec<Span>)> = Vec::new();
        for item in &syntax.items {
            let ItemSyntax::Tensor { name, axes } = item else {
                continue;
            };
            let mut resolved = Vec::new();
            let mut user_axes: Vec<(String, Option<usize>)> = Vec::new();
            let mut axis_spans = Vec::new();
            let is_custom = !matches!(name.to_string().as_str(), "q" | "k" | "v");
            for a in axes {
                let an = a.name.to_string();
                let standard = Axis::from_name(&an).filter(|x| known.contains(x));
                if standard.is_none() && is_custom {
                    // A user axis: indexed explicitly (`name[i - j]`), never broadcast.
                    if user_axes.iter().any(|(u, _)| *u == an) {
                        return Err(Diagnostic::new(
                            a.name.span(),
                            format!("axis `{an}` appears twice in `{name}`"),
                        ));
                    }
                    let size = match &a.size {
                        Some(lit) => Some(lit.base10_parse::<usize>().map_err(Diagnostic::from)?),
                        None => None,
                    };
                    if size == Some(0) {
                        return Err(Diagnostic::new(
                            a.name.span(),
                            "an axis size must be at least 1",
                        ));
                    }
                    user_axes.push((an, size));
                    continue;
                }
                if !user_axes.is_empty() {
                    return Err(Diagnostic::new(
                        a.name.span(),
                        format!(
                            "the broadcast axis `{an}` must come before the user axes of `{name}`"
                        ),
                    )
                    .help(format!(
                        "write `{name}: [<axes of {}>…, <user axes>…]`",
                        known_names()
                    )));
                }
                let Some(axis) = standard else {
                    let mut d = Diagnostic::new(
                        a.name.span(),
                        format!("unknown axis `{an}`; the {} pattern's axes are {}", pattern_name(pattern), known_names()),
                    )
                    .help("custom inputs are broadcast over the closures' axes, so every axis must be one of these");
                    if let Some(s) = suggest(&an, known.iter().map(|a| a.name())) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    return Err(d);
                };
                if resolved.contains(&axis) {
                    return Err(Diagnostic::new(
                        a.name.span(),
                        format!("axis `{an}` appears twice in `{name}`"),
                    ));
                }
                if let Some(lit) = &a.size {
                    let size: usize = lit.base10_parse().map_err(Diagnostic::from)?;
                    if size == 0 || size > i32::MAX as usize {
                        return Err(Diagnostic::new(
                            lit.span(),
                            "an axis size must be between 1 and 2^31 - 1 (kernels index with 32-bit integers)",
                        ));
                    }
                    if let Some((_, prev, _)) = fixed.iter().find(|(x, ..)| *x == axis) {
                        if *prev != size {
                            return Err(Diagnostic::new(
                                lit.span(),
                                format!(
                                    "axis `{an}` is fixed to {prev} elsewhere but to {size} here"
                                ),
                            ));
                        }
                    } else {
                        fixed.push((axis, size, lit.span()));
                    }
                }
                resolved.push(axis);
                axis_spans.push(a.name.span());
            }
            let decl = TensorDecl {
                name: name.to_string(),
                axes: resolved,
                user_axes,
            };
            let slot = match decl.name.as_str() {
                "q" => &mut q,
                "k" => &mut k,
                "v" => &mut v,
                _ => {
                    let n = decl.name.as_str();
                    if Axis::from_name(n).is_some()
                        || FUNCTIONS.contains(&n)
                        || RESERVED.contains(&n)
                    {
                        return Err(Diagnostic::new(
                            name.span(),
                            format!("`{n}` cannot name a custom input: it is an axis, a function or a DSL keyword"),
                        )
                        .help("pick another name, e.g. `bias` or `slopes`"));
                    }
                    if customs.iter().any(|c| c.name == decl.name) {
                        return Err(Diagnostic::new(
                            name.span(),
                            format!("tensor `{name}` is declared twice"),
                        ));
                    }
                    customs.push(decl);
                    spans.push((name.to_string(), axis_spans));
                    continue;
                }
            };
            if slot.is_some() {
                return Err(Diagnostic::new(
                    name.span(),
                    format!("tensor `{name}` is declared twice"),
                ));
            }
            *slot = Some((decl, name.span(), axis_spans));
        }
        let missing = |n: &str| {
            Diagnostic::new(
                syntax.name.span(),
                format!("missing tensor declaration `{n}`"),
            )
            .help(match (pattern, n) {
                (Pattern::Parallel, "q") => "declare it as `q: [B, H, Sq, Dqk]`",
                (Pattern::Parallel, "k") => {
                    "declare it as `k: [B, Hkv, Skv, Dqk]` (or `[B, H, Skv, Dqk]` for multi-head)"
                }
                (Pattern::Parallel, _) => {
                    "declare it as `v: [B, Hkv, Skv, Dv]` (or `[B, H, Skv, Dv]` for multi-head)"
                }
                (Pattern::Recurrent, "v") => "declare it as `v: [B, H, S, Dv]`",
                (Pattern::Recurrent, _) => "declare it as `[B, H, S, Dk]`",
            })
        };
        let q = q.ok_or_else(|| missing("q"))?;
        let k = k.ok_or_else(|| missing("k"))?;
        let v = v.ok_or_else(|| missing("v"))?;
        let kv_heads = match pattern {
            Pattern::Parallel => {
                k.0.axes
                    .get(1)
                    .copied()
                    .filter(|a| *a == Axis::Hkv)
                    .unwrap_or(Axis::H)
            }
            Pattern::Recurrent => Axis::H,
        };
        let layouts: [(&str, Vec<Axis>, &str); 3] = match pattern {
            Pattern::Parallel => [
                (
                    "q",
                    vec![Axis::B, Axis::H, Axis::Sq, Axis::Dqk],
                    "q is [batch, heads, query position, head dim Dqk]",
                ),
                (
                    "k",
                    vec![Axis::B, kv_heads, Axis::Skv, Axis::Dqk],
                    "k is multiplied with q, so its last axis is `Dqk`; its heads are `Hkv` (grouped-query) or `H`",
                ),
                (
                    "v",
                    vec![Axis::B, kv_heads, Axis::Skv, Axis::Dv],
                    "v has k's heads and positions and the value dim `Dv`",
                ),
            ],
            Pattern::Recurrent => [
                (
                    "q",
                    vec![Axis::B, Axis::H, Axis::S, Axis::Dk],
                    "q is [batch, heads, position, key dim Dk]",
                ),
                (
                    "k",
                    vec![Axis::B, Axis::H, Axis::S, Axis::Dk],
                    "k is [batch, heads, position, key dim Dk]",
                ),
                (
                    "v",
                    vec![Axis::B, Axis::H, Axis::S, Axis::Dv],
                    "v is [batch, heads, position, value dim Dv]",
                ),
            ],
        };
        for ((decl, name_span, axis_spans), (n, want, why)) in
            [&q, &k, &v].into_iter().zip(layouts.iter())
        {
            let want_str = want.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
            if decl.axes.len() != want.len() {
                return Err(Diagnostic::new(
                    *name_span,
                    format!(
                        "axis mismatch: `{n}` must have {} axes [{want_str}], found {}",
                        want.len(),
                        decl.axes.len()
                    ),
                )
                .help(*why));
            }
            for (pos, (got, exp)) in decl.axes.iter().zip(want).enumerate() {
                if got != exp {
                    return Err(Diagnostic::new(
                        axis_spans[pos],
                        format!("axis mismatch: axis {} of `{n}` must be `{exp}`, found `{got}` (expected [{want_str}])", pos + 1),
                    )
                    .help(*why));
                }
            }
        }
        if pattern == Pattern::Parallel && kv_heads == Axis::H {
            for (name, spans) in &spans {
                let c = customs.iter().find(|c| &c.name == name).expect("declared");
                if let Some(pos) = c.axes.iter().position(|a| *a == Axis::Hkv) {
                    return Err(Diagnostic::new(
                        spans[pos],
                        format!(
                            "`{name}` uses axis `Hkv`, but k and v are declared with `H` heads"
                        ),
                    ));
                }
            }
        }
        Ok(Decls {
            pattern,
            q: q.0,
            k: k.0,
            v: v.0,
            customs,
            fixed: {
                let size = |a: Axis| {
                    fixed
                        .iter()
                        .find(|(x, ..)| *x == a)
                        .map(|(_, n, span)| (*n, *span))
                };
                if let (Some((h, _)), Some((hkv, span))) = (size(Axis::H), size(Axis::Hkv))
                    && h % hkv != 0
                {
                    return Err(Diagnostic::new(
                        span,
                        format!(
                            "H = {h} query heads cannot be shared by Hkv = {hkv} key/value heads: H must be a multiple of Hkv"
                        ),
                    ));
                }
                fixed.into_iter().map(|(a, s, _)| (a, s)).collect()
            },
            kv_heads,
        })
    }

    fn custom(&self, name: &str) -> Option<(u32, &TensorDecl)> {
        self.customs
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
            .map(|(i, c)| (i as u32, c))
    }

    fn shape_axis(&self, name: &str) -> Option<Axis> {
        let axis = Axis::from_name(name)?;
        let known: &[Axis] = match self.pattern {
            Pattern::Parallel => &PARALLEL_AXES,
            Pattern::Recurrent => &RECURRENT_AXES,
        };
        known.contains(&axis).then_some(axis)
    }
}

fn pattern_name(p: Pattern) -> &'static str {
    match p {
        Pattern::Parallel => "parallel",
        Pattern::Recurrent => "recurrent",
    }
}

struct Closures<'a> {
    items: Vec<(String, &'a ExprClosure)>,
    online: Option<&'a OnlineSyntax>,
}

impl<'a> Closures<'a> {
    fn get(&self, key: &str) -> Option<&'a ExprClosure> {
        self.items.iter().find(|(k, _)| k == key).map(|(_, c)| *c)
    }
}

fn collect_closures(syntax: &VariantSyntax, pattern: Pattern) -> Result<Closures<'_>> {
    let allowed: &[&str] = match pattern {
        Pattern::Parallel => &PARALLEL_CLOSURES,
        Pattern::Recurrent => &RECURRENT_CLOSURES,
    };
    let mut out = Closures {
        items: Vec::new(),
        online: None,
    };
    for item in &syntax.items {
        match item {
            ItemSyntax::Closure { key, closure } => {
                let k = key.to_string();
                if !allowed.contains(&k.as_str()) {
                    let mut d = Diagnostic::new(
                        key.span(),
                        format!(
                            "unknown closure `{k}` for the {} pattern; expected one of {}",
                            pattern_name(pattern),
                            allowed.join(", ")
                        ),
                    );
                    if let Some(s) = suggest(&k, allowed.iter().copied()) {
                        d = d.help(format!("did you mean `{s}`?"));
                    }
                    return Err(d);
                }
                if out.get(&k).is_some() {
                    return Err(Diagnostic::new(key.span(), format!("`{k}` is given twice")));
                }
                out.items.push((k, closure));
            }
            ItemSyntax::Online(o) => {
                if pattern == Pattern::Recurrent {
                    return Err(Diagnostic::new(
                        o.keyword.span(),
                        "the recurrent pattern has no online normalisation block",
                    )
                    .help("use `normalize = |o, n| …` to normalise the output"));
                }
                if out.online.is_some() {
                    return Err(Diagnostic::new(o.keyword.span(), "`online` is given twice"));
                }
                out.online = Some(o);
            }
            ItemSyntax::Tensor { .. } => {}
        }
    }
    Ok(out)
}

/// One closure parameter slot.
#[derive(Clone, Copy)]
enum Slot {
    /// The element being transformed, varying over these axes.
    Element(&'static str, AxisSet),
    /// An index variable over the axis.
    Index(Axis),
    /// The row state (`st`), accessed by field.
    State,
    /// A named per-row value (the recurrent normaliser `n`).
    Row(&'static str, AxisSet),
}

/// A region under construction.
struct RegionTracer<'d> {
    decls: &'d Decls,
    name: &'static str,
    iter_axes: AxisSet,
    allow_reduce: bool,
    allow_customs: bool,
    graph: Graph,
    params: Vec<Param>,
    scopes: Vec<(String, Binding)>,
    state_fields: Vec<String>,
}

#[derive(Clone)]
enum Binding {
    Value(NodeId),
    State,
}

impl<'d> RegionTracer<'d> {
    fn new(decls: &'d Decls, name: &'static str, iter_axes: AxisSet) -> RegionTracer<'d> {
        let reduce_axis = match decls.pattern {
            Pattern::Parallel => Axis::Skv,
            Pattern::Recurrent => Axis::S,
        };
        RegionTracer {
            decls,
            name,
            iter_axes,
            allow_reduce: false,
            allow_customs: true,
            graph: Graph::new(Fold::Exact, reduce_axis),
            params: Vec::new(),
            scopes: Vec::new(),
            state_fields: Vec::new(),
        }
    }

    fn add_param(&mut self, name: &str, role: ParamRole, dtype: DType, axes: AxisSet) -> NodeId {
        let idx = self.params.len() as u32;
        self.params.push(Param {
            name: name.to_string(),
            role,
            dtype,
            axes,
        });
        self.graph.leaf(Op::Param(idx), dtype, axes)
    }

    /// Binds the closure's parameters, choosing the first signature whose
    /// arity matches.
    fn bind(&mut self, c: &ExprClosure, signatures: &[&[Slot]], shape: &str) -> Result<()> {
        let Some(sig) = signatures.iter().find(|s| s.len() == c.inputs.len()) else {
            let arities: Vec<String> = signatures.iter().map(|s| s.len().to_string()).collect();
            return Err(Diagnostic::new(
                closure_span(c),
                format!(
                    "wrong closure arity: `{}` takes {} parameter(s), found {}",
                    self.name,
                    arities.join(" or "),
                    c.inputs.len()
                ),
            )
            .help(format!("write it as `{} = {shape}`", self.name)));
        };
        for (pat, slot) in c.inputs.iter().zip(sig.iter()) {
            let name = match pat {
                Pat::Ident(pi)
                    if pi.by_ref.is_none() && pi.mutability.is_none() && pi.subpat.is_none() =>
                {
                    Some(pi.ident.to_string())
                }
                Pat::Wild(_) => None,
                Pat::Type(t) => {
                    return Err(Diagnostic::new(
                        t.colon_token.span,
                        "closure parameters take no type annotations",
                    ));
                }
                other => return Err(Diagnostic::new(other.span(), "expected a parameter name")),
            };
            let binding = match *slot {
                Slot::Element(role_name, axes) => {
                    let n = self.add_param(role_name, ParamRole::Element, DType::F32, axes);
                    Binding::Value(n)
                }
                Slot::Index(axis) => Binding::Value(self.graph.leaf(
                    Op::Index(axis),
                    DType::Int,
                    AxisSet::of(&[axis]),
                )),
                Slot::State => Binding::State,
                Slot::Row(role_name, axes) => Binding::Value(self.add_param(
                    role_name,
                    ParamRole::State(role_name.into()),
                    DType::F32,
                    axes,
                )),
            };
            if let Some(n) = name {
                self.scopes.push((n, binding));
            }
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
    }

    fn numeric(&self, id: NodeId, span: Span) -> Result<NodeId> {
        if self.graph.node(id).dtype == DType::Bool {
            return Err(Diagnostic::new(span, "expected a number, found a boolean")
                .help("use `select(cond, a, b)` to turn a condition into a number"));
        }
        Ok(id)
    }

    fn boolean(&self, id: NodeId, span: Span) -> Result<NodeId> {
        if self.graph.node(id).dtype != DType::Bool {
            return Err(
                Diagnostic::new(span, "expected a boolean condition, found a number")
                    .help("write a comparison such as `i >= j`"),
            );
        }
        Ok(id)
    }

    fn state_field(&mut self, field: &str, span: Span) -> Result<NodeId> {
        let Some(pos) = self.state_fields.iter().position(|f| f == field) else {
            let mut d = Diagnostic::new(
                span,
                if self.state_fields.is_empty() {
                    format!("the state has no field `{field}` (it declares none)")
                } else {
                    format!(
                        "the state has no field `{field}`; it declares {}",
                        self.state_fields.join(", ")
                    )
                },
            );
            if let Some(s) = suggest(field, self.state_fields.iter().map(String::as_str)) {
                d = d.help(format!("did you mean `{s}`?"));
            }
            return Err(d);
        };
        let idx = self
            .params
            .iter()
            .position(|p| p.role == ParamRole::State(self.state_fields[pos].clone()))
            .expect("state params are bound with the state") as u32;
        let p = &self.params[idx as usize];
        Ok(self.graph.leaf(Op::Param(idx), p.dtype, p.axes))
    }

    fn bind_state_params(&mut self, fields: &[String], row_axes: AxisSet) {
        self.state_fields = fields.to_vec();
        for f in fields {
            self.add_param(
                &format!("st.{f}"),
                ParamRole::State(f.clone()),
                DType::F32,
                row_axes,
            );
        }
    }

    fn ident(&mut self, name: &str, span: Span) -> Result<NodeId> {
        match self.lookup(name) {
            Some(Binding::Value(id)) => return Ok(*id),
            Some(Binding::State) => {
                return Err(Diagnostic::new(
                    span,
                    format!("`{name}` is the row state; read a field such as `{name}.m`"),
                ));
            }
            None => {}
        }
        if let Some((idx, decl)) = self.decls.custom(name) {
            if !self.allow_customs {
                return Err(Diagnostic::new(
                    span,
                    format!("custom input `{name}` cannot be read in `{}`", self.name),
                )
                .help(
                    "apply custom inputs in `modify_scores` (or `modify_q`/`modify_k`/`modify_v`)",
                ));
            }
            let axes = AxisSet::of(&decl.axes);
            if !axes.is_subset(self.iter_axes) {
                return Err(Diagnostic::new(
                    span,
                    format!(
                        "axis mismatch: input `{name}` varies over {}, which `{}` does not iterate over (it iterates {})",
                        axes.minus(self.iter_axes),
                        self.name,
                        self.iter_axes
                    ),
                )
                .help("a closure reads custom inputs broadcast over its own axes; declare the input with a subset of them"));
            }
            if !decl.user_axes.is_empty() {
                let users: Vec<&str> = decl.user_axes.iter().map(|(u, _)| u.as_str()).collect();
                let mut d = Diagnostic::new(
                    span,
                    format!(
                        "`{name}` has user axes [{}]: read it with an index, e.g. `{name}[i - j]`",
                        users.join(", ")
                    ),
                );
                if let Some(s) = suggest(
                    users[0],
                    PARALLEL_AXES
                        .iter()
                        .chain(&RECURRENT_AXES)
                        .map(|a| a.name()),
                ) {
                    d = d.help(format!(
                        "if `{}` was meant to be the broadcast axis `{s}`, fix the declaration",
                        users[0]
                    ));
                }
                return Err(d);
            }
            return Ok(self.graph.leaf(Op::Custom(idx), DType::F32, axes));
        }
        if let Some(axis) = self.decls.shape_axis(name) {
            return Ok(self.graph.leaf(Op::Shape(axis), DType::Int, AxisSet::EMPTY));
        }
        if name == "inf" {
            return Ok(self.graph.f32(f64::INFINITY));
        }
        let mut candidates: Vec<String> = self.scopes.iter().map(|(n, _)| n.clone()).collect();
        candidates.extend(self.decls.customs.iter().map(|c| c.name.clone()));
        let mut d = Diagnostic::new(span, format!("unknown name `{name}`"));
        if let Some(s) = suggest(name, candidates.iter().map(String::as_str)) {
            d = d.help(format!("did you mean `{s}`?"));
        } else if FUNCTIONS.contains(&name) {
            d = d.help(format!("`{name}` is a function: call it as `{name}(x)`"));
        }
        Err(d)
    }

    fn expr(&mut self, e: &Expr) -> Result<NodeId> {
        match e {
            Expr::Lit(l) => self.literal(&l.lit),
            Expr::Path(p) => {
                let Some(id) = p.path.get_ident().filter(|_| p.qself.is_none()) else {
                    return Err(Diagnostic::new(p.span(), "expected a plain name, not a path"));
                };
                self.ident(&id.to_string(), id.span())
            }
            Expr::Paren(p) => self.expr(&p.expr),
            Expr::Group(g) => self.expr(&g.expr),
            Expr::Index(ix) => self.index(ix),
            Expr::Field(f) => {
                let base_is_state = matches!(&*f.base, Expr::Path(p) if p.path.get_ident()
                    .is_some_and(|i| matches!(self.lookup(&i.to_string()), Some(Binding::State))));
                if !base_is_state {
                    return Err(Diagnostic::new(f.base.span(), "only the row state has fields (e.g. `st.m`)"));
                }
                let field = match &f.member {
                    syn::Member::Named(n) => n.to_string(),
                    syn::Member::Unnamed(i) => i.index.to_string(),
                };
                self.state_field(&field, f.member.span())
            }
            Expr::Unary(u) => {
                let x = self.expr(&u.expr)?;
                match u.op {
                    syn::UnOp::Neg(_) => {
                        let x = self.numeric(x, u.expr.span())?;
                        Ok(self.graph.unary(Unary::Neg, x))
                    }
                    syn::UnOp::Not(_) => {
                        let x = self.boolean(x, u.expr.span())?;
                        Ok(self.graph.unary(Unary::Not, x))
                    }
                    _ => Err(Diagnostic::new(u.span(), "dereference is not supported")),
                }
            }
            Expr::Binary(b) => self.binary(b),
            Expr::Call(c) => self.call(c),
            Expr::Block(b) => self.block(&b.block),
            Expr::If(i) => {
                let c = self.expr(&i.cond)?;
                let c = self.boolean(c, i.cond.span())?;
                let t = self.block(&i.then_branch)?;
                let Some((_, else_e)) = &i.else_branch else {
                    return Err(Diagnostic::new(i.if_token.span, "`if` needs an `else` branch (it is `select(cond, a, b)`)"));
                };
                let f = self.expr(else_e)?;
                let t = self.numeric(t, i.then_branch.span())?;
                let f = self.numeric(f, else_e.span())?;
                Ok(self.graph.select(c, t, f))
            }
            Expr::MethodCall(m) => Err(Diagnostic::new(
                m.method.span(),
                format!("method calls are not supported; write `{0}(x)` instead of `x.{0}()`", m.method),
            )),
            Expr::Tuple(t) => Err(Diagnostic::new(t.span(), format!("a tuple is not a value here; only `fwd` and `epilogue` return tuples (in `{}`)", self.name))),
            Expr::Struct(s) => Err(Diagnostic::new(s.span(), "a `State { … }` literal is only allowed as the second element of `fwd`'s result")),
            other => Err(Diagnostic::new(other.span(), "this kind of expression is not supported in the attention DSL")
                .help("closures use numbers, names, `+ - * /`, comparisons, `&& || !`, `if … else …`, `let` and calls such as `exp(x)`")),
        }
    }

    /// `name[i1][i2]…`: a custom input read at integer indices on its user axes.
    fn index(&mut self, ix: &syn::ExprIndex) -> Result<NodeId> {
        let mut indices = vec![&*ix.index];
        let mut base = &*ix.expr;
        while let Expr::Index(inner) = base {
            indices.push(&*inner.index);
            base = &*inner.expr;
        }
        indices.reverse();
        let name = match base {
            Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                p.path.get_ident().expect("ident")
            }
            other => {
                return Err(Diagnostic::new(
                    other.span(),
                    "only custom inputs can be indexed",
                ));
            }
        };
        let n = name.to_string();
        let Some((c, decl)) = self.decls.custom(&n) else {
            return Err(Diagnostic::new(
                name.span(),
                format!(
                    "`{n}` is not a custom input; only custom inputs with user axes can be indexed"
                ),
            ));
        };
        if !self.allow_customs {
            return Err(Diagnostic::new(
                name.span(),
                format!("custom input `{n}` cannot be read in `{}`", self.name),
            ));
        }
        if decl.user_axes.len() != indices.len() {
            return Err(Diagnostic::new(
                ix.bracket_token.span.join(),
                format!(
                    "`{n}` has {} user ax{} but is indexed with {}",
                    decl.user_axes.len(),
                    if decl.user_axes.len() == 1 {
                        "is"
                    } else {
                        "es"
                    },
                    indices.len()
                ),
            )
            .help("give one index per user axis, in declaration order: `name[a][b]`"));
        }
        let axes = AxisSet::of(&decl.axes);
        if !axes.is_subset(self.iter_axes) {
            return Err(Diagnostic::new(
                name.span(),
                format!(
                    "axis mismatch: input `{n}` varies over {}, which `{}` does not iterate over",
                    axes.minus(self.iter_axes),
                    self.name
                ),
            ));
        }
        let mut args = Vec::new();
        for e in indices {
            let id = self.expr(e)?;
            if self.graph.node(id).dtype != DType::Int {
                return Err(Diagnostic::new(
                    e.span(),
                    "an index must be an integer expression (index variables, integer constants, + - *)",
                ));
            }
            args.push(id);
        }
        Ok(self.graph.gather(c, axes, &args))
    }

    fn literal(&mut self, l: &syn::Lit) -> Result<NodeId> {
        match l {
            syn::Lit::Float(f) => {
                let v: f64 = f.base10_parse().map_err(Diagnostic::from)?;
                Ok(self.graph.f32(v))
            }
            syn::Lit::Int(i) => {
                let v: i64 = i.base10_parse().map_err(Diagnostic::from)?;
                Ok(self.graph.constant(v as f64, DType::Int))
            }
            syn::Lit::Bool(b) => Ok(self
                .graph
                .constant(if b.value { 1.0 } else { 0.0 }, DType::Bool)),
            other => Err(Diagnostic::new(
                other.span(),
                "only number and boolean literals are supported",
            )),
        }
    }

    fn binary(&mut self, b: &syn::ExprBinary) -> Result<NodeId> {
        use syn::BinOp as B;
        let x = self.expr(&b.left)?;
        let y = self.expr(&b.right)?;
        let (ls, rs) = (b.left.span(), b.right.span());
        let op = match b.op {
            B::Add(_) => Binary::Add,
            B::Sub(_) => Binary::Sub,
            B::Mul(_) => Binary::Mul,
            B::Div(_) => Binary::Div,
            B::Lt(_) => Binary::Lt,
            B::Le(_) => Binary::Le,
            B::Gt(_) => Binary::Gt,
            B::Ge(_) => Binary::Ge,
            B::Eq(_) => Binary::Eq,
            B::Ne(_) => Binary::Ne,
            B::And(_) => Binary::And,
            B::Or(_) => Binary::Or,
            other => {
                return Err(
                    Diagnostic::new(other.span(), "this operator is not supported")
                        .help("supported: + - * / < <= > >= == != && ||"),
                );
            }
        };
        if op.is_logical() {
            self.boolean(x, ls)?;
            self.boolean(y, rs)?;
        } else {
            self.numeric(x, ls)?;
            self.numeric(y, rs)?;
        }
        Ok(self.graph.binary(op, x, y))
    }

    fn call(&mut self, c: &syn::ExprCall) -> Result<NodeId> {
        let Expr::Path(p) = &*c.func else {
            return Err(Diagnostic::new(c.func.span(), "expected a function name"));
        };
        let Some(fname) = p.path.get_ident() else {
            return Err(Diagnostic::new(
                p.span(),
                "expected a function name, not a path",
            ));
        };
        let name = fname.to_string();
        let fspan = fname.span();
        let arity = match name.as_str() {
            "max" | "min" | "pow" => 2,
            "select" => 3,
            n if FUNCTIONS.contains(&n) => 1,
            _ => {
                let mut d = Diagnostic::new(fspan, format!("unknown function `{name}`"));
                d = match suggest(&name, FUNCTIONS) {
                    Some(s) => d.help(format!("did you mean `{s}`?")),
                    None => d.help(format!("available functions: {}", FUNCTIONS.join(", "))),
                };
                return Err(d);
            }
        };
        if c.args.len() != arity {
            return Err(Diagnostic::new(
                c.paren_token.span.join(),
                format!("`{name}` takes {arity} argument(s), found {}", c.args.len()),
            ));
        }
        let args: Vec<(NodeId, Span)> = c
            .args
            .iter()
            .map(|a| Ok((self.expr(a)?, a.span())))
            .collect::<Result<_>>()?;
        let reduce = match name.as_str() {
            "rowsum" => Some(Reduce::Sum),
            "rowmax" => Some(Reduce::Max),
            "rowabssum" => Some(Reduce::AbsSum),
            _ => None,
        };
        if let Some(r) = reduce {
            if !self.allow_reduce {
                return Err(Diagnostic::new(
                    fspan,
                    format!("row reductions (`{name}`) are only allowed in the online block's `fwd`; `{}` is elementwise", self.name),
                )
                .help("move the reduction into `online { fwd = |s, st| … }`"));
            }
            let (x, span) = args[0];
            self.numeric(x, span)?;
            if !self.graph.node(x).axes.contains(self.graph.reduce_axis()) {
                return Err(Diagnostic::new(
                    span,
                    format!(
                        "`{name}` needs a value that varies along the row (one that depends on `s`)"
                    ),
                ));
            }
            return Ok(self.graph.reduce(r, x));
        }
        match name.as_str() {
            "select" => {
                let c0 = self.boolean(args[0].0, args[0].1)?;
                let a = self.numeric(args[1].0, args[1].1)?;
                let b = self.numeric(args[2].0, args[2].1)?;
                Ok(self.graph.select(c0, a, b))
            }
            "max" | "min" | "pow" => {
                let a = self.numeric(args[0].0, args[0].1)?;
                let b = self.numeric(args[1].0, args[1].1)?;
                if name == "pow" && self.graph.const_value(b).is_none() {
                    return Err(Diagnostic::new(
                        args[1].1,
                        "the exponent of `pow` must be a constant",
                    )
                    .help("for a variable exponent write `exp(y * log(x))`"));
                }
                let op = match name.as_str() {
                    "max" => Binary::Max,
                    "min" => Binary::Min,
                    _ => Binary::Pow,
                };
                Ok(self.graph.binary(op, a, b))
            }
            _ => {
                let u = match name.as_str() {
                    "exp" => Unary::Exp,
                    "exp2" => Unary::Exp2,
                    "log" => Unary::Log,
                    "log2" => Unary::Log2,
                    "sqrt" => Unary::Sqrt,
                    "rsqrt" => Unary::Rsqrt,
                    "tanh" => Unary::Tanh,
                    "sigmoid" => Unary::Sigmoid,
                    "relu" => Unary::Relu,
                    "abs" => Unary::Abs,
                    "sign" => Unary::Sign,
                    _ => Unary::Neg,
                };
                let x = self.numeric(args[0].0, args[0].1)?;
                Ok(self.graph.unary(u, x))
            }
        }
    }

    fn block(&mut self, b: &syn::Block) -> Result<NodeId> {
        self.with_tail_block(b, |t, e| t.expr(e))
    }

    /// Traces a block's `let` statements, then hands its tail expression to `f`.
    fn with_tail_block<T>(
        &mut self,
        b: &syn::Block,
        f: impl FnOnce(&mut Self, &Expr) -> Result<T>,
    ) -> Result<T> {
        let depth = self.scopes.len();
        let mut tail = None;
        for (n, stmt) in b.stmts.iter().enumerate() {
            match stmt {
                syn::Stmt::Local(l) => {
                    let name = match &l.pat {
                        Pat::Ident(pi) if pi.subpat.is_none() && pi.by_ref.is_none() => {
                            pi.ident.to_string()
                        }
                        Pat::Type(t) => {
                            return Err(Diagnostic::new(
                                t.colon_token.span,
                                "`let` bindings take no type annotations",
                            ));
                        }
                        other => {
                            return Err(Diagnostic::new(other.span(), "expected `let name = …;`"));
                        }
                    };
                    let Some(init) = &l.init else {
                        return Err(Diagnostic::new(
                            l.let_token.span,
                            "`let` needs a value: `let x = …;`",
                        ));
                    };
                    if let Some((else_tok, _)) = &init.diverge {
                        return Err(Diagnostic::new(
                            else_tok.span,
                            "`let … else` is not supported",
                        ));
                    }
                    let id = self.expr(&init.expr)?;
                    self.scopes.push((name, Binding::Value(id)));
                }
                syn::Stmt::Expr(e, None) if n + 1 == b.stmts.len() => tail = Some(e),
                other => {
                    return Err(Diagnostic::new(
                        other.span(),
                        "only `let` statements and a final expression are allowed in a block",
                    ));
                }
            }
        }
        let Some(tail) = tail else {
            return Err(Diagnostic::new(
                b.brace_token.span.join(),
                "this block has no final expression (its value)",
            ));
        };
        let r = f(self, tail);
        self.scopes.truncate(depth);
        r
    }

    /// Runs `f` on the closure body's value expression, after its `let`s.
    fn with_tail<T>(
        &mut self,
        e: &Expr,
        f: impl FnOnce(&mut Self, &Expr) -> Result<T>,
    ) -> Result<T> {
        match e {
            Expr::Block(b) => self.with_tail_block(&b.block, f),
            Expr::Paren(p) if !matches!(&*p.expr, Expr::Tuple(_)) => self.with_tail(&p.expr, f),
            other => f(self, other),
        }
    }

    fn finish(self, outputs: Vec<(String, NodeId)>) -> Region {
        let mut r = Region {
            name: self.name.to_string(),
            iter_axes: self.iter_axes,
            params: self.params,
            graph: self.graph,
            outputs: outputs
                .into_iter()
                .map(|(name, node)| Output { name, node })
                .collect(),
        };
        r.compact();
        r
    }
}

/// What an elementwise closure is: its name, iteration space, accepted
/// parameter lists, how to write it (for errors) and its output.
struct Elementwise<'a> {
    name: &'static str,
    iter_axes: AxisSet,
    signatures: &'a [&'a [Slot]],
    shape: &'a str,
    out: &'a str,
    /// A mask returns a boolean, everything else a number.
    boolean: bool,
}

/// Traces an elementwise closure with one output.
fn trace_elementwise(decls: &Decls, c: &ExprClosure, spec: Elementwise) -> Result<Region> {
    let name = spec.name;
    let mut t = RegionTracer::new(decls, name, spec.iter_axes);
    t.bind(c, spec.signatures, spec.shape)?;
    let v = t.expr(&c.body)?;
    let span = c.body.span();
    if spec.boolean {
        t.boolean(v, span).map_err(|d| {
            Diagnostic::new(
                span,
                format!("`{name}` must return a boolean (true where the key is visible)"),
            )
            .help(d.help.unwrap_or_default())
        })?;
    } else {
        t.numeric(v, span)?;
    }
    Ok(t.finish(vec![(spec.out.to_string(), v)]))
}

/// A modification closure (`modify_q`, …) if the variant has one: `|x| …`
/// or `|x, <index variables idx>| …`.
fn trace_modification(
    decls: &Decls,
    cl: &Closures,
    key: &'static str,
    elem: &'static str,
    axes: AxisSet,
    idx: &[Slot],
    shape: &str,
) -> Result<Option<Region>> {
    let Some(c) = cl.get(key) else {
        return Ok(None);
    };
    let one: &[Slot] = &[Slot::Element(elem, axes)];
    let mut full = vec![Slot::Element(elem, axes)];
    full.extend_from_slice(idx);
    let spec = Elementwise {
        name: key,
        iter_axes: axes,
        signatures: &[one, &full],
        shape,
        out: elem,
        boolean: false,
    };
    trace_elementwise(decls, c, spec).map(Some)
}

fn trace_parallel(syntax: &VariantSyntax, decls: &Decls, cl: &Closures) -> Result<Parallel> {
    use Axis::*;
    let hk = decls.kv_heads;
    let q_axes = AxisSet::of(&[B, H, Sq, Dqk]);
    let k_axes = AxisSet::of(&[B, hk, Skv, Dqk]);
    let v_axes = AxisSet::of(&[B, hk, Skv, Dv]);
    let s_axes = AxisSet::of(&[B, H, Sq, Skv]);
    let row_axes = AxisSet::of(&[B, H, Sq]);
    let o_axes = AxisSet::of(&[B, H, Sq, Dv]);
    let modify =
        |key: &'static str, elem: &'static str, axes: AxisSet, idx: &[Slot], shape: &str| {
            trace_modification(decls, cl, key, elem, axes, idx, shape)
        };
    let modify_q = modify(
        "modify_q",
        "q",
        q_axes,
        &[Slot::Index(B), Slot::Index(H), Slot::Index(Sq)],
        "|q| … or |q, b, h, i| …",
    )?;
    let modify_k = modify(
        "modify_k",
        "k",
        k_axes,
        &[Slot::Index(B), Slot::Index(hk), Slot::Index(Skv)],
        "|k| … or |k, b, h, j| …",
    )?;
    let modify_v = modify(
        "modify_v",
        "v",
        v_axes,
        &[Slot::Index(B), Slot::Index(hk), Slot::Index(Skv)],
        "|v| … or |v, b, h, j| …",
    )?;
    let modify_scores = modify(
        "modify_scores",
        "s",
        s_axes,
        &[
            Slot::Index(B),
            Slot::Index(H),
            Slot::Index(Sq),
            Slot::Index(Skv),
        ],
        "|s| … or |s, b, h, i, j| …",
    )?;
    let mask = match cl.get("mask") {
        None => None,
        Some(c) => Some(trace_elementwise(
            decls,
            c,
            Elementwise {
                name: "mask",
                iter_axes: s_axes,
                signatures: &[&[
                    Slot::Index(B),
                    Slot::Index(H),
                    Slot::Index(Sq),
                    Slot::Index(Skv),
                ]],
                shape: "|b, h, i, j| i >= j",
                out: "mask",
                boolean: true,
            },
        )?),
    };
    let online = match cl.online {
        Some(o) => trace_online(decls, o, s_axes, row_axes, o_axes)?,
        None => implicit_online(decls, s_axes, o_axes),
    };
    let span = cl
        .online
        .map(|o| o.keyword.span())
        .unwrap_or(syntax.name.span());
    let backward = derive::parallel_backward(
        &online,
        [&modify_q, &modify_k, &modify_v, &modify_scores],
        &decls
            .customs
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>(),
    )
    .map_err(|e| Diagnostic::new(span, e))?;
    Ok(Parallel {
        kv_heads: hk,
        modify_q,
        modify_k,
        modify_v,
        modify_scores,
        mask,
        online,
        backward,
    })
}

fn implicit_online(decls: &Decls, s_axes: AxisSet, o_axes: AxisSet) -> Online {
    let mut fwd = RegionTracer::new(decls, "fwd", s_axes.without(Axis::Skv));
    let s = fwd.add_param("s", ParamRole::Element, DType::F32, s_axes);
    let one = fwd.graph.f32(1.0);
    let fwd = fwd.finish(vec![("p".into(), s), ("alpha".into(), one)]);
    let mut epi = RegionTracer::new(decls, "epilogue", o_axes);
    let o = epi.add_param("o", ParamRole::Element, DType::F32, o_axes);
    let epilogue = epi.finish(vec![("o".into(), o)]);
    Online {
        state: Vec::new(),
        fwd,
        epilogue,
        scales: Vec::new(),
        implicit: true,
    }
}

fn trace_online(
    decls: &Decls,
    o: &OnlineSyntax,
    s_axes: AxisSet,
    row_axes: AxisSet,
    o_axes: AxisSet,
) -> Result<Online> {
    // Prologue: constant initial values.
    let mut state = Vec::new();
    for (name, init) in &o.state {
        if state.iter().any(|f: &StateField| *name == f.name) {
            return Err(Diagnostic::new(
                name.span(),
                format!("state field `{name}` is declared twice"),
            ));
        }
        let mut t = RegionTracer::new(decls, "state", AxisSet::EMPTY);
        t.allow_customs = false;
        let v = t.expr(init)?;
        t.numeric(v, init.span())?;
        let Some(c) = t.graph.const_value(v) else {
            return Err(Diagnostic::new(
                init.span(),
                "an initial state value must be a constant (e.g. `-inf` or `0.0`)",
            ));
        };
        state.push(StateField {
            name: name.to_string(),
            init: c,
        });
    }
    let fields: Vec<String> = state.iter().map(|f| f.name.clone()).collect();
    let Some(fwd_c) = &o.fwd else {
        return Err(Diagnostic::new(
            o.keyword.span(),
            "the online block needs `fwd = |s, st| (weights, State { … }, rescale)`",
        ));
    };
    let Some(epi_c) = &o.epilogue else {
        return Err(Diagnostic::new(
            o.keyword.span(),
            "the online block needs `epilogue = |o, st| (output, Scales { … })`",
        ));
    };

    // fwd: one KV block of one row.
    let mut t = RegionTracer::new(decls, "fwd", row_axes);
    t.allow_reduce = true;
    t.allow_customs = false;
    t.bind(
        fwd_c,
        &[&[Slot::Element("s", s_axes), Slot::State]],
        "|s, st| (p, State { … }, alpha)",
    )?;
    t.bind_state_params(&fields, row_axes);
    let outputs = t.with_tail(&fwd_c.body, |t, tail| {
        let Expr::Tuple(tup) = tail else {
            return Err(Diagnostic::new(
                tail.span(),
                "`fwd` must return `(weights, State { … }, rescale)`",
            ));
        };
        if tup.elems.len() != 3 {
            return Err(Diagnostic::new(
                tup.span(),
                format!(
                    "`fwd` must return 3 values `(weights, State {{ … }}, rescale)`, found {}",
                    tup.elems.len()
                ),
            ));
        }
        let p = t.expr(&tup.elems[0])?;
        t.numeric(p, tup.elems[0].span())?;
        let mut outs = vec![("p".to_string(), p)];
        let new_state = state_literal(t, &tup.elems[1], "State", Some(&fields))?;
        for (f, id, span) in new_state {
            if t.graph.node(id).axes.contains(Axis::Skv) {
                return Err(Diagnostic::new(
                    span,
                    format!(
                        "state field `{f}` varies along the row; reduce it with `rowsum`/`rowmax`"
                    ),
                ));
            }
            outs.push((format!("state.{f}"), id));
        }
        let alpha = t.expr(&tup.elems[2])?;
        let aspan = tup.elems[2].span();
        t.numeric(alpha, aspan)?;
        if t.graph.node(alpha).axes.contains(Axis::Skv) {
            return Err(Diagnostic::new(
                aspan,
                "the rescale factor must be one number per row; it varies along the row here",
            ));
        }
        Ok(outs
            .into_iter()
            .chain([("alpha".to_string(), alpha)])
            .collect::<Vec<_>>())
    })?;
    let fwd = t.finish(outputs);

    // epilogue: one output row.
    let mut t = RegionTracer::new(decls, "epilogue", o_axes);
    t.allow_customs = false;
    t.bind(
        epi_c,
        &[&[Slot::Element("o", o_axes), Slot::State]],
        "|o, st| (o / st.l, Scales { … })",
    )?;
    t.bind_state_params(&fields, row_axes);
    let (outputs, out_span) = t.with_tail(&epi_c.body, |t, tail| {
        let (o_expr, scales) = match tail {
            Expr::Tuple(tup) if tup.elems.len() == 2 => (&tup.elems[0], Some(&tup.elems[1])),
            Expr::Tuple(tup) => {
                return Err(Diagnostic::new(tup.span(), format!("`epilogue` must return `(output, Scales {{ … }})` or just the output, found {} values", tup.elems.len())));
            }
            other => (other, None),
        };
        let o = t.expr(o_expr)?;
        t.numeric(o, o_expr.span())?;
        let mut outs = vec![("o".to_string(), o)];
        if let Some(s) = scales {
            for (name, id, span) in state_literal(t, s, "Scales", None)? {
                if t.graph.node(id).axes.contains(Axis::Dv) {
                    return Err(Diagnostic::new(span, format!("row scale `{name}` varies over Dv; final row scales are one number per row")));
                }
                outs.push((format!("scale.{name}"), id));
            }
        }
        Ok((outs, o_expr.span()))
    })?;
    let scales = outputs
        .iter()
        .skip(1)
        .map(|(n, _)| n.trim_start_matches("scale.").to_string())
        .collect();
    let epilogue = t.finish(outputs);
    check_linear_in_o(&epilogue).map_err(|m| {
        Diagnostic::new(out_span, m).help(
            "write the output as `o` times or divided by a function of the state, e.g. `o / st.l`",
        )
    })?;
    Ok(Online {
        state,
        fwd,
        epilogue,
        scales,
        implicit: false,
    })
}

/// `State { m, l: … }` (fields must match `expect` when given) or `Scales { … }`.
fn state_literal(
    t: &mut RegionTracer,
    e: &Expr,
    what: &str,
    expect: Option<&[String]>,
) -> Result<Vec<(String, NodeId, Span)>> {
    let Expr::Struct(s) = e else {
        return Err(Diagnostic::new(
            e.span(),
            format!("expected `{what} {{ field: value, … }}` here"),
        ));
    };
    if !s.path.is_ident(what) {
        return Err(Diagnostic::new(
            s.path.span(),
            format!("expected `{what} {{ … }}`, found `{}`", quote_path(&s.path)),
        ));
    }
    if let Some(dots) = &s.dot2_token {
        return Err(Diagnostic::new(
            dots.spans[0],
            format!("`..` is not supported in `{what} {{ … }}`; give every field"),
        ));
    }
    let mut out: Vec<(String, NodeId, Span)> = Vec::new();
    for fv in &s.fields {
        let syn::Member::Named(name) = &fv.member else {
            return Err(Diagnostic::new(fv.member.span(), "expected a field name"));
        };
        let n = name.to_string();
        if let Some(exp) = expect
            && !exp.contains(&n)
        {
            let mut d = Diagnostic::new(
                name.span(),
                format!(
                    "`{n}` is not a state field; the state declares {}",
                    if exp.is_empty() {
                        "none".to_string()
                    } else {
                        exp.join(", ")
                    }
                ),
            );
            if let Some(sg) = suggest(&n, exp.iter().map(String::as_str)) {
                d = d.help(format!("did you mean `{sg}`?"));
            }
            return Err(d);
        }
        if out.iter().any(|(o, ..)| *o == n) {
            return Err(Diagnostic::new(
                name.span(),
                format!("field `{n}` is given twice"),
            ));
        }
        let id = t.expr(&fv.expr)?;
        t.numeric(id, fv.expr.span())?;
        out.push((n, id, fv.span()));
    }
    if let Some(exp) = expect {
        let missing: Vec<&String> = exp
            .iter()
            .filter(|f| !out.iter().any(|(o, ..)| o == *f))
            .collect();
        if !missing.is_empty() {
            let list = missing
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Diagnostic::new(
                s.path.span(),
                format!("state field {list} missing from `fwd`'s new state"),
            )
            .help(format!(
                "`fwd` must give every state field a new value: `State {{ {} }}`",
                exp.join(", ")
            )));
        }
        // Keep the declared order.
        out.sort_by_key(|(n, ..)| exp.iter().position(|f| f == n));
    }
    Ok(out)
}

fn quote_path(p: &syn::Path) -> String {
    p.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

/// The epilogue's output must be `o · c(state)`: checked on sample points.
fn check_linear_in_o(epi: &Region) -> std::result::Result<(), String> {
    let out = epi.output("o").expect("epilogue has an output");
    let only_o = Region {
        outputs: vec![Output {
            name: "o".into(),
            node: out,
        }],
        ..epi.clone()
    };
    let states = [
        [0.75, 1.5, 2.25, 0.6],
        [1.3, 0.4, 3.1, 1.7],
        [2.0, 0.9, 0.55, 1.1],
    ];
    for st in states {
        let at = |o: f64| {
            eval_scalar(&only_o, &mut |op| match op {
                Op::Param(p) => match &epi.params[*p as usize].role {
                    ParamRole::Element => o,
                    _ => st[*p as usize % st.len()],
                },
                Op::Shape(_) => 7.0,
                Op::Index(_) => 3.0,
                _ => 1.0,
            })[0]
        };
        let (y0, y1, y2) = (at(0.0), at(1.0), at(-2.5));
        let tol = 1e-9 * (1.0 + y1.abs() * 2.5);
        if y0.abs() > 1e-12 || !y1.is_finite() || (y2 - (-2.5 * y1)).abs() > tol {
            return Err(
                "the epilogue's output must be linear in `o` (o times a function of the state)"
                    .into(),
            );
        }
    }
    Ok(())
}

fn trace_recurrent(decls: &Decls, cl: &Closures) -> Result<Recurrent> {
    use Axis::*;
    let qk_axes = AxisSet::of(&[B, H, S, Dk]);
    let v_axes = AxisSet::of(&[B, H, S, Dv]);
    let idx: &[Slot] = &[Slot::Index(B), Slot::Index(H), Slot::Index(S)];
    let modify = |key: &'static str, elem: &'static str, axes: AxisSet, shape: &str| {
        trace_modification(decls, cl, key, elem, axes, idx, shape)
    };
    let modify_q = modify("modify_q", "q", qk_axes, "|q| … or |q, b, h, t| …")?;
    let modify_k = modify("modify_k", "k", qk_axes, "|k| … or |k, b, h, t| …")?;
    let modify_v = modify("modify_v", "v", v_axes, "|v| … or |v, b, h, t| …")?;
    let decay = match cl.get("decay") {
        None => None,
        Some(c) => {
            let per_key_dim = c.inputs.len() == 4;
            let axes = if per_key_dim {
                qk_axes
            } else {
                AxisSet::of(&[B, H, S])
            };
            let scalar: &[Slot] = &[Slot::Index(B), Slot::Index(H), Slot::Index(S)];
            let per_dim: &[Slot] = &[
                Slot::Index(B),
                Slot::Index(H),
                Slot::Index(S),
                Slot::Index(Dk),
            ];
            let region = trace_elementwise(
                decls,
                c,
                Elementwise {
                    name: "decay",
                    iter_axes: axes,
                    signatures: &[scalar, per_dim],
                    shape: "|b, h, t| … (per head and step) or |b, h, t, d| … (per key dimension)",
                    out: "decay",
                    boolean: false,
                },
            )?;
            Some(Decay {
                region,
                per_key_dim,
            })
        }
    };
    let normalize = match cl.get("normalize") {
        None => None,
        Some(c) => Some(trace_elementwise(
            decls,
            c,
            Elementwise {
                name: "normalize",
                iter_axes: v_axes,
                signatures: &[&[
                    Slot::Element("o", v_axes),
                    Slot::Row("n", AxisSet::of(&[B, H, S])),
                ]],
                shape: "|o, n| o / n  (o: the output row q·S, n: q·z with z the decayed key sum)",
                out: "o",
                boolean: false,
            },
        )?),
    };
    let customs: Vec<String> = decls.customs.iter().map(|c| c.name.clone()).collect();
    let backward = derive::recurrent_backward(
        [&modify_q, &modify_k, &modify_v],
        decay.as_ref(),
        normalize.as_ref(),
        &customs,
    );
    Ok(Recurrent {
        modify_q,
        modify_k,
        modify_v,
        decay,
        normalize,
        backward,
    })
}
