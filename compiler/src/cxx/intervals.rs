//! The mask's tile classification (`crate::intervals`) as a device
//! function (CUDA and HIP): `int mask_block(i0, i1, j0, j1, b, h, hk, P)` returns 0 (empty),
//! 1 (partial) or 2 (full) for rows `[i0, i1]` and keys `[j0, j1]`. Numbers
//! are `double` intervals, booleans a pair of "can be true / can be false"
//! flags; the rules are those of `crate::intervals::classify`.

use super::closures::axis_size;
use aec_frontend::ir::{Axis, Binary, DType, NodeId, Op, Region, Unary};
use std::fmt::Write;

/// Helpers the function needs (once per source).
const HELPERS: &str = r#"struct Iv {
    double lo, hi;
};
__device__ __forceinline__ double iv_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ Iv iv_unknown() { return Iv{-iv_inf(), iv_inf()}; }
__device__ __forceinline__ Iv iv_checked(double lo, double hi) {
    return (isnan(lo) || isnan(hi)) ? iv_unknown() : Iv{lo, hi};
}
__device__ __forceinline__ Iv iv_of4(double a, double b, double c, double d) {
    if (isnan(a) || isnan(b) || isnan(c) || isnan(d)) return iv_unknown();
    return Iv{fmin(fmin(a, b), fmin(c, d)), fmax(fmax(a, b), fmax(c, d))};
}
__device__ __forceinline__ double iv_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ double iv_sign(double x) { return (double)((x > 0.0) - (x < 0.0)); }
"#;

fn num(id: NodeId) -> String {
    format!("v{}", id.0)
}
fn flag(id: NodeId) -> (String, String) {
    (format!("t{}", id.0), format!("f{}", id.0))
}

/// The device function for a mask region (output `mask`).
pub fn mask_block_fn(mask: &Region) -> String {
    let g = &mask.graph;
    let out = mask.output("mask").expect("mask region has `mask`");
    let live = g.live(&[out]);
    let mut code = String::new();
    let is_bool = |id: NodeId| g.node(id).dtype == DType::Bool;
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let n = g.node(id);
        let a = |k: usize| num(n.args[k]);
        let t = |k: usize| flag(n.args[k]);
        let v = num(id);
        let (tv, fv) = flag(id);
        let line = match n.op {
            Op::Const(c) if n.dtype == DType::Bool => {
                let b = c.get() != 0.0;
                format!("const bool {tv} = {b}, {fv} = {};", !b)
            }
            Op::Const(c) => {
                let x = double_lit(c.get());
                format!("const Iv {v} = Iv{{{x}, {x}}};")
            }
            Op::Index(Axis::Sq) => format!("const Iv {v} = Iv{{(double)i0, (double)i1}};"),
            Op::Index(Axis::Skv) => format!("const Iv {v} = Iv{{(double)j0, (double)j1}};"),
            Op::Index(ax) => {
                let p = match ax {
                    Axis::B => "b",
                    Axis::H => "h",
                    Axis::Hkv => "hk",
                    other => unreachable!("masks index B, H, Hkv, Sq, Skv, not {other}"),
                };
                format!("const Iv {v} = Iv{{(double){p}, (double){p}}};")
            }
            Op::Shape(ax) => {
                let s = axis_size(ax);
                format!("const Iv {v} = Iv{{(double)({s}), (double)({s})}};")
            }
            Op::Param(_) | Op::Custom(_) | Op::Gather(_) | Op::Reduce(_) => {
                if n.dtype == DType::Bool {
                    format!("const bool {tv} = true, {fv} = true;")
                } else {
                    format!("const Iv {v} = iv_unknown();")
                }
            }
            Op::Unary(Unary::Not) => {
                let (xt, xf) = t(0);
                format!("const bool {tv} = {xf}, {fv} = {xt};")
            }
            Op::Unary(u) => format!("const Iv {v} = {};", unary(u, &a(0))),
            Op::Binary(b) if b.is_logical() => {
                let ((xt, xf), (yt, yf)) = (t(0), t(1));
                match b {
                    Binary::And => {
                        format!("const bool {tv} = {xt} && {yt}, {fv} = {xf} || {yf};")
                    }
                    _ => format!("const bool {tv} = {xt} || {yt}, {fv} = {xf} && {yf};"),
                }
            }
            Op::Binary(b) if b.is_comparison() => {
                let (ct, cf) = compare(b, &a(0), &a(1));
                format!("const bool {tv} = {ct}, {fv} = {cf};")
            }
            Op::Binary(b) => format!("const Iv {v} = {};", arith(b, &a(0), &a(1))),
            Op::Select => {
                let (ct, cf) = t(0);
                if is_bool(id) {
                    let ((xt, xf), (yt, yf)) = (t(1), t(2));
                    format!(
                        "const bool {tv} = ({ct} && {xt}) || ({cf} && {yt}), {fv} = ({ct} && {xf}) || ({cf} && {yf});"
                    )
                } else {
                    let (x, y) = (a(1), a(2));
                    format!(
                        "const Iv {v} = !{cf} ? {x} : (!{ct} ? {y} : Iv{{fmin({x}.lo, {y}.lo), fmax({x}.hi, {y}.hi)}});"
                    )
                }
            }
        };
        let _ = writeln!(code, "    {line}");
    }
    let (ot, of) = flag(out);
    format!(
        "{HELPERS}\n// 0: the mask is false on all of rows [i0, i1] × keys [j0, j1]; 2: true on all; 1: neither.\n__device__ __forceinline__ int mask_block(int i0, int i1, int j0, int j1, int b, int h, int hk, const Params& P) {{\n{code}    return !{ot} ? 0 : (!{of} ? 2 : 1);\n}}\n"
    )
}

