//! The CUDA dialect: everything target-specific the emitters need, in one place.

use aec_frontend::ir::{Binary, DType, Reduce, Unary};

/// Element type of q, k, v and o in memory (bf16 unless asked otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Elem {
    #[default]
    Bf16,
    F16,
}

impl Elem {
    pub fn c_type(self) -> &'static str {
        match self {
            Elem::Bf16 => "__nv_bfloat16",
            Elem::F16 => "__half",
        }
    }

    /// The PTX type suffix of `mma.sync` operands.
    pub fn mma_type(self) -> &'static str {
        match self {
            Elem::Bf16 => "bf16",
            Elem::F16 => "f16",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::Bf16 => "bf16",
            Elem::F16 => "f16",
        }
    }
}

/// The instruction set a kernel is generated for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Isa {
    /// `mma.sync`, `ldmatrix`, `cp.async`: every GPU from sm_80 on.
    #[default]
    Sm80,
    /// Hopper with its architecture-specific features (`wgmma`): sm_90a only.
    Sm90a,
}

impl Isa {
    /// The instruction set for an NVRTC architecture name (`sm_90a`, `sm_80`, …).
    pub fn for_arch(arch: &str) -> Isa {
        if arch == "sm_90a" {
            Isa::Sm90a
        } else {
            Isa::Sm80
        }
    }

    /// Shared memory one thread block may use (static and dynamic): 163 KiB
    /// on sm_80 (A100), 227 KiB on sm_90 (H100, H200).
    pub fn max_dynamic_smem(self) -> u32 {
        match self {
            Isa::Sm80 => 163 * 1024,
            Isa::Sm90a => 227 * 1024,
        }
    }
}

/// Lanes per warp on NVIDIA GPUs. Kept here, never written as a literal in
/// templates or emitters, so the HIP dialect can say 64.
pub const WARP_SIZE: u32 = 32;

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
        Unary::Exp => format!("__expf({x})"),
        // The hardware approximation (2 ulp, denormal results flushed to
        // zero): `exp2f` adds range checks that cost three instructions per
        // score in the online softmax.
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
/// cross-lane combine helper in the template prelude.
pub fn reduce(r: Reduce) -> (&'static str, fn(&str, &str) -> String, &'static str) {
    match r {
        Reduce::Sum => ("0.0f", |a, x| format!("{a} + {x}"), "quad_sum"),
        Reduce::AbsSum => ("0.0f", |a, x| format!("{a} + fabsf({x})"), "quad_sum"),
        Reduce::Max => (
            "__int_as_float(0xff800000)",
            |a, x| format!("fmaxf({a}, {x})"),
            "quad_max",
        ),
    }
}
