//! How the C++ templates (CUDA and HIP alike) spell the IR's scalars and
//! operations. Both preludes define the helpers named here (`fast_exp2`,
//! `fast_tanh`, `row_lanes_sum`, …) with the target's instructions.

use aec_frontend::ir::{Binary, DType, Reduce, Unary};

pub fn c_scalar(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::Int => "int",
        DType::Bool => "bool",
    }
}

/// A float literal CUDA accepts (infinities through the math header macros).
pub fn float_lit(v: f64) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if v == f64::INFINITY {
        "__int_as_float(0x7f800000)".into()
    } else if v == f64::NEG_INFINITY {
        "__int_as_float(0xff800000)".into()
    } else {
        let s = format!("{:e}", v as f32);
        format!("{s}f")
    }
}

pub fn unary(u: Unary, x: &str, dtype: DType) -> String {
    match u {
        Unary::Neg => format!("(-{x})"),
        // The hardware approximations (2 ulp, denormal results flushed to
        // zero): `exp2f` adds range checks that cost three instructions per
        // score in the online softmax; `__expf` keeps denormal results with a
        // compare and two predicated multiplies per call, whose predicates
        // spilled RetNet's per-score decay in the sm_90a backward (44 bytes).
        Unary::Exp => format!("fast_exp2(({x}) * 1.44269504f)"),
        Unary::Exp2 => format!("fast_exp2({x})"),
        Unary::Log => format!("__logf({x})"),
        Unary::Log2 => format!("__log2f({x})"),
        Unary::Sqrt => format!("sqrtf({x})"),
        Unary::Rsqrt => format!("rsqrtf({x})"),
        // The hardware approximation (`tanh.approx`, relative error ~2^-11,
        // far below bf16 resolution): one SFU operation instead of `tanhf`'s
        // range reduction and polynomial.
        Unary::Tanh => format!("fast_tanh({x})"),
        // σ(x) = ½ + ½·tanh(x/2): one SFU operation per score instead of an
        // exponential and a reciprocal (the SFU bounds the sigmoid forward).
        Unary::Sigmoid => format!("fmaf(0.5f, fast_tanh(0.5f * ({x})), 0.5f)"),
        Unary::Relu => format!("fmaxf({x}, 0.0f)"),
        Unary::Abs if dtype == DType::Int => format!("abs({x})"),
        Unary::Abs => format!("fabsf({x})"),
        Unary::Sign => format!("(({x}) > 0 ? 1 : (({x}) < 0 ? -1 : 0))"),
        Unary::Not => format!("(!{x})"),
    }
}

pub fn binary(b: Binary, x: &str, y: &str, dtype: DType) -> String {
    let op = |o: &str| format!("({x} {o} {y})");
    match b {
        Binary::Add => op("+"),
        Binary::Sub => op("-"),
        Binary::Mul => op("*"),
        // Approximate division (2 ulp), far below bf16 resolution and several
        // times cheaper than IEEE division.
        Binary::Div => format!("__fdividef((float)({x}), (float)({y}))"),
        Binary::Max if dtype == DType::Int => format!("max({x}, {y})"),
        Binary::Min if dtype == DType::Int => format!("min({x}, {y})"),
        Binary::Max => format!("fmaxf({x}, {y})"),
        Binary::Min => format!("fminf({x}, {y})"),
        Binary::Pow => format!("powf({x}, {y})"),
        Binary::Lt => op("<"),
        Binary::Le => op("<="),
        Binary::Gt => op(">"),
        Binary::Ge => op(">="),
        Binary::Eq => op("=="),
        Binary::Ne => op("!="),
        Binary::And => op("&&"),
        Binary::Or => op("||"),
    }
}

/// `(identity, combine(acc, x))` of a row reduction, and the name of the
/// prelude helper that combines the lanes holding parts of one row.
pub fn reduce(r: Reduce) -> (&'static str, fn(&str, &str) -> String, &'static str) {
    match r {
        Reduce::Sum => ("0.0f", |a, x| format!("{a} + {x}"), "row_lanes_sum"),
        Reduce::AbsSum => ("0.0f", |a, x| format!("{a} + fabsf({x})"), "row_lanes_sum"),
        Reduce::Max => (
            "__int_as_float(0xff800000)",
            |a, x| format!("fmaxf({a}, {x})"),
            "row_lanes_max",
        ),
    }
}