/// A double literal (exact for every integer a mask can hold).
fn double_lit(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else if v.is_nan() {
        "(iv_inf() - iv_inf())".into()
    } else if v > 0.0 {
        "iv_inf()".into()
    } else {
        "(-iv_inf())".into()
    }
}

fn unary(u: Unary, x: &str) -> String {
    let rising = |f: &str| format!("iv_checked({f}({x}.lo), {f}({x}.hi))");
    match u {
        Unary::Neg => format!("Iv{{-{x}.hi, -{x}.lo}}"),
        Unary::Exp => rising("exp"),
        Unary::Exp2 => rising("exp2"),
        Unary::Tanh => rising("tanh"),
        Unary::Sigmoid => rising("iv_sigmoid"),
        Unary::Relu => format!("Iv{{fmax({x}.lo, 0.0), fmax({x}.hi, 0.0)}}"),
        Unary::Sign => rising("iv_sign"),
        Unary::Log => format!("({x}.lo >= 0.0 ? {} : iv_unknown())", rising("log")),
        Unary::Log2 => format!("({x}.lo >= 0.0 ? {} : iv_unknown())", rising("log2")),
        Unary::Sqrt => format!("({x}.lo >= 0.0 ? {} : iv_unknown())", rising("sqrt")),
        Unary::Rsqrt => format!(
            "({x}.lo > 0.0 ? iv_checked(1.0 / sqrt({x}.hi), 1.0 / sqrt({x}.lo)) : iv_unknown())"
        ),
        Unary::Abs => format!(
            "({x}.lo >= 0.0 ? {x} : ({x}.hi <= 0.0 ? Iv{{-{x}.hi, -{x}.lo}} : Iv{{0.0, fmax(-{x}.lo, {x}.hi)}}))"
        ),
        Unary::Not => unreachable!("boolean"),
    }
}

fn arith(b: Binary, x: &str, y: &str) -> String {
    match b {
        Binary::Add => format!("iv_checked({x}.lo + {y}.lo, {x}.hi + {y}.hi)"),
        Binary::Sub => format!("iv_checked({x}.lo - {y}.hi, {x}.hi - {y}.lo)"),
        Binary::Mul => {
            format!("iv_of4({x}.lo * {y}.lo, {x}.lo * {y}.hi, {x}.hi * {y}.lo, {x}.hi * {y}.hi)")
        }
        Binary::Div => format!(
            "(({y}.lo > 0.0 || {y}.hi < 0.0) ? iv_of4({x}.lo / {y}.lo, {x}.lo / {y}.hi, {x}.hi / {y}.lo, {x}.hi / {y}.hi) : iv_unknown())"
        ),
        Binary::Max => format!("Iv{{fmax({x}.lo, {y}.lo), fmax({x}.hi, {y}.hi)}}"),
        Binary::Min => format!("Iv{{fmin({x}.lo, {y}.lo), fmin({x}.hi, {y}.hi)}}"),
        _ => "iv_unknown()".into(),
    }
}

/// (can be true, can be false) of a comparison of two intervals.
fn compare(b: Binary, x: &str, y: &str) -> (String, String) {
    match b {
        Binary::Lt => (format!("({x}.lo < {y}.hi)"), format!("({x}.hi >= {y}.lo)")),
        Binary::Le => (format!("({x}.lo <= {y}.hi)"), format!("({x}.hi > {y}.lo)")),
        Binary::Gt => compare(Binary::Lt, y, x),
        Binary::Ge => compare(Binary::Le, y, x),
        Binary::Eq => (
            format!("({x}.lo <= {y}.hi && {y}.lo <= {x}.hi)"),
            format!("!({x}.lo == {x}.hi && {y}.lo == {y}.hi && {x}.lo == {y}.lo)"),
        ),
        _ => {
            let (t, f) = compare(Binary::Eq, x, y);
            (f, t)
        }
    }
}
