//! Operations of the graph IR and their scalar semantics.
//!
//! [`Unary::apply`] and [`Binary::apply`] are the single definition of what each
//! primitive computes; the constant folder and the reference interpreter both
//! call them, so the two can never disagree.

use super::axis::Axis;
use serde::Serialize;
use std::fmt;

/// Element type of a node's value. Arithmetic is carried out in `F32` on GPUs
/// (f64 in the reference interpreter); `Int` values come from index variables
/// and shape sizes, `Bool` from comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Int,
    Bool,
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::Int => "int",
            DType::Bool => "bool",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unary {
    Neg,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    Abs,
    Sign,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// `pow(x, c)`; the tracer only accepts a constant exponent.
    Pow,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

/// Row reductions over the pattern's reduction axis (`Skv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reduce {
    Sum,
    Max,
    AbsSum,
}

/// An f64 constant compared and hashed by its bits, so graphs can hash-cons it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConstBits(u64);

impl ConstBits {
    pub fn new(v: f64) -> ConstBits {
        // One zero, so that 0.0 and -0.0 constants share a node.
        ConstBits(if v == 0.0 { 0 } else { v.to_bits() })
    }
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl fmt::Debug for ConstBits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Const(ConstBits),
    /// A parameter of the region (its element value, a state field, a seed adjoint…).
    Param(u32),
    /// An index variable ranging over the axis (`b` over B, `j` over Skv, …).
    Index(Axis),
    /// The size of an axis, known at launch time.
    Shape(Axis),
    /// Element of a custom input tensor, broadcast over the closure's axes.
    Custom(u32),
    /// Element of a custom input with user axes: broadcast over its named
    /// axes, its user axes indexed by the (integer) operands, clamped into range.
    Gather(u32),
    Unary(Unary),
    Binary(Binary),
    /// `select(cond, a, b)`.
    Select,
    Reduce(Reduce),
}

impl Unary {
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Unary::Neg => -x,
            Unary::Exp => x.exp(),
            Unary::Exp2 => x.exp2(),
            Unary::Log => x.ln(),
            Unary::Log2 => x.log2(),
            Unary::Sqrt => x.sqrt(),
            Unary::Rsqrt => 1.0 / x.sqrt(),
            Unary::Tanh => x.tanh(),
            Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Unary::Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            Unary::Abs => x.abs(),
            Unary::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            Unary::Not => bool_f(x == 0.0),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Exp => "exp",
            Unary::Exp2 => "exp2",
            Unary::Log => "log",
            Unary::Log2 => "log2",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Tanh => "tanh",
            Unary::Sigmoid => "sigmoid",
            Unary::Relu => "relu",
            Unary::Abs => "abs",
            Unary::Sign => "sign",
            Unary::Not => "not",
        }
    }

    /// Ops priced as special-function-unit work by cost models.
    pub fn is_transcendental(self) -> bool {
        matches!(
            self,
            Unary::Exp
                | Unary::Exp2
                | Unary::Log
                | Unary::Log2
                | Unary::Sqrt
                | Unary::Rsqrt
                | Unary::Tanh
                | Unary::Sigmoid
        )
    }
}

impl Binary {
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
            // NaN-propagating, unlike f64::max.
            Binary::Max => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else if a >= b {
                    a
                } else {
                    b
                }
            }
            Binary::Min => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else if a <= b {
                    a
                } else {
                    b
                }
            }
            Binary::Pow => a.powf(b),
            Binary::Lt => bool_f(a < b),
            Binary::Le => bool_f(a <= b),
            Binary::Gt => bool_f(a > b),
            Binary::Ge => bool_f(a >= b),
            Binary::Eq => bool_f(a == b),
            Binary::Ne => bool_f(a != b),
            Binary::And => bool_f(a != 0.0 && b != 0.0),
            Binary::Or => bool_f(a != 0.0 || b != 0.0),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Max => "max",
            Binary::Min => "min",
            Binary::Pow => "pow",
            Binary::Lt => "lt",
            Binary::Le => "le",
            Binary::Gt => "gt",
            Binary::Ge => "ge",
            Binary::Eq => "eq",
            Binary::Ne => "ne",
            Binary::And => "and",
            Binary::Or => "or",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge | Binary::Eq | Binary::Ne
        )
    }

    pub fn is_logical(self) -> bool {
        matches!(self, Binary::And | Binary::Or)
    }
}

impl Reduce {
    /// The value of the reduction over an empty row.
    pub fn identity(self) -> f64 {
        match self {
            Reduce::Sum | Reduce::AbsSum => 0.0,
            Reduce::Max => f64::NEG_INFINITY,
        }
    }

    pub fn combine(self, acc: f64, x: f64) -> f64 {
        match self {
            Reduce::Sum => acc + x,
            Reduce::AbsSum => acc + x.abs(),
            Reduce::Max => Binary::Max.apply(acc, x),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "rowsum",
            Reduce::Max => "rowmax",
            Reduce::AbsSum => "rowabssum",
        }
    }
}

fn bool_f(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}
